#!/usr/bin/env bash
# Checks `spate load` against independent tools on the trivial endpoint GET /health: same server, same
# connections, same duration, alternating runs. Installs wrk (Debian package) if it is missing; also runs
# oha when it is installed (INSTALL_OHA=1 installs it with cargo, which takes minutes).
# PIN=1 runs the server on CPU 0 and every load tool on CPU 1 (one wrk thread), so that the tools do not
# compete with the server for cores; without it all share every core.
# Usage: [PIN=1] scripts/compare-with-wrk.sh [rounds=3] [seconds=10] [connections=16]
set -euo pipefail
rounds=${1:-3}
seconds=${2:-10}
connections=${3:-16}
cd "$(dirname "$0")/.."

if ! command -v wrk >/dev/null; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq wrk >/dev/null
fi
if [ "${INSTALL_OHA:-0}" = 1 ] && ! command -v oha >/dev/null; then
    cargo install oha --locked -q
fi
cargo build --release -q
server_cpu="" tool_cpu="" wrk_threads=2
if [ "${PIN:-0}" = 1 ]; then
    server_cpu="taskset -c 0" tool_cpu="taskset -c 1" wrk_threads=1
fi
data=$(mktemp -d)
out=$(mktemp)
$server_cpu target/release/spate serve --data-dir "$data" --listen 127.0.0.1:0 --apps tally --fraud-stream-listen off \
    >"$out" 2>/dev/null &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$data" "$out"' EXIT
until grep -q "spate listening on" "$out"; do sleep 0.1; done
base=$(sed -n 's/^spate listening on //p' "$out")

echo "GET $base/health, $connections connections, $seconds s per run, $rounds rounds, PIN=${PIN:-0}"
for round in $(seq "$rounds"); do
    $tool_cpu wrk -t"$wrk_threads" -c"$connections" -d"${seconds}s" --latency "$base/health" |
        awk -v r="$round" '/Requests\/sec/ {rps=$2} /^ +50%/ {p50=$2} /^ +99%/ {p99=$2}
            END {printf "round %s  wrk         %10.0f req/s  p50 %8s  p99 %8s\n", r, rps, p50, p99}'
    if command -v oha >/dev/null; then
        $tool_cpu oha -z "${seconds}s" -c "$connections" --no-tui --output-format json "$base/health" |
            python3 -c 'import json, sys; d = json.load(sys.stdin); p = d["latencyPercentiles"]
print("round %s  oha         %10.0f req/s  p50 %6.3fms  p99 %6.3fms" % (sys.argv[1], d["summary"]["requestsPerSec"], p["p50"] * 1e3, p["p99"] * 1e3))' "$round"
    fi
    $tool_cpu target/release/spate load server health --target "$base" --connections "$connections" \
        --duration-s "$seconds" --warmup-s 0 |
        awk -v r="$round" '/achieved/ {rps=$4} /latency/ {p50=$9 $10; p99=$15 $16}
            END {sub("/s", "", rps); printf "round %s  spate load  %10.0f req/s  p50 %8s  p99 %8s\n", r, rps, p50, p99}'
done
