#!/usr/bin/env bash
# fraud's history generation on spate binaries in turn: each round starts a fresh server per binary,
# times `POST /fraud/history/generate` of CARDS cards x 20 until it answers (every card stored), and
# kills the server. Prints one line per run.
# Usage: scripts/bench-fraud-generate-ab.sh BINARY_A BINARY_B [ROUNDS=3] [CARDS=10000000]
set -euo pipefail
binaries=("$1" "$2")
rounds=${3:-3}
cards=${4:-10000000}
port=18280
stream=18290
. "$(dirname "$0")/lib/measure.sh"

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
for round in $(seq "$rounds"); do
    for binary in "${binaries[@]}"; do
        rm -rf "$dir/data" "$dir/fraud.key"
        "$binary" serve --apps fraud --data-dir "$dir/data" --fraud-key-file "$dir/fraud.key" \
            --listen "127.0.0.1:$port" --fraud-stream-listen "127.0.0.1:$stream" \
            --fraud-entries-per-card 20 >"$dir/serve.log" 2>&1 &
        pid=$!
        wait_until_serving "$port" "$dir/serve.log"
        begin=$(now)
        curl -sf -XPOST "127.0.0.1:$port/fraud/history/generate" -H 'content-type: application/json' \
            -d "{\"cards\":$cards,\"now_ms\":1800000000000}" >/dev/null
        echo "round $round, $binary: $cards cards x 20 generated in $(seconds_since "$begin") s"
        kill -9 "$pid"
        wait "$pid" 2>/dev/null || true
    done
done
