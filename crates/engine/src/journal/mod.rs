//! The journal: an append-only, partitioned log of framed records (see [`crate::record`]).
//!
//! The engine talks to it only through [`Log`], so that the embedded [`FileJournal`] can later be swapped
//! for a replicated log (Kafka: one topic partition per engine partition, offsets as [`Lsn`]s) without any
//! app noticing.

mod file;

pub use file::{FileJournal, JournalConfig, RecoveryReport};
pub(crate) use file::{read_range, sync_dir};

use std::path::PathBuf;
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
    #[error("journal I/O on {path}: {source}")]
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
    #[error("journal is missing records: {0}")]
    Gap(String),
    #[error(
        "journal refuses writes after an earlier write or fsync failure; restart to recover from disk"
    )]
    Failed,
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
}
