#!/usr/bin/env bash
# Builds the Debian package with cargo-deb (installed from crates.io, pinned, if missing) and prints
# its path. What goes in it is `[package.metadata.deb]` in crates/spate/Cargo.toml and deploy/debian/.
# Usage: scripts/package-deb.sh [--dev] [OUTPUT_DIR=target/debian]
#   --dev packages the binary `cargo build` (or `cargo test`) already made, stripped, instead of
#   building a release: tests/package.rs uses it so that CI needs no release build. cargo-deb warns
#   that it is meant for release profiles; such a package is for tests only.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo_deb_version=3.8.0
profile=()
if [ "${1:-}" = --dev ]; then
    profile=(--no-build --profile dev)
    shift
fi
output=${1:-target/debian}
if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $cargo_deb_version" ]; then
    cargo install cargo-deb --locked --version "$cargo_deb_version" --quiet >&2
fi
cargo deb -p spate "${profile[@]}" --output "$output" 2> >(grep -v "dev profile is not supported\|To enable debug symbols" >&2)
