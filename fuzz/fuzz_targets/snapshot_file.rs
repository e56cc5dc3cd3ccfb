//! A partition snapshot file as start-up reads it: the header, the sections and their checksums, the
//! bookkeeping, each app's section, the idempotency table and the archive. Any bytes are a partition
//! or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = spate_fuzz::scratch_dir().join("snapshot_file.snap");
    std::fs::write(&path, data).unwrap();
    let _ = spate_engine::untrusted::read_partition_snapshot(spate_fuzz::app_specs(), &path);
});
