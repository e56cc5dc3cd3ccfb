#!/usr/bin/env bash
# How many times a server calls glibc's malloc per request, by thread kind: starts `spate serve --apps
# APP --partitions 1`, runs `spate load APP SCENARIO --connections CONNECTIONS` for SECONDS, and counts
# the calls with a perf uprobe on libc's malloc over the run (added once with `perf probe`, which needs
# root). Allocations are counted, not timed: the figure does not move with this machine's noise.
# Usage: scripts/mallocs-by-thread.sh BINARY APP SCENARIO [CONNECTIONS=64] [SECONDS=3]
set -euo pipefail
binary=$1 app=$2 scenario=$3 connections=${4:-64} seconds=${5:-3}
libc=$(ldd "$binary" | awk '/libc\.so/ {print $3}')
perf probe -l 2>/dev/null | grep -q 'probe_libc:malloc ' || perf probe -q -x "$libc" malloc
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
coproc server { exec "$binary" serve --apps "$app" --partitions 1 --listen 127.0.0.1:0 \
    --fraud-stream-listen 127.0.0.1:0 --data-dir "$work/data" 2>"$work/log"; }
base=""
while read -r line <&"${server[0]}"; do
    case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
done
[ -n "$base" ] || { echo "the server did not start: $(cat "$work/log")" >&2; exit 1; }
# Counting starts before the load and ends after it, so that every request's calls are in.
perf stat -e probe_libc:malloc --per-thread -p "$server_PID" -o "$work/stat" -- sleep $((seconds + 1)) &
counting=$!
sleep 0.5
"$binary" load "$app" "$scenario" --target "$base" --connections "$connections" --duration-s "$seconds" \
    --warmup-s 0 --out "$work" >"$work/load" 2>&1
wait "$counting"
requests=$(grep -o '"ok": *[0-9]*' "$work/$app-$scenario.json" | head -1 | grep -o '[0-9]*$')
echo "$app $scenario: $requests requests"
awk -v n="$requests" '/probe_libc:malloc/ {
        name = $1; sub(/-[0-9]+$/, "", name); gsub(",", "", $2); calls[name] += $2; all += $2 }
    END {
        for (kind in calls) printf "  %-18s %6.1f mallocs per request\n", kind, calls[kind] / n
        printf "  %-18s %6.1f mallocs per request\n", "whole process", all / n }' "$work/stat" | LC_ALL=C sort
kill "$server_PID"
wait "$server_PID" || true
