#!/usr/bin/env bash
# Snapshot pauses of two spate binaries, back to back: each serves tally (whose accounts grow with every
# add, so each snapshot is larger than the last) with a snapshot every 250,000 records per partition,
# under `spate load tally adds` in closed loop; then its /metrics give the longest apply pause by cause,
# the snapshots written and their mean duration. Rounds alternate A and B to spread the machine's noise.
# Usage: scripts/bench-snapshot-pause.sh BINARY_A BINARY_B [SECONDS_PER_RUN [ROUNDS]]
set -euo pipefail
binaries=("$1" "$2")
seconds=${3:-60}
rounds=${4:-2}

run() {
    local binary=$1 dir
    dir=$(mktemp -d)
    coproc server { exec "$binary" serve --apps tally --listen 127.0.0.1:0 --data-dir "$dir/data" \
        --fraud-stream-listen 127.0.0.1:0 --snapshot-interval-records 250000 2>"$dir/log"; }
    local base="" line
    while read -r line <&"${server[0]}"; do
        case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
    done
    [ -n "$base" ] || { echo "the server did not start: $(cat "$dir/log")" >&2; exit 1; }
    "$binary" load tally adds --target "$base" --connections 32 --duration-s "$seconds" \
        --out "$dir" >"$dir/load" 2>&1
    local rate
    rate=$(grep -o '"ok_rate_per_s": *[0-9.]*' "$dir"/tally-adds.json | grep -o '[0-9.]*$')
    curl -s "$base/metrics" | awk -v binary="$binary" -v rate="$rate" '
        /^spate_apply_pause_max_seconds\{/ {
            match($0, /cause="[a-z]+"/); cause = substr($0, RSTART + 7, RLENGTH - 8)
            if ($2 > longest[cause]) longest[cause] = $2
        }
        /^spate_snapshot_seconds_count/ { count += $2 }
        /^spate_snapshot_seconds_sum/ { sum += $2 }
        END {
            printf "%s: %.0f adds/s, %d snapshots of %.1f ms on average, longest pause: snapshot %.1f ms, journal %.1f ms\n",
                binary, rate, count, count ? 1000 * sum / count : 0, 1000 * longest["snapshot"], 1000 * longest["journal"]
        }'
    kill "$server_PID"
    wait "$server_PID" || true
    rm -rf "$dir"
}

for _ in $(seq "$rounds"); do
    for binary in "${binaries[@]}"; do
        run "$binary"
    done
done
