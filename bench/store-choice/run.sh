#!/usr/bin/env bash
# Builds store-choice with RocksDB (whose build needs libclang: installed from Debian's packages if
# missing) and measures the three candidate stores, one process each, so that each peak RSS is its own.
# Usage: bench/store-choice/run.sh [store-choice options, e.g. --keys 5000000]
set -euo pipefail
cd "$(dirname "$0")"
if ! ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 && ! ls /usr/lib/llvm-*/lib/libclang-*.so >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq libclang-dev >/dev/null
fi
cargo build --release -q --features rocksdb
for store in rocksdb fjall redb; do
    target/release/store-choice --stores "$store" "$@"
done
