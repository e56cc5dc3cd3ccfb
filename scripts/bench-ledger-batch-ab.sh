#!/usr/bin/env bash
# The ledger's batch API on two spate binaries, back to back: each serves the ledger on one partition
# under `spate load ledger batch` in closed loop; prints requests/s and the server's CPU seconds (from
# /proc/<pid>/stat) for the run, and per request (counting the load's 1 s warm-up at the same rate).
# Rounds alternate A and B to spread the machine's noise. An optional
# environment for the servers (such as a tuning knob of a local build) goes in SERVER_ENV, or in
# SERVER_ENV_A and SERVER_ENV_B for one side each: one binary with and without a setting, as in
# `SERVER_ENV_A=SPATE_STORE_SCRUB_MB_PER_S=0 scripts/bench-ledger-batch-ab.sh BIN BIN 4 8000 25 3`.
# LOAD names another app and scenario of `spate load`, served alone (OPERATIONS is then its --batch,
# which single-item scenarios ignore), as in `LOAD="tally adds" scripts/bench-ledger-batch-ab.sh A B 64`.
# Usage: scripts/bench-ledger-batch-ab.sh BINARY_A BINARY_B [CONNECTIONS [OPERATIONS [SECONDS [ROUNDS]]]]
set -euo pipefail
binaries=("$1" "$2")
connections=${3:-64}
operations=${4:-100}
seconds=${5:-10}
rounds=${6:-2}
ticks_per_s=$(getconf CLK_TCK)
read -r app scenario <<<"${LOAD:-ledger batch}"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run() {
    local binary=$1 side_env=$2 dir
    dir=$(mktemp -d)
    coproc server { exec env ${SERVER_ENV:-} $side_env "$binary" serve --apps "$app" --partitions 1 \
        --listen 127.0.0.1:0 --fraud-stream-listen 127.0.0.1:0 --data-dir "$dir/data" 2>"$dir/log"; }
    local base="" line
    while read -r line <&"${server[0]}"; do
        case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
    done
    [ -n "$base" ] || { echo "the server did not start: $(cat "$dir/log")" >&2; exit 1; }
    local before after rate
    before=$(cpu_ticks "$server_PID")
    "$binary" load "$app" "$scenario" --target "$base" --connections "$connections" --batch "$operations" \
        --duration-s "$seconds" --out "$dir" >"$dir/load" 2>&1
    after=$(cpu_ticks "$server_PID")
    rate=$(grep -o '"ok_rate_per_s": *[0-9.]*' "$dir/$app-$scenario.json" | grep -o '[0-9.]*$')
    awk -v binary="$binary${side_env:+ ($side_env)}" -v rate="$rate" -v ticks=$((after - before)) \
        -v hz="$ticks_per_s" -v seconds="$seconds" 'BEGIN {
            printf "%s: %.1f requests/s, server CPU %.1f s, %.1f us per request\n", binary, rate,
                ticks / hz, ticks / hz / (rate * (seconds + 1)) * 1e6 }'
    kill "$server_PID"
    wait "$server_PID" || true
    rm -rf "$dir"
}

for _ in $(seq "$rounds"); do
    run "${binaries[0]}" "${SERVER_ENV_A:-}"
    run "${binaries[1]}" "${SERVER_ENV_B:-}"
done
