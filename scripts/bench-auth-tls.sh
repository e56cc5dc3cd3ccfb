#!/usr/bin/env bash
# What `--auth` and TLS cost a small request: one binary serves tally three ways, back to back in each
# round (plain HTTP; HTTP with `--auth`; HTTPS with `--auth`), under wrk (Debian package, installed if
# missing) reading GET /tally/accounts/a (one entry, written first) with a key that may read and write
# tally; a run with any answer other than 200 stops the script. Prints requests/s and the
# server's CPU per request (from /proc/<pid>/stat) for each run. New connections are made only at the
# start of a run (keep-alive), so the TLS figure is the cost of encrypting the requests, not of
# handshakes.
# Usage: scripts/bench-auth-tls.sh BINARY [ROUNDS=3] [SECONDS=10] [CONNECTIONS=16]
set -euo pipefail
binary=$1
rounds=${2:-3}
seconds=${3:-10}
connections=${4:-16}
if ! command -v wrk >/dev/null; then
	sudo=""
	[ "$(id -u)" -ne 0 ] && sudo=sudo
	$sudo apt-get update -qq && $sudo apt-get install -y -qq wrk >/dev/null
fi
ticks_per_s=$(getconf CLK_TCK)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
key=$("$binary" auth new-key --name bench --role tally:read --role tally:write --file "$work/keys.toml" 2>/dev/null)
openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -days 1 \
	-keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

run() {
	local label=$1 scheme=$2
	shift 2
	local data=$work/data-$RANDOM
	coproc server { exec "$binary" serve --apps tally --partitions 1 --listen 127.0.0.1:0 \
		--fraud-stream-listen off --data-dir "$data" "$@" 2>"$work/log"; }
	local base="" line
	while read -r line <&"${server[0]}"; do
		case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
	done
	[ -n "$base" ] || { echo "the server did not start: $(cat "$work/log")" >&2; exit 1; }
	[[ $base == "$scheme"://* ]] || { echo "expected $scheme, got $base" >&2; exit 1; }
	curl -sfk -o /dev/null -H "Authorization: Bearer $key" -H "Content-Type: application/json" \
		-d '{"amount": 1, "tag": 1}' "$base/tally/accounts/a/entries"
	local before after report requests
	before=$(awk '{print $14 + $15}' "/proc/$server_PID/stat")
	report=$(wrk -t2 -c"$connections" -d"${seconds}s" -H "Authorization: Bearer $key" \
		"$base/tally/accounts/a")
	after=$(awk '{print $14 + $15}' "/proc/$server_PID/stat")
	if grep -q "Non-2xx" <<<"$report"; then
		echo "$label: answers other than 200: $report" >&2
		exit 1
	fi
	requests=$(awk '/requests in/ {print $1}' <<<"$report")
	kill "$server_PID"
	wait "$server_PID" 2>/dev/null || true
	awk -v label="$label" -v requests="$requests" -v ticks=$((after - before)) -v hz="$ticks_per_s" \
		-v seconds="$seconds" 'BEGIN {
			printf "%-16s %10.0f requests/s  server CPU %5.1f s  %6.1f us per request\n",
				label, requests / seconds, ticks / hz, ticks / hz / requests * 1e6 }'
}

echo "GET /tally/accounts/a, $connections connections, $seconds s, $rounds rounds"
for _ in $(seq "$rounds"); do
	run "http" http
	run "http, --auth" http --auth "$work/keys.toml"
	run "https, --auth" https --auth "$work/keys.toml" --tls-cert "$work/cert.pem" --tls-key "$work/key.pem"
done
