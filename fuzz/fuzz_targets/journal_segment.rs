//! A journal segment file holding any bytes: opening it recovers (cutting a torn tail) or refuses
//! with an error, and whatever it recovered replays in LSN order, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate_engine::journal::{FileJournal, JournalConfig, Log};
use std::path::Path;
use std::sync::OnceLock;

/// One directory for every run, in memory where the machine has /dev/shm: opening a journal syncs
/// its files, which on a disk would make each run take milliseconds.
fn dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory")
    })
    .path()
}

fuzz_target!(|data: &[u8]| {
    let dir = dir();
    for entry in std::fs::read_dir(dir).expect("listed").flatten() {
        std::fs::remove_file(entry.path()).expect("removed");
    }
    std::fs::write(dir.join("00000000000000000000.seg"), data).expect("written");
    let config = JournalConfig {
        segment_bytes: 1 << 16,
        ..JournalConfig::default()
    };
    let Ok((journal, _report)) = FileJournal::open(dir, config) else {
        return;
    };
    let mut expected = 0;
    let replayed = journal.replay(0, &mut |lsn, _kind, _body| {
        assert_eq!(lsn, expected, "replay out of order");
        expected += 1;
        Ok(())
    });
    if replayed.is_ok() {
        assert_eq!(
            expected,
            journal.next_lsn(),
            "replay ended before the journal's end"
        );
    }
});
