#!/usr/bin/env bash
# ski's history: COUNT lift rides POSTed (closed loop, 168 connections) by SKIERS skiers, so that most
# rides are a skier's own day; then the server's RSS once the read model has every ride, a stop
# (SIGTERM, final checkpoints) timed, its data directory, a restart timed until it answers, the RSS after
# it, and queries that read the rides back. Run it with two binaries to see what a ride costs each in
# memory and on disk (BENCHMARKS.md, "ski: rides on disk").
#
#   scripts/bench-ski-history.sh [BINARY] [COUNT] [SKIERS]
set -euo pipefail

bin=${1:-target/release/spate}
count=${2:-3000000}
skiers=${3:-10000000}
port=18281
base="http://127.0.0.1:$port"
. "$(dirname "$0")/lib/measure.sh"

start() {
    "$bin" serve --apps ski --data-dir "$dir/data" --ski-skiers "1-$skiers" \
        --listen "127.0.0.1:$port" --fraud-stream-listen off >>"$dir/serve.log" 2>&1 &
    pid=$!
    until curl -sf "$base/health" >/dev/null; do sleep 0.05; done
}

rides_in_model() { curl -sf "$base/ski/lag" | grep -o '"rides":[0-9]*' | cut -d: -f2; }
# Times 100 queries of a skier's day (skiers 1..100), which read rides back from the read model.
time_queries() {
    local begin found=0
    begin=$(now)
    for skier in $(seq 1 100); do
        if curl -sf "$base/skiers/$skier/seasons/2022/days" | grep -q '"daysSkied":1'; then
            found=$((found + 1))
        fi
    done
    echo "100 GET /skiers/{id}/seasons/2022/days in $(seconds_since "$begin") s (curl each): $found skiers with rides"
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "binary: $bin"
start
echo "RSS at start $(rss_mib) MiB"
begin=$(now)
"$bin" load ski rides --target "$base" --connections 168 --requests "$count" --warmup-s 0 \
    --users "$skiers" --seed 17 >"$dir/load.txt"
until [ "$(rides_in_model)" -ge "$count" ]; do sleep 0.1; done
echo "$count rides acknowledged and in the read model in $(seconds_since "$begin") s; RSS $(rss_mib) MiB"
time_queries
begin=$(now)
kill -TERM "$pid"
wait "$pid" || true
pid=
echo "stopped (SIGTERM, final snapshots and checkpoints) in $(seconds_since "$begin") s"
echo "data directory $(mib "$dir/data") MiB: the ride store $(mib "$dir/data/ski/model") MiB," \
    "journal and snapshots $(mib "$dir/data/partitions") MiB, checkpoints $(mib "$dir/data/projections") MiB"
begin=$(now)
start
echo "restarted, answering in $(seconds_since "$begin") s with $(rides_in_model) rides; RSS $(rss_mib) MiB"
time_queries
echo "RSS after the queries: $(rss_mib) MiB"
