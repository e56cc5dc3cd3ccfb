#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for SECONDS each (CI: a few seconds; a long run: minutes or hours),
# with cargo-fuzz on the nightly toolchain (installs cargo-fuzz if missing). Each target's corpus
# grows in fuzz/corpus/<target> (not committed); a crash stops the run with the input that caused
# it in fuzz/artifacts/<target>, which becomes a regression test.
# Targets are built as cargo-fuzz builds them by default (optimized, with AddressSanitizer) for the long
# runs. SPATE_FUZZ_BUILD=smoke builds them unoptimized without a sanitizer instead: 2.3x faster to build
# from nothing (172 s against 392 s on the project's VM), for CI's runs of a few seconds, where building
# is most of the time. Both check overflows and debug assertions.
# Usage: [SPATE_FUZZ_BUILD=smoke] scripts/fuzz.sh [SECONDS [TARGET...]]
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
build_flags=()
case "${SPATE_FUZZ_BUILD:-long}" in
    long) ;;
    smoke) build_flags=(--dev --sanitizer none) ;;
    *) echo "SPATE_FUZZ_BUILD must be long or smoke, not ${SPATE_FUZZ_BUILD}" >&2; exit 2 ;;
esac
# One build first (of every target, unless only one is asked for): cargo then builds and links the
# targets side by side, where each `fuzz run` alone would build one after the other.
only=()
if [ ${#targets[@]} -eq 1 ]; then
    only=("${targets[0]}")
fi
cargo +nightly fuzz build --fuzz-dir fuzz "${build_flags[@]}" "${only[@]}"
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
    if ! cargo +nightly fuzz run --fuzz-dir fuzz "${build_flags[@]}" "$target" -- -max_total_time="$seconds" "${extra[@]}" >"$log" 2>&1; then
        grep -E "ERROR|panicked|SUMMARY|Test unit written" "$log" || tail -30 "$log"
        echo "fuzz target $target failed; inputs: $(ls fuzz/artifacts/"$target" 2>/dev/null)" >&2
        exit 1
    fi
    grep -E "Done [0-9]+ runs" "$log"
done
