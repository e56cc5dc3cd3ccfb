#!/usr/bin/env bash
# fraud's replay after kill -9, on two spate binaries in turn: each generates CARDS cards x 20 in place,
# streams COUNT transactions with snapshots held off after the first (due after 64 MiB of journal),
# is killed with kill -9 and restarted, timed until it answers /health. Prints, per run, the stream's
# rate, that time and what each partition replayed (the server's "partition recovered" log lines).
# With PERF set, each restart runs under it until it serves, then the server is killed: for example
# PERF="perf record -F 1999 -o replay.data --" with ROUNDS=1 and the same binary twice (each run writes
# the same output file).
# Usage: scripts/bench-fraud-replay-ab.sh BINARY_A BINARY_B [ROUNDS] [CARDS] [COUNT]
set -euo pipefail
binaries=("$1" "$2")
rounds=${3:-2}
cards=${4:-3000000}
count=${5:-10000000}
port=18280
stream=18290
. "$(dirname "$0")/lib/measure.sh"

serve_args() {
    echo serve --apps fraud --data-dir "$dir/data" --fraud-key-file "$dir/fraud.key" \
        --listen "127.0.0.1:$port" --fraud-stream-listen "127.0.0.1:$stream" \
        --fraud-entries-per-card 20 --snapshot-interval-records 1000000000000 \
        --snapshot-interval-bytes 1000000000000 --snapshot-interval-apply-ms 100000000000
}

# Kills the server in `$pid` and waits until it is gone (under perf it is perf's child, not ours).
kill_server() {
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    pid=
}

run() {
    local binary=$1 begin perf_pid=
    rm -rf "$dir/data" "$dir/fraud.key"
    # shellcheck disable=SC2046 # the arguments hold no spaces
    RUST_LOG=info "$binary" $(serve_args) >"$dir/serve.log" 2>&1 &
    pid=$!
    wait_until_serving "$port" "$dir/serve.log"
    curl -sf -XPOST "127.0.0.1:$port/fraud/history/generate" -H 'content-type: application/json' \
        -d "{\"cards\":$cards,\"now_ms\":1800000000000}" >/dev/null
    "$binary" fraud push --server "127.0.0.1:$stream" --cards "$cards" --count "$count" \
        --start-ms 1800000100000 --batch 8192 --window 32 >"$dir/push.json"
    kill_server
    begin=$(now)
    # shellcheck disable=SC2046,SC2086 # PERF is a command line to split
    RUST_LOG=info ${PERF:-} "$binary" $(serve_args) >"$dir/serve.log" 2>&1 &
    pid=$!
    if [ -n "${PERF:-}" ]; then
        perf_pid=$pid
        until pid=$(pgrep -n -P "$perf_pid"); do sleep 0.01; done
    fi
    wait_until_serving "$port" "$dir/serve.log"
    echo "$binary: stream $(sed 's/.*"records_per_s":\([0-9]*\).*/\1/' "$dir/push.json") transactions/s;" \
        "serving after $(seconds_since "$begin") s after kill -9"
    recovery_phases "$dir/serve.log"
    kill_server
    if [ -n "$perf_pid" ]; then
        wait "$perf_pid" 2>/dev/null || true
    fi
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "$cards cards x 20, $count transactions streamed, kill -9, restart"
for round in $(seq "$rounds"); do
    echo "round $round"
    for binary in "${binaries[@]}"; do
        run "$binary"
    done
done
