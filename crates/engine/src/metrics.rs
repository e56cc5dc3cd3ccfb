//! The engine's Prometheus metrics. Each partition thread holds its own handles (atomic counters), so
//! recording costs no lock and no label lookup on the hot path.

use crate::PartitionId;
use crate::release::ReleaseMetrics;
use crate::scrub::ScrubMetrics;
use crate::thread_time::PauseTimer;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    pub partition: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AppLabel {
    pub app: String,
}

/// Why a partition could not apply for a while.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum PauseCause {
    /// Writing a snapshot of the partition's state.
    Snapshot,
    /// The journal writer still held the previous batch when the partition's batch was full.
    Journal,
}

impl EncodeLabelValue for PauseCause {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(match self {
            Self::Snapshot => "snapshot",
            Self::Journal => "journal",
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PauseLabel {
    pub partition: u32,
    pub cause: PauseCause,
}

fn new_pause_histogram() -> Histogram {
    // Bounds chosen so that 10 ms, the pause budget, is one of them.
    Histogram::new([
        0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        2.5, 5.0, 10.0, 25.0, 50.0, 100.0,
    ])
}

/// One cause's pauses of one partition: every one in a histogram, and the longest as a gauge, since a
/// histogram only bounds it; the same for each pause's own share (see `thread_time.rs`); and the
/// longest part of any pause by where it went.
#[derive(Clone)]
pub(crate) struct PauseMetric {
    seconds: Histogram,
    max_seconds: Gauge<f64, AtomicU64>,
    own_seconds: Histogram,
    own_max_seconds: Gauge<f64, AtomicU64>,
    cpu_max_seconds: Gauge<f64, AtomicU64>,
    queued_max_seconds: Gauge<f64, AtomicU64>,
    stolen_max_seconds: Gauge<f64, AtomicU64>,
}

impl PauseMetric {
    /// Records the pause `timer` measured, ending now. Only the partition's thread records, so reading
    /// and raising a maximum need no compare-and-swap.
    pub fn record(&self, timer: PauseTimer) {
        let split = timer.stop();
        self.seconds.observe(split.wall().as_secs_f64());
        self.own_seconds.observe(split.own().as_secs_f64());
        for (gauge, part) in [
            (&self.max_seconds, split.wall()),
            (&self.own_max_seconds, split.own()),
            (&self.cpu_max_seconds, split.cpu()),
            (&self.queued_max_seconds, split.queued()),
            (&self.stolen_max_seconds, split.stolen()),
        ] {
            if part.as_secs_f64() > gauge.get() {
                gauge.set(part.as_secs_f64());
            }
        }
    }
}

fn new_fsync_histogram() -> Histogram {
    // 10 us .. ~1.3 s
    Histogram::new(exponential_buckets(0.000_01, 2.0, 18))
}

fn new_snapshot_histogram() -> Histogram {
    // 1 ms .. ~8 min
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

fn new_batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 4.0, 10))
}

#[derive(Clone)]
pub(crate) struct EngineMetrics {
    commands_applied: Family<PartitionLabel, Counter>,
    duplicates: Family<PartitionLabel, Counter>,
    rejected_overloaded: Family<PartitionLabel, Counter>,
    journal_bytes: Family<PartitionLabel, Counter>,
    journal_fsync_seconds: Family<PartitionLabel, Histogram, fn() -> Histogram>,
    journal_batch_records: Family<PartitionLabel, Histogram, fn() -> Histogram>,
    journal_failures: Family<PartitionLabel, Counter>,
    partition_starts: Family<PartitionLabel, Counter>,
    snapshot_seconds: Family<PartitionLabel, Histogram, fn() -> Histogram>,
    apply_pause_seconds: Family<PauseLabel, Histogram, fn() -> Histogram>,
    apply_pause_max_seconds: Family<PauseLabel, Gauge<f64, AtomicU64>>,
    apply_pause_own_seconds: Family<PauseLabel, Histogram, fn() -> Histogram>,
    apply_pause_own_max_seconds: Family<PauseLabel, Gauge<f64, AtomicU64>>,
    apply_pause_cpu_max_seconds: Family<PauseLabel, Gauge<f64, AtomicU64>>,
    apply_pause_queued_max_seconds: Family<PauseLabel, Gauge<f64, AtomicU64>>,
    apply_pause_stolen_max_seconds: Family<PauseLabel, Gauge<f64, AtomicU64>>,
    queue_depth: Family<PartitionLabel, Gauge>,
    durable_lsn: Family<PartitionLabel, Gauge>,
    archive_memory_records: Family<PartitionLabel, Gauge>,
    archive_failures: Family<PartitionLabel, Counter>,
    follow_lag_seconds: Family<PartitionLabel, Gauge<f64, AtomicU64>>,
    projection_lag_records: Family<AppLabel, Gauge>,
    projection_journal_reads: Family<AppLabel, Counter>,
    disk_free_bytes: Gauge,
    rejected_disk_full: Counter,
    scrub: ScrubMetrics,
    store_releases: ReleaseMetrics,
}

#[derive(Clone)]
pub(crate) struct PartitionMetrics {
    pub commands_applied: Counter,
    pub duplicates: Counter,
    pub rejected_overloaded: Counter,
    pub journal_bytes: Counter,
    pub journal_fsync_seconds: Histogram,
    pub journal_batch_records: Histogram,
    pub journal_failures: Counter,
    pub partition_starts: Counter,
    pub snapshot_seconds: Histogram,
    pub snapshot_pause: PauseMetric,
    pub journal_pause: PauseMetric,
    pub queue_depth: Gauge,
    pub durable_lsn: Gauge,
    pub archive_memory_records: Gauge,
    pub archive_failures: Counter,
}

impl EngineMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            commands_applied: Family::default(),
            duplicates: Family::default(),
            rejected_overloaded: Family::default(),
            journal_bytes: Family::default(),
            journal_fsync_seconds: Family::new_with_constructor(new_fsync_histogram),
            journal_batch_records: Family::new_with_constructor(new_batch_histogram),
            journal_failures: Family::default(),
            partition_starts: Family::default(),
            snapshot_seconds: Family::new_with_constructor(new_snapshot_histogram),
            apply_pause_seconds: Family::new_with_constructor(new_pause_histogram),
            apply_pause_max_seconds: Family::default(),
            apply_pause_own_seconds: Family::new_with_constructor(new_pause_histogram),
            apply_pause_own_max_seconds: Family::default(),
            apply_pause_cpu_max_seconds: Family::default(),
            apply_pause_queued_max_seconds: Family::default(),
            apply_pause_stolen_max_seconds: Family::default(),
            queue_depth: Family::default(),
            durable_lsn: Family::default(),
            archive_memory_records: Family::default(),
            archive_failures: Family::default(),
            follow_lag_seconds: Family::default(),
            projection_lag_records: Family::default(),
            projection_journal_reads: Family::default(),
            disk_free_bytes: Gauge::default(),
            rejected_disk_full: Counter::default(),
            scrub: ScrubMetrics::default(),
            store_releases: ReleaseMetrics::default(),
        };
        let r = registry.sub_registry_with_prefix("spate");
        r.register(
            "commands_applied",
            "Commands applied to partition state",
            metrics.commands_applied.clone(),
        );
        r.register(
            "commands_deduplicated",
            "Retried command ids answered from the idempotency table",
            metrics.duplicates.clone(),
        );
        r.register(
            "commands_rejected_overloaded",
            "Commands refused because the partition queue was full",
            metrics.rejected_overloaded.clone(),
        );
        r.register(
            "journal_bytes",
            "Bytes appended to the journal",
            metrics.journal_bytes.clone(),
        );
        r.register(
            "journal_commit_seconds",
            "Time to write and fsync one group commit",
            metrics.journal_fsync_seconds.clone(),
        );
        r.register(
            "journal_batch_records",
            "Records per group commit",
            metrics.journal_batch_records.clone(),
        );
        r.register(
            "journal_failures",
            "Journal write or fsync failures (the partition then refuses writes)",
            metrics.journal_failures.clone(),
        );
        r.register(
            "partition_starts",
            "Times this node started applying the partition: at start-up, taking it over from another \
             node, or again after its log failed (a cluster node does that by itself)",
            metrics.partition_starts.clone(),
        );
        r.register(
            "snapshot_seconds",
            "Time to write one partition snapshot",
            metrics.snapshot_seconds.clone(),
        );
        r.register(
            "apply_pause_seconds",
            "Intervals in which a partition had work but could not apply it, by cause",
            metrics.apply_pause_seconds.clone(),
        );
        r.register(
            "apply_pause_max_seconds",
            "The longest interval in which a partition had work but could not apply it, by cause",
            metrics.apply_pause_max_seconds.clone(),
        );
        r.register(
            "apply_pause_own_seconds",
            "The same intervals less the time the partition's thread was runnable but not running \
             (behind other threads, the process's own among them, or held by a CPU quota) and, in an \
             interval in which it never blocked, the time it was neither on a core nor runnable (the \
             host ran something else on its virtual CPU, or interrupts held it); nothing is taken from \
             an interval that waited for another of spate's threads",
            metrics.apply_pause_own_seconds.clone(),
        );
        r.register(
            "apply_pause_own_max_seconds",
            "The longest such interval less those waits, by cause",
            metrics.apply_pause_own_max_seconds.clone(),
        );
        r.register(
            "apply_pause_cpu_max_seconds",
            "The most CPU time a partition's thread used in one such interval, by cause",
            metrics.apply_pause_cpu_max_seconds.clone(),
        );
        r.register(
            "apply_pause_queued_max_seconds",
            "The longest time a partition's thread was runnable but not running within one such \
             interval, by cause",
            metrics.apply_pause_queued_max_seconds.clone(),
        );
        r.register(
            "apply_pause_stolen_max_seconds",
            "The longest time within one such interval in which a partition's thread was neither on a \
             core, nor runnable, nor blocked: the host ran something else on its virtual CPU (steal) \
             or interrupts held it, by cause; only counted in an interval in which the thread never \
             blocked",
            metrics.apply_pause_stolen_max_seconds.clone(),
        );
        r.register(
            "queue_depth",
            "Requests waiting in the partition queue",
            metrics.queue_depth.clone(),
        );
        r.register(
            "durable_lsn",
            "Next LSN after the last durable record",
            metrics.durable_lsn.clone(),
        );
        r.register(
            "archive_memory_records",
            "Archived records still in memory: not yet in the archive's store on disk (all of them with \
             the journal on Kafka, which keeps the archive in memory and in snapshots)",
            metrics.archive_memory_records.clone(),
        );
        r.register(
            "archive_failures",
            "Failures to store archived records (they then stay in memory and in snapshots)",
            metrics.archive_failures.clone(),
        );
        r.register(
            "follow_lag_seconds",
            "For a partition another node applies: how far this node's reader of its log, which feeds \
             the read models, is behind the log's end (the age of the newest record read; 0 at the end)",
            metrics.follow_lag_seconds.clone(),
        );
        r.register(
            "projection_lag_records",
            "Durable records not yet applied to the app's projection, over all partitions",
            metrics.projection_lag_records.clone(),
        );
        r.register(
            "projection_journal_reads",
            "Times a projection read records from the journal because its feed was full",
            metrics.projection_journal_reads.clone(),
        );
        r.register(
            "disk_free_bytes",
            "Free space of the data directory's file system, as last read (at most 100 ms ago while \
             commands arrive)",
            metrics.disk_free_bytes.clone(),
        );
        r.register(
            "commands_rejected_disk_full",
            "Commands refused because the data directory's file system had less free space than the \
             reserve (--disk-reserve-mb)",
            metrics.rejected_disk_full.clone(),
        );
        r.register(
            "store_scrub_bytes",
            "Bytes of keys and values the background scrub read back from a store on disk",
            metrics.scrub.bytes.clone(),
        );
        r.register(
            "store_scrub_passes",
            "Passes of the background scrub over every record of a store on disk",
            metrics.scrub.passes.clone(),
        );
        r.register(
            "store_damaged",
            "1 once the scrub met a block of the store it could not read back (see /health)",
            metrics.scrub.damaged.clone(),
        );
        r.register(
            "store_releases",
            "Memtables and tables a store on disk replaced, let go of by its release thread rather \
             than under the store's version lock, which reads wait on",
            metrics.store_releases.clone(),
        );
        metrics
    }

    pub fn scrub(&self) -> ScrubMetrics {
        self.scrub.clone()
    }

    pub fn store_releases(&self) -> ReleaseMetrics {
        self.store_releases.clone()
    }

    /// The disk guard's gauge of free bytes and its count of refusals.
    pub fn disk(&self) -> (Gauge, Counter) {
        (
            self.disk_free_bytes.clone(),
            self.rejected_disk_full.clone(),
        )
    }

    pub fn for_partition(&self, partition: PartitionId) -> PartitionMetrics {
        let label = PartitionLabel {
            partition: u32::from(partition),
        };
        PartitionMetrics {
            commands_applied: self.commands_applied.get_or_create(&label).clone(),
            duplicates: self.duplicates.get_or_create(&label).clone(),
            rejected_overloaded: self.rejected_overloaded.get_or_create(&label).clone(),
            journal_bytes: self.journal_bytes.get_or_create(&label).clone(),
            journal_fsync_seconds: self.journal_fsync_seconds.get_or_create(&label).clone(),
            journal_batch_records: self.journal_batch_records.get_or_create(&label).clone(),
            journal_failures: self.journal_failures.get_or_create(&label).clone(),
            partition_starts: self.partition_starts.get_or_create(&label).clone(),
            snapshot_seconds: self.snapshot_seconds.get_or_create(&label).clone(),
            snapshot_pause: self.pause(partition, PauseCause::Snapshot),
            journal_pause: self.pause(partition, PauseCause::Journal),
            queue_depth: self.queue_depth.get_or_create(&label).clone(),
            durable_lsn: self.durable_lsn.get_or_create(&label).clone(),
            archive_memory_records: self.archive_memory_records.get_or_create(&label).clone(),
            archive_failures: self.archive_failures.get_or_create(&label).clone(),
        }
    }

    fn pause(&self, partition: PartitionId, cause: PauseCause) -> PauseMetric {
        let label = PauseLabel {
            partition: u32::from(partition),
            cause,
        };
        PauseMetric {
            seconds: self.apply_pause_seconds.get_or_create(&label).clone(),
            max_seconds: self.apply_pause_max_seconds.get_or_create(&label).clone(),
            own_seconds: self.apply_pause_own_seconds.get_or_create(&label).clone(),
            own_max_seconds: self
                .apply_pause_own_max_seconds
                .get_or_create(&label)
                .clone(),
            cpu_max_seconds: (self.apply_pause_cpu_max_seconds.get_or_create(&label)).clone(),
            queued_max_seconds: (self.apply_pause_queued_max_seconds.get_or_create(&label)).clone(),
            stolen_max_seconds: (self.apply_pause_stolen_max_seconds.get_or_create(&label)).clone(),
        }
    }

    /// Per partition, once this node has followed it: see [`crate::EngineHandle::note_follow_lag`].
    pub fn follow_lag(&self) -> Family<PartitionLabel, Gauge<f64, AtomicU64>> {
        self.follow_lag_seconds.clone()
    }

    pub fn projection_journal_reads(&self, app_name: &str) -> Counter {
        self.projection_journal_reads
            .get_or_create(&AppLabel {
                app: app_name.to_string(),
            })
            .clone()
    }

    pub fn projection_lag(&self, app_name: &str) -> Gauge {
        self.projection_lag_records
            .get_or_create(&AppLabel {
                app: app_name.to_string(),
            })
            .clone()
    }
}
