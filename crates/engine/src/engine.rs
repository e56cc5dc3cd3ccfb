//! Wiring: start-up (recovery of every partition and projection), the handle callers use, shutdown.

use crate::app::{AppSpec, StateMachine};
use crate::archive::{ArchiveDatabase, ArchiveReader, ArchiveStore};
use crate::cluster::{Command, Peers, Remote};
use crate::core::Core;
use crate::disk::{DiskGuard, DiskStatus};
use crate::idempotency::IdempotencyTable;
use crate::journal::{FileLogStore, JournalConfig, Log, LogStore};
use crate::metrics::{EngineMetrics, PartitionLabel, PartitionMetrics};
use crate::partition::{
    self, Feed, Frees, Internal, Limits, Linger, PartitionShared, Request, SinceSnapshot,
};
use crate::projection::ProjectionRuntime;
use crate::release::Releases;
use crate::scrub::{Scrubs, StoreDamage};
use crate::{AppId, CommandId, EngineError, Lsn, PartitionId, Reply, StartError};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::any::Any;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    pub partitions: u16,
    pub journal: JournalConfig,
    /// Requests waiting per partition before callers are told to back off.
    pub queue_capacity: usize,
    /// A group commit is handed to the writer once it holds this many bytes (it may be handed over sooner).
    pub batch_bytes_max: usize,
    pub batch_records_max: usize,
    /// How long a partition's batch waits for more requests before it goes to the journal's writer.
    pub linger: Linger,
    pub snapshot_interval_records: u64,
    /// A snapshot is also due once this many journal bytes were written since the last one: records
    /// can be large (a batch of thousands of operations is one), and the journal is released only
    /// behind snapshots.
    pub snapshot_interval_bytes: u64,
    /// A snapshot is also due once the partition spent this long applying since the last one: a restart
    /// replays what was applied since the newest snapshot, and a small record can stand for much work.
    pub snapshot_interval_apply: Duration,
    /// What one step of a snapshot writes, for apps that write theirs in steps (see
    /// `StateMachine::begin_snapshot`): the partition applies nothing during a step.
    pub snapshot_step_bytes: usize,
    pub idempotency_window_ms: u64,
    pub idempotency_entries_max: usize,
    /// Bound on the bytes of a partition's idempotency table (its replies, and a fixed overhead each).
    pub idempotency_bytes_max: usize,
    /// Unacknowledged follow-ups per destination before a partition stops taking new client commands.
    pub follow_ups_in_flight_max: usize,
    pub projection_checkpoint_interval_records: u64,
    /// A checkpoint is also due after this many journal bytes of the app's records.
    pub projection_checkpoint_interval_bytes: u64,
    /// Group commits queued for a projection; a projection further behind reads the journal instead.
    pub projection_feed_batches_max: usize,
    /// The least time between two passes of a read model over its feed that a group commit started (see
    /// `projection.rs`; not for one that requests wait for, `Projection::requests_wait`): such a read
    /// model lags the journal by up to this much more, and a stream of group commits wakes it up and
    /// has it flush at most this often.
    pub projection_pass_interval: Duration,
    /// Memory for the archive store's block cache, all partitions together (the archive's records not
    /// yet stored are extra, and few).
    pub archive_cache_bytes: u64,
    /// Bytes of the archive's writes each partition's keyspace holds in memory before they go to a
    /// table on disk.
    pub archive_memtable_bytes: u64,
    /// What the background scrub reads back per second from each store on disk (see `scrub.rs`); 0
    /// turns it off.
    pub store_scrub_bytes_per_s: u64,
    /// New client commands are refused while the data directory's file system has less free space
    /// than this (see `disk.rs`); 0 turns the guard off.
    pub disk_reserve_bytes: u64,
}

impl EngineConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            data_dir: data_dir.into(),
            partitions: cores.clamp(1, 256) as u16,
            journal: JournalConfig::default(),
            queue_capacity: 16_384,
            batch_bytes_max: 4 * 1024 * 1024,
            batch_records_max: 16_384,
            linger: Linger::default(),
            snapshot_interval_records: 1_000_000,
            snapshot_interval_bytes: 256 << 20,
            // At 10 s, snapshots of fraud's streamed state fell due three times as often as by bytes, and
            // the stream ran 17% slower; at 30 s no more often (BENCHMARKS.md, "Restart: partitions
            // recovered side by side").
            snapshot_interval_apply: Duration::from_secs(30),
            // 2-6 ms of encoding on a 2-core VM (BENCHMARKS.md, "Apply pauses"); 1 MiB took 10-13 ms.
            snapshot_step_bytes: 64 << 10,
            idempotency_window_ms: 24 * 60 * 60 * 1000,
            idempotency_entries_max: 1_000_000,
            idempotency_bytes_max: 64 << 20,
            follow_ups_in_flight_max: 16_384,
            projection_checkpoint_interval_records: 1_000_000,
            projection_checkpoint_interval_bytes: 256 << 20,
            projection_feed_batches_max: 1024,
            // Below the peak, 1 ms took a read model's wake-ups from one per group commit to about
            // 1,000/s and its CPU per request from 3.7-8.6 to 0.7-5.1 µs (BENCHMARKS.md, "Read models
            // that pass over their feed at most once a millisecond").
            projection_pass_interval: Duration::from_millis(1),
            archive_cache_bytes: 256 << 20,
            // fjall's default.
            archive_memtable_bytes: 64 << 20,
            // A pass over 15 GB of history takes about 15 minutes (BENCHMARKS.md, "The scrub").
            store_scrub_bytes_per_s: 16 << 20,
            disk_reserve_bytes: 128 << 20,
        }
    }
}

/// Per-partition view for health checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub partitions: u16,
    pub failed_partitions: Vec<PartitionId>,
    pub queue_depth: Vec<usize>,
    pub disk: DiskStatus,
    /// Stores on disk the background scrub found damaged.
    pub damaged_stores: Vec<StoreDamage>,
    /// Read models that stopped applying while the engine runs (an event they could not read): what
    /// they answer is as old as the last record they applied.
    pub stopped_read_models: Vec<&'static str>,
}

struct ProjectionView {
    app: AppId,
    name: &'static str,
    positions: Arc<Vec<AtomicU64>>,
    stopped: Arc<AtomicBool>,
}

/// One partition's place in the engine, whether or not this node applies it right now.
#[derive(Default)]
struct Slot {
    /// The queue of the partition's thread while this node applies the partition.
    queue: RwLock<Option<Sender<Request>>>,
    /// The partition and writer threads while they run; the lock also keeps one start or stop of the
    /// partition at a time.
    threads: Mutex<Option<[JoinHandle<()>; 2]>>,
}

impl Slot {
    fn queue(&self) -> std::sync::RwLockReadGuard<'_, Option<Sender<Request>>> {
        self.queue.read().expect("no thread panics holding a queue")
    }

    fn set_queue(&self, queue: Option<Sender<Request>>) {
        *self
            .queue
            .write()
            .expect("no thread panics holding a queue") = queue;
    }

    fn threads(&self) -> std::sync::MutexGuard<'_, Option<[JoinHandle<()>; 2]>> {
        self.threads
            .lock()
            .expect("no thread panics holding a slot")
    }
}

/// What starting a partition needs; kept because in a cluster partitions start and stop while the
/// engine runs.
struct Starter {
    logs: Arc<dyn LogStore>,
    data_dir: PathBuf,
    apps: Vec<AppSpec>,
    empty_idempotency: IdempotencyTable,
    limits: Limits,
    queue_capacity: usize,
    /// The projections' feeds; dropped at shutdown, so that projections end after the last writer.
    feeds: Mutex<Option<Vec<FeedSender>>>,
    /// Per partition, per projection: the LSN its checkpoint covers (the journal keeps what is after).
    floors_by_partition: Vec<Vec<Arc<AtomicU64>>>,
    /// The archive's store on disk, by partition, with the embedded journal only: a state whose
    /// journal is on Kafka must outlive this machine's disk, so its archive stays in memory and in
    /// snapshots.
    archive_stores: Option<Vec<ArchiveStore>>,
}

struct Inner {
    partition_count: u16,
    slots: Vec<Slot>,
    peers: Arc<Peers>,
    /// The receiving ends of the partitions' internal channels, handed to each start of a partition.
    internal: Vec<Receiver<Internal>>,
    shared: Vec<Arc<PartitionShared>>,
    metrics: Vec<PartitionMetrics>,
    follow_lag: Family<PartitionLabel, Gauge<f64, AtomicU64>>,
    projections: Vec<ProjectionView>,
    disk: DiskGuard,
    scrubs: Scrubs,
    releases: Releases,
    starter: Starter,
}

/// A projection's feed, as each writer holds it.
type FeedSender = (AppId, Sender<Feed>);
/// A projection not yet running, with the receiving end of its feed.
type FedProjection = (ProjectionRuntime, Receiver<Feed>);

/// In a cluster, follow-ups that made no progress for this long are sent again (see `Peers`).
const RESEND_INTERVAL: Duration = Duration::from_secs(1);

/// What request handlers hold: cheap to clone, usable from any thread or task.
/// A queued command; [`Pending::reply`] resolves once it is applied and durable.
pub struct Pending(tokio::sync::oneshot::Receiver<Result<Reply, EngineError>>);

impl Pending {
    pub async fn reply(self) -> Result<Reply, EngineError> {
        self.0.await.map_err(|_| EngineError::ShuttingDown)?
    }
}

/// A command the engine did not queue, with its payload handed back.
#[derive(Debug)]
pub struct Refused {
    pub error: EngineError,
    pub payload: Vec<u8>,
}

#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

pub struct Engine {
    handle: EngineHandle,
    projection_threads: Vec<JoinHandle<()>>,
}

impl Engine {
    /// Recovers every partition and projection from `config.data_dir`, journals included, and starts
    /// their threads.
    pub fn start(
        config: EngineConfig,
        apps: Vec<AppSpec>,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
        let logs = Arc::new(FileLogStore::new(&config.data_dir, config.journal.clone()));
        Self::start_with(logs, true, config, apps, registry)
    }

    /// Like [`Self::start`], with the partitions' logs in `logs` (for example a replicated log); snapshots
    /// and projection checkpoints stay in `config.data_dir`. The archive stays in memory and in
    /// snapshots: a state kept in a replicated log must outlive this machine's disk.
    pub fn start_on(
        logs: Arc<dyn LogStore>,
        config: EngineConfig,
        apps: Vec<AppSpec>,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
        Self::start_with(logs, false, config, apps, registry)
    }

    fn start_with(
        logs: Arc<dyn LogStore>,
        archive_on_disk: bool,
        config: EngineConfig,
        apps: Vec<AppSpec>,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
        let partition_count = config.partitions;
        let data_dir = config.data_dir.clone();
        let started = Instant::now();
        let (engine, mut projections) =
            Self::prepare(logs.clone(), None, archive_on_disk, config, apps, registry)?;
        let prepare_ms = started.elapsed().as_millis() as u64;
        // Opening a replicated log takes round trips (fencing the old owner, reading to the end): open
        // every partition's at once.
        let journals = std::thread::scope(|scope| {
            let opening: Vec<_> = (0..partition_count)
                .map(|partition| {
                    let (logs, data_dir) = (&logs, &data_dir);
                    scope.spawn(move || {
                        logs.open(partition, &crate::snapshot_dir(data_dir, partition))
                    })
                })
                .collect();
            opening
                .into_iter()
                .map(|thread| thread.join().expect("opening a log does not panic"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        let open_ms = started.elapsed().as_millis() as u64 - prepare_ms;
        let inner = &engine.handle.inner;
        // Partitions share nothing until they run: restore and replay them side by side, a core each.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let recovered = in_parallel(journals, cores, |partition, journal| {
            let partition = PartitionId::try_from(partition).expect("partition ids fit");
            inner
                .recover(partition, journal.as_ref())
                .map(|recovered| (recovered, journal))
        })
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        let recover_ms = started.elapsed().as_millis() as u64 - prepare_ms - open_ms;
        for ((core, _), journal) in &recovered {
            // Before the projections run: they start caught up with what the partitions recovered.
            for (projection, _) in &mut projections {
                projection.catch_up(core.partition, journal.as_ref())?;
            }
        }
        tracing::info!(
            prepare_ms,
            open_ms,
            recover_ms,
            catch_up_ms = started.elapsed().as_millis() as u64 - prepare_ms - open_ms - recover_ms,
            "engine recovered"
        );
        let engine = engine.run_projections(projections)?;
        for ((core, replayed), journal) in recovered {
            let slot = &engine.handle.inner.slots[usize::from(core.partition)];
            *slot.threads() = Some(
                engine
                    .handle
                    .inner
                    .spawn_partition(core, replayed, journal)?,
            );
        }
        Ok(engine)
    }

    /// Starts the engine as one node of a cluster: no partition runs until [`EngineHandle::activate`]
    /// starts it (the cluster's membership decides which); commands for the others go to `remote`.
    pub fn start_node(
        logs: Arc<dyn LogStore>,
        remote: Arc<dyn Remote>,
        config: EngineConfig,
        apps: Vec<AppSpec>,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
        let (engine, projections) =
            Self::prepare(logs, Some(remote), false, config, apps, registry)?;
        // Until a partition runs here, its projections follow it from where their checkpoints end.
        for (partition, shared) in engine.handle.inner.shared.iter().enumerate() {
            let checkpointed = projections
                .iter()
                .map(|(projection, _)| projection.positions[partition].load(Ordering::Acquire))
                .min()
                .unwrap_or(0);
            shared.durable_lsn.store(checkpointed, Ordering::Release);
            shared.fed_lsn.store(checkpointed, Ordering::Release);
        }
        let engine = engine.run_projections(projections)?;
        Ok(engine)
    }

    /// Checks the configuration and builds everything but the threads.
    fn prepare(
        logs: Arc<dyn LogStore>,
        remote: Option<Arc<dyn Remote>>,
        archive_on_disk: bool,
        config: EngineConfig,
        mut apps: Vec<AppSpec>,
        registry: &mut Registry,
    ) -> Result<(Self, Vec<FedProjection>), StartError> {
        if config.partitions == 0 {
            return Err(StartError::Config(
                "at least one partition is needed".into(),
            ));
        }
        for (index, spec) in apps.iter().enumerate() {
            if spec.id >= 64 || apps[..index].iter().any(|other| other.id == spec.id) {
                return Err(StartError::Config(format!(
                    "app id {} of {} is out of range or taken",
                    spec.id, spec.name
                )));
            }
        }
        std::fs::create_dir_all(&config.data_dir).map_err(|source| {
            crate::journal::JournalError::Io {
                path: config.data_dir.clone(),
                source,
            }
        })?;
        // Only an embedded journal (the one case with the archive on disk) keeps a directory for every
        // partition here.
        crate::meta::check(&config.data_dir, config.partitions, archive_on_disk)?;
        let archive_db = (archive_on_disk && apps.iter().any(|app| app.archives))
            .then(|| {
                ArchiveDatabase::open(
                    &config.data_dir.join("archive"),
                    config.archive_cache_bytes,
                    config.archive_memtable_bytes,
                )
            })
            .transpose()?;
        let archive_stores = (archive_db.as_ref())
            .map(|db| {
                (0..config.partitions)
                    .map(|partition| db.partition(partition))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let partition_count = config.partitions;
        let metrics = EngineMetrics::register(registry);
        let scrubs = Scrubs::new(config.store_scrub_bytes_per_s, metrics.scrub());
        let releases = Releases::new(metrics.store_releases());
        if let Some(db) = archive_db {
            tend_store(&scrubs, &releases, "archive", db.database())
                .map_err(|e| StartError::Config(format!("spawning the archive's threads: {e}")))?;
        }
        let (free_bytes_gauge, disk_refusals) = metrics.disk();
        let disk = DiskGuard::new(
            &config.data_dir,
            config.disk_reserve_bytes,
            free_bytes_gauge,
            disk_refusals,
        )
        .map_err(|e| {
            StartError::Config(format!(
                "reading the free space of {}: {e}",
                config.data_dir.display()
            ))
        })?;
        let shared: Vec<Arc<PartitionShared>> = (0..partition_count)
            .map(|_| Arc::new(PartitionShared::default()))
            .collect();

        let mut projections = Vec::new();
        for spec in &mut apps {
            if let Some(projection) = spec.projection.take() {
                projections.push(ProjectionRuntime::restore(
                    spec.id,
                    spec.name,
                    projection,
                    config.data_dir.join("projections"),
                    partition_count,
                    config.projection_checkpoint_interval_records,
                    config.projection_checkpoint_interval_bytes,
                    config.projection_pass_interval,
                    metrics.projection_lag(spec.name),
                    metrics.projection_journal_reads(spec.name),
                    shared.clone(),
                    logs.clone(),
                )?);
            }
        }
        let mut floors_by_partition: Vec<Vec<Arc<AtomicU64>>> =
            vec![Vec::new(); usize::from(partition_count)];
        for projection in &projections {
            for (partition, floor) in projection.floors.iter().enumerate() {
                floors_by_partition[partition].push(floor.clone());
            }
        }

        let internal_capacity =
            2 * usize::from(partition_count) * config.follow_ups_in_flight_max + 16;
        let (internal_tx, internal_rx): (Vec<_>, Vec<_>) = (0..partition_count)
            .map(|_| bounded(internal_capacity))
            .unzip();
        let resend_interval = remote.is_some().then_some(RESEND_INTERVAL);
        let limits = Limits {
            batch_bytes_max: config.batch_bytes_max,
            batch_records_max: config.batch_records_max,
            linger: config.linger,
            snapshot_interval_records: config.snapshot_interval_records,
            snapshot_interval_bytes: config.snapshot_interval_bytes,
            snapshot_interval_apply: config.snapshot_interval_apply,
            snapshot_step_bytes: config.snapshot_step_bytes,
            follow_ups_in_flight_max: config.follow_ups_in_flight_max,
            resend_interval,
            reads_need_lease: remote.is_some(),
        };
        // Feeds are bounded: a projection that falls this many group commits behind reads the journal.
        let mut feeds = Vec::new();
        let mut views = Vec::new();
        let mut feed_receivers = Vec::new();
        for projection in &projections {
            let (feed_tx, feed_rx) = bounded(config.projection_feed_batches_max.max(1));
            feeds.push((projection.app, feed_tx));
            feed_receivers.push(feed_rx);
            views.push(ProjectionView {
                app: projection.app,
                name: projection.name,
                positions: projection.positions.clone(),
                stopped: projection.stopped.clone(),
            });
        }
        let inner = Inner {
            partition_count,
            slots: (0..partition_count).map(|_| Slot::default()).collect(),
            peers: Arc::new(Peers::new(internal_tx, remote)),
            internal: internal_rx,
            shared,
            metrics: (0..partition_count)
                .map(|partition| metrics.for_partition(partition))
                .collect(),
            follow_lag: metrics.follow_lag(),
            projections: views,
            disk,
            scrubs,
            releases,
            starter: Starter {
                logs,
                data_dir: config.data_dir.clone(),
                apps,
                empty_idempotency: IdempotencyTable::new(
                    config.idempotency_window_ms,
                    config.idempotency_entries_max,
                    config.idempotency_bytes_max,
                ),
                limits,
                queue_capacity: config.queue_capacity,
                feeds: Mutex::new(Some(feeds)),
                floors_by_partition,
                archive_stores,
            },
        };
        let engine = Self {
            handle: EngineHandle {
                inner: Arc::new(inner),
            },
            projection_threads: Vec::new(),
        };
        Ok((
            engine,
            projections.into_iter().zip(feed_receivers).collect(),
        ))
    }

    fn run_projections(mut self, projections: Vec<FedProjection>) -> Result<Self, StartError> {
        for (projection, feed) in projections {
            let name = format!("projection-{}", projection.name);
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || projection.run(feed))
                .map_err(|e| StartError::Config(format!("spawning a projection thread: {e}")))?;
            self.projection_threads.push(thread);
        }
        Ok(self)
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Drains every partition this node applies, writes final snapshots, syncs the journals and waits
    /// for the threads; the apps' states are freed after, on threads of their own (`Frees::InBackground`).
    pub fn shutdown(self) -> Result<(), String> {
        let inner = &self.handle.inner;
        inner.scrubs.stop_all();
        inner.releases.stop_all();
        let mut errors = Vec::new();
        let running: Vec<PartitionId> = (0..inner.partition_count)
            .filter(|&partition| inner.is_here(partition))
            .collect();
        let waits = self.handle.broadcast(&running, |done| {
            Internal::Shutdown(done, Frees::InBackground)
        });
        for (&partition, wait) in running.iter().zip(waits) {
            // The slot is locked only to look: a partition's thread may lock it as it stops.
            let slot = &inner.slots[usize::from(partition)];
            let applier_ended =
                || (slot.threads().as_ref()).is_none_or(|[applier, _]| applier.is_finished());
            if let Err(error) = await_stopped(&wait, applier_ended) {
                errors.push(format!("partition {partition}: {error}"));
            }
        }
        for slot in &inner.slots {
            for thread in slot.threads().take().into_iter().flatten() {
                if thread.join().is_err() {
                    errors.push("a partition thread panicked".into());
                }
            }
        }
        // The writers have stopped: without the engine's own senders, projections see their feeds end.
        drop(inner.starter.feeds.lock().map(|mut feeds| feeds.take()));
        for thread in self.projection_threads {
            if thread.join().is_err() {
                errors.push("a projection thread panicked".into());
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

impl Inner {
    fn is_here(&self, partition: PartitionId) -> bool {
        self.peers.is_here(partition)
    }

    /// Restores a partition's state from its newest snapshot and its log.
    fn recover(
        &self,
        partition: PartitionId,
        log: &dyn Log,
    ) -> Result<(Core, SinceSnapshot), StartError> {
        let starter = &self.starter;
        let snapshot_dir = crate::snapshot_dir(&starter.data_dir, partition);
        let archive =
            (starter.archive_stores.as_ref()).map(|stores| stores[usize::from(partition)].clone());
        crate::recovery::recover_partition(
            partition,
            self.partition_count,
            &starter.apps,
            &starter.empty_idempotency,
            &archive,
            log,
            &snapshot_dir,
        )
    }

    /// Starts the partition and writer threads of a recovered partition and opens its queue.
    fn spawn_partition(
        &self,
        core: Core,
        replayed: SinceSnapshot,
        log: Box<dyn Log>,
    ) -> Result<[JoinHandle<()>; 2], StartError> {
        let partition = core.partition;
        let index = usize::from(partition);
        let starter = &self.starter;
        let feeds = starter
            .feeds
            .lock()
            .expect("no thread panics holding the feeds")
            .clone()
            .ok_or(StartError::Config("the engine is shutting down".into()))?;
        let (queue_tx, queue_rx) = bounded(starter.queue_capacity);
        self.shared[index].failed.store(false, Ordering::Release);
        self.shared[index].fenced.store(false, Ordering::Release);
        self.metrics[index].partition_starts.inc();
        let (partition_thread, writer_thread) = partition::pair(
            core,
            replayed,
            log,
            queue_rx,
            self.internal[index].clone(),
            self.peers.clone(),
            feeds,
            starter.floors_by_partition[index].clone(),
            starter.limits.clone(),
            self.shared[index].clone(),
            self.metrics[index].clone(),
            crate::snapshot_dir(&starter.data_dir, partition),
        );
        let spawn = |name: String, body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(body)
                .map_err(|e| StartError::Config(format!("spawning a partition thread: {e}")))
        };
        let writer = spawn(
            format!("journal-{partition}"),
            Box::new(move || writer_thread.run()),
        )?;
        let applier = spawn(
            format!("partition-{partition}"),
            Box::new(move || partition_thread.run()),
        )?;
        self.slots[index].set_queue(Some(queue_tx));
        self.peers.set_here(partition, true);
        Ok([applier, writer])
    }
}

/// How often a stop looks whether the partition's thread still runs while it waits for its answer.
const STOP_POLL_MS: u64 = 100;

/// The answer of a partition's thread to `Internal::Shutdown`. Its internal channel outlives the thread
/// (it keeps messages for the partition's next start), so a thread that has died (a panic in apply)
/// neither answers nor drops the reply's sender: the wait ends once `applier_ended` says the thread has.
fn await_stopped(
    wait: &Receiver<Result<(), String>>,
    applier_ended: impl Fn() -> bool,
) -> Result<(), String> {
    let ended_without_answer = || Err("the partition thread ended without answering".to_string());
    loop {
        match wait.recv_timeout(Duration::from_millis(STOP_POLL_MS)) {
            Ok(stopped) => return stopped,
            Err(RecvTimeoutError::Disconnected) => return ended_without_answer(),
            // It may have answered just before it ended.
            Err(RecvTimeoutError::Timeout) if applier_ended() => {
                return wait.try_recv().unwrap_or_else(|_| ended_without_answer());
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

impl EngineHandle {
    pub fn partition_count(&self) -> u16 {
        self.inner.partition_count
    }

    pub fn partition_of(&self, key: &[u8]) -> PartitionId {
        crate::partition_of(key, self.inner.partition_count)
    }

    /// Submits a command and waits until it is durable. `command_id` makes retries safe: a repeat within
    /// the idempotency window is answered from the table instead of being applied again.
    pub async fn submit(
        &self,
        partition: PartitionId,
        app: AppId,
        command_id: Option<CommandId>,
        payload: Vec<u8>,
    ) -> Result<Reply, EngineError> {
        match self.enqueue(partition, app, command_id, payload) {
            Ok(pending) => pending.reply().await,
            Err(refused) => Err(refused.error),
        }
    }

    /// Queues a command now, without waiting for it to be applied. Commands enqueued one after another
    /// on a partition are applied in that order, which is what streams rely on. A refused command comes
    /// back with its payload, so the caller can retry it (for example after [`EngineError::Overloaded`]).
    /// In a cluster, a command for a partition another node applies is forwarded to it, in order.
    pub fn enqueue(
        &self,
        partition: PartitionId,
        app: AppId,
        command_id: Option<CommandId>,
        payload: Vec<u8>,
    ) -> Result<Pending, Refused> {
        self.enqueue_at(partition, app, command_id, payload, true)
    }

    /// Like [`Self::enqueue`], but only on this node: for commands another node forwarded here, which
    /// must not travel again (two nodes that disagree on the owner would bounce them).
    pub fn enqueue_here(
        &self,
        partition: PartitionId,
        app: AppId,
        command_id: Option<CommandId>,
        payload: Vec<u8>,
    ) -> Result<Pending, Refused> {
        self.enqueue_at(partition, app, command_id, payload, false)
    }

    fn enqueue_at(
        &self,
        partition: PartitionId,
        app: AppId,
        command_id: Option<CommandId>,
        payload: Vec<u8>,
        may_forward: bool,
    ) -> Result<Pending, Refused> {
        let (reply_to, reply) = tokio::sync::oneshot::channel();
        let index = self.slot_index(partition);
        let queue = self.inner.slots[index].queue();
        let Some(queue) = queue.as_ref() else {
            drop(queue);
            // The owner checks its own disk.
            return match self.inner.peers.remote() {
                Some(remote) if may_forward => {
                    let command = Command {
                        app,
                        command_id,
                        payload,
                    };
                    remote.forward(partition, command, reply_to);
                    Ok(Pending(reply))
                }
                _ => Err(Refused {
                    error: EngineError::NotOwner(partition),
                    payload,
                }),
            };
        };
        if let Err(error) = self.inner.disk.admit() {
            return Err(Refused { error, payload });
        }
        let request = Request::Command {
            app,
            command_id,
            payload,
            reply_to,
        };
        match partition::offer(queue, request, &self.inner.metrics[index]) {
            Ok(()) => Ok(Pending(reply)),
            Err((error, Request::Command { payload, .. })) => Err(Refused { error, payload }),
            Err((error, Request::Query(_))) => {
                unreachable!("offered a command, got back {error:?} with a query")
            }
        }
    }

    fn slot_index(&self, partition: PartitionId) -> usize {
        let index = usize::from(partition);
        assert!(
            index < self.inner.slots.len(),
            "partition {partition} out of range"
        );
        index
    }

    /// Runs `read` on the partition's state of `app` (of type `S`), in order with the commands queued
    /// before it, and returns its result once everything it saw is durable. The partition must be applied
    /// on this node; reads that may run on another node use [`Self::read`].
    pub async fn query<S, R>(
        &self,
        partition: PartitionId,
        app: AppId,
        read: impl FnOnce(&S) -> R + Send + 'static,
    ) -> Result<R, EngineError>
    where
        S: StateMachine,
        R: Send + 'static,
    {
        self.query_state(partition, app, move |state, _| {
            (state as &dyn Any).downcast_ref::<S>().map(read)
        })
        .await
    }

    /// What `app` archived under `key` on `partition`, if it is in the archive's store, read on the
    /// calling thread instead of through the partition's queue (which holds a read until the next group
    /// commit): a stored record is final and its command durable, so any reader may have it. `None`
    /// when it is not stored: not archived, archived so recently it is still in memory, or archived
    /// where there is no store (a journal on Kafka); [`Self::query_archive`] answers those.
    ///
    /// May read the disk: call it where blocking is allowed (`tokio::task::spawn_blocking`).
    pub fn read_stored(
        &self,
        partition: PartitionId,
        app: AppId,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, crate::ArchiveError> {
        match &self.inner.starter.archive_stores {
            Some(stores) => stores[usize::from(partition)].get_value(app, key),
            None => Ok(None),
        }
    }

    /// [`Self::query`] for reads that may need what the app archived (see `Effects::archive`).
    pub async fn query_archive<S, R>(
        &self,
        partition: PartitionId,
        app: AppId,
        read: impl FnOnce(&S, &ArchiveReader<'_>) -> R + Send + 'static,
    ) -> Result<R, EngineError>
    where
        S: StateMachine,
        R: Send + 'static,
    {
        self.query_state(partition, app, move |state, archive| {
            (state as &dyn Any)
                .downcast_ref::<S>()
                .map(|state| read(state, archive))
        })
        .await
    }

    /// Answers `query` with the app's [`StateMachine::read`] on `partition`, wherever the partition is
    /// applied: here, or in a cluster on its owner. For reads that span partitions, which the cluster
    /// may have spread over several nodes.
    pub async fn read(
        &self,
        partition: PartitionId,
        app: AppId,
        query: Vec<u8>,
    ) -> Result<Vec<u8>, EngineError> {
        match self.inner.peers.remote() {
            Some(remote) if !self.inner.is_here(partition) => {
                let (reply_to, reply) = tokio::sync::oneshot::channel();
                remote.read(partition, app, query, reply_to);
                reply.await.map_err(|_| EngineError::NotOwner(partition))?
            }
            _ => self.read_here(partition, app, query).await,
        }
    }

    /// [`Self::read`] on this node only: [`EngineError::NotOwner`] if another node applies `partition`.
    pub async fn read_here(
        &self,
        partition: PartitionId,
        app: AppId,
        query: Vec<u8>,
    ) -> Result<Vec<u8>, EngineError> {
        self.query_state(partition, app, move |state, archive| {
            Some(state.read(&query, archive))
        })
        .await
    }

    /// Runs `read` on `app`'s state in `partition`'s thread; `None` from it means the state is not of
    /// the type the caller expected.
    async fn query_state<R: Send + 'static>(
        &self,
        partition: PartitionId,
        app: AppId,
        read: impl FnOnce(&dyn StateMachine, &ArchiveReader<'_>) -> Option<R> + Send + 'static,
    ) -> Result<R, EngineError> {
        let (reply_to, reply) = tokio::sync::oneshot::channel();
        let query: partition::QueryFn = Box::new(move |core: &Core| {
            let archive = ArchiveReader {
                archive: Some(&core.archive),
                app,
                as_of: core.next_lsn,
            };
            let result = core
                .app_state(app)
                .and_then(|state| read(state, &archive))
                .ok_or(EngineError::UnknownApp(app));
            Box::new(move |durable: Result<(), EngineError>| {
                let _ = reply_to.send(durable.and(result));
            })
        });
        let index = self.slot_index(partition);
        {
            let queue = self.inner.slots[index].queue();
            let Some(queue) = queue.as_ref() else {
                if let Some(remote) = self.inner.peers.remote() {
                    remote.query_refused(partition);
                }
                return Err(EngineError::NotOwner(partition));
            };
            partition::offer(queue, Request::Query(query), &self.inner.metrics[index])
                .map_err(|(error, _)| error)?;
        }
        let answer = reply.await.map_err(|_| EngineError::ShuttingDown)?;
        // The partition runs here but its read lease ran out: the lease may have moved on.
        if let (Err(EngineError::NotOwner(_)), Some(remote)) = (&answer, self.inner.peers.remote())
        {
            remote.query_refused(partition);
        }
        answer
    }

    /// Sends a control message to each of `partitions`; each answers on its own channel.
    fn broadcast(
        &self,
        partitions: &[PartitionId],
        message: fn(Sender<Result<(), String>>) -> Internal,
    ) -> Vec<Receiver<Result<(), String>>> {
        partitions
            .iter()
            .map(|&partition| {
                let (done_tx, done_rx) = bounded(1);
                let _ = self.inner.peers.internal(partition).send(message(done_tx));
                done_rx
            })
            .collect()
    }

    /// The partitions this node applies now.
    pub fn local_partitions(&self) -> Vec<PartitionId> {
        (0..self.inner.partition_count)
            .filter(|&partition| self.inner.is_here(partition))
            .collect()
    }

    /// Snapshots every partition this node applies now (blocking); for operators and tests.
    pub fn snapshot_now(&self) -> Result<(), String> {
        let waits = self.broadcast(&self.local_partitions(), Internal::Snapshot);
        for wait in waits {
            wait.recv().map_err(|_| "engine stopped".to_string())??;
        }
        Ok(())
    }

    /// Starts applying `partition` on this node (blocking: it opens the partition's log, which fences
    /// any earlier owner, and recovers its state). Its projections read what they missed from the log.
    pub fn activate(&self, partition: PartitionId) -> Result<(), StartError> {
        let inner = &self.inner;
        let index = self.slot_index(partition);
        let mut threads = inner.slots[index].threads();
        if threads.is_some() {
            return Ok(());
        }
        let log = inner.starter.logs.open(
            partition,
            &crate::snapshot_dir(&inner.starter.data_dir, partition),
        )?;
        let (core, replayed) = inner.recover(partition, log.as_ref())?;
        let end_lsn = log.next_lsn();
        for view in &inner.projections {
            inner.shared[index].feed_dropped_end[usize::from(view.app)]
                .fetch_max(end_lsn, Ordering::AcqRel);
        }
        *threads = Some(inner.spawn_partition(core, replayed, log)?);
        Ok(())
    }

    /// Stops applying `partition` on this node: new commands for it are forwarded, queued ones fail
    /// with [`EngineError::ShuttingDown`], and its thread writes a last snapshot (which fails harmlessly
    /// if another node has taken the log over already).
    pub fn deactivate(&self, partition: PartitionId) -> Result<(), String> {
        let inner = &self.inner;
        let index = self.slot_index(partition);
        let mut threads = inner.slots[index].threads();
        let Some(running) = threads.take() else {
            return Ok(());
        };
        inner.peers.set_here(partition, false);
        inner.slots[index].set_queue(None);
        let wait = self.broadcast(&[partition], |done| {
            Internal::Shutdown(done, Frees::BeforeAnswering)
        });
        let stopped = await_stopped(&wait[0], || running[0].is_finished());
        for thread in running {
            if thread.join().is_err() {
                return Err(format!("a thread of partition {partition} panicked"));
            }
        }
        stopped
    }

    /// True if some app keeps a read model: then a cluster node follows the partitions other nodes apply.
    pub fn has_projections(&self) -> bool {
        !self.inner.projections.is_empty()
    }

    /// The LSN from which [`Self::follow`] needs `partition`'s records next.
    pub fn followed_lsn(&self, partition: PartitionId) -> Lsn {
        self.inner.shared[self.slot_index(partition)]
            .fed_lsn
            .load(Ordering::Acquire)
    }

    /// Records how far behind the end of `partition`'s shared log the reader for [`Self::follow`] is:
    /// the age of the newest record it has read while it has not read to the end, zero once it has (or
    /// once it stops following the partition). Metric `spate_follow_lag_seconds`; a partition this node
    /// has never followed has none. The projections' own lag counts only what they were handed.
    pub fn note_follow_lag(&self, partition: PartitionId, behind: Duration) {
        let label = PartitionLabel {
            partition: u32::from(partition),
        };
        self.inner
            .follow_lag
            .get_or_create(&label)
            .set(behind.as_secs_f64());
    }

    /// Hands the projections durable records `first_lsn..first_lsn + record_count` (`frames`) of a
    /// partition another node applies, read from the shared log: read models on every node cover every
    /// partition. Records this node has already followed are skipped; a gap (records not followed) is
    /// read from the log by the projections before anything after it.
    pub fn follow(
        &self,
        partition: PartitionId,
        first_lsn: Lsn,
        record_count: u64,
        frames: Vec<u8>,
    ) {
        let inner = &self.inner;
        let index = self.slot_index(partition);
        if inner.is_here(partition) || inner.projections.is_empty() {
            return;
        }
        let shared = &inner.shared[index];
        let followed = shared.fed_lsn.load(Ordering::Acquire);
        let end_lsn = first_lsn + record_count;
        if end_lsn <= followed {
            return;
        }
        if first_lsn > followed {
            for view in &inner.projections {
                shared.feed_dropped_end[usize::from(view.app)]
                    .fetch_max(first_lsn, Ordering::AcqRel);
            }
        }
        shared.durable_lsn.fetch_max(end_lsn, Ordering::AcqRel);
        let frames = Arc::new(frames);
        let feeds = inner
            .starter
            .feeds
            .lock()
            .expect("no thread panics holding the feeds");
        for (app, feed) in feeds.iter().flatten() {
            let sent = feed.try_send(Feed {
                partition,
                first_lsn,
                frames: frames.clone(),
            });
            if sent.is_err() {
                shared.feed_dropped_end[usize::from(*app)].fetch_max(end_lsn, Ordering::AcqRel);
            }
        }
        shared.fed_lsn.store(end_lsn, Ordering::Release);
    }

    /// Takes a follow-up or an acknowledgement another node sent to `partition`. One for a partition
    /// this node does not apply is dropped: its sender sends it again.
    pub fn deliver(&self, partition: PartitionId, message: &[u8]) -> Result<(), String> {
        let inner = &self.inner;
        if partition >= inner.partition_count {
            return Err(format!(
                "partition {partition} is out of range (the cluster has {})",
                inner.partition_count
            ));
        }
        let message = crate::cluster::decode_message(message, inner.partition_count)
            .map_err(|e| format!("bad internal message: {e}"))?;
        // Applied, it would stop the partition: apply finds the app it names or asserts.
        if let Internal::FollowUp(follow_up) = &message
            && !(inner.starter.apps.iter()).any(|spec| spec.id == follow_up.app)
        {
            return Err(format!(
                "bad internal message: a follow-up for app {}, which this node does not serve (every \
                 node of a cluster must serve the same --apps)",
                follow_up.app
            ));
        }
        if inner.is_here(partition) {
            let _ = inner.peers.internal(partition).send(message);
        }
        Ok(())
    }

    /// On a cluster node: lets `partitions` answer reads from their own state until `until` (see
    /// `ReadLease`). The membership calls it each time the group shows this node holding them.
    pub fn extend_read_leases(&self, partitions: &[PartitionId], until: Instant) {
        for &partition in partitions {
            if let Some(shared) = self.inner.shared.get(usize::from(partition)) {
                shared.read_lease.extend_to(until);
            }
        }
    }

    /// True while `partition`'s read lease lasts: the group's description showed this node holding it
    /// less than the lease's length ago.
    pub fn holds_read_lease(&self, partition: PartitionId) -> bool {
        self.inner
            .shared
            .get(usize::from(partition))
            .is_some_and(|shared| shared.read_lease.holds_at(Instant::now()))
    }

    /// The partitions applied here whose journal failed: they refuse commands and reads.
    pub fn failed_partitions(&self) -> Vec<PartitionId> {
        let inner = &self.inner;
        (0..inner.partition_count)
            .filter(|&p| {
                inner.is_here(p) && inner.shared[usize::from(p)].failed.load(Ordering::Acquire)
            })
            .collect()
    }

    /// True when `partition`'s journal failed because another writer took its log over
    /// ([`crate::journal::JournalError::Fenced`]), until the partition's next start. Starting such a partition
    /// again takes the log back from that writer: right only where something else says this node
    /// should hold it (a cluster's group), where starting a partition whose log merely failed (a commit
    /// refused, or timed out) heals it.
    pub fn is_fenced(&self, partition: PartitionId) -> bool {
        self.inner
            .shared
            .get(usize::from(partition))
            .is_some_and(|shared| shared.fenced.load(Ordering::Acquire))
    }

    /// What `/health` counts as failed: the failed partitions, and on a node that applies every
    /// partition (no other node to forward to), any it does not apply right now (one being started
    /// again after its log failed, whose start may fail again while Kafka is out of reach).
    fn unserved_partitions(&self) -> Vec<PartitionId> {
        let inner = &self.inner;
        if inner.peers.remote().is_some() {
            return self.failed_partitions();
        }
        (0..inner.partition_count)
            .filter(|&p| {
                !inner.is_here(p) || inner.shared[usize::from(p)].failed.load(Ordering::Acquire)
            })
            .collect()
    }

    pub fn health(&self) -> Health {
        let inner = &self.inner;
        Health {
            partitions: inner.partition_count,
            failed_partitions: self.unserved_partitions(),
            queue_depth: inner
                .slots
                .iter()
                .map(|slot| slot.queue().as_ref().map_or(0, |q| q.len()))
                .collect(),
            disk: inner.disk.status(),
            damaged_stores: inner.scrubs.damage(),
            stopped_read_models: (inner.projections.iter())
                .filter(|view| view.stopped.load(Ordering::Acquire))
                .map(|view| view.name)
                .collect(),
        }
    }

    /// Looks after `db`, an app's store on disk named `store` in reports, until shutdown: reads
    /// every record of it in the background at `EngineConfig::store_scrub_bytes_per_s`, so that a
    /// damaged block shows in [`Self::health`] and `/metrics` (see `scrub.rs`), and frees what it
    /// replaces outside the lock its reads take (see `release.rs`).
    pub fn tend_store(&self, store: &str, db: fjall::Database) -> std::io::Result<()> {
        tend_store(&self.inner.scrubs, &self.inner.releases, store, db)
    }

    /// Durable records not yet applied to `app`'s projection, over all partitions; `None` without one.
    pub fn projection_lag(&self, app: AppId) -> Option<u64> {
        let view = self.inner.projections.iter().find(|v| v.app == app)?;
        Some(crate::projection::lag_records(
            &self.inner.shared,
            &view.positions,
        ))
    }
}

/// Starts `db`'s scrub and release threads (see [`EngineHandle::tend_store`]).
fn tend_store(
    scrubs: &Scrubs,
    releases: &Releases,
    store: &str,
    db: fjall::Database,
) -> std::io::Result<()> {
    scrubs.start(store, db.clone())?;
    releases.start(store, db)
}

/// Runs `work` on every item with its index, on at most `threads` threads at once, and returns the
/// results in the items' order. A panic in `work` is carried to the caller.
fn in_parallel<T: Send, R: Send>(
    items: Vec<T>,
    threads: usize,
    work: impl Fn(usize, T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.clamp(1, items.len().max(1));
    let mut lanes: Vec<Vec<(usize, T)>> = (0..threads).map(|_| Vec::new()).collect();
    for (index, item) in items.into_iter().enumerate() {
        lanes[index % threads].push((index, item));
    }
    let work = &work;
    let mut results: Vec<(usize, R)> = std::thread::scope(|scope| {
        let running: Vec<_> = lanes
            .into_iter()
            .map(|lane| {
                scope.spawn(move || {
                    lane.into_iter()
                        .map(|(index, item)| (index, work(index, item)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        running
            .into_iter()
            .flat_map(|lane| {
                lane.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    results.sort_unstable_by_key(|(index, _)| *index);
    results.into_iter().map(|(_, result)| result).collect()
}

#[cfg(test)]
mod tests {
    use super::in_parallel;
    use std::collections::HashSet;
    use std::sync::Mutex;

    #[test]
    fn in_parallel_keeps_the_order_and_uses_at_most_the_threads_given() {
        for (items, threads) in [(0, 2), (1, 4), (7, 1), (10, 3), (5, 8)] {
            let names = Mutex::new(HashSet::new());
            let results = in_parallel((0..items).collect(), threads, |index, item: u32| {
                assert_eq!(index as u32, item);
                names.lock().unwrap().insert(std::thread::current().id());
                item * 2
            });
            assert_eq!(results, (0..items).map(|n| n * 2).collect::<Vec<_>>());
            let used = names.into_inner().unwrap().len();
            assert!(used <= threads.min(items as usize), "{used} threads");
        }
    }
}
