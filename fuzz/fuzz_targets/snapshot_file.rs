//! A partition snapshot file as start-up reads it: the header, the sections and their checksums, the
//! bookkeeping, an app's section, the idempotency table and the archive. Any bytes are a partition or
//! an error, never a panic.
//!
//! The partition has one app, tally: making the empty state of all six for every input took most of
//! the time (about 130 inputs/s; 3,300 with tally only and the file on tmpfs), and every app's section
//! is fuzzed through the same interface by `snapshot_restore`. A section of another app is refused
//! here as an unknown one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate_engine::AppSpec;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    static TALLY: OnceLock<Vec<AppSpec>> = OnceLock::new();
    let specs = TALLY.get_or_init(|| vec![spate_tally::module().spec]);
    let path = spate_fuzz::scratch_dir().join("snapshot_file.snap");
    std::fs::write(&path, data).unwrap();
    let _ = spate_engine::untrusted::read_partition_snapshot(specs, &path);
});
