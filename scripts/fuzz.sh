#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for SECONDS each (CI: a few seconds; a long run: minutes or hours),
# with cargo-fuzz on the nightly toolchain (installs cargo-fuzz if missing). Each target's corpus
# grows in fuzz/corpus/<target> (not committed); a crash stops the run with the input that caused
# it in fuzz/artifacts/<target>, which becomes a regression test.
# Usage: scripts/fuzz.sh [SECONDS [TARGET...]]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --quiet
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz)
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in "${targets[@]}"; do
    echo "fuzzing $target for ${seconds}s"
    # A build error or a finding (libFuzzer stops at the first crash) exits non-zero.
    # A target's own libFuzzer options, one per line (a dictionary, say), are in fuzz/args/<target>.
    extra=()
    if [ -f "fuzz/args/$target" ]; then
        mapfile -t extra < <(grep -v '^#' "fuzz/args/$target")
    fi
    if ! cargo +nightly fuzz run --fuzz-dir fuzz "$target" -- -max_total_time="$seconds" "${extra[@]}" >"$log" 2>&1; then
        grep -E "ERROR|panicked|SUMMARY|Test unit written" "$log" || tail -30 "$log"
        echo "fuzz target $target failed; inputs: $(ls fuzz/artifacts/"$target" 2>/dev/null)" >&2
        exit 1
    fi
    grep -E "Done [0-9]+ runs" "$log"
done
