//! The two threads of a partition.
//!
//! The *partition thread* owns the [`Core`] and is the only writer of its state: it takes requests from a
//! bounded queue, applies them, and builds the next group commit. The *writer thread* owns the [`Log`]: it
//! appends each group commit, fsyncs it, and only then releases what depends on it (replies, follow-ups,
//! acknowledgements, projection feeds). While the writer fsyncs one batch, the partition applies the next,
//! so the batch size adapts to the load by itself.

use crate::archive::{ArchiveStore, ArchivedRecord};
use crate::cluster::Peers;
use crate::core::{Admission, Core, FollowUp, Outgoing};
use crate::journal::{JournalError, Log, Lsn};
use crate::metrics::PartitionMetrics;
use crate::record::{Envelope, Origin, begin_record, finish_record};
use crate::snapshot::{ChunkReceiver, ChunkSender, Unpublished};
use crate::stepped_snapshot::SteppedSnapshot;
use crate::thread_time::PauseTimer;
use crate::{AppId, CommandId, EngineError, PartitionId, Reply, StateMachine, app_bit};
use crossbeam_channel::{Receiver, Select, Sender, TryRecvError, TrySendError, bounded};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub(crate) use crate::cluster::ReplySender;
/// Sends a query's result once everything the query saw is durable (or reports why it is not).
pub(crate) type Deliver = Box<dyn FnOnce(Result<(), EngineError>) + Send>;
pub(crate) type QueryFn = Box<dyn FnOnce(&Core) -> Deliver + Send>;

/// From clients, through the bounded queue that gives back-pressure.
pub(crate) enum Request {
    Command {
        app: AppId,
        command_id: Option<CommandId>,
        payload: Vec<u8>,
        reply_to: ReplySender,
    },
    Query(QueryFn),
}

/// From other partitions and the engine. Never refused: its volume is bounded by the follow-up window.
pub(crate) enum Internal {
    FollowUp(FollowUp),
    Ack { destination: PartitionId, seq: u64 },
    Snapshot(Sender<Result<(), String>>),
    Shutdown(Sender<Result<(), String>>, Frees),
}

/// When a stopping partition frees its apps' states.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Frees {
    /// After the stop answers, on a thread of their own: the whole engine stops, and a large state goes
    /// back one allocation at a time (measured: 1.6-1.7 s per partition for fraud's 5 M cards x 20), while
    /// a process that exits meanwhile returns its memory at once.
    InBackground,
    /// Before the stop answers: the partition is handed over and the node goes on, and may take it back;
    /// it must not hold the old state beside a new one.
    BeforeAnswering,
}

/// Records flow to projections in whole group commits, shared rather than copied.
pub(crate) struct Feed {
    pub partition: PartitionId,
    pub first_lsn: Lsn,
    pub frames: Arc<Vec<u8>>,
}

enum Release {
    Reply(ReplySender, Reply),
    Deliver(Deliver),
}

#[derive(Default)]
struct Batch {
    frames: Vec<u8>,
    first_lsn: Lsn,
    record_count: u64,
    releases: Vec<Release>,
    sends: Vec<Outgoing>,
    acks: Vec<(PartitionId, u64)>,
    apps: u64,
    /// Records the batch's commands archived, for the writer to store once the batch is durable.
    archived: Vec<ArchivedRecord>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.size() == 0
    }

    /// Its items: records, and the replies, follow-ups and acknowledgements that wait for them. Only grows
    /// until the batch is taken.
    fn size(&self) -> usize {
        self.record_count as usize + self.releases.len() + self.sends.len() + self.acks.len()
    }
}

/// How long a batch waits for more before it goes to the writer. A group commit costs the same CPU
/// whatever it holds (on this project's VMs about 40 µs for `fdatasync` alone, two requests to the
/// virtual disk, BENCHMARKS.md): below the peak, a batch handed over the moment the writer is free holds a
/// few records, and the server spends more per request than at the peak. So a batch waits while requests
/// keep joining it: it may go once none joined for `quiet` (the burst that built it is over, as when every
/// client of a closed loop has sent its request) or once its first item joined `max` ago (a steady stream
/// would otherwise hold it forever), and it goes at that moment or when the writer is free, whichever is
/// later: both clocks run while the writer still writes the batch before. Off (zero) unless both are set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Linger {
    pub quiet: Duration,
    pub max: Duration,
}

/// Linux wakes a thread that sleeps with a timeout up to its timer slack late, 50 µs by default: as much
/// as a linger's quiet time. One nanosecond of slack costs the partition thread the timer's precision
/// only: a lingering batch's timer expires at most once per group commit (the others are rearmed before
/// they expire, as requests keep coming).
fn precise_timeouts() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and changes only the calling thread.
    if unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "timer slack not set");
    }
}

impl Linger {
    pub fn is_on(&self) -> bool {
        !self.quiet.is_zero() && !self.max.is_zero()
    }

    /// When the batch may go to the writer; `None` while it is empty.
    fn hand_off_at(&self, growth: &BatchGrowth) -> Option<Instant> {
        let (opened_at, grew_at) = (growth.opened_at?, growth.grew_at?);
        if !self.is_on() {
            return Some(opened_at);
        }
        Some((grew_at + self.quiet).min(opened_at + self.max))
    }
}

/// When the batch being built got its first item and when it last grew, seen by the partition's loop
/// (one clock read per turn, not per request).
#[derive(Debug, Default)]
struct BatchGrowth {
    size: usize,
    opened_at: Option<Instant>,
    grew_at: Option<Instant>,
}

impl BatchGrowth {
    fn observe(&mut self, size: usize, now: Instant) {
        debug_assert!(size >= self.size, "a batch only grows until it is taken");
        if size > self.size {
            self.opened_at.get_or_insert(now);
            self.grew_at = Some(now);
            self.size = size;
        }
    }
}

enum ToWriter {
    Batch(Batch),
    Barrier(Sender<Result<(), JournalError>>),
    ReleaseBefore(Lsn),
    SnapshotWritten(Lsn, PathBuf),
    Stop(Sender<Result<(), JournalError>>),
}

/// What other threads may read of a partition.
#[derive(Debug)]
pub(crate) struct PartitionShared {
    pub durable_lsn: AtomicU64,
    /// Every durable batch below this LSN has been handed to the projections it concerns (or, when a
    /// projection's feed was full, recorded in `feed_dropped_end`). A projection that has drained its
    /// feed after reading this may move past other apps' records up to here.
    pub fed_lsn: AtomicU64,
    /// Per app: every batch that app's projection did not get because its feed was full lies below this
    /// LSN; the projection reads those records from the journal. Only grows.
    pub feed_dropped_end: [AtomicU64; APPS_MAX],
    pub failed: AtomicBool,
    /// Set with `failed` when the journal failed because another writer took the log over
    /// ([`JournalError::Fenced`]); cleared with it by the partition's next start.
    pub fenced: AtomicBool,
    /// Every record archived before this LSN is in the archive's store; the partition may drop it from
    /// memory. Stops growing for good if the store fails, so that nothing unstored is dropped.
    pub archived_lsn: AtomicU64,
    /// On a cluster node, until when the partition may answer reads from its own state (see
    /// [`ReadLease`]); unused on a single node.
    pub read_lease: ReadLease,
}

/// How long a cluster node may go on answering reads of a partition from the state it holds. Fencing
/// keeps an old owner's writes out of the log, not its reads: a node paused while its lease moved
/// answers, once resumed and until it notices, from a state that misses what the new owner
/// acknowledged. The membership extends the lease each time the group's description shows this node
/// holding the partition, by a margin the group's session timeout guarantees no other node can own it
/// within (`spate_kafka::membership`); reads after it are refused as `NotOwner` (and forwarded).
#[derive(Debug)]
pub(crate) struct ReadLease {
    base: Instant,
    /// Nanoseconds after `base`; only grows.
    until_ns: AtomicU64,
}

impl Default for ReadLease {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            until_ns: AtomicU64::new(0),
        }
    }
}

impl ReadLease {
    pub fn extend_to(&self, until: Instant) {
        let until_ns = until.saturating_duration_since(self.base).as_nanos() as u64;
        self.until_ns.fetch_max(until_ns, Ordering::AcqRel);
    }

    pub fn holds_at(&self, now: Instant) -> bool {
        (now.saturating_duration_since(self.base).as_nanos() as u64)
            < self.until_ns.load(Ordering::Acquire)
    }
}

/// What one start of a partition (one [`pair`]) has made durable, and whether its journal failed: the
/// word of its own writer, which is all its threads may trust. [`PartitionShared`] outlives the start
/// and hears others: on a cluster node, `EngineHandle::follow` raises its `durable_lsn` with records
/// another owner committed, and the partition's next start clears its `failed`. A start fenced off
/// its log has applied records that will never be in it; had its snapshot waited on the shared word, it
/// would have been published with them, holding records that are not the log's at those LSNs, and a
/// later recovery from it would skip the log's own (acknowledged) ones.
#[derive(Debug)]
pub(crate) struct WriterProgress {
    /// Every record below this LSN is durable in this start's log.
    durable_lsn: AtomicU64,
    /// Set once an append failed; never cleared.
    failed: AtomicBool,
}

impl WriterProgress {
    fn new(durable_lsn: Lsn) -> Self {
        Self {
            durable_lsn: AtomicU64::new(durable_lsn),
            failed: AtomicBool::new(false),
        }
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// App ids are below this.
pub(crate) const APPS_MAX: usize = 64;

impl Default for PartitionShared {
    fn default() -> Self {
        Self {
            durable_lsn: AtomicU64::new(0),
            fed_lsn: AtomicU64::new(0),
            feed_dropped_end: std::array::from_fn(|_| AtomicU64::new(0)),
            failed: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            archived_lsn: AtomicU64::new(0),
            read_lease: ReadLease::default(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub batch_bytes_max: usize,
    pub batch_records_max: usize,
    pub linger: Linger,
    pub snapshot_interval_records: u64,
    pub snapshot_interval_bytes: u64,
    pub snapshot_interval_apply: Duration,
    pub snapshot_step_bytes: usize,
    pub follow_ups_in_flight_max: usize,
    /// In a cluster, follow-ups that made no progress for this long are sent again (a message between
    /// nodes can be lost); `None` on a single node, where channels lose nothing.
    pub resend_interval: Option<Duration>,
    /// Whether reads need the partition's [`ReadLease`]: on a cluster node.
    pub reads_need_lease: bool,
}

/// What a partition applied since its newest snapshot began: what a restart would replay. A snapshot
/// falls due when any of it reaches its interval. Recovery starts it at what it replayed, so that a
/// partition killed again and again before its next snapshot does not replay an ever longer journal.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SinceSnapshot {
    pub records: u64,
    /// Journal bytes: a few large records (a batch of 8,000 transfers is one) would otherwise keep the
    /// journal from being released for a long time.
    pub journal_bytes: u64,
    /// Time spent applying: a small record can stand for much work (one part of a generated fraud
    /// history is 100,000 records), and replay does that work again.
    pub apply_time: Duration,
    /// Bytes of the newest snapshot whose size is known (written, or restored at start-up; 0 if
    /// none): the smaller it is, the sooner the next one falls due (`snapshot::journal_bytes_between`).
    pub snapshot_bytes: u64,
}

impl SinceSnapshot {
    /// Whether any measure reached its interval divided by `divisor` (1: the snapshot is due).
    fn reached(&self, limits: &Limits, divisor: u32) -> bool {
        self.records >= limits.snapshot_interval_records / u64::from(divisor)
            || self.journal_bytes >= self.journal_bytes_max(limits) / u64::from(divisor)
            || self.apply_time >= limits.snapshot_interval_apply / divisor
    }

    /// The journal bytes after which the next snapshot falls due.
    fn journal_bytes_max(&self, limits: &Limits) -> u64 {
        crate::snapshot::journal_bytes_between(self.snapshot_bytes, limits.snapshot_interval_bytes)
    }

    /// Counts from a snapshot just begun, whose size is not known yet.
    fn restart(&mut self) {
        *self = Self {
            snapshot_bytes: self.snapshot_bytes,
            ..Self::default()
        };
    }

    /// Counts one record applied.
    pub(crate) fn add(&mut self, journal_bytes: usize, apply_time: Duration) {
        self.records += 1;
        self.journal_bytes += journal_bytes as u64;
        self.apply_time += apply_time;
    }
}

/// Requests taken from the queues per wake-up before the batch is offered to the writer again.
const DRAIN_MAX: usize = 4096;

/// The longest a partition goes on with a late snapshot's steps at a time. A snapshot is late once a
/// quarter of the interval that made it due has gone by without it being whole; from then on the
/// partition steps for as long as it applied since the last steps, up to this: a busy partition gives
/// the snapshot up to half its time, so that a state far larger than the interval is still written
/// while the load goes on (one step per step's budget of journal fell ever further behind fraud's 750 MB
/// per partition, BENCHMARKS.md), and no pause grows past this plus one step. A snapshot on time keeps
/// to one step at a time, the shortest pauses.
const SNAPSHOT_STEPS_MAX: Duration = Duration::from_millis(3);

/// Chunks of a snapshot (1 MiB each) queued for the thread that writes its file: a partition waits for
/// the file system only when this many are behind.
const SNAPSHOT_CHUNKS_QUEUED: usize = 16;

/// How long a partition goes on applying without stepping its snapshot while the file's thread is
/// behind (over half of the chunk queue taken: the disk is slower than the steps, or stalled in
/// writeback). Past it the partition steps again and waits for the file system in its steps, so that
/// what apply forces out of the snapshot meanwhile (copy-on-write, held until the next step) stays
/// bounded. In a diagnostic run at fraud's 30 M cards the three pauses over 40 ms (48-85 ms) were such
/// waits: the partition slept in them, with under 1 ms of CPU.
const SNAPSHOT_FILE_BEHIND_MAX: Duration = Duration::from_millis(250);

pub(crate) struct PartitionThread {
    pub core: Core,
    pub external: Receiver<Request>,
    pub internal: Receiver<Internal>,
    pub limits: Limits,
    pub shared: Arc<PartitionShared>,
    progress: Arc<WriterProgress>,
    pub metrics: PartitionMetrics,
    pub snapshot_dir: PathBuf,
    /// Per projection: the LSN of this partition up to which its checkpoint covers the journal.
    pub projection_floors: Vec<Arc<AtomicU64>>,
    writer: Sender<ToWriter>,
    /// For a log that does not queue batches ([`Log::queues_batches`]): whether the writer is idle.
    writer_idle: Option<WriterIdle>,
    batch: Batch,
    /// The follow-ups of the last apply, until `route_follow_ups` moves them on.
    sent: Vec<Outgoing>,
    /// Follow-ups this partition sent itself and `route_follow_ups` has not applied yet.
    local: VecDeque<FollowUp>,
    rng: SmallRng,
    since_snapshot: SinceSnapshot,
    snapshot: Option<SteppedSnapshot<ChunkSender>>,
    /// When the snapshot in progress last took steps: the partition has applied since.
    snapshot_steps_ended: Instant,
    /// Since when the snapshot's file thread has been behind, while it is.
    snapshot_file_behind_since: Option<Instant>,
    /// The answer of the thread writing and publishing the last snapshot begun, until it came.
    publishing: Option<Receiver<Result<(), String>>>,
    external_open: bool,
    /// When `resend_stalled` runs next.
    resend_due: Instant,
    /// What `resend_stalled` saw last time: the oldest unacknowledged follow-up per destination.
    oldest_at_last_check: Vec<Option<u64>>,
    /// How the batch being built has grown, for `Linger`.
    batch_growth: BatchGrowth,
}

/// How a partition whose log does not queue batches knows that its writer is idle: the writer counts
/// the batches it appended and wakes the partition after each.
struct WriterIdle {
    batches_sent: u64,
    batches_appended: Arc<AtomicU64>,
    /// A wake-up after each batch appended (one pending at most).
    appended: Receiver<()>,
}

impl WriterIdle {
    fn new() -> (Self, BatchesAppended) {
        let (wake, appended) = bounded(1);
        let batches_appended = Arc::new(AtomicU64::new(0));
        let idle = Self {
            batches_sent: 0,
            batches_appended: batches_appended.clone(),
            appended,
        };
        (
            idle,
            BatchesAppended {
                count: batches_appended,
                wake,
            },
        )
    }

    /// True while a batch handed over has not been appended. Wake-ups are taken first: one that comes
    /// after this returns true is for an append not counted yet. A writer gone is not busy: the
    /// partition then hands its batch over and finds the writer gone, as with a log that queues.
    fn writer_busy(&self) -> bool {
        loop {
            match self.appended.try_recv() {
                Ok(()) => {}
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
        // SeqCst with the writer's increment: this load and the wake-up the writer may have found
        // pending must not both miss that append.
        let appended = self.batches_appended.load(Ordering::SeqCst);
        assert!(
            appended <= self.batches_sent,
            "the writer appended {appended} batches of the {} handed over",
            self.batches_sent
        );
        appended < self.batches_sent
    }
}

/// The writer's side of [`WriterIdle`].
struct BatchesAppended {
    count: Arc<AtomicU64>,
    wake: Sender<()>,
}

impl BatchesAppended {
    fn one_more(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
        // A full channel holds a wake-up the partition has not taken yet: enough.
        let _ = self.wake.try_send(());
    }
}

pub(crate) struct WriterThread {
    partition: PartitionId,
    log: Box<dyn Log>,
    input: Receiver<ToWriter>,
    appended: Option<BatchesAppended>,
    peers: Arc<Peers>,
    projections: Vec<(AppId, Sender<Feed>)>,
    shared: Arc<PartitionShared>,
    progress: Arc<WriterProgress>,
    metrics: PartitionMetrics,
    archive: Option<ArchiveStore>,
    /// Set when storing archived records failed: none is stored after, so none is dropped from memory.
    archive_failed: bool,
}

/// Builds the two threads' states, connected by a one-slot channel: one batch in the writer's hands and
/// one waiting is enough to keep both busy.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pair(
    core: Core,
    since_snapshot: SinceSnapshot,
    log: Box<dyn Log>,
    external: Receiver<Request>,
    internal: Receiver<Internal>,
    peers: Arc<Peers>,
    projections: Vec<(AppId, Sender<Feed>)>,
    projection_floors: Vec<Arc<AtomicU64>>,
    limits: Limits,
    shared: Arc<PartitionShared>,
    metrics: PartitionMetrics,
    snapshot_dir: PathBuf,
) -> (PartitionThread, WriterThread) {
    let (writer_tx, writer_rx) = bounded(1);
    assert_eq!(
        log.next_lsn(),
        core.next_lsn,
        "recovery leaves the core at the end of the journal"
    );
    shared.durable_lsn.store(log.next_lsn(), Ordering::Release);
    shared.fed_lsn.store(log.next_lsn(), Ordering::Release);
    let progress = Arc::new(WriterProgress::new(log.next_lsn()));
    let (writer_idle, appended) = match log.queues_batches() {
        true => (None, None),
        false => {
            let (idle, appended) = WriterIdle::new();
            (Some(idle), Some(appended))
        }
    };
    let writer = WriterThread {
        partition: core.partition,
        log,
        input: writer_rx,
        appended,
        peers,
        projections,
        shared: shared.clone(),
        progress: progress.clone(),
        metrics: metrics.clone(),
        archive: core.archive.store().cloned(),
        archive_failed: false,
    };
    let first_lsn = core.next_lsn;
    let partition = PartitionThread {
        core,
        external,
        internal,
        limits,
        shared,
        progress,
        metrics,
        snapshot_dir,
        projection_floors,
        writer: writer_tx,
        writer_idle,
        batch: Batch {
            first_lsn,
            ..Batch::default()
        },
        sent: Vec::new(),
        local: VecDeque::new(),
        rng: SmallRng::from_os_rng(),
        since_snapshot,
        snapshot: None,
        snapshot_steps_ended: Instant::now(),
        snapshot_file_behind_since: None,
        publishing: None,
        external_open: true,
        resend_due: Instant::now(),
        oldest_at_last_check: Vec::new(),
        batch_growth: BatchGrowth::default(),
    };
    (partition, writer)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl PartitionThread {
    pub fn run(mut self) {
        if self.limits.linger.is_on() {
            precise_timeouts();
        }
        // Follow-ups that were not acknowledged before the last stop are sent again; destinations skip
        // the ones they already applied. Those to this partition are applied before anything else, so
        // that new ones, applied at once, follow them in sequence.
        let resend: Vec<Outgoing> = self.core.unacknowledged().collect();
        self.sent.extend(resend);
        self.route_follow_ups();
        // Select borrows the channels while the loop body mutates self: hold clones (same channels).
        let (internal, external, writer) = (
            self.internal.clone(),
            self.external.clone(),
            self.writer.clone(),
        );
        let appended = self.writer_idle.as_ref().map(|idle| idle.appended.clone());
        loop {
            // Only a cluster node resends (single nodes skip the clock read on this hot loop).
            if self.limits.resend_interval.is_some() && Instant::now() >= self.resend_due {
                self.resend_stalled();
            }
            self.snapshot_work();
            let accepting = self.external_open
                && self.core.unacknowledged_max() < self.limits.follow_ups_in_flight_max;
            // Without a linger, a batch waits only for the writer to take it, and requests that come
            // meanwhile would join that same batch whenever they were applied. When this thread has
            // nothing else to do, they wait in the queue and are taken just before the batch goes, so
            // that the tasks that queue them need not wake it once per request (a wake-up costs both
            // threads a few µs on a VM). The queue is then the only buffer while the writer commits
            // (a slow commit to Kafka fills it after `queue_capacity` requests, where the batch used to
            // take as many again). Not while requests are queued already: applying them now
            // overlaps the writer's work (fraud's stream applies milliseconds per request). Nor while a
            // snapshot is written: this thread does not sleep then, and `drain` interleaves its steps
            // with the requests they make wait.
            let waits_for_writer = !self.batch.is_empty()
                && !self.limits.linger.is_on()
                && self.snapshot.is_none()
                && self.external.is_empty();
            let listening = accepting && !waits_for_writer;
            let mut select = Select::new();
            select.recv(&internal);
            if listening {
                select.recv(&external);
            }
            // A batch is offered to the writer once it stopped growing (`Linger`); until then the select
            // wakes at that moment (or earlier, for new work).
            let now = Instant::now();
            self.batch_growth.observe(self.batch.size(), now);
            let hand_off_at = self.limits.linger.hand_off_at(&self.batch_growth);
            debug_assert_eq!(hand_off_at.is_none(), self.batch.is_empty());
            // A log that does not queue batches takes one only from an idle writer: until then the
            // select wakes when the writer has appended the batch before.
            let writer_busy = || (self.writer_idle.as_ref()).is_some_and(WriterIdle::writer_busy);
            let (writer_index, appended_index) = match (hand_off_at, &appended) {
                (Some(at), Some(appended)) if at <= now && writer_busy() => {
                    (None, Some(select.recv(appended)))
                }
                (Some(at), _) if at <= now => (Some(select.send(&writer)), None),
                _ => (None, None),
            };
            let wake_at = [
                hand_off_at.filter(|_| writer_index.is_none() && appended_index.is_none()),
                self.limits.resend_interval.map(|_| self.resend_due),
                // A snapshot being written goes on while the partition is idle.
                self.snapshot.as_ref().map(|_| now),
            ]
            .into_iter()
            .flatten()
            .min();
            // Readiness only: each queue is then read without blocking, so that a batch that waited
            // for the writer goes after what queued meanwhile has joined it. What is ready now is
            // checked by hand: crossbeam's `ready` spins and yields the thread a few times before it
            // gives up or sleeps, which the loop would pay on every turn while a snapshot is written.
            let writer_free = writer_index.is_some() && !self.writer.is_full();
            let hands_off =
                if writer_free || !internal.is_empty() || (listening && !external.is_empty()) {
                    writer_free
                } else {
                    let ready = match wake_at {
                        Some(at) if at <= now => continue,
                        None => select.ready(),
                        Some(at) => match select.ready_timeout(at - now) {
                            Ok(index) => index,
                            Err(_) => continue,
                        },
                    };
                    Some(ready) == writer_index
                };
            // After any wait and before the drain, so that it shows what queued meanwhile.
            self.metrics.queue_depth.set(self.external.len() as i64);
            if (waits_for_writer || !hands_off)
                && let Some((done, frees)) = self.drain()
            {
                let result = self.stop(frees);
                let _ = done.send(result);
                return;
            }
            if hands_off {
                // Readiness may be spurious, or another sender (a published snapshot, a release) may
                // have taken the slot since: then the batch waits for the next turn, not in a pause.
                if !self.writer.is_full() {
                    self.flush_batch();
                }
                continue;
            }
            if self.batch.frames.len() >= self.limits.batch_bytes_max
                || self.batch.releases.len() >= self.limits.batch_records_max
            {
                self.flush_batch();
            }
        }
    }

    /// Between batches: a step of the snapshot being written, or a new one if one is due and the last
    /// one is published.
    fn snapshot_work(&mut self) {
        if let Some(publishing) = &self.publishing {
            let published = match publishing.try_recv() {
                Ok(published) => Some(published),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => {
                    Some(Err("the snapshot's thread stopped".into()))
                }
            };
            if let Some(published) = published {
                self.publishing = None;
                if let Err(error) = published {
                    tracing::error!(partition = self.core.partition, %error, "snapshot failed");
                }
            }
        }
        let due = self.snapshot.is_none()
            && self.publishing.is_none()
            && self.since_snapshot.reached(&self.limits, 1);
        if (self.snapshot.is_none() && !due) || self.snapshot_file_is_behind() {
            return;
        }
        let pause = PauseTimer::start();
        if due {
            // Counted from the attempt: one that fails is tried again an interval later.
            self.since_snapshot.restart();
            if let Err(error) = self.begin_snapshot() {
                tracing::error!(partition = self.core.partition, %error, "snapshot failed");
            }
        } else {
            let late = self.since_snapshot.reached(&self.limits, 4);
            let applied = self.snapshot_steps_ended.elapsed();
            let slice = if late {
                applied.min(SNAPSHOT_STEPS_MAX)
            } else {
                Duration::ZERO
            };
            let until = Instant::now() + slice;
            loop {
                self.step_snapshot();
                let file_keeps_up =
                    (self.snapshot.as_ref()).is_some_and(|s| s.writer().file_keeps_up());
                if !file_keeps_up || Instant::now() >= until {
                    break;
                }
            }
        }
        self.snapshot_steps_ended = Instant::now();
        self.metrics.snapshot_pause.record(pause);
    }

    /// True while the snapshot in progress skips its steps: its file's thread is behind, and has been
    /// for less than [`SNAPSHOT_FILE_BEHIND_MAX`].
    fn snapshot_file_is_behind(&mut self) -> bool {
        let keeps_up = (self.snapshot.as_ref()).is_none_or(|s| s.writer().file_keeps_up());
        if keeps_up {
            self.snapshot_file_behind_since = None;
            return false;
        }
        let since = *self
            .snapshot_file_behind_since
            .get_or_insert_with(Instant::now);
        since.elapsed() < SNAPSHOT_FILE_BEHIND_MAX
    }

    /// Takes what is already queued without blocking, internal messages first. While a snapshot is
    /// being written it stops after a step's budget of journal bytes past its first request, so that
    /// the next step follows: what apply forces out of a snapshot between two steps (copy-on-write)
    /// then stays near what one step writes, however long the queue (measured: fraud at 30 M cards
    /// applied up to 32 batches of 4,096 transactions between two steps, and the step that wrote what
    /// they forced out took 310 ms). The first request is outside the budget, as it was when the loop's
    /// select took it before the drain: counting it halved what fraud's stream applied between two
    /// steps at 30 M cards (a request is more than a budget), and the stream ran about a sixth slower.
    fn drain(&mut self) -> Option<(Sender<Result<(), String>>, Frees)> {
        let mut budget_from = None;
        for _ in 0..DRAIN_MAX {
            match self.internal.try_recv() {
                Ok(message) => {
                    if let Some(stop) = self.handle_internal(message) {
                        return Some(stop);
                    }
                    continue;
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => {
                    unreachable!("the engine holds an internal sender")
                }
            }
            if !self.external_open
                || self.core.unacknowledged_max() >= self.limits.follow_ups_in_flight_max
            {
                break;
            }
            match self.external.try_recv() {
                Ok(request) => self.handle_request(request),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.external_open = false;
                    break;
                }
            }
            let journal_bytes = self.batch.frames.len();
            let taken_in = journal_bytes.saturating_sub(*budget_from.get_or_insert(journal_bytes));
            if self.snapshot.is_some() && taken_in >= self.limits.snapshot_step_bytes {
                break;
            }
        }
        None
    }

    fn take_batch(&mut self) -> Batch {
        debug_assert!(
            self.sent.is_empty() && self.local.is_empty(),
            "every apply's follow-ups are routed before its batch moves on"
        );
        self.batch_growth = BatchGrowth::default();
        self.core
            .archive
            .forget_stored(self.shared.archived_lsn.load(Ordering::Acquire));
        (self.metrics.archive_memory_records).set(self.core.archive.pending_count() as i64);
        let next = Batch {
            first_lsn: self.core.next_lsn,
            ..Batch::default()
        };
        std::mem::replace(&mut self.batch, next)
    }

    /// Hands the batch to the writer, waiting (a pause, recorded) while it still holds the previous one.
    fn flush_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let batch = self.take_batch();
        if let Some(idle) = &mut self.writer_idle {
            idle.batches_sent += 1;
        }
        match self.writer.try_send(ToWriter::Batch(batch)) {
            Ok(()) => {}
            Err(TrySendError::Full(batch)) => {
                let pause = PauseTimer::start();
                crate::thread_time::note_hand_off_wait();
                self.writer
                    .send(batch)
                    .expect("the writer outlives its partition");
                self.metrics.journal_pause.record(pause);
            }
            Err(TrySendError::Disconnected(_)) => unreachable!("the writer outlives its partition"),
        }
    }

    fn stamp(&mut self, app: AppId, origin: Origin) -> Envelope {
        let timestamp_ms = now_ms().max(self.core.last_timestamp_ms);
        Envelope {
            app,
            origin,
            timestamp_ms,
            random: self.rng.next_u64(),
        }
    }

    fn release(&mut self, release: Release) {
        self.batch.releases.push(release);
    }

    fn handle_request(&mut self, request: Request) {
        match request {
            Request::Command {
                app,
                command_id,
                payload,
                reply_to,
            } => {
                if self.progress.failed() {
                    let _ = reply_to.send(Err(EngineError::JournalFailed));
                    return;
                }
                if !self.core.has_app(app) {
                    let _ = reply_to.send(Err(EngineError::UnknownApp(app)));
                    return;
                }
                let durable_lsn = self.progress.durable_lsn.load(Ordering::Acquire);
                let reply = match self.core.admit(command_id, &payload) {
                    Admission::Apply => None,
                    Admission::Duplicate { reply, lsn } if lsn < durable_lsn => {
                        Some(Reply::Duplicate(reply.to_vec()))
                    }
                    Admission::Duplicate { .. } => Some(Reply::InFlight),
                    Admission::Conflict => Some(Reply::Conflict),
                };
                if let Some(reply) = reply {
                    self.metrics.duplicates.inc();
                    self.release(Release::Reply(reply_to, reply));
                    return;
                }
                let envelope = self.stamp(app, Origin::Client { command_id });
                let reply = self.apply(&envelope, &payload).to_vec();
                self.route_follow_ups();
                self.release(Release::Reply(reply_to, Reply::Applied(reply)));
            }
            Request::Query(query) => {
                if self.progress.failed() {
                    query(&self.core)(Err(EngineError::JournalFailed));
                    return;
                }
                if self.limits.reads_need_lease && !self.shared.read_lease.holds_at(Instant::now())
                {
                    query(&self.core)(Err(EngineError::NotOwner(self.core.partition)));
                    return;
                }
                let deliver = query(&self.core);
                self.release(Release::Deliver(deliver));
            }
        }
    }

    /// Applies one command into the current batch: frame and events; its follow-ups wait in `self.sent`
    /// for [`Self::route_follow_ups`], which every caller runs right after.
    fn apply(&mut self, envelope: &Envelope, payload: &[u8]) -> &[u8] {
        let start = begin_record(&mut self.batch.frames, envelope, payload);
        let apply_started = Instant::now();
        let reply = self.core.apply(
            envelope,
            payload,
            &mut self.batch.frames,
            &mut self.sent,
            &mut self.batch.archived,
        );
        let apply_time = apply_started.elapsed();
        finish_record(&mut self.batch.frames, start);
        self.since_snapshot
            .add(self.batch.frames.len() - start, apply_time);
        self.batch.record_count += 1;
        self.batch.apps |= app_bit(envelope.app);
        self.metrics.commands_applied.inc();
        reply
    }

    /// Routes the follow-ups in `self.sent`: those to other partitions wait in the batch until it is
    /// durable; those to this partition are applied now, in the order sent (and theirs after them), and
    /// acknowledged at once.
    ///
    /// A follow-up to this partition need not wait for durability: its record lands in this partition's
    /// journal after its cause, so no crash keeps it without its cause, and replay rebuilds both. Nothing
    /// of either leaves the partition (replies, events, sends) before the batch holding them is durable.
    fn route_follow_ups(&mut self) {
        loop {
            let here = self.core.partition;
            for outgoing in self.sent.drain(..) {
                if outgoing.destination == here {
                    self.local.push_back(outgoing.follow_up);
                } else {
                    self.batch.sends.push(outgoing);
                }
            }
            let Some(follow_up) = self.local.pop_front() else {
                return;
            };
            let FollowUp {
                source,
                seq,
                app,
                ref payload,
            } = follow_up;
            debug_assert_eq!(source, self.core.partition);
            if !self.core.already_applied(source, seq) {
                let envelope = self.stamp(app, Origin::FollowUp { source, seq });
                self.apply(&envelope, payload);
            }
            self.core.acknowledge(source, seq);
        }
    }

    fn handle_internal(
        &mut self,
        message: Internal,
    ) -> Option<(Sender<Result<(), String>>, Frees)> {
        match message {
            Internal::FollowUp(follow_up) => {
                let expected = self.core.next_follow_up_from(follow_up.source);
                if follow_up.seq > expected {
                    // Earlier ones were lost on the way between nodes; the source resends them in order.
                    return None;
                }
                if follow_up.seq == expected {
                    let origin = Origin::FollowUp {
                        source: follow_up.source,
                        seq: follow_up.seq,
                    };
                    let envelope = self.stamp(follow_up.app, origin);
                    self.apply(&envelope, &follow_up.payload);
                    self.route_follow_ups();
                }
                // Acknowledged once this batch is durable; a resend of an applied one is acknowledged too.
                self.batch.acks.push((follow_up.source, follow_up.seq));
            }
            Internal::Ack { destination, seq } => self.core.acknowledge(destination, seq),
            Internal::Snapshot(done) => {
                let _ = done.send(self.snapshot_now());
            }
            Internal::Shutdown(done, frees) => return Some((done, frees)),
        }
        None
    }

    /// Sends again, in order, the follow-ups to every destination whose oldest unacknowledged one has not
    /// changed since the last check: in a cluster a message between nodes can be lost.
    fn resend_stalled(&mut self) {
        let Some(interval) = self.limits.resend_interval else {
            return;
        };
        let oldest = self.core.oldest_unacknowledged();
        for (destination, (now, before)) in
            oldest.iter().zip(&self.oldest_at_last_check).enumerate()
        {
            if now.is_some() && now == before {
                let stalled = self.core.unacknowledged_to(destination as PartitionId);
                self.batch.sends.extend(stalled);
            }
        }
        self.oldest_at_last_check = oldest;
        self.resend_due = Instant::now() + interval;
    }

    /// Waits until every applied record is durable (or the journal failed).
    fn barrier(&mut self) -> Result<(), String> {
        self.flush_batch();
        let (done_tx, done_rx) = bounded(1);
        self.writer
            .send(ToWriter::Barrier(done_tx))
            .expect("the writer outlives its partition");
        done_rx
            .recv()
            .expect("the writer answers barriers")
            .map_err(|e| e.to_string())
    }

    /// Starts a snapshot of the partition as it is now. The engine's bookkeeping and the apps that write
    /// their state whole are written at once; the apps that write it in steps and the idempotency table
    /// follow (`step_snapshot`) while apply goes on. App sections are found by id, in any order.
    fn begin_snapshot(&mut self) -> Result<(), String> {
        debug_assert!(self.snapshot.is_none() && self.publishing.is_none());
        let lsn = self.core.next_lsn;
        let (out, file_chunks) =
            crate::snapshot::chunk_pipe(Some(SNAPSHOT_CHUNKS_QUEUED)).map_err(|e| e.to_string())?;
        self.start_snapshot_thread(lsn, file_chunks)?;
        self.snapshot = Some(SteppedSnapshot::begin(&mut self.core, out));
        self.since_snapshot.restart();
        Ok(())
    }

    /// Writes the next part of the snapshot in progress; once it is whole, publishes it.
    fn step_snapshot(&mut self) {
        let snapshot = self.snapshot.as_mut().expect("a snapshot is in progress");
        if snapshot.step(&mut self.core, self.limits.snapshot_step_bytes) {
            self.finish_snapshot();
        }
    }

    /// Starts the thread that writes the file of the snapshot of `lsn` from `chunks`, then publishes it
    /// (see [`publish_snapshot`]); its answer comes through `self.publishing`.
    fn start_snapshot_thread(&mut self, lsn: Lsn, chunks: ChunkReceiver) -> Result<(), String> {
        let (answer, publishing) = bounded(1);
        let publish = Publish {
            partition: self.core.partition,
            lsn,
            started: Instant::now(),
            progress: self.progress.clone(),
            writer: self.writer.clone(),
            snapshot_dir: self.snapshot_dir.clone(),
            projection_floors: self.projection_floors.clone(),
            metrics: self.metrics.clone(),
            archive: self.core.archive.store().cloned(),
        };
        std::thread::Builder::new()
            .name(format!("p{}-snapshot", self.core.partition))
            .spawn(move || {
                let written = crate::snapshot::write_streamed(&publish.snapshot_dir, lsn, chunks);
                let _ = answer.send(written.and_then(|file| publish_snapshot(publish, file)));
            })
            .map_err(|error| format!("could not start a snapshot's thread: {error}"))?;
        self.publishing = Some(publishing);
        Ok(())
    }

    /// Ends the snapshot in progress: tells its thread to publish it, or to discard it if it failed.
    fn finish_snapshot(&mut self) {
        let snapshot = self.snapshot.take().expect("a snapshot is in progress");
        self.since_snapshot.snapshot_bytes = snapshot.writer().bytes();
        let (chunks, failed) = snapshot.finish();
        match failed {
            Some(error) => chunks.fail(error),
            // If its thread stopped, its answer says why.
            None => drop(chunks.finish()),
        }
    }

    /// Writes a snapshot of the partition as it is now and waits until it is published; first ends the
    /// one in progress, if any.
    fn snapshot_now(&mut self) -> Result<(), String> {
        let finish = |this: &mut Self| -> Result<(), String> {
            while this.snapshot.is_some() {
                this.step_snapshot();
            }
            // The snapshot is published once what it holds is durable, or given up if the journal
            // failed: its answer is awaited either way, so that no thread of this start touches the
            // snapshot directory after the stop answers (the partition may start here again).
            let durable = this.barrier();
            let published = match this.publishing.take() {
                Some(publishing) => publishing
                    .recv()
                    .unwrap_or_else(|_| Err("the snapshot publisher stopped".to_string())),
                None => Ok(()),
            };
            durable.and(published)
        };
        let earlier = finish(self);
        if self.progress.failed() {
            // A snapshot begun now could never be published.
            debug_assert!(earlier.is_err(), "the barrier reports the failure");
            return earlier;
        }
        let pause = PauseTimer::start();
        self.begin_snapshot()?;
        let now = finish(self);
        self.metrics.snapshot_pause.record(pause);
        earlier.and(now)
    }

    fn stop(mut self, frees: Frees) -> Result<(), String> {
        let snapshot = self.snapshot_now();
        let (done_tx, done_rx) = bounded(1);
        self.writer
            .send(ToWriter::Stop(done_tx))
            .expect("the writer outlives its partition");
        let synced = done_rx
            .recv()
            .expect("the writer answers stop")
            .map_err(|e| e.to_string());
        let apps = std::mem::take(&mut self.core.apps);
        match frees {
            Frees::InBackground => free_in_background(self.core.partition, apps),
            Frees::BeforeAnswering => drop(apps),
        }
        snapshot.and(synced)
    }
}

/// Frees the apps' states of a stopped partition on a thread of their own (see [`Frees::InBackground`]).
/// A state's drop may then never run, if the process exits first: `StateMachine` says so.
fn free_in_background(partition: PartitionId, apps: Vec<(AppId, Box<dyn StateMachine>)>) {
    let spawned = std::thread::Builder::new()
        .name(format!("p{partition}-free"))
        .spawn(move || drop(apps));
    // Without a thread, the spawn dropped its closure, states and all, in this thread.
    drop(spawned);
}

/// What the thread publishing a written snapshot needs.
struct Publish {
    partition: PartitionId,
    lsn: Lsn,
    started: Instant,
    progress: Arc<WriterProgress>,
    writer: Sender<ToWriter>,
    snapshot_dir: PathBuf,
    projection_floors: Vec<Arc<AtomicU64>>,
    metrics: PartitionMetrics,
    archive: Option<ArchiveStore>,
}

/// Publishes a snapshot once everything it holds is durable (a snapshot must not hold effects that a
/// crash could still take back) and the archive's store holds every record the snapshot left out,
/// then lets the journal drop what the older of the two kept snapshots
/// (and every projection checkpoint) no longer needs.
fn publish_snapshot(publish: Publish, out: Unpublished) -> Result<(), String> {
    let Publish {
        partition,
        lsn,
        started,
        progress,
        writer,
        snapshot_dir,
        projection_floors,
        metrics,
        archive,
    } = publish;
    while progress.durable_lsn.load(Ordering::Acquire) < lsn {
        if progress.failed() {
            return Err("the journal failed before the snapshot's records were durable".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if let Some(archive) = archive {
        archive.persist().map_err(|e| e.to_string())?;
    }
    let path = out.publish().map_err(|e| e.to_string())?;
    let stopped = || "the journal writer stopped".to_string();
    writer
        .send(ToWriter::SnapshotWritten(lsn, path))
        .map_err(|_| stopped())?;
    let kept = crate::snapshot::list(&snapshot_dir).map_err(|e| e.to_string())?;
    for (_, path) in kept.iter().skip(2) {
        std::fs::remove_file(path).map_err(|e| format!("removing {}: {e}", path.display()))?;
    }
    // Until two snapshots exist, keep the whole journal: the only fallback for a damaged snapshot.
    // A kept snapshot needs the record it ends at too: recovery checks it against the journal.
    let oldest_kept = if kept.len() >= 2 {
        kept[1].0.saturating_sub(1)
    } else {
        0
    };
    let floor = projection_floors
        .iter()
        .map(|f| f.load(Ordering::Acquire))
        .fold(oldest_kept, Lsn::min);
    writer
        .send(ToWriter::ReleaseBefore(floor))
        .map_err(|_| stopped())?;
    let elapsed = started.elapsed();
    metrics.snapshot_seconds.observe(elapsed.as_secs_f64());
    tracing::info!(
        partition,
        lsn,
        release_before = floor,
        elapsed_ms = elapsed.as_millis() as u64,
        "snapshot written"
    );
    Ok(())
}

impl WriterThread {
    pub fn run(mut self) {
        while let Ok(message) = self.input.recv() {
            match message {
                ToWriter::Batch(batch) => {
                    self.commit(batch);
                    if let Some(appended) = &self.appended {
                        appended.one_more();
                    }
                }
                ToWriter::Barrier(done) => {
                    let _ = done.send(if self.progress.failed() {
                        Err(JournalError::Failed)
                    } else {
                        Ok(())
                    });
                }
                ToWriter::ReleaseBefore(lsn) => {
                    if let Err(error) = self.log.release_before(lsn) {
                        tracing::warn!(partition = self.partition, %error, "could not release old journal segments");
                    }
                }
                ToWriter::SnapshotWritten(lsn, path) => self.log.snapshot_written(lsn, &path),
                ToWriter::Stop(done) => {
                    let _ = done.send(self.log.sync());
                    return;
                }
            }
        }
    }

    fn commit(&mut self, batch: Batch) {
        if batch.record_count > 0 && !self.progress.failed() {
            debug_assert_eq!(
                batch.first_lsn,
                self.log.next_lsn(),
                "batches arrive in LSN order without gaps"
            );
            let started = Instant::now();
            let appended = self.log.append(&batch.frames, batch.record_count);
            self.metrics
                .journal_fsync_seconds
                .observe(started.elapsed().as_secs_f64());
            self.metrics
                .journal_batch_records
                .observe(batch.record_count as f64);
            match appended {
                Ok(()) => {
                    let durable_lsn = batch.first_lsn + batch.record_count;
                    self.progress
                        .durable_lsn
                        .store(durable_lsn, Ordering::Release);
                    self.shared
                        .durable_lsn
                        .store(durable_lsn, Ordering::Release);
                    self.metrics.durable_lsn.set(durable_lsn as i64);
                    self.metrics.journal_bytes.inc_by(batch.frames.len() as u64);
                }
                Err(error) => {
                    tracing::error!(partition = self.partition, %error, "journal append failed; refusing writes");
                    self.metrics.journal_failures.inc();
                    self.progress.failed.store(true, Ordering::Release);
                    let fenced = matches!(error, JournalError::Fenced(_));
                    self.shared.fenced.store(fenced, Ordering::Release);
                    self.shared.failed.store(true, Ordering::Release);
                }
            }
        }
        if self.progress.failed() {
            // Nothing in this batch may be acknowledged, sent on or projected: it may not be on disk.
            for release in batch.releases {
                match release {
                    Release::Reply(to, _) => {
                        let _ = to.send(Err(EngineError::JournalFailed));
                    }
                    Release::Deliver(deliver) => deliver(Err(EngineError::JournalFailed)),
                }
            }
            return;
        }
        for release in batch.releases {
            match release {
                Release::Reply(to, reply) => {
                    let _ = to.send(Ok(reply));
                }
                Release::Deliver(deliver) => deliver(Ok(())),
            }
        }
        for outgoing in batch.sends {
            // A follow-up lost on the way stays unacknowledged and is resent.
            self.peers
                .send(outgoing.destination, Internal::FollowUp(outgoing.follow_up));
        }
        for (source, seq) in batch.acks {
            self.peers.send(
                source,
                Internal::Ack {
                    destination: self.partition,
                    seq,
                },
            );
        }
        if batch.record_count > 0 {
            let frames = Arc::new(batch.frames);
            let end_lsn = batch.first_lsn + batch.record_count;
            for (app, feed) in &self.projections {
                if batch.apps & app_bit(*app) != 0 {
                    let sent = feed.try_send(Feed {
                        partition: self.partition,
                        first_lsn: batch.first_lsn,
                        frames: frames.clone(),
                    });
                    // A projection this far behind reads the batch from the journal: read models never
                    // hold up acknowledgements.
                    if let Err(TrySendError::Full(_)) = sent {
                        self.shared.feed_dropped_end[usize::from(*app)]
                            .fetch_max(end_lsn, Ordering::Release);
                    }
                }
            }
            // After the sends: a projection that reads this and then drains its feed has seen them.
            self.shared.fed_lsn.store(end_lsn, Ordering::Release);
            self.store_archived(&batch.archived, end_lsn);
        }
    }

    /// Stores the records a durable batch archived, so that the partition may drop them from memory.
    fn store_archived(&mut self, records: &[ArchivedRecord], end_lsn: Lsn) {
        let Some(archive) = &self.archive else {
            return;
        };
        if self.archive_failed {
            return;
        }
        if !records.is_empty()
            && let Err(error) = archive.put_all(records)
        {
            tracing::error!(partition = self.partition, %error, "storing archived records failed; they stay in memory and in snapshots");
            self.metrics.archive_failures.inc();
            self.archive_failed = true;
            return;
        }
        self.shared.archived_lsn.store(end_lsn, Ordering::Release);
    }
}

/// Offers a request to a partition queue without waiting: a full queue is the caller's signal to back off.
/// Queues `request` without blocking; on refusal hands it back so the caller can retry or drop it.
pub(crate) fn offer(
    queue: &Sender<Request>,
    request: Request,
    metrics: &PartitionMetrics,
) -> Result<(), (EngineError, Request)> {
    match queue.try_send(request) {
        Ok(()) => Ok(()),
        Err(TrySendError::Full(request)) => {
            metrics.rejected_overloaded.inc();
            Err((EngineError::Overloaded, request))
        }
        Err(TrySendError::Disconnected(request)) => Err((EngineError::ShuttingDown, request)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(snapshot_interval_bytes: u64) -> Limits {
        Limits {
            batch_bytes_max: 1 << 20,
            batch_records_max: 1024,
            linger: Linger::default(),
            snapshot_interval_records: u64::MAX,
            snapshot_interval_bytes,
            snapshot_interval_apply: Duration::MAX,
            snapshot_step_bytes: 65536,
            follow_ups_in_flight_max: 1024,
            resend_interval: None,
            reads_need_lease: false,
        }
    }

    fn after(journal_bytes: u64, snapshot_bytes: u64) -> SinceSnapshot {
        SinceSnapshot {
            journal_bytes,
            snapshot_bytes,
            ..SinceSnapshot::default()
        }
    }

    #[test]
    fn a_lingering_batch_goes_once_nothing_joined_for_the_quiet_time_or_at_the_longest_wait() {
        let us = Duration::from_micros;
        let linger = Linger {
            quiet: us(30),
            max: us(500),
        };
        let start = Instant::now();
        let at = |micros: u64| start + us(micros);
        let mut growth = BatchGrowth::default();
        growth.observe(0, at(0));
        assert_eq!(linger.hand_off_at(&growth), None, "nothing to hand over");
        growth.observe(2, at(10));
        assert_eq!(linger.hand_off_at(&growth), Some(at(40)));
        growth.observe(2, at(20));
        assert_eq!(
            linger.hand_off_at(&growth),
            Some(at(40)),
            "no growth, no more waiting"
        );
        // A steady stream keeps it growing: the longest wait counts from its first item.
        for micros in (30..600).step_by(20) {
            growth.observe(growth.size + 1, at(micros));
        }
        assert_eq!(linger.hand_off_at(&growth), Some(at(510)));
        // Off, or half set: the batch may go from its first item on, as soon as the writer is free.
        for off in [
            Linger::default(),
            Linger {
                quiet: us(30),
                max: Duration::ZERO,
            },
            Linger {
                quiet: Duration::ZERO,
                max: us(500),
            },
        ] {
            assert!(!off.is_on());
            assert_eq!(off.hand_off_at(&growth), Some(at(10)), "{off:?}");
        }
    }

    #[test]
    fn a_small_snapshot_falls_due_sooner_and_its_size_outlives_the_count() {
        let limits = limits(256 << 20);
        // A state of 3 MB: due after 64 MiB of journal, late (a quarter) after 16 MiB.
        assert!(!after((64 << 20) - 1, 3 << 20).reached(&limits, 1));
        assert!(after(64 << 20, 3 << 20).reached(&limits, 1));
        assert!(!after((16 << 20) - 1, 3 << 20).reached(&limits, 4));
        assert!(after(16 << 20, 3 << 20).reached(&limits, 4));
        // A state of 500 MB: the interval.
        assert!(!after((256 << 20) - 1, 500 << 20).reached(&limits, 1));
        assert!(after(256 << 20, 500 << 20).reached(&limits, 1));
        // A snapshot begun counts from zero, and the size of the one before stands until its own is
        // known.
        let mut since = after(300 << 20, 3 << 20);
        since.apply_time = Duration::from_secs(1);
        since.records = 7;
        since.restart();
        assert_eq!(
            (
                since.records,
                since.journal_bytes,
                since.apply_time,
                since.snapshot_bytes
            ),
            (0, 0, Duration::ZERO, 3 << 20)
        );
    }
}
