//! What every fjall store on disk shares (the archive, and the stores apps keep their read models in).

use std::io;

/// Opens a fjall database with `open`, turning a panic in its recovery into an error: fjall asserts
/// on some damaged journal entries (in debug builds), and a damaged store must be refused with a
/// message naming it, not crash the server.
pub fn open(
    open: impl FnOnce() -> fjall::Result<fjall::Database>,
) -> fjall::Result<fjall::Database> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(open)).unwrap_or_else(|panic| {
        let message = (panic.downcast_ref::<String>().map(String::as_str))
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Err(fjall::Error::from(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("recovering it panicked, so it is damaged: {message}"),
        )))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panic_while_opening_is_an_error() {
        let opened = super::open(|| panic!("journal entry length mismatch"));
        let error = opened.err().expect("an error").to_string();
        assert!(error.contains("journal entry length mismatch"), "{error}");
    }

    #[test]
    fn a_flipped_byte_anywhere_in_the_journal_never_panics() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = fjall::Database::builder(dir.path()).open().unwrap();
            let keyspace = db.keyspace("rides", Default::default).unwrap();
            for n in 0u32..3 {
                keyspace.insert(n.to_be_bytes(), [n as u8; 24]).unwrap();
            }
            db.persist(fjall::PersistMode::SyncAll).unwrap();
        }
        let journal = dir.path().join("0.jnl");
        let bytes = std::fs::read(&journal).unwrap();
        let used = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
        let mut refused = 0;
        // Every third byte: each open starts fjall's threads, and debug builds take 0.1 s for one.
        for at in (0..used).step_by(3) {
            let copy = tempfile::tempdir().unwrap();
            for entry in std::fs::read_dir(dir.path()).unwrap() {
                copy_tree(&entry.unwrap().path(), copy.path());
            }
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x20;
            std::fs::write(copy.path().join("0.jnl"), &damaged).unwrap();
            // Ok (fjall's recovery stopped early, which spate's own checks catch) or Err; never a
            // panic (fjall's debug builds assert on some of these bytes).
            let opened = super::open(|| fjall::Database::builder(copy.path()).open());
            refused += usize::from(opened.is_err());
        }
        assert!(refused > 0, "no flipped byte of {used} was refused");
    }

    fn copy_tree(from: &std::path::Path, into: &std::path::Path) {
        let to = into.join(from.file_name().unwrap());
        if from.is_dir() {
            std::fs::create_dir(&to).unwrap();
            for entry in std::fs::read_dir(from).unwrap() {
                copy_tree(&entry.unwrap().path(), &to);
            }
        } else {
            std::fs::copy(from, &to).unwrap();
        }
    }

    #[test]
    fn a_store_that_opens_is_handed_back() {
        let dir = tempfile::tempdir().unwrap();
        let db = super::open(|| fjall::Database::builder(dir.path()).open()).unwrap();
        assert_eq!(db.keyspace_count(), 0);
    }
}
