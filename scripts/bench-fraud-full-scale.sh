#!/usr/bin/env bash
# fraud at the case study's full scale: CARDS cards x 20 generated in place, COUNT transactions streamed
# through the acknowledged stream, then the longest apply pause (and the longest own share, with the
# longest part of any pause by where it went), how many snapshot pauses passed 10 ms, the snapshots
# written so far (the server's "snapshot written" log lines: when, at which LSN, in how long), the
# server's RSS and data directory, and a restart from kill -9 timed until the server answers again,
# with what each partition restored and replayed (the server's "partition recovered" log lines) and
# the start-up phases ("engine recovered").
# Needs about 17 GB of memory and 16 GB of disk at the default 30 M cards (BENCHMARKS.md, "fraud: the
# case study's full scale").
#
#   scripts/bench-fraud-full-scale.sh [BINARY] [CARDS] [COUNT]
#
# With STOP=term the server is stopped with SIGTERM instead (it writes a final snapshot of every
# partition, timed), so that the restart is one from a snapshot rather than a replay of the journal.
# With AB=BINARY_B the same data directory is then started ROUNDS (default 2) more times by each binary
# in turn, BINARY_B first, each start timed until it serves (with the process's user and system CPU
# seconds) and then killed with kill -9: one state restarted by two binaries back to back. COLD=1
# drops the page cache before each of those starts (needs root: checked before anything runs);
# WAIT_S=N waits N seconds after each kill first (this VM hands a killed server's memory back to its
# host within seconds, and a restart then faults it all in again).
# With RATE=R the COUNT transactions come from a source paced at R/s (`spate fraud gen --serve --rate`)
# through `spate fraud pull`, as the case study's did, instead of as fast as the server takes them: a
# restart after a steady stream, whose snapshots keep falling due, rather than after a burst.
set -euo pipefail

bin=${1:-target/release/spate}
cards=${2:-30000000}
count=${3:-20000000}
port=18180
stream=18190
source=18195
. "$(dirname "$0")/lib/measure.sh"

start() {
    RUST_LOG=info "$bin" serve --apps fraud --data-dir "$dir/data" --fraud-key-file "$dir/fraud.key" \
        --listen "127.0.0.1:$port" --fraud-stream-listen "127.0.0.1:$stream" \
        --fraud-entries-per-card 20 >"$dir/serve.log" 2>&1 &
    pid=$!
    wait_until_serving "$port" "$dir/serve.log"
}


if [ "${COLD:-0}" = 1 ] && [ ! -w /proc/sys/vm/drop_caches ]; then
    echo "COLD=1 drops the page cache: /proc/sys/vm/drop_caches must be writable (root)" >&2
    exit 1
fi
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "binary: $bin ($("$bin" --version 2>/dev/null || echo unknown))"
start
begin=$(now)
curl -sf -XPOST "127.0.0.1:$port/fraud/history/generate" -H 'content-type: application/json' \
    -d "{\"cards\":$cards,\"now_ms\":1800000000000}" >/dev/null
echo "history: $cards cards x 20 generated and stored in $(seconds_since "$begin") s (ended $(date -u +%H:%M:%S)); RSS $(rss_mib) MiB"

if [ -n "${RATE:-}" ]; then
    # The case study's topology: a source that does not wait for acknowledgements, at RATE records/s,
    # forwarded to the acknowledged stream.
    "$bin" fraud gen --serve "127.0.0.1:$source" --rate "$RATE" --cards "$cards" --count "$count" \
        --start-ms 1800000100000 >"$dir/source.log" 2>&1 &
    source_pid=$!
    until grep -q "spate fraud source on" "$dir/source.log"; do sleep 0.05; done
    "$bin" fraud pull --source "127.0.0.1:$source" --server "127.0.0.1:$stream" --count "$count" \
        --batch 2048 --window 32 >"$dir/push.json"
    kill "$source_pid"
else
    "$bin" fraud push --server "127.0.0.1:$stream" --cards "$cards" --count "$count" \
        --start-ms 1800000100000 --batch 8192 --window 32 >"$dir/push.json"
fi
echo "stream: $(cat "$dir/push.json")"
echo "RSS after the stream: $(rss_mib) MiB; data directory $(du -sm "$dir/data" | cut -f1) MiB"
metrics=$(curl -s "127.0.0.1:$port/metrics")
metric_max() {
    echo "$metrics" | awk -v name="$1" '$1 ~ "^"name"\\{" && $1 ~ /cause="snapshot"/ {
        if ($2 > max) max = $2 } END { printf "%.1f ms\n", max * 1000 }'
}
over_budget() {
    echo "$metrics" | awk -v name="$1" '
        $1 ~ "^"name"_count\\{.*cause=\"snapshot\"" { all += $2 }
        $1 ~ "^"name"_bucket\\{le=\"0.01\",.*cause=\"snapshot\"" { within += $2 }
        END { printf "%d of %d", all - within, all }'
}
echo "longest apply pause (snapshot): $(metric_max spate_apply_pause_max_seconds)," \
    "its own share at most $(metric_max spate_apply_pause_own_max_seconds); the longest part of any" \
    "one on a core $(metric_max spate_apply_pause_cpu_max_seconds)," \
    "runnable but not running $(metric_max spate_apply_pause_queued_max_seconds)," \
    "neither (host steal or interrupts) $(metric_max spate_apply_pause_stolen_max_seconds)"
echo "snapshot pauses over 10 ms: $(over_budget spate_apply_pause_seconds);" \
    "own shares over 10 ms: $(over_budget spate_apply_pause_own_seconds)"
echo "snapshots written: $(curl -s "127.0.0.1:$port/metrics" |
    awk '/^spate_snapshot_seconds_count/ {n += $2} END {print n + 0}')"
sed -n 's/^\([0-9T:-]*\)\..*snapshot written \(.*\)/  snapshot written at \1: \2/p' "$dir/serve.log"
stats=$(curl -s "127.0.0.1:$port/fraud/stats")

if [ "${STOP:-kill}" = term ]; then
    begin=$(now)
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    echo "SIGTERM: stopped, final snapshots written, after $(seconds_since "$begin") s;" \
        "data directory $(du -sm "$dir/data" | cut -f1) MiB"
else
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true
fi
begin=$(now)
start
echo "restart after ${STOP:-kill -9}: serving after $(seconds_since "$begin") s; RSS $(rss_mib) MiB"
recovery_phases "$dir/serve.log"
strip() { echo "$1" | sed -e 's/"rate_per_s":[0-9.]*,\{0,1\}//' -e 's/"history_bytes[a-z_]*":[0-9.e+-]*,\{0,1\}//g'; }
compare_stats() {
    local after
    after=$(curl -s "127.0.0.1:$port/fraud/stats")
    if [ "$(strip "$stats")" = "$(strip "$after")" ]; then
        echo "stats after the restart: identical"
    else
        echo "stats differ after the restart:"; echo " before: $stats"; echo " after:  $after"; exit 1
    fi
}
compare_stats

if [ -n "${AB:-}" ]; then
    binary_a=$bin
    for _ in $(seq "${ROUNDS:-2}"); do
        for bin in "$AB" "$binary_a"; do
            kill -9 "$pid"
            wait "$pid" 2>/dev/null || true
            sleep "${WAIT_S:-0}"
            if [ "${COLD:-0}" = 1 ]; then
                sync
                echo 3 >/proc/sys/vm/drop_caches
            fi
            begin=$(now)
            start
            echo "restart by $bin: serving after $(seconds_since "$begin") s; $(awk -v hz="$(getconf CLK_TCK)" \
                '{printf "CPU %.1f s user, %.1f s system", $14 / hz, $15 / hz}' "/proc/$pid/stat")"
            recovery_phases "$dir/serve.log"
            compare_stats
        done
    done
fi
