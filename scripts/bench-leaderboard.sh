#!/usr/bin/env bash
# The leaderboard benchmark with its peer: installs redis-server (Debian package) if it is missing, then
# runs `spate bench leaderboard`, which starts spate and Redis itself and writes bench-results/REPORT.md.
# Usage: scripts/bench-leaderboard.sh [spate bench options, e.g. --duration-s 5]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server >/dev/null
fi
cargo build --release -q
exec target/release/spate bench leaderboard "$@"
