#!/usr/bin/env bash
# The ledger's batch API beside TigerBeetle, in one session: builds TigerBeetle from a checkout of its
# repository (with the Zig release its `zig/download.sh` names, installed from PyPI's `ziglang` into a
# virtual environment under ~/.cache/spate), then alternates, ROUNDS times:
#   - TigerBeetle's own `tigerbeetle benchmark`: one replica on this machine (started by the benchmark,
#     data file in a temporary directory), TRANSFERS transfers in batches of 8,189 from one client,
#     single-phase, then the same with `--transfer-pending` (two-phase: pending transfers, not posted);
#   - spate: `spate serve --apps ledger --partitions 1` under `spate load ledger batch` with 4 connections
#     and batches of 8,000, for SECONDS: each transfer prepared then fulfilled (two steps, counted once).
# Prints TigerBeetle's report lines and the server's CPU, and spate's transfers/s and server CPU.
# Usage: scripts/bench-tigerbeetle.sh TIGERBEETLE_CHECKOUT [ROUNDS=3] [TRANSFERS=10000000] [SECONDS=15]
# (a checkout: `git clone` of github.com/tigerbeetle/tigerbeetle at a release tag, such as 0.17.8).
set -euo pipefail
source_dir=$(cd "$1" && pwd)
rounds=${2:-3}
transfers=${3:-10000000}
seconds=${4:-15}
cd "$(dirname "$0")/.."
repo=$(pwd)

zig_release=$(sed -n 's/^ZIG_RELEASE="\(.*\)"$/\1/p' "$source_dir/zig/download.sh")
[ -n "$zig_release" ] || { echo "no ZIG_RELEASE in $source_dir/zig/download.sh" >&2; exit 1; }
venv=$HOME/.cache/spate/ziglang-$zig_release
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "ziglang==$zig_release"
fi
tigerbeetle=$source_dir/zig-out/bin/tigerbeetle
if [ ! -x "$tigerbeetle" ]; then
    echo "building TigerBeetle $(git -C "$source_dir" describe --tags 2>/dev/null) with Zig $zig_release ..."
    (cd "$source_dir" && "$venv/bin/python" -m ziglang build -Drelease)
fi
cargo build --release -q
spate=$repo/target/release/spate
ticks_per_s=$(getconf CLK_TCK)

tigerbeetle_run() {
    local work
    work=$(mktemp -d)
    echo "TigerBeetle $(basename "$tigerbeetle") benchmark $*:"
    (cd "$work" && "$tigerbeetle" benchmark --transfer-count="$transfers" "$@" 2>&1) |
        grep -E '^(load accepted|batch latency p(50|99) |[0-9]+ batches in)' | sed 's/^/  /'
    rm -rf "$work"
}

spate_run() {
    local work before after rate
    work=$(mktemp -d)
    coproc server { exec "$spate" serve --apps ledger --partitions 1 --listen 127.0.0.1:0 \
        --fraud-stream-listen 127.0.0.1:0 --data-dir "$work/data" 2>"$work/log"; }
    local base="" line
    while read -r line <&"${server[0]}"; do
        case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
    done
    [ -n "$base" ] || { echo "the server did not start: $(cat "$work/log")" >&2; exit 1; }
    before=$(awk '{print $14 + $15}' "/proc/$server_PID/stat")
    "$spate" load ledger batch --target "$base" --connections 4 --batch 8000 --duration-s "$seconds" \
        --out "$work" >"$work/load" 2>&1
    after=$(awk '{print $14 + $15}' "/proc/$server_PID/stat")
    rate=$(grep -o '"ok_rate_per_s": *[0-9.]*' "$work/ledger-batch.json" | grep -o '[0-9.]*$')
    awk -v rate="$rate" -v ticks=$((after - before)) -v hz="$ticks_per_s" -v seconds="$seconds" 'BEGIN {
        transfers = rate * 8000 / 2
        printf "spate ledger batch (prepare + fulfil, batches of 8,000, 4 connections): %.0f transfers/s, server CPU %.2f us per transfer\n",
            transfers, ticks / hz / (transfers * (seconds + 1)) * 1e6 }'
    kill "$server_PID"
    wait "$server_PID" || true
    rm -rf "$work"
}

for _ in $(seq "$rounds"); do
    tigerbeetle_run
    tigerbeetle_run --transfer-pending
    spate_run
done
