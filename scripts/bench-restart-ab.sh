#!/usr/bin/env bash
# Restart after kill -9 under load, on two spate binaries back to back: each serves an app on two
# partitions under `spate load` in closed loop, is killed with kill -9 after a number of seconds drawn
# for the round (the same for both binaries), and is timed from the kill to a server that answers
# /health. Prints, per run, that time and what each partition replayed (from the server's
# "partition recovered" log lines), and the start-up phases ("engine recovered").
# LOAD names the app and scenario (default "ledger batch", 4 connections x 8,000 operations; BATCH and
# CONNECTIONS change those); KILL_AFTER_S is the range of the kill time (default "20 40").
# Usage: scripts/bench-restart-ab.sh BINARY_A BINARY_B [ROUNDS]
set -euo pipefail
binaries=("$1" "$2")
rounds=${3:-3}
read -r app scenario <<<"${LOAD:-ledger batch}"
read -r kill_min kill_max <<<"${KILL_AFTER_S:-20 40}"
port=18380
. "$(dirname "$0")/lib/measure.sh"

start() {
    RUST_LOG=info "$binary" serve --apps "$app" --partitions 2 --listen "127.0.0.1:$port" \
        --fraud-stream-listen 127.0.0.1:0 --data-dir "$dir/data" >/dev/null 2>>"$dir/log" &
    pid=$!
    until curl -sf "127.0.0.1:$port/health" >/dev/null; do sleep 0.02; done
}

run() {
    local binary=$1 kill_after_s=$2 dir begin load
    dir=$(mktemp -d)
    start
    "$binary" load "$app" "$scenario" --target "http://127.0.0.1:$port" \
        --connections "${CONNECTIONS:-4}" --batch "${BATCH:-8000}" --duration-s 600 \
        --max-error-share 1 --out "$dir" >/dev/null 2>&1 &
    load=$!
    sleep "$kill_after_s"
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true
    begin=$(now)
    : >"$dir/log"
    start
    echo "$binary: killed after $kill_after_s s; serving again after $(seconds_since "$begin") s"
    kill "$load" 2>/dev/null || true
    wait "$load" 2>/dev/null || true
    recovery_phases "$dir/log"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
for round in $(seq "$rounds"); do
    kill_after_s=$((kill_min + RANDOM % (kill_max - kill_min + 1)))
    for binary in "${binaries[@]}"; do
        run "$binary" "$kill_after_s"
    done
    binaries=("${binaries[1]}" "${binaries[0]}")
done
