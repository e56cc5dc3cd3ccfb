#!/usr/bin/env bash
# Reads of old ledger transfers under two server settings, on one ledger filled once: stores TRANSFERS
# transfers with the batch API (4 connections x 8,000 operations, 2 partitions, as `spate bench ledger
# --ledger-history` does), stops the server, then for ROUNDS rounds restarts it on that data directory
# with the environment ENV_A, then ENV_B (such as `SPATE_ARCHIVE_CACHE_MB=1024`), and each time reads
# random old transfers for SECONDS in closed loop beside the saturating batch load (a warm-up), then at
# 1,000/s beside writes held to 20,000 transfers/s (the bench's third read run), and prints that run's
# latency, its p99 per second and the server's RSS. The data directory goes under DIR (it takes about
# 155 bytes per transfer).
# Usage: scripts/bench-ledger-reads-ab.sh BINARY TRANSFERS ROUNDS ENV_A ENV_B [SECONDS=30] [DIR=/tmp]
set -euo pipefail
binary=$1 transfers=$2 rounds=$3 env_a=$4 env_b=$5 seconds=${6:-30}
work=$(mktemp -d "${7:-/tmp}/ledger-reads-ab.XXXX")
trap 'kill -9 "${server_PID:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

start() {
    coproc server { exec env $1 "$binary" serve --apps ledger --partitions 2 --listen 127.0.0.1:0 \
        --fraud-stream-listen off --data-dir "$work/data" 2>>"$work/log"; }
    base=""
    while read -r line <&"${server[0]}"; do
        case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
    done
    [ -n "$base" ] || { echo "the server did not start: $(tail -5 "$work/log")" >&2; exit 1; }
}
stop() { kill -TERM "$server_PID"; wait "$server_PID" || true; }
writes() { # SEED, then load options
    local seed=$1
    shift
    "$binary" load ledger batch --target "$base" --connections 4 --participants 16 --seed "$seed" \
        --warmup-s 0 "$@" >/dev/null 2>&1
}
reads() { # load options; prints the latency line
    "$binary" load ledger reads --target "$base" --participants 16 --seed 1 --written-by 4 \
        --users "$per_writer" --duration-s "$seconds" --warmup-s 0 "$@" 2>&1 | grep latency
}

start ""
filling=$(date +%s)
writes 1 --batch 8000 --requests $((2 * transfers / 8000))
sleep 2
stored=$(curl -s "$base/participants" | python3 -c 'import json, sys; print(json.load(sys.stdin)["transfers"]["COMMITTED"])')
echo "stored $stored transfers in $(($(date +%s) - filling)) s; data directory $(du -sh "$work/data" | cut -f1)"
stop
# Closed-loop writers progress alike: half the mean share is written by every one of them.
per_writer=$((stored / 4 / 2))
for round in $(seq "$rounds"); do
    for side in A B; do
        settings=$env_a
        [ "$side" = B ] && settings=$env_b
        started=$(date +%s.%N)
        start "$settings"
        echo "round $round, $side ($settings): serving after $(echo "$(date +%s.%N) - $started" | bc) s"
        writes $((100 + round)) --batch 8000 --duration-s "$seconds" &
        writing=$!
        echo "  warm-up, closed loop: $(reads --connections 4)"
        wait "$writing"
        writes $((200 + round)) --batch 100 --rate 400 --duration-s "$seconds" &
        writing=$!
        echo "  1,000/s beside 20,000 transfers/s: $(reads --connections 32 --rate 1000 --out "$work/$round$side")"
        wait "$writing"
        python3 -c "import json, sys; print('  p99 per second (ms):', ' '.join(f\"{s['p99_us'] / 1000:.1f}\" for s in json.load(open(sys.argv[1]))['per_second']))" \
            "$work/$round$side/ledger-reads.json"
        echo "  RSS $(($(awk '/VmRSS/ {print $2}' "/proc/$server_PID/status") / 1024)) MiB"
        stop
    done
done
