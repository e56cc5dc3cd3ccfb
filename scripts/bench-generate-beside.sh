#!/usr/bin/env bash
# How long other commands wait while fraud generates a history on the same partitions (issue 19,
# defect 2): a server with fraud and tally on 2 partitions generates CARDS cards x 20, while one client
# writes tally entries one after another, each to an account of its own (so both partitions see them).
# Prints the generation's time, and the count, median, p99 and longest time taken of the tally writes
# that began while it ran (curl's own time included: a few ms).
#
#   scripts/bench-generate-beside.sh [BINARY] [CARDS]
set -euo pipefail

bin=${1:-target/release/spate}
cards=${2:-3000000}
port=18280
. "$(dirname "$0")/lib/measure.sh"

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "binary: $bin ($("$bin" --version 2>/dev/null || echo unknown))"
"$bin" serve --apps fraud,tally --partitions 2 --data-dir "$dir/data" \
    --fraud-key-file "$dir/fraud.key" --listen "127.0.0.1:$port" >"$dir/serve.log" 2>&1 &
pid=$!
until curl -sf "127.0.0.1:$port/health" >/dev/null; do sleep 0.05; done

touch "$dir/generating"
(
    i=0
    while [ -e "$dir/generating" ]; do
        i=$((i + 1))
        printf '%s ' "$(now)"
        curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -XPOST \
            "127.0.0.1:$port/tally/accounts/a$i/entries" -H 'content-type: application/json' \
            -d '{"amount": 1, "tag": 1}'
    done
) >"$dir/writes" &
writer=$!
sleep 1
begin=$(now)
curl -sf -XPOST "127.0.0.1:$port/fraud/history/generate" -H 'content-type: application/json' \
    -d "{\"cards\":$cards,\"now_ms\":1800000000000}" >/dev/null
took=$(seconds_since "$begin")
rm "$dir/generating"
wait "$writer"
echo "history: $cards cards x 20 generated and stored in $took s"
# Only the writes that began once the generation had.
awk -v begin="$begin" '$1 >= begin' "$dir/writes" >"$dir/during"
awk '$2 != 201 { bad++ } END { if (bad) print bad " writes answered other than 201" }' "$dir/during"
awk '{ print $3 }' "$dir/during" | sort -n | awk '{ t[NR] = $1 } END {
    printf "tally writes during it: %d; median %.1f ms, p99 %.1f ms, max %.1f ms\n",
        NR, t[int(NR * 0.5) + 1] * 1000, t[int(NR * 0.99) + 1] * 1000, t[NR] * 1000 }'
