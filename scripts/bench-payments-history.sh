#!/usr/bin/env bash
# payments' history: COUNT payments authorized and captured at once, then settled, which makes them
# final; then the server's RSS, its data directory, a restart (after SIGTERM) timed until it answers, the
# RSS after it, and reads of the settled payments (one by id, a page of the list). Run it with two
# binaries to see what a final payment costs each in memory and on disk (BENCHMARKS.md, "payments'
# history").
#
#   scripts/bench-payments-history.sh [BINARY] [COUNT]
set -euo pipefail

bin=${1:-target/release/spate}
count=${2:-1000000}
port=18280
base="http://127.0.0.1:$port"
. "$(dirname "$0")/lib/measure.sh"

start() {
    SPATE_KEK_FILE="$dir/kek" "$bin" serve --apps payments --data-dir "$dir/data" \
        --listen "127.0.0.1:$port" --fraud-stream-listen off >>"$dir/serve.log" 2>&1 &
    pid=$!
    until curl -sf "$base/health" >/dev/null; do sleep 0.05; done
}


echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "binary: $bin"
start
begin=$(now)
"$bin" load payments authorize-capture --target "$base" --connections 64 --requests "$count" \
    --warmup-s 0 --cards 100000000 --seed 300 >"$dir/load.txt"
echo "$count authorizations captured at once in $(seconds_since "$begin") s; RSS $(rss_mib) MiB"
begin=$(now)
settled=$(curl -sf -XPOST "$base/admin/settlements")
captures=$(echo "$settled" | grep -o '"captures":[0-9]*' | head -1 | cut -d: -f2)
echo "settled $captures captures in $(seconds_since "$begin") s; RSS $(rss_mib) MiB"
begin=$(now)
kill -TERM "$pid"
wait "$pid" || true
pid=
echo "stopped (SIGTERM, final snapshots) in $(seconds_since "$begin") s"
echo "data directory $(mib "$dir/data") MiB: archive $(mib "$dir/data/archive") MiB," \
    "the list's store $(mib "$dir/data/payments/model") MiB, journal and snapshots" \
    "$(mib "$dir/data/partitions") MiB"
begin=$(now)
start
echo "restarted, answering in $(seconds_since "$begin") s; RSS $(rss_mib) MiB"
listed=$(curl -sf "$base/v1/payments?limit=100" | grep -o '"id":"pay_[^"]*"' | wc -l)
first=$(curl -sf "$base/v1/payments?limit=1" | grep -o '"id":"pay_[^"]*"' | head -1 | cut -d'"' -f4)
status=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/payments/$first")
echo "after the restart: the list's first page holds $listed payments; GET /v1/payments/$first: $status"
echo "RSS after the reads: $(rss_mib) MiB"
