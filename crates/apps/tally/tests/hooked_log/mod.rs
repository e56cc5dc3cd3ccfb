//! A journal on files that calls hooks before each group commit is appended and before each read of a
//! range of records, for tests that hold a commit back or fail it, or fail a read.

use spate_engine::journal::{JournalError, Log, Visit};
use spate_engine::{FileLogStore, LogStore, Lsn, PartitionId};
use std::path::Path;
use std::sync::Arc;

pub trait LogHooks: Send + Sync + 'static {
    /// Runs before each append, on the journal's writer thread; an error fails the append instead.
    fn before_append(&self) -> Result<(), JournalError> {
        Ok(())
    }

    /// Runs before each read of a range of records (`LogStore::read_range`, which read models use);
    /// an error fails the read instead.
    fn before_read_range(&self) -> Result<(), JournalError> {
        Ok(())
    }

    /// Whether the log lets batches queue behind an append ([`Log::queues_batches`]): the files' answer
    /// unless this says no, as a log with slow appends would.
    fn queues_batches(&self) -> bool {
        true
    }
}

pub struct HookedLogs<H> {
    files: FileLogStore,
    hook: Arc<H>,
}

impl<H: LogHooks> HookedLogs<H> {
    pub fn new(files: FileLogStore, hook: Arc<H>) -> Self {
        Self { files, hook }
    }
}

impl<H: LogHooks> LogStore for HookedLogs<H> {
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
        self.hook.before_read_range()?;
        self.files.read_range(partition, from, until, visit)
    }
}

struct HookedLog<H> {
    log: Box<dyn Log>,
    hook: Arc<H>,
}

impl<H: LogHooks> Log for HookedLog<H> {
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

    fn queues_batches(&self) -> bool {
        self.hook.queues_batches() && self.log.queues_batches()
    }
}
