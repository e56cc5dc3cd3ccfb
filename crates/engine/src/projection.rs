//! Runs an app's [`Projection`] on its own thread, fed with durable group commits from every partition.
//!
//! The projection's position per partition is the next LSN it has not applied. A checkpoint (snapshot of
//! the read model plus those positions) is written every so often; the journal keeps every record a
//! checkpoint does not cover, so on start-up the projection restores its checkpoint and replays the rest.
//!
//! The feed is bounded, and a writer never waits for it: when a projection is so far behind that its feed
//! is full (a large checkpoint being written, a slow read model), the writer records the batch as dropped
//! and the projection later reads it from the journal (`read_dropped`). Read models lag; acknowledgements
//! do not.

use crate::app::Projection;
use crate::journal::{JournalError, Log, LogStore, Lsn};
use crate::partition::{Feed, PartitionShared};
use crate::record::{Frame, RecordRef, read_frame};
use crate::snapshot;
use crate::wire::{ReadLe, WriteLe};
use crate::{AppId, PartitionId, StartError};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often an idle projection moves past other apps' records (see `pass_other_apps`).
const IDLE_PASS_INTERVAL: Duration = Duration::from_millis(20);

/// How long a projection waits before it reads again records its feed dropped, after the log could not
/// be read (see `read_dropped`).
const DROPPED_READ_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// See `checkpoint_due`.
const PASSED_CHECKPOINT_FACTOR: u64 = 8;

pub(crate) struct ProjectionRuntime {
    pub app: AppId,
    pub name: &'static str,
    projection: Box<dyn Projection>,
    /// Next LSN to apply, per partition.
    next: Vec<Lsn>,
    /// `next` as of the read model's last flush, which is what readers see; read by other threads for
    /// the lag, so a lag of zero means every durable record can be read from the model.
    pub positions: Arc<Vec<AtomicU64>>,
    /// Set when this read model's thread ended by a panic (an event it cannot read): it applies nothing
    /// more, and `Health` names it.
    pub stopped: Arc<AtomicBool>,
    /// Per partition, the LSN the last checkpoint covers: the journal must keep everything from there.
    pub floors: Vec<Arc<AtomicU64>>,
    dir: PathBuf,
    checkpoint_interval_records: u64,
    checkpoint_interval_bytes: u64,
    since_checkpoint: u64,
    /// Journal bytes of this app's records applied since the last checkpoint: a few large records
    /// (a batch of thousands of operations is one) would otherwise hold the journal for long.
    bytes_since_checkpoint: u64,
    /// Other apps' records passed since the last checkpoint (see `checkpoint_due`).
    passed_since_checkpoint: u64,
    /// Bytes of the newest checkpoint (0 if none): the smaller the read model, the sooner the next
    /// one falls due, and the less a restart catches up (`snapshot::journal_bytes_between`).
    checkpoint_bytes: u64,
    /// The least time between two passes of this read model that a group commit started: one that
    /// comes sooner waits for the rest of it, and the group commits of the interval are applied and
    /// flushed together. Zero if requests wait for the model (`Projection::requests_wait`).
    pass_interval: Duration,
    lag: Gauge,
    journal_reads: Counter,
    partitions: Vec<Arc<PartitionShared>>,
    /// The partitions' logs, for the batches the feed dropped.
    logs: Arc<dyn LogStore>,
    /// Per partition: after a failed read of what the feed dropped, when to try again.
    dropped_read_retry_at: Vec<Option<Instant>>,
}

impl ProjectionRuntime {
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        app: AppId,
        name: &'static str,
        mut projection: Box<dyn Projection>,
        dir: PathBuf,
        partition_count: u16,
        checkpoint_interval_records: u64,
        checkpoint_interval_bytes: u64,
        pass_interval: Duration,
        lag: Gauge,
        journal_reads: Counter,
        partitions: Vec<Arc<PartitionShared>>,
        logs: Arc<dyn LogStore>,
    ) -> Result<Self, StartError> {
        let mut positions = vec![0; usize::from(partition_count)];
        let path = dir.join(file_name(name));
        let checkpoint_bytes = std::fs::metadata(&path).map_or(0, |file| file.len());
        if path.exists() {
            let restored = snapshot::open(&path).and_then(|mut input| {
                let count = input.read_u32_le()?;
                if count != u32::from(partition_count) {
                    return Err(std::io::Error::other(format!(
                        "checkpoint is for {count} partitions"
                    )));
                }
                for position in positions.iter_mut() {
                    *position = input.read_u64_le()?;
                }
                input.end_section("positions")?;
                projection.restore(&mut input, &positions)?;
                input.end_section(name)?;
                input.finish()
            });
            restored.map_err(|e| {
                StartError::Unrecoverable(format!("projection checkpoint {}: {e}", path.display()))
            })?;
        }
        let pass_interval = if projection.requests_wait() {
            Duration::ZERO
        } else {
            pass_interval
        };
        Ok(Self {
            app,
            name,
            pass_interval,
            projection,
            floors: positions
                .iter()
                .map(|&p| Arc::new(AtomicU64::new(p)))
                .collect(),
            positions: Arc::new(positions.iter().map(|&p| AtomicU64::new(p)).collect()),
            stopped: Arc::new(AtomicBool::new(false)),
            next: positions,
            dir,
            checkpoint_interval_records,
            checkpoint_interval_bytes,
            since_checkpoint: 0,
            bytes_since_checkpoint: 0,
            passed_since_checkpoint: 0,
            checkpoint_bytes,
            lag,
            journal_reads,
            partitions,
            logs,
            dropped_read_retry_at: vec![None; usize::from(partition_count)],
        })
    }

    /// Replays what the journal of `partition` holds beyond this projection's position.
    pub fn catch_up(&mut self, partition: PartitionId, log: &dyn Log) -> Result<(), StartError> {
        let from = self.next[usize::from(partition)];
        log.replay(from, &mut |lsn, kind, body| {
            self.apply_record(partition, lsn, kind, body)
                .map_err(|reason| JournalError::Corrupt {
                    path: "journal".into(),
                    offset: lsn,
                    reason,
                })
        })
        .map_err(|e| {
            StartError::Unrecoverable(format!("rebuilding projection {}: {e}", self.name))
        })?;
        self.flush();
        Ok(())
    }

    /// Has the read model write what it was handed, then shows readers the positions it now covers.
    fn flush(&mut self) {
        self.projection.flush();
        for (published, next) in self.positions.iter().zip(&self.next) {
            published.store(*next, Ordering::Release);
        }
    }

    fn apply_record(
        &mut self,
        partition: PartitionId,
        lsn: Lsn,
        kind: u8,
        body: &[u8],
    ) -> Result<(), String> {
        if lsn < self.next[usize::from(partition)] {
            return Ok(());
        }
        let record = RecordRef::decode(kind, body).map_err(|e| format!("record {lsn}: {e}"))?;
        if record.envelope.app == self.app {
            for event in record.events() {
                (self.projection)
                    .apply(partition, lsn, record.envelope.timestamp_ms, event)
                    .map_err(|e| format!("an event of record {lsn} cannot be read: {e}"))?;
            }
            self.since_checkpoint += 1;
            self.bytes_since_checkpoint += body.len() as u64;
        }
        self.next[usize::from(partition)] = lsn + 1;
        Ok(())
    }

    /// Applies from the journal what the feed of `partition` dropped while this projection lagged, so
    /// that nothing after it is applied before it. False while some of it is left unread: the log could
    /// not be read (a replicated log's brokers out of reach), and is tried again after
    /// [`DROPPED_READ_RETRY_INTERVAL`]. An event the read model cannot apply stops it, as from the feed.
    fn read_dropped(&mut self, partition: PartitionId) -> bool {
        let index = usize::from(partition);
        let dropped_end =
            self.partitions[index].feed_dropped_end[usize::from(self.app)].load(Ordering::Acquire);
        let from = self.next[index];
        if dropped_end <= from {
            return true;
        }
        if self.dropped_read_retry_at[index].is_some_and(|at| Instant::now() < at) {
            return false;
        }
        self.journal_reads.inc();
        let logs = self.logs.clone();
        let mut unappliable = None;
        let read = logs.read_range(partition, from, dropped_end, &mut |lsn, kind, body| {
            self.apply_record(partition, lsn, kind, body)
                .map_err(|reason| {
                    unappliable = Some(reason.clone());
                    JournalError::Corrupt {
                        path: format!("journal of partition {partition}").into(),
                        offset: lsn,
                        reason,
                    }
                })
        });
        match read {
            Ok(()) => {
                self.dropped_read_retry_at[index] = None;
                true
            }
            Err(error) => {
                if let Some(reason) = unappliable {
                    panic!("projection {}: {reason}", self.name);
                }
                tracing::warn!(
                    projection = self.name,
                    partition,
                    %error,
                    "cannot read records {}..{dropped_end} that the feed dropped; trying again",
                    self.next[index]
                );
                self.dropped_read_retry_at[index] =
                    Some(Instant::now() + DROPPED_READ_RETRY_INTERVAL);
                false
            }
        }
    }

    fn apply_feed(&mut self, feed: &Feed) {
        if !self.read_dropped(feed.partition) {
            // Its records come after some not read yet: they are read from the log with those.
            let end_lsn = feed.first_lsn + frame_count(&feed.frames);
            self.partitions[usize::from(feed.partition)].feed_dropped_end[usize::from(self.app)]
                .fetch_max(end_lsn, Ordering::AcqRel);
            return;
        }
        let mut offset = 0;
        let mut lsn = feed.first_lsn;
        while offset < feed.frames.len() {
            let Frame::Valid {
                kind,
                body,
                total_bytes,
            } = read_frame(&feed.frames[offset..])
            else {
                panic!("a durable group commit holds an invalid frame at byte {offset}");
            };
            if let Err(reason) = self.apply_record(feed.partition, lsn, kind, body) {
                panic!("projection {}: {reason}", self.name);
            }
            offset += total_bytes;
            lsn += 1;
        }
    }

    fn update_lag(&self) {
        self.lag
            .set(lag_records(&self.partitions, &self.positions) as i64);
    }

    fn checkpoint(&mut self) -> Result<(), JournalError> {
        self.flush();
        let positions = self.next.clone();
        let projection = &self.projection;
        let path = snapshot::write_atomically(&self.dir, &file_name(self.name), |out| {
            out.write_u32_le(positions.len() as u32)?;
            for position in &positions {
                out.write_u64_le(*position)?;
            }
            out.end_section()?;
            projection.write_snapshot(out)?;
            out.flush()?;
            out.end_section()
        })?;
        self.checkpoint_bytes = std::fs::metadata(&path).map_or(0, |file| file.len());
        for (floor, position) in self.floors.iter().zip(&positions) {
            floor.store(*position, Ordering::Release);
        }
        self.since_checkpoint = 0;
        self.bytes_since_checkpoint = 0;
        self.passed_since_checkpoint = 0;
        Ok(())
    }

    /// Moves each partition's position past records of other apps: they are never fed to this projection,
    /// and a position left behind them would hold the journal (the checkpoint floor) and show as lag.
    /// Reads every partition's `fed_lsn` before draining the feed, so every batch below it that concerns
    /// this projection is applied first.
    fn pass_other_apps(&mut self, feeds: &Receiver<Feed>) {
        let fed: Vec<Lsn> = self
            .partitions
            .iter()
            .map(|p| p.fed_lsn.load(Ordering::Acquire))
            .collect();
        while let Ok(feed) = feeds.try_recv() {
            self.apply_feed(&feed);
        }
        for (index, fed) in fed.into_iter().enumerate() {
            // Not past records of this app left unread.
            if self.read_dropped(index as PartitionId) && fed > self.next[index] {
                self.passed_since_checkpoint += fed - self.next[index];
                self.next[index] = fed;
            }
        }
    }

    /// After `checkpoint_interval_records` (or `checkpoint_interval_bytes`, less for a small read
    /// model) of this app's records, or eight times as many of other apps' (so an idle projection
    /// still lets the journal go, without rewriting a large read model often).
    fn checkpoint_due(&self) -> bool {
        self.since_checkpoint >= self.checkpoint_interval_records
            || self.bytes_since_checkpoint
                >= snapshot::journal_bytes_between(
                    self.checkpoint_bytes,
                    self.checkpoint_interval_bytes,
                )
            || self.passed_since_checkpoint
                >= PASSED_CHECKPOINT_FACTOR * self.checkpoint_interval_records
    }

    pub fn run(mut self, feeds: Receiver<Feed>) {
        let _marks_a_panic = MarkStoppedOnPanic(self.stopped.clone());
        let mut next_fed_pass = Instant::now();
        loop {
            match feeds.recv_timeout(IDLE_PASS_INTERVAL) {
                Ok(feed) => {
                    self.apply_feed(&feed);
                    // Below the peak every group commit is small and would be a wake-up and a flush
                    // of its own; what comes meanwhile is drained below, in the same pass. A feed
                    // half full (a burst, a cluster node catching up) is drained at once instead.
                    let rest = next_fed_pass.saturating_duration_since(Instant::now());
                    if !rest.is_zero() && feeds.len() < feeds.capacity().unwrap_or(0) / 2 {
                        std::thread::sleep(rest);
                    }
                    next_fed_pass = Instant::now() + self.pass_interval;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.pass_other_apps(&feeds);
            self.flush();
            self.update_lag();
            if self.checkpoint_due()
                && let Err(error) = self.checkpoint()
            {
                tracing::error!(projection = self.name, %error, "projection checkpoint failed");
            }
        }
        // Every writer has stopped: the projection has seen all that is durable.
        self.pass_other_apps(&feeds);
        self.flush();
        self.update_lag();
        if let Err(error) = self.checkpoint() {
            tracing::error!(projection = self.name, %error, "final projection checkpoint failed");
        }
    }
}

/// Marks a read model stopped if its thread unwinds: a panic is how it refuses to go on past a record
/// it cannot apply, rather than serve a model that skipped it.
struct MarkStoppedOnPanic(Arc<AtomicBool>);

impl Drop for MarkStoppedOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

/// Durable records not yet applied by a projection at `positions`, over all partitions.
pub(crate) fn lag_records(partitions: &[Arc<PartitionShared>], positions: &[AtomicU64]) -> u64 {
    partitions
        .iter()
        .zip(positions)
        .map(|(shared, position)| {
            shared
                .durable_lsn
                .load(Ordering::Acquire)
                .saturating_sub(position.load(Ordering::Acquire))
        })
        .sum()
}

/// The records in `frames`, a durable group commit.
fn frame_count(frames: &[u8]) -> Lsn {
    let (mut offset, mut count) = (0, 0);
    while offset < frames.len() {
        let Frame::Valid { total_bytes, .. } = read_frame(&frames[offset..]) else {
            panic!("a durable group commit holds an invalid frame at byte {offset}");
        };
        offset += total_bytes;
        count += 1;
    }
    count
}

fn file_name(name: &str) -> String {
    format!("{name}.snap")
}
