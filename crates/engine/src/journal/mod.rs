//! The journal: an append-only, partitioned log of framed records (see [`crate::record`]).
//!
//! The engine talks to it only through [`Log`] (one partition's log, owned by its writer thread) and
//! [`LogStore`] (where the logs live), so that the embedded [`FileJournal`] and a replicated log (the
//! `spate-kafka` crate: a topic partition per engine partition) are interchangeable without any app
//! noticing.

mod file;

pub(crate) use file::sync_dir;
pub use file::{FileJournal, FileLogStore, JournalConfig, RecoveryReport};

use crate::PartitionId;

use std::path::{Path, PathBuf};
use thiserror::Error;

/// Log sequence number: the position of a record in its partition's log, counted from 0 and never reused.
pub type Lsn = u64;

/// How hard `append` works before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `fdatasync` after every group commit: an acknowledged record survives power loss.
    #[default]
    Fsync,
    /// Write to the OS page cache only: survives a process crash, not a machine crash.
    None,
}

#[derive(Debug, Error)]
pub enum JournalError {
    /// An I/O error on one of the engine's files: a journal segment, a snapshot, the meta file. The
    /// path says which.
    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "corrupt journal record in {path} at byte {offset}: {reason}; refusing to start (records after it would be lost)"
    )]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A record a newer binary wrote (on a shared log), in a format this binary does not read.
    #[error(
        "the journal record in {path} at offset {offset} is of data format version {found}; this binary reads versions 1 to {readable}: run a binary at least as new as the one that wrote it"
    )]
    NewerFormat {
        path: PathBuf,
        offset: u64,
        found: u32,
        readable: u32,
    },
    #[error("journal is missing records: {0}")]
    Gap(String),
    #[error(
        "journal refuses writes after an earlier write or fsync failure; restart to recover from disk"
    )]
    Failed,
    /// A replicated log's error (its client's words, with what was being done).
    #[error("replicated log: {0}")]
    Replicated(String),
    /// Another writer took the shared log over: this one may never append to it again, and must not
    /// take it back by opening it anew.
    #[error("replicated log: another writer took it over: {0}")]
    Fenced(String),
}

/// Called by replay with each record's LSN, frame kind and body.
pub type Visit<'a> = dyn FnMut(Lsn, u8, &[u8]) -> Result<(), JournalError> + 'a;

/// A partition's durable, ordered log.
pub trait Log: Send + 'static {
    /// The LSN the next appended record gets.
    fn next_lsn(&self) -> Lsn;
    /// The LSN of the oldest record still held.
    fn first_lsn(&self) -> Lsn;
    /// Appends `record_count` whole frames, durable per the configured [`Durability`] when this returns.
    /// After an error the log is failed: every later append returns [`JournalError::Failed`], because the
    /// state of the bytes on disk is unknown (an fsync error may have dropped dirty pages).
    fn append(&mut self, frames: &[u8], record_count: u64) -> Result<(), JournalError>;
    /// Calls `visit` with every record at or after `from`, in order.
    fn replay(&self, from: Lsn, visit: &mut Visit<'_>) -> Result<(), JournalError>;
    /// Frees storage of records below `lsn` (whole segments only); they will no longer be replayed.
    fn release_before(&mut self, lsn: Lsn) -> Result<(), JournalError>;
    /// Makes everything appended so far durable, whatever the [`Durability`] (used at shutdown).
    fn sync(&mut self) -> Result<(), JournalError>;
    /// Whether the partition's next batch may wait in the writer's one-slot queue while the batch
    /// before it is appended. Yes (the default) where an append is short, an fsync: the queued batch
    /// keeps the writer busy. A log whose appends take milliseconds (a Kafka transaction) says no: a
    /// queued batch would add a whole append to the wait of every request in it, where a batch handed
    /// over only once the writer is idle takes everything that came meanwhile.
    fn queues_batches(&self) -> bool {
        true
    }
    /// A snapshot of the partition at `lsn` is durable at `path`. A replicated log keeps a copy where a
    /// node that never had this disk finds it (see [`LogStore::open`]); it must not block the caller, and a
    /// copy it loses costs only time (the log itself holds everything). The embedded journal's snapshots
    /// are on its own disk already: nothing to do.
    fn snapshot_written(&mut self, _lsn: Lsn, _path: &Path) {}
}

/// Where the partitions' logs live: the embedded journal ([`FileLogStore`]) or a replicated one.
pub trait LogStore: Send + Sync + 'static {
    /// Opens `partition`'s log for appending after its last durable record. A replicated store also takes
    /// ownership here: any earlier writer of the partition can no longer append once this returns; and it
    /// first copies the newest snapshot it keeps of the partition into `snapshot_dir`, unless that holds
    /// one at least as new, so that recovery starts from it even on a node that never had the partition.
    fn open(
        &self,
        partition: PartitionId,
        snapshot_dir: &Path,
    ) -> Result<Box<dyn Log>, JournalError>;
    /// Calls `visit` with the durable records `from..until` of `partition` while its writer may be
    /// appending: for a projection reading records its feed dropped. The records must still be held (the
    /// projection's checkpoint floor keeps them).
    fn read_range(
        &self,
        partition: PartitionId,
        from: Lsn,
        until: Lsn,
        visit: &mut Visit<'_>,
    ) -> Result<(), JournalError>;
}
