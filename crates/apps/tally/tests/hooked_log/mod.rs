//! A journal on files that calls a hook before each group commit is appended, for tests that hold a
//! commit back or fail it.

use spate_engine::journal::{JournalError, Log, Visit};
use spate_engine::{FileLogStore, LogStore, Lsn, PartitionId};
use std::path::Path;
use std::sync::Arc;

pub trait BeforeAppend: Send + Sync + 'static {
    /// Runs before each append, on the journal's writer thread; an error fails the append instead.
    fn before_append(&self) -> Result<(), JournalError>;
}

pub struct HookedLogs<H> {
    files: FileLogStore,
    hook: Arc<H>,
}

impl<H: BeforeAppend> HookedLogs<H> {
    pub fn new(files: FileLogStore, hook: Arc<H>) -> Self {
        Self { files, hook }
    }
}

impl<H: BeforeAppend> LogStore for HookedLogs<H> {
    fn open(
        &self,
        partition: PartitionId,
        snapshot_dir: &Path,
    ) -> Result<Box<dyn Log>, JournalError> {
        let log = self.files.open(partition, snapshot_dir)?;
        Ok(Box::new(HookedLog {
            log,
            hook: self.hook.clone(),
        }))
    }

    fn read_range(
        &self,
        partition: PartitionId,
        from: Lsn,
        until: Lsn,
        visit: &mut Visit<'_>,
    ) -> Result<(), JournalError> {
        self.files.read_range(partition, from, until, visit)
    }
}

struct HookedLog<H> {
    log: Box<dyn Log>,
    hook: Arc<H>,
}

impl<H: BeforeAppend> Log for HookedLog<H> {
    fn next_lsn(&self) -> Lsn {
        self.log.next_lsn()
    }

    fn first_lsn(&self) -> Lsn {
        self.log.first_lsn()
    }

    fn append(&mut self, frames: &[u8], record_count: u64) -> Result<(), JournalError> {
        self.hook.before_append()?;
        self.log.append(frames, record_count)
    }

    fn replay(&self, from: Lsn, visit: &mut Visit<'_>) -> Result<(), JournalError> {
        self.log.replay(from, visit)
    }

    fn release_before(&mut self, lsn: Lsn) -> Result<(), JournalError> {
        self.log.release_before(lsn)
    }

    fn sync(&mut self) -> Result<(), JournalError> {
        self.log.sync()
    }
}
