#!/usr/bin/env bash
# Where reads of old ledger transfers wait: fills the archive with 3 M transfers (`spate load ledger
# batch`, 4 x 8,000), then for SECONDS reads old ones at 1,000/s in open loop beside a batch load held to
# 20,000 transfers/s (batches of 100), with `perf record -e sched:sched_switch -g` on the server. Prints
# the reads' p99 per second, then, per second, how often and how long the threads reading the store
# slept inside lsm-tree's `get_internal_entry` (waiting on its version lock), and what fjall's worker
# threads waited on meanwhile. Needs perf and python3; run as a user allowed to trace the server.
# Usage: scripts/trace-read-stalls.sh BINARY [SECONDS]
set -euo pipefail
binary=$1
seconds=${2:-30}
source "$(dirname "$0")/lib/measure.sh"

coproc server { exec "$binary" serve --apps ledger --partitions 2 --listen 127.0.0.1:0 \
    --fraud-stream-listen off --data-dir "$dir/data" 2>"$dir/log"; }
pid=$server_PID
base=""
while read -r line <&"${server[0]}"; do
    case $line in "spate listening on "*) base=${line#spate listening on }; break ;; esac
done
[ -n "$base" ] || { echo "the server did not start: $(cat "$dir/log")" >&2; exit 1; }

"$binary" load ledger batch --target "$base" --connections 4 --batch 8000 --requests 750 \
    --participants 16 --seed 1 --warmup-s 0 >"$dir/fill" 2>&1
perf record -q -e sched:sched_switch -g -p "$pid" -o "$dir/perf.data" -- sleep "$((seconds + 1))" \
    2>"$dir/perf.log" &
perf_pid=$!
sleep 0.3
"$binary" load ledger batch --target "$base" --connections 4 --batch 100 --rate 400 \
    --participants 16 --seed 7 --duration-s "$seconds" --warmup-s 0 >"$dir/writes" 2>&1 &
writes_pid=$!
# 750 requests of 8,000 operations by 4 writers: each wrote 375,000 transfers.
"$binary" load ledger reads --target "$base" --rate 1000 --connections 32 --participants 16 \
    --seed 1 --written-by 4 --users 375000 --duration-s "$seconds" --warmup-s 0 --out "$dir" \
    2>&1 | grep latency
wait "$writes_pid" "$perf_pid"

perf script -i "$dir/perf.data" -F tid,time,trace,ip,sym 2>/dev/null >"$dir/switches"
python3 - "$dir/ledger-reads.json" "$dir/switches" <<'EOF'
import collections, json, re, sys

reads = json.load(open(sys.argv[1]))
print("reads' p99 per second (ms):",
      " ".join(f"{s['second']}:{s['p99_us'] / 1000:.0f}" for s in reads["per_second"]))

switch = re.compile(r"\s*\d+\s+([\d.]+):\s+prev_comm=(.*?) prev_pid=(\d+) .*prev_state=(\S+) ==> "
                    r"next_comm=.*? next_pid=(\d+)")
events, current = [], None
for line in open(sys.argv[2]):
    match = switch.match(line)
    if match:
        time, comm, prev, state, following = match.groups()
        current = dict(time=float(time), comm=comm, prev=int(prev), state=state,
                       next=int(following), stack=[])
        events.append(current)
    elif current is not None and line.strip():
        frame = line.split(None, 1)
        if len(frame) == 2:
            current["stack"].append(frame[1].split("+")[0].strip())
start = events[0]["time"]
off_cpu, lock_waits, worker_waits = {}, collections.defaultdict(list), collections.Counter()
for event in events:
    off_cpu[event["prev"]] = event
    left = off_cpu.pop(event["next"], None)
    if left is None:
        continue
    waited = event["time"] - left["time"]
    if any("get_internal_entry" in frame for frame in left["stack"]):
        lock_waits[int(left["time"] - start)].append(waited)
    if left["comm"].startswith("fjall") and left["state"].startswith("D") and waited > 0.005:
        kernel = [f for f in left["stack"] if not f.startswith(("__", "schedule", "io_schedule"))]
        worker_waits[" <- ".join(kernel[:4])] += 1
print("reads waiting in lsm-tree's get, per second of the trace: count over 5 ms / longest (ms)")
for second in sorted(lock_waits):
    waits = lock_waits[second]
    print(f"  {second}: {sum(w > 0.005 for w in waits)} / {max(waits) * 1000:.0f}")
print("fjall's workers waiting over 5 ms on the disk, by where:")
for where, count in worker_waits.most_common(5):
    print(f"  {count} {where}")
EOF
