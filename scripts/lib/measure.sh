# Shared by the measurement scripts that start a server of their own (`bench-*-history.sh`,
# `bench-fraud-full-scale.sh`): a scratch directory removed on exit with the server in `$pid` killed,
# and the timers and sizes they report. Source it; it sets `dir` and `pid`.

dir=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ]; then
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT

now() { date +%s.%N; }
# Seconds since a time `now` printed, to a tenth.
seconds_since() { printf '%.1f' "$(echo "$(now) - $1" | bc)"; }
# The server's resident memory.
rss_mib() { echo $(($(awk '/VmRSS/ {print $2}' "/proc/$pid/status") / 1024)); }
# A file's or directory's size on disk; 0 if it does not exist.
mib() { if [ -e "$1" ]; then du -sm "$1" | cut -f1; else echo 0; fi; }
# Waits until the server in `$pid` answers /health on port $1; if it stops first, prints the end of
# its log, $2, and fails.
wait_until_serving() {
    until curl -sf "127.0.0.1:$1/health" >/dev/null; do
        kill -0 "$pid" 2>/dev/null || { echo "the server stopped before it served:"; tail -5 "$2"; exit 1; }
        sleep 0.05
    done
}
# What each partition restored and replayed, and the start-up phases, from a server's log at info.
recovery_phases() {
    sed -n 's/.*partition recovered \(.*\)/  \1/p; s/.*engine recovered \(.*\)/  \1/p' "$1"
}
