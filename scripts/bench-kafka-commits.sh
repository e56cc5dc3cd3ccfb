#!/usr/bin/env bash
# Group commits on a Kafka journal: tally adds on a one-partition server whose journal is a Kafka
# topic, closed loop at 1, 64 and 256 connections for SECONDS each, printing the rate, p50 and p99 and
# how many records each group commit held (`spate_journal_batch_records` from /metrics). With two
# binaries, A then B, ROUNDS times (default 2), each on a fresh topic: an A/B of how a batch reaches
# Kafka's writer. Starts its own 3-broker cluster (scripts/kafka.sh) and stops it at the end.
#
#   scripts/bench-kafka-commits.sh BINARY_A [BINARY_B] [SECONDS=8]
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1
b=${2:-}
seconds=${3:-8}
port=18300
dir=$(mktemp -d)
trap 'scripts/kafka.sh stop "$dir/kafka" >/dev/null 2>&1; rm -rf "$dir"' EXIT
bootstrap=$(scripts/kafka.sh start "$dir/kafka" 29092 | tail -n 1)
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; date: $(date -u +%Y-%m-%dT%H:%M:%SZ); Kafka at $bootstrap"

metric_sum() { # METRICS_TEXT NAME: the value of NAME's single series
	echo "$1" | awk -v name="$2" '$1 ~ "^"name"\\{" { print $2 }'
}

run() { # BINARY LABEL
	local data="$dir/data-$RANDOM"
	"$1" serve --apps tally --partitions 1 --kafka "$bootstrap" --kafka-topic "commits-$RANDOM$RANDOM" \
		--data-dir "$data" --listen "127.0.0.1:$port" >"$data.log" 2>&1 &
	local pid=$!
	local tries=0
	until curl -sf "127.0.0.1:$port/health" >/dev/null; do
		tries=$((tries + 1))
		if [ "$tries" -gt 600 ]; then
			echo "$2: the server did not serve within 60 s" >&2
			cat "$data.log" >&2
			exit 1
		fi
		sleep 0.1
	done
	local records_before=0 commits_before=0
	for connections in 1 64 256; do
		local report metrics records commits
		report=$("$1" load tally adds --target "http://127.0.0.1:$port" --connections "$connections" \
			--duration-s "$seconds" 2>/dev/null)
		metrics=$(curl -s "127.0.0.1:$port/metrics")
		records=$(metric_sum "$metrics" spate_journal_batch_records_sum)
		commits=$(metric_sum "$metrics" spate_journal_batch_records_count)
		echo "$2 $connections connections: $(echo "$report" | grep -oE 'achieved +[0-9]+/s' | tr -s ' ')," \
			"$(echo "$report" | grep -oE 'p(50|99) [0-9.]+ ms' | paste -sd ' ')," \
			"$(awk -v r="$records" -v rb="$records_before" -v c="$commits" -v cb="$commits_before" \
				'BEGIN { printf "%.1f records per commit", (r - rb) / (c - cb) }')"
		records_before=$records
		commits_before=$commits
	done
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}

for round in $(seq "${ROUNDS:-2}"); do
	run "$a" "A $("$a" --version | cut -d' ' -f3-)"
	if [ -n "$b" ]; then
		run "$b" "B $("$b" --version | cut -d' ' -f3-)"
	fi
done
