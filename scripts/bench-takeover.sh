#!/usr/bin/env bash
# How long a node without the partitions' disk takes to serve them, with and without their snapshots on
# Kafka: starts a 3-broker cluster (scripts/kafka.sh) in a temporary directory, builds history on one
# node (`spate load <SCENARIO>` for LOAD_S seconds), stops it cleanly (its last snapshots go to Kafka),
# then ROUNDS times: starts a node on an empty data directory and times it until it listens (snapshot
# from Kafka + the journal after it), stops it, deletes the snapshot topic, and times the same start again
# (the whole journal replayed).
#
#   scripts/bench-takeover.sh [OUT] [LOAD_S] [ROUNDS] [SCENARIO]
#   e.g. scripts/bench-takeover.sh /tmp/takeover 60 3 "fraud http"
#
# AB=BIN times BIN's starts beside this build's, on the same history, in each round (this build first).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/takeover}
load_s=${2:-60}
rounds=${3:-3}
scenario=${4:-fraud http}
cargo build --release -p spate
spate=$PWD/target/release/spate
mkdir -p "$out"
dir=$(mktemp -d)
pid=""
stop_node() {
	if [[ -n $pid ]]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		pid=""
	fi
}
trap 'stop_node; scripts/kafka.sh stop "$dir"; rm -rf "$dir"' EXIT
bootstrap=$(scripts/kafka.sh start "$dir" | tail -n 1)
head -c 32 /dev/urandom >"$dir/fraud.key"
topic="takeover-$$"
port=$((18900 + RANDOM % 800))
ready_s=""
start_node() { # DATA_DIR LOG [BIN]: starts a node; ready_s is the seconds until it listened
	local started ready
	started=$(date +%s.%N)
	"${3:-$spate}" serve --kafka "$bootstrap" --kafka-topic "$topic" --listen "127.0.0.1:$port" \
		--data-dir "$1" --partitions 2 --apps tally,ski,ledger,fraud --fraud-key-file "$dir/fraud.key" \
		--fraud-stream-listen off >"$2.out" 2>"$2" &
	pid=$!
	until grep -q "spate listening on" "$2.out"; do
		kill -0 "$pid" || { echo "the node exited; see $2" >&2; exit 1; }
		sleep 0.05
	done
	ready=$(date +%s.%N)
	ready_s=$(awk -v a="$started" -v b="$ready" 'BEGIN { printf "%.2f", b - a }')
}

start_node "$dir/history" "$out/history.log"
# shellcheck disable=SC2086 # the scenario is two words on purpose
"$spate" load $scenario --target "http://127.0.0.1:$port" --connections 32 --duration-s "$load_s" \
	--max-error-share 1 --out "$out/history" >"$out/history-load.txt" 2>&1
grep -m1 achieved "$out/history-load.txt" || true
stop_node
du -sh "$dir/history/partitions"/*/snapshots | sed 's/^/snapshot: /'

time_starts() { # ROUND NAME BIN: a start with the snapshots on Kafka, then one without them
	start_node "$dir/with-$1$2" "$out/with-$1$2.log" "$3"
	with=$ready_s
	stop_node
	scripts/kafka.sh topics "$dir" --delete --topic "$topic-snapshots" >/dev/null
	sleep 2
	start_node "$dir/without-$1$2" "$out/without-$1$2.log" "$3"
	without=$ready_s
	# Its clean stop puts a snapshot on Kafka again for the next start.
	stop_node
	echo "round $1${2:+ ($2)}: serving after ${with} s with the snapshots on Kafka, ${without} s replaying the whole journal"
}

for round in $(seq 1 "$rounds"); do
	if [[ -n ${AB:-} ]]; then
		time_starts "$round" A "$spate"
		time_starts "$round" B "$AB"
	else
		time_starts "$round" "" "$spate"
	fi
done
