//! spate's journal on Apache Kafka.
//!
//! Each engine partition's log is one partition of a journal topic (replication factor 3,
//! `min.insync.replicas=2`). A group commit is one Kafka transaction of as few records as the size limit
//! allows (usually one), written with `acks=all` by a transactional producer that belongs to the engine
//! partition (`transactional.id` = `spate.<topic>.p<partition>`): when a new owner opens the partition's
//! log, `init_transactions` aborts whatever the old owner left open and fences it, so a paused or cut-off
//! old owner can never again get a record into the log, and every append it tries fails (its commands are
//! then answered with an error, never acknowledged). Readers use `read_committed`, so they see only whole
//! group commits.
//!
//! A Kafka record is `key = version u8 | first_lsn u64 | record_count u32` (little-endian) and
//! `value = frames`, the engine's own checksummed frames (`spate_engine::record`). LSNs stay dense
//! whatever offsets Kafka gives (transaction markers take offsets too); offsets are found through a sparse
//! index built when the log is opened and kept as it grows.
//!
//! **Architecture invariant:** the engine never sees Kafka: it appends and replays through
//! `spate_engine::journal::Log` exactly as with its own files.

mod follow;
mod log;
mod membership;
mod snapshots;
mod topic;

pub use log::KafkaLog;
pub use membership::{KafkaMembership, NodeIdentity, watch_sole_owner};

use rdkafka::ClientConfig;
use spate_engine::PartitionId;
use spate_engine::journal::{JournalError, Log, LogStore, Lsn, Visit};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;

/// How spate reaches its Kafka cluster.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// `host:port[,host:port...]`.
    pub bootstrap_servers: String,
    /// The journal topic: one partition per engine partition.
    pub topic: String,
    /// How long start-up waits for the cluster (metadata, topic creation, fencing the old owner).
    pub connect_timeout: Duration,
    /// The longest a group commit may take before it counts as failed; also Kafka's
    /// `transaction.timeout.ms`, after which the cluster aborts a transaction whose producer went silent.
    pub commit_timeout: Duration,
}

impl KafkaConfig {
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            topic: "spate-journal".into(),
            connect_timeout: Duration::from_secs(30),
            commit_timeout: Duration::from_secs(30),
        }
    }

    pub(crate) fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("socket.nagle.disable", "true")
            // Metadata refreshes often enough that a moved partition leader is found within seconds.
            .set("topic.metadata.refresh.interval.ms", "5000");
        config
    }
}

/// The replication the journal topic must have: every record on three brokers, acknowledged by two.
pub const REPLICATION_FACTOR: i32 = 3;
pub const MIN_INSYNC_REPLICAS: i32 = 2;
/// The largest Kafka record the topic accepts; a group commit larger than this is split (at frame
/// boundaries) into several records of one transaction.
pub const MESSAGE_BYTES_MAX: usize = 16 * 1024 * 1024;

#[derive(Debug, Error)]
pub enum SetupError {
    #[error("cannot reach Kafka at {bootstrap} within {timeout_s} s: {reason}")]
    Unreachable {
        bootstrap: String,
        timeout_s: u64,
        reason: String,
    },
    #[error("Kafka topic {topic}: {problem}")]
    Topic { topic: String, problem: String },
    #[error("cluster membership: {0}")]
    Membership(String),
    #[error("Kafka client: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
}

/// Every engine partition's log on one Kafka topic.
pub struct KafkaLogStore {
    config: KafkaConfig,
    /// Per partition, the offsets of some records by LSN, shared by its writer and by readers.
    indexes: Vec<Arc<Mutex<log::OffsetIndex>>>,
    snapshots: Arc<snapshots::Uploader>,
    ends: log::LogEnds,
    takeovers: TakeoversStop,
}

/// Set once the node stops: a takeover still reading its partition's snapshot or log from Kafka gives
/// up at its next poll. Otherwise a read that Kafka holds up (a transaction another producer left
/// open, a partition without a leader) would hold the node's stop, and with it the hand-over of every
/// partition it applies, for as long as the read may stall (a minute).
#[derive(Clone, Default)]
pub(crate) struct TakeoversStop(Arc<AtomicBool>);

impl TakeoversStop {
    pub(crate) fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl KafkaLogStore {
    /// Checks that the cluster answers and that the journal and snapshot topics exist with
    /// `partition_count` partitions and the required replication (creating them if they do not exist).
    pub fn connect(config: KafkaConfig, partition_count: u16) -> Result<Self, SetupError> {
        topic::ensure(&config, partition_count, topic::Keep::Everything)?;
        let snapshots = snapshots::Uploader::start(&config, partition_count)?;
        Ok(Self {
            snapshots,
            ends: log::LogEnds::new(&config)?,
            takeovers: TakeoversStop::default(),
            indexes: (0..partition_count)
                .map(|_| Arc::new(Mutex::new(log::OffsetIndex::default())))
                .collect(),
            config,
        })
    }

    fn index(&self, partition: PartitionId) -> Result<&Arc<Mutex<log::OffsetIndex>>, JournalError> {
        self.indexes.get(usize::from(partition)).ok_or_else(|| {
            JournalError::Replicated(format!(
                "partition {partition} is not one of the topic's {} partitions",
                self.indexes.len()
            ))
        })
    }
}

impl LogStore for KafkaLogStore {
    fn open(
        &self,
        partition: PartitionId,
        snapshot_dir: &Path,
    ) -> Result<Box<dyn Log>, JournalError> {
        let index = self.index(partition)?.clone();
        let snapshots = self.snapshots.clone();
        Ok(Box::new(KafkaLog::open(
            &self.config,
            partition,
            index,
            snapshots,
            &self.ends,
            &self.takeovers,
            snapshot_dir,
        )?))
    }

    fn read_range(
        &self,
        partition: PartitionId,
        from: Lsn,
        until: Lsn,
        visit: &mut Visit<'_>,
    ) -> Result<(), JournalError> {
        let index = self.index(partition)?;
        log::read(&self.config, partition, index, None, from, until, visit)
    }
}

/// The snapshots queued for Kafka reach it before the process ends.
impl Drop for KafkaLogStore {
    fn drop(&mut self) {
        self.snapshots.finish();
    }
}
