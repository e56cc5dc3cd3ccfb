#!/usr/bin/env bash
# Snapshot pauses of two spate binaries, back to back, on an app whose state grows with the load, so that
# each snapshot is larger than the last:
# - APP=tally (the default): `spate load tally adds`, a snapshot every 250,000 records per partition;
# - APP=leaderboard: `spate load leaderboard bulk` (100 increments per request) drawing from USERS users
#   (20 million by default; each new one is a member of the one board), a snapshot every 20,000 records.
# Both closed loop, 32 connections. Then /metrics give the longest apply pause by cause, the snapshots
# written and their mean duration. Rounds alternate A and B to spread the machine's noise.
# Usage: [APP=leaderboard] [USERS=N] scripts/bench-snapshot-pause.sh BINARY_A BINARY_B [SECONDS_PER_RUN [ROUNDS]]
set -euo pipefail
binaries=("$1" "$2")
seconds=${3:-60}
rounds=${4:-2}
app=${APP:-tally}
case $app in
    tally) interval=250000 load=(tally adds) ;;
    leaderboard) interval=20000 load=(leaderboard bulk --users "${USERS:-20000000}") ;;
    *) echo "APP is tally or leaderboard, not $app" >&2; exit 2 ;;
esac

run() {
    local binary=$1 dir
    dir=$(mktemp -d)
    coproc server { exec "$binary" serve --apps "$app" --listen 127.0.0.1:0 --data-dir "$dir/data" \
        --fraud-stream-listen 127.0.0.1:0 --snapshot-interval-records "$interval" 2>"$dir/log"; }
    local base="" line
    while read -r line <&"${server[0]}"; do
        case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
    done
    [ -n "$base" ] || { echo "the server did not start: $(cat "$dir/log")" >&2; exit 1; }
    "$binary" load "${load[@]}" --target "$base" --connections 32 --duration-s "$seconds" \
        --out "$dir" >"$dir/load" 2>&1
    local rate size=""
    rate=$(grep -ho '"ok_rate_per_s": *[0-9.]*' "$dir"/*.json | grep -o '[0-9.]*$')
    if [ "$app" = leaderboard ]; then
        size=" ($(curl -s "$base/leaderboards" | grep -o '"members":[0-9]*' | grep -o '[0-9]*' | head -1) members at the end)"
    fi
    curl -s "$base/metrics" | awk -v binary="$binary" -v rate="$rate" -v size="$size" '
        /^spate_apply_pause_max_seconds\{/ {
            match($0, /cause="[a-z]+"/); cause = substr($0, RSTART + 7, RLENGTH - 8)
            if ($2 > longest[cause]) longest[cause] = $2
        }
        /^spate_snapshot_seconds_count/ { count += $2 }
        /^spate_snapshot_seconds_sum/ { sum += $2 }
        END {
            printf "%s: %.0f requests/s%s, %d snapshots of %.1f ms on average, longest pause: snapshot %.1f ms, journal %.1f ms\n",
                binary, rate, size, count, count ? 1000 * sum / count : 0, 1000 * longest["snapshot"], 1000 * longest["journal"]
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
