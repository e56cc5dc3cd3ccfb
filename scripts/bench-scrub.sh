#!/usr/bin/env bash
# What the background scrub costs: fills the ledger's archive with `spate load ledger batch` for
# FILL_SECONDS (scrub off), then restarts the server at each scrub rate given and reports, over
# SECONDS, the scrub thread's share of a core (from /proc/<pid>/task/<tid>/stat), the bytes it read
# per second, its CPU per MiB and its passes. A rate of 0 means unbounded (a large
# --store-scrub-mb-per-s), where a small store is read as often as passes may start (every 10 s).
# Usage: scripts/bench-scrub.sh BINARY [FILL_SECONDS [SECONDS [RATE_MB_PER_S...]]] (rates: 16 0)
set -euo pipefail
binary=$1
fill_seconds=${2:-40}
seconds=${3:-30}
shift $(($# < 3 ? $# : 3))
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(16 0)
source "$(dirname "$0")/lib/measure.sh"
ticks_per_s=$(getconf CLK_TCK)

# Starts the server on the data directory with `--store-scrub-mb-per-s $1`; sets pid and base.
start() {
    coproc server { exec "$binary" serve --apps ledger --partitions 2 --listen 127.0.0.1:0 \
        --fraud-stream-listen off --data-dir "$dir/data" --store-scrub-mb-per-s "$1" 2>>"$dir/log"; }
    pid=$server_PID
    base=""
    local line
    while read -r line <&"${server[0]}"; do
        case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
    done
    [ -n "$base" ] || { echo "the server did not start: $(cat "$dir/log")" >&2; exit 1; }
}

stop() {
    kill "$pid"
    wait "$pid" || true
    pid=
}

metric() { curl -s "$base/metrics" | awk -v name="$1{store=\"archive\"}" '$1 == name {print $2}'; }

start 0
"$binary" load ledger batch --target "$base" --connections 4 --batch 8000 --duration-s "$fill_seconds" \
    --warmup-s 0 >"$dir/fill" 2>&1
stop
echo "archive: $(mib "$dir/data/archive") MiB on disk after $fill_seconds s of ledger batches"

for rate in "${rates[@]}"; do
    start "$([ "$rate" = 0 ] && echo 100000 || echo "$rate")"
    sleep 1
    tid=""
    for task in /proc/"$pid"/task/*; do
        [ "$(cat "$task/comm")" = "scrub-archive" ] && tid=${task##*/}
    done
    [ -n "$tid" ] || { echo "no scrub thread" >&2; exit 1; }
    ticks() { awk '{print $14 + $15}' "/proc/$pid/task/$tid/stat"; }
    ticks_before=$(ticks) bytes_before=$(metric spate_store_scrub_bytes_total) started=$(now)
    sleep "$seconds"
    ticks_after=$(ticks) bytes_after=$(metric spate_store_scrub_bytes_total) ended=$(now)
    awk -v rate="$rate" -v ticks=$((ticks_after - ticks_before)) -v hz="$ticks_per_s" \
        -v bytes=$((bytes_after - bytes_before)) -v s="$(echo "$ended - $started" | bc)" \
        -v passes="$(metric spate_store_scrub_passes_total)" -v health="$(curl -s -o /dev/null -w '%{http_code}' "$base/health")" \
        'BEGIN { mib = bytes / 1048576; cpu = ticks / hz
                 printf "rate %s MiB/s: %.1f%% of a core, %.1f MiB/s read, %.1f ms of CPU per MiB, %s passes, /health %s\n",
                 rate == 0 ? "unbounded" : rate, 100 * cpu / s, mib / s, 1000 * cpu / mib, passes, health }'
    stop
done
