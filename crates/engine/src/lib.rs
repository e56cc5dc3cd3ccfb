//! spate's engine: keyed commands routed to single-writer partitions, applied to in-memory state,
//! made durable in a journal by group commit before they are acknowledged, snapshotted, and rebuilt after a
//! crash. It knows no app and no network protocol; see ARCHITECTURE.md for the whole picture.

mod app;
mod archive;
pub mod cluster;
mod core;
mod direct_io;
mod disk;
mod engine;
mod idempotency;
pub mod journal;
mod meta;
mod metrics;
mod partition;
mod projection;
pub mod record;
mod recovery;
mod release;
mod scrub;
pub mod segmented;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod sim_follow_ups;
pub mod snapshot;
mod stepped_snapshot;
pub mod store;
mod thread_time;
pub mod untrusted;
pub mod wire;

pub use app::{AppSpec, Command, Effects, NewState, Projection, RestoreState, StateMachine};
pub use archive::{ArchiveError, ArchiveReader};
pub use disk::DiskStatus;
pub use engine::{Engine, EngineConfig, EngineHandle, Health, Pending, Refused};
pub use journal::{Durability, FileLogStore, JournalConfig, LogStore, Lsn};
pub use meta::DATA_FORMAT_VERSION;
pub use partition::Linger;
pub use record::{Envelope, Origin};
pub use scrub::StoreDamage;
pub use segmented::{EntryCodec, SegmentedMap};

use thiserror::Error;

/// Identifies an app in journal records. Below 64.
pub type AppId = u8;
/// Index of a partition, `0..partition_count`.
pub type PartitionId = u16;
/// A client's idempotency key for a command (apps hash their natural keys into it).
pub type CommandId = u128;

/// What a submitted command got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Applied now; the app's reply bytes.
    Applied(Vec<u8>),
    /// The command id was seen before with the same payload; the original reply.
    Duplicate(Vec<u8>),
    /// The command id was seen before with the same payload and that command is not durable yet.
    InFlight,
    /// The command id was seen before with a different payload.
    Conflict,
}

/// Why the engine could not answer. Operating conditions, not bugs: callers map them to responses.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum EngineError {
    #[error("the partition queue is full; retry later")]
    Overloaded,
    #[error(
        "the journal failed (a write or fsync error, or another node took the partition over); this partition refuses requests until restarted"
    )]
    JournalFailed,
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("app {0} is not enabled")]
    UnknownApp(AppId),
    #[error(
        "partition {0} is not served by this node and no other node could take the request (it is moving between nodes); retry shortly"
    )]
    NotOwner(PartitionId),
    #[error(
        "the data directory's file system has {} MiB free, less than the {} MiB reserve (--disk-reserve-mb): writes are refused until space is freed; reads go on",
        free_bytes >> 20,
        reserve_bytes >> 20
    )]
    DiskFull { free_bytes: u64, reserve_bytes: u64 },
}

#[derive(Debug, Error)]
pub enum StartError {
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error("{0}")]
    Config(String),
    #[error("cannot recover: {0}")]
    Unrecoverable(String),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
}

/// The partition that owns `key`. Stable across versions and restarts: data placement depends on it.
pub fn partition_of(key: &[u8], partition_count: u16) -> PartitionId {
    debug_assert!(partition_count > 0);
    (xxhash_rust::xxh3::xxh3_64(key) % u64::from(partition_count)) as PartitionId
}

/// A partition's directory under a data directory: its snapshots, and its journal when embedded.
pub(crate) fn partition_dir(
    data_dir: &std::path::Path,
    partition: PartitionId,
) -> std::path::PathBuf {
    data_dir.join("partitions").join(format!("p{partition:03}"))
}

/// Where a partition's snapshots are written and looked for.
pub(crate) fn snapshot_dir(
    data_dir: &std::path::Path,
    partition: PartitionId,
) -> std::path::PathBuf {
    partition_dir(data_dir, partition).join("snapshots")
}

pub(crate) fn app_bit(app: AppId) -> u64 {
    debug_assert!(app < 64);
    1u64 << app
}
