#!/usr/bin/env bash
# Where a server's CPU goes, by thread: starts `spate serve --apps APP --partitions 1` (plus any extra
# serve options), runs `spate load APP SCENARIO --connections CONNECTIONS` for SECONDS, and prints the
# CPU per request of each thread kind (tokio workers, partition, journal, ...) from
# /proc/<pid>/task/*/stat, with their voluntary context switches, the whole process's CPU per request
# (threads that came and went during the run included), the load generator's CPU per request and the
# group commits' mean size.
# `server health` as APP SCENARIO serves tally and drives GET /health: the HTTP stack without the engine.
# RATE=R runs the load in open loop at R requests/s over the same connections (prints p99 too);
# PARTITIONS=N serves N partitions instead of one; LOAD_BINARY=B runs the load with another build of
# spate than the server's (to A/B the load generator against one server).
# Usage: scripts/cpu-by-thread.sh BINARY APP SCENARIO [CONNECTIONS=64] [SECONDS=6] [SERVE OPTIONS...]
set -euo pipefail
binary=$1 app=$2 scenario=$3 connections=${4:-64} seconds=${5:-6}
shift $(($# < 5 ? $# : 5))
served=$app
[ "$app" = server ] && served=tally
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
coproc server { exec "$binary" serve --apps "$served" --partitions "${PARTITIONS:-1}" --listen 127.0.0.1:0 \
    --fraud-stream-listen 127.0.0.1:0 --data-dir "$work/data" "$@" 2>"$work/log"; }
base="" 
while read -r line <&"${server[0]}"; do
    case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
done
[ -n "$base" ] || { echo "the server did not start: $(cat "$work/log")" >&2; exit 1; }
by_thread() {
    for task in /proc/"$server_PID"/task/*; do
        awk -v name="$(cat "$task/comm")" -v switches="$(awk '/^voluntary/ {print $2}' "$task/status")" \
            '{print name, switches, $14 + $15}' "$task/stat"
    done | sed 's/-[0-9]* / /' | awk '{s[$1] += $2; t[$1] += $3} END {for (k in s) print k, s[k], t[k]}' | LC_ALL=C sort
}
by_thread >"$work/before"
process_before=$(awk '{print $14 + $15}' /proc/"$server_PID"/stat)
TIMEFORMAT='%3U %3S'
{ time "${LOAD_BINARY:-$binary}" load "$app" "$scenario" --target "$base" --connections "$connections" --duration-s "$seconds" \
    --warmup-s 0 ${RATE:+--rate "$RATE"} --out "$work" >"$work/load" 2>&1; } 2>"$work/load-cpu"
by_thread >"$work/after"
requests=$(grep -o '"ok": *[0-9]*' "$work/$app-$scenario.json" | head -1 | grep -o '[0-9]*$')
hz=$(getconf CLK_TCK)
echo "$app $scenario: $requests requests in ${seconds}s${RATE:+ (open loop at $RATE/s)}, $(grep -o 'p99 [0-9.]* ms' "$work/load" | head -1)"
LC_ALL=C join "$work/before" "$work/after" | awk -v n="$requests" -v hz="$hz" '{
    printf "  %-18s %6.2f us per request  %8d voluntary switches\n", $1, ($5 - $3) / hz / n * 1e6, $4 - $2 }'
awk -v n="$requests" -v hz="$hz" -v before="$process_before" '{
    printf "  %-18s %6.2f us per request\n", "whole process", ($14 + $15 - before) / hz / n * 1e6 }' /proc/"$server_PID"/stat
awk -v n="$requests" '{ printf "  %-18s %6.2f us per request\n", "load generator", ($1 + $2) / n * 1e6 }' "$work/load-cpu"
curl -s "$base/metrics" | awk '/^spate_journal_batch_records_sum/ {s += $2} /^spate_journal_batch_records_count/ {c += $2}
    END {if (c) printf "  group commits: %d, %.1f records each\n", c, s / c}'
kill "$server_PID"
wait "$server_PID" || true
