#!/usr/bin/env bash
# fraud's replay after kill -9, on two spate binaries in turn: each generates CARDS cards x 20 in place,
# streams COUNT transactions with snapshots held off after the first (due after 64 MiB of journal),
# is killed with kill -9 and restarted, timed until it answers /health. Prints, per run, the stream's
# rate, that time and what each partition replayed (the server's "partition recovered" log lines).
# With PERF set, the restart runs under it: PERF="perf record -F 1999 -o replay.data --" profiles the
# replay (perf stops when the server serves).
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
        --snapshot-interval-apply-ms 100000000000
}

wait_until_serving() {
    until curl -sf "127.0.0.1:$port/health" >/dev/null; do
        kill -0 "$pid" 2>/dev/null || { echo "the server stopped:"; tail -5 "$dir/serve.log"; exit 1; }
        sleep 0.05
    done
}

run() {
    local binary=$1 begin
    rm -rf "$dir/data" "$dir/fraud.key"
    # shellcheck disable=SC2046 # the arguments hold no spaces
    RUST_LOG=info "$binary" $(serve_args) >"$dir/serve.log" 2>&1 &
    pid=$!
    wait_until_serving
    curl -sf -XPOST "127.0.0.1:$port/fraud/history/generate" -H 'content-type: application/json' \
        -d "{\"cards\":$cards,\"now_ms\":1800000000000}" >/dev/null
    "$binary" fraud push --server "127.0.0.1:$stream" --cards "$cards" --count "$count" \
        --start-ms 1800000100000 --batch 8192 --window 32 >"$dir/push.json"
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true
    begin=$(now)
    # shellcheck disable=SC2046,SC2086 # PERF is a command line to split
    RUST_LOG=info ${PERF:-} "$binary" $(serve_args) >"$dir/serve.log" 2>&1 &
    pid=$!
    wait_until_serving
    echo "$binary: stream $(sed 's/.*"records_per_s":\([0-9]*\).*/\1/' "$dir/push.json") transactions/s;" \
        "serving after $(seconds_since "$begin") s after kill -9"
    recovery_phases "$dir/serve.log"
    if [ -n "${PERF:-}" ]; then
        kill -INT "$pid"
        wait "$pid" 2>/dev/null || true
        pkill -9 -f "$dir/data" 2>/dev/null || true
    else
        kill -9 "$pid"
        wait "$pid" 2>/dev/null || true
    fi
    pid=
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "$cards cards x 20, $count transactions streamed, kill -9, restart"
for round in $(seq "$rounds"); do
    for binary in "${binaries[@]}"; do
        echo "round $round"
        run "$binary"
    done
done
