//! Wiring: start-up (recovery of every partition and projection), the handle callers use, shutdown.

use crate::app::{AppSpec, StateMachine};
use crate::core::Core;
use crate::idempotency::IdempotencyTable;
use crate::journal::{FileLogStore, JournalConfig, Log, LogStore};
use crate::metrics::{EngineMetrics, PartitionMetrics};
use crate::partition::{self, Internal, Limits, PartitionShared, Request};
use crate::projection::ProjectionRuntime;
use crate::{AppId, CommandId, EngineError, PartitionId, Reply, StartError};
use crossbeam_channel::{Receiver, Sender, bounded};
use prometheus_client::registry::Registry;
use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

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
    /// Minimum time between two journal flushes of a partition; 0 flushes as soon as the writer is free.
    pub flush_interval: Duration,
    pub snapshot_interval_records: u64,
    pub idempotency_window_ms: u64,
    pub idempotency_entries_max: usize,
    /// Unacknowledged follow-ups per destination before a partition stops taking new client commands.
    pub follow_ups_in_flight_max: usize,
    pub projection_checkpoint_interval_records: u64,
    /// Group commits queued for a projection; a projection further behind reads the journal instead.
    pub projection_feed_batches_max: usize,
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
            flush_interval: Duration::ZERO,
            snapshot_interval_records: 1_000_000,
            idempotency_window_ms: 24 * 60 * 60 * 1000,
            idempotency_entries_max: 1_000_000,
            follow_ups_in_flight_max: 16_384,
            projection_checkpoint_interval_records: 1_000_000,
            projection_feed_batches_max: 1024,
        }
    }
}

/// Per-partition view for health checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub partitions: u16,
    pub failed_partitions: Vec<PartitionId>,
    pub queue_depth: Vec<usize>,
}

struct ProjectionView {
    app: AppId,
    positions: Arc<Vec<AtomicU64>>,
}

struct Inner {
    partition_count: u16,
    queues: Vec<Sender<Request>>,
    internal: Vec<Sender<Internal>>,
    shared: Vec<Arc<PartitionShared>>,
    metrics: Vec<PartitionMetrics>,
    projections: Vec<ProjectionView>,
}

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
    threads: Vec<JoinHandle<()>>,
    projection_threads: Vec<JoinHandle<()>>,
}

const META_FILE: &str = "spate.meta";

/// The partition count is fixed for the life of a data directory: keys were placed by it.
fn check_meta(data_dir: &Path, partitions: u16) -> Result<(), StartError> {
    let path = data_dir.join(META_FILE);
    let expected = format!("partitions = {partitions}\n");
    match std::fs::read_to_string(&path) {
        Ok(found) if found == expected => Ok(()),
        Ok(found) => Err(StartError::Config(format!(
            "{} was created with `{}`, but {partitions} partitions were requested; the partition count of a data \
             directory cannot change",
            data_dir.display(),
            found.trim()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let io = |source| crate::journal::JournalError::Io {
                path: path.clone(),
                source,
            };
            std::fs::write(&path, expected).map_err(io)?;
            crate::journal::sync_dir(data_dir)?;
            Ok(())
        }
        Err(source) => Err(crate::journal::JournalError::Io { path, source }.into()),
    }
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
        Self::start_on(logs, config, apps, registry)
    }

    /// Like [`Self::start`], with the partitions' logs in `logs` (for example a replicated log); snapshots
    /// and projection checkpoints stay in `config.data_dir`.
    pub fn start_on(
        logs: Arc<dyn LogStore>,
        config: EngineConfig,
        mut apps: Vec<AppSpec>,
        registry: &mut Registry,
    ) -> Result<Self, StartError> {
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
        check_meta(&config.data_dir, config.partitions)?;
        let partition_count = config.partitions;
        let metrics = EngineMetrics::register(registry);
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
                    metrics.projection_lag(spec.name),
                    metrics.projection_journal_reads(spec.name),
                    shared.clone(),
                    logs.clone(),
                )?);
            }
        }

        let empty_idempotency =
            IdempotencyTable::new(config.idempotency_window_ms, config.idempotency_entries_max);
        // Opening a replicated log takes round trips (fencing the old owner, reading to the end): open
        // every partition's at once.
        let journals = std::thread::scope(|scope| {
            let opening: Vec<_> = (0..partition_count)
                .map(|partition| {
                    let logs = &logs;
                    scope.spawn(move || logs.open(partition))
                })
                .collect();
            opening
                .into_iter()
                .map(|thread| thread.join().expect("opening a log does not panic"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        let mut recovered: Vec<(Core, Box<dyn Log>, PathBuf)> = Vec::new();
        for (partition, journal) in (0..partition_count).zip(journals) {
            let snapshot_dir = crate::partition_dir(&config.data_dir, partition).join("snapshots");
            let core = crate::recovery::recover_partition(
                partition,
                partition_count,
                &apps,
                &empty_idempotency,
                journal.as_ref(),
                &snapshot_dir,
            )?;
            for projection in &mut projections {
                projection.catch_up(partition, journal.as_ref())?;
            }
            recovered.push((core, journal, snapshot_dir));
        }

        let internal_capacity =
            2 * usize::from(partition_count) * config.follow_ups_in_flight_max + 16;
        let (internal_tx, internal_rx): (Vec<_>, Vec<_>) = (0..partition_count)
            .map(|_| bounded(internal_capacity))
            .unzip();
        let peers = Arc::new(internal_tx.clone());
        let limits = Limits {
            batch_bytes_max: config.batch_bytes_max,
            batch_records_max: config.batch_records_max,
            flush_interval: config.flush_interval,
            snapshot_interval_records: config.snapshot_interval_records,
            follow_ups_in_flight_max: config.follow_ups_in_flight_max,
        };

        // Feeds are bounded: a projection that falls this many group commits behind reads the journal.
        let mut feeds = Vec::new();
        let mut projection_threads = Vec::new();
        let mut views = Vec::new();
        let mut floors_by_partition: Vec<Vec<Arc<AtomicU64>>> =
            vec![Vec::new(); usize::from(partition_count)];
        for projection in projections {
            let (feed_tx, feed_rx) = bounded(config.projection_feed_batches_max.max(1));
            feeds.push((projection.app, feed_tx));
            views.push(ProjectionView {
                app: projection.app,
                positions: projection.positions.clone(),
            });
            for (partition, floor) in projection.floors.iter().enumerate() {
                floors_by_partition[partition].push(floor.clone());
            }
            let name = format!("projection-{}", projection.name);
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || projection.run(feed_rx))
                .map_err(|e| StartError::Config(format!("spawning a projection thread: {e}")))?;
            projection_threads.push(thread);
        }

        let mut queues = Vec::new();
        let mut partition_metrics = Vec::new();
        let mut threads = Vec::new();
        for (((core, log, snapshot_dir), internal), floors) in recovered
            .into_iter()
            .zip(internal_rx)
            .zip(floors_by_partition)
        {
            let partition = core.partition;
            let (queue_tx, queue_rx) = bounded(config.queue_capacity);
            let metrics = metrics.for_partition(partition);
            let (partition_thread, writer_thread) = partition::pair(
                core,
                log,
                queue_rx,
                internal,
                peers.clone(),
                feeds.clone(),
                floors,
                limits.clone(),
                shared[usize::from(partition)].clone(),
                metrics.clone(),
                snapshot_dir,
            );
            let spawn = |name: String, body: Box<dyn FnOnce() + Send>| {
                std::thread::Builder::new()
                    .name(name)
                    .spawn(body)
                    .map_err(|e| StartError::Config(format!("spawning a partition thread: {e}")))
            };
            threads.push(spawn(
                format!("partition-{partition}"),
                Box::new(move || partition_thread.run()),
            )?);
            threads.push(spawn(
                format!("journal-{partition}"),
                Box::new(move || writer_thread.run()),
            )?);
            queues.push(queue_tx);
            partition_metrics.push(metrics);
        }
        // Only the writers may hold feed senders: projections end when the last writer stops.
        drop(feeds);

        let inner = Inner {
            partition_count,
            queues,
            internal: internal_tx,
            shared,
            metrics: partition_metrics,
            projections: views,
        };
        Ok(Self {
            handle: EngineHandle {
                inner: Arc::new(inner),
            },
            threads,
            projection_threads,
        })
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Drains every partition, writes final snapshots, syncs the journals and waits for the threads.
    pub fn shutdown(self) -> Result<(), String> {
        let mut errors = Vec::new();
        let waits = self.handle.broadcast(Internal::Shutdown);
        for (partition, wait) in waits.into_iter().enumerate() {
            match wait.recv() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => errors.push(format!("partition {partition}: {error}")),
                Err(_) => errors.push(format!(
                    "partition {partition}: thread ended without answering"
                )),
            }
        }
        for thread in self.threads.into_iter().chain(self.projection_threads) {
            if thread.join().is_err() {
                errors.push("a thread panicked".into());
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
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

    fn queue(&self, partition: PartitionId) -> (&Sender<Request>, &PartitionMetrics) {
        let index = usize::from(partition);
        assert!(
            index < self.inner.queues.len(),
            "partition {partition} out of range"
        );
        (&self.inner.queues[index], &self.inner.metrics[index])
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
    pub fn enqueue(
        &self,
        partition: PartitionId,
        app: AppId,
        command_id: Option<CommandId>,
        payload: Vec<u8>,
    ) -> Result<Pending, Refused> {
        let (reply_to, reply) = tokio::sync::oneshot::channel();
        let (queue, metrics) = self.queue(partition);
        let request = Request::Command {
            app,
            command_id,
            payload,
            reply_to,
        };
        match partition::offer(queue, request, metrics) {
            Ok(()) => Ok(Pending(reply)),
            Err((error, Request::Command { payload, .. })) => Err(Refused { error, payload }),
            Err((error, Request::Query(_))) => {
                unreachable!("offered a command, got back {error:?} with a query")
            }
        }
    }

    /// Runs `read` on the partition's state of `app` (of type `S`), in order with the commands queued
    /// before it, and returns its result once everything it saw is durable.
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
        let (reply_to, reply) = tokio::sync::oneshot::channel();
        let query: partition::QueryFn = Box::new(move |core: &Core| {
            let result = core
                .app_state(app)
                .and_then(|state| (state as &dyn Any).downcast_ref::<S>())
                .map(read)
                .ok_or(EngineError::UnknownApp(app));
            Box::new(move |durable: Result<(), EngineError>| {
                let _ = reply_to.send(durable.and(result));
            })
        });
        let (queue, metrics) = self.queue(partition);
        partition::offer(queue, Request::Query(query), metrics).map_err(|(error, _)| error)?;
        reply.await.map_err(|_| EngineError::ShuttingDown)?
    }

    /// Sends a control message to every partition; each answers on its own channel.
    fn broadcast(
        &self,
        message: fn(Sender<Result<(), String>>) -> Internal,
    ) -> Vec<Receiver<Result<(), String>>> {
        self.inner
            .internal
            .iter()
            .map(|internal| {
                let (done_tx, done_rx) = bounded(1);
                let _ = internal.send(message(done_tx));
                done_rx
            })
            .collect()
    }

    /// Snapshots every partition now (blocking); for operators and tests.
    pub fn snapshot_now(&self) -> Result<(), String> {
        let waits = self.broadcast(Internal::Snapshot);
        for wait in waits {
            wait.recv().map_err(|_| "engine stopped".to_string())??;
        }
        Ok(())
    }

    pub fn health(&self) -> Health {
        let inner = &self.inner;
        Health {
            partitions: inner.partition_count,
            failed_partitions: (0..inner.partition_count)
                .filter(|&p| inner.shared[usize::from(p)].failed.load(Ordering::Acquire))
                .collect(),
            queue_depth: inner.queues.iter().map(|q| q.len()).collect(),
        }
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
