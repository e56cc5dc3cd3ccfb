#!/usr/bin/env bash
# Throughput of 1, 2 and 3 spate nodes sharing a Kafka journal, all on this machine: starts a 3-broker
# cluster (scripts/kafka.sh) in a temporary directory; for each node count starts that many nodes on a
# new topic of six partitions, waits until every partition has an owner, then drives each scenario
# through node 1 (so with more nodes most requests are forwarded to their partition's owner), and stops.
#
#   scripts/bench-cluster-scale.sh [OUT] [DURATION_S] [CONNECTIONS] [NODE_COUNTS]
#   e.g. scripts/bench-cluster-scale.sh /tmp/scale 10 32 "1 2 3 1" (a count again at the end shows how much
#   the brokers' own warm-up weighs on the first)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/cluster-scale}
duration=${2:-10}
connections=${3:-32}
node_counts=${4:-1 2 3}
cargo build --release -p spate
spate=target/release/spate
mkdir -p "$out"
dir=$(mktemp -d)
pids=()
stop_nodes() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	pids=()
}
trap 'stop_nodes; scripts/kafka.sh stop "$dir"; rm -rf "$dir"' EXIT
bootstrap=$(scripts/kafka.sh start "$dir" | tail -n 1)
# Every node seals and opens card data with the same key, kept outside their data directories.
head -c 32 /dev/urandom >"$dir/fraud.key"
# And sign their requests to each other with one secret.
head -c 32 /dev/urandom | base64 >"$dir/cluster.secret"
base_port=$((18100 + RANDOM % 800))
scenarios=("tally adds" "ski rides" "ledger batch" "fraud http")
round=0
for nodes in $node_counts; do
	round=$((round + 1))
	topic="scale-$round-$nodes-$$"
	for n in $(seq 1 "$nodes"); do
		port=$((base_port + n))
		"$spate" serve --kafka "$bootstrap" --kafka-topic "$topic" --node-id "$n" \
			--cluster-secret-file "$dir/cluster.secret" \
			--listen "127.0.0.1:$port" --data-dir "$dir/data-$round-$n" --partitions 6 \
			--apps tally,ski,ledger,fraud --fraud-key-file "$dir/fraud.key" \
			--fraud-stream-listen off >/dev/null 2>"$out/node-$round-$n.log" &
		pids+=($!)
	done
	target="127.0.0.1:$((base_port + 1))"
	# Settled: every partition owned by one of the nodes, and the same answer for 5 s (a rebalance moves
	# partitions in two rounds; requests for a moving partition get 503).
	previous="" same=0
	for _ in $(seq 1 120); do
		status=$("$spate" cluster status --node "$target" 2>/dev/null || true)
		owners=$(echo "$status" | tail -n +3 | grep -c . || true)
		if [[ $status == *" 0 without an owner"* && $owners -eq $nodes && $status == "$previous" ]]; then
			same=$((same + 1))
			if ((same >= 5)); then break; fi
		else
			same=0
		fi
		previous=$status
		sleep 1
	done
	echo "== round $round: $nodes node(s)"; echo "$status"
	for scenario in "${scenarios[@]}"; do
		# shellcheck disable=SC2086 # the scenario is two words on purpose
		"$spate" load $scenario --target "http://$target" --connections "$connections" \
			--duration-s "$duration" --max-error-share 1 --out "$out/$round-$nodes-nodes" \
			>"$out/$round-$nodes-nodes-${scenario// /-}.txt" 2>&1 || true
		echo "round $round, $nodes node(s), $scenario: $(grep -m1 'achieved' "$out/$round-$nodes-nodes-${scenario// /-}.txt" || echo 'see the .txt')"
	done
	stop_nodes
done
