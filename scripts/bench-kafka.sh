#!/usr/bin/env bash
# The fraud stream with its journal on Kafka against the embedded journal, in one session, alternated:
# starts a 3-broker cluster (scripts/kafka.sh) in a temporary directory, runs `spate bench fraud` twice
# each way after a warm-up run of the brokers, and stops the cluster. The brokers run in both cases, so
# both share the machine alike.
#
#   scripts/bench-kafka.sh [OUT] [spate bench fraud options...]
#   e.g. scripts/bench-kafka.sh bench-results/kafka --cards 1000000 --count 5000000
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/kafka}
shift || true
cargo build --release -p spate
dir=$(mktemp -d)
trap 'scripts/kafka.sh stop "$dir"; rm -rf "$dir"' EXIT
bootstrap=$(scripts/kafka.sh start "$dir" | tail -n 1)
# The brokers' JVMs compile their hot paths during the first tens of seconds of load (a first Kafka
# round right after the start ran at half the second's rate): 10 M transactions, not reported, warm them.
target/release/spate bench fraud --kafka "$bootstrap" --cards 1000000 --count 5000000 --runs 2 \
	--out "$(mktemp -d)" >/dev/null 2>&1
for round in 1 2; do
	target/release/spate bench fraud "$@" --out "$out/embedded-$round"
	target/release/spate bench fraud --kafka "$bootstrap" "$@" --out "$out/kafka-$round"
done
grep -h -A6 "^## fraud\|^- journal" "$out"/*/REPORT.md
