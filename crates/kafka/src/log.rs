//! One engine partition's log on its Kafka topic partition: transactional appends, `read_committed`
//! reads, and the sparse LSN -> offset index that lets a read start near the LSN it wants.

use crate::snapshots::{JournalStart, Uploader};
use crate::{KafkaConfig, MESSAGE_BYTES_MAX, TakeoversStop};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use spate_engine::journal::{JournalError, Log, Lsn, Visit};
use spate_engine::record::{FRAME_HEADER_BYTES, Frame, read_frame};
use spate_engine::{DATA_FORMAT_VERSION, PartitionId};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The first byte of every record's key: the data format version of its frames (the journal records
/// and the events in them, [`DATA_FORMAT_VERSION`]). Nodes of two versions may share a topic during an
/// upgrade, so a node refuses a record of a newer version rather than misread it.
const KEY_VERSION: u8 = {
    assert!(DATA_FORMAT_VERSION >= 1 && DATA_FORMAT_VERSION <= u8::MAX as u32);
    DATA_FORMAT_VERSION as u8
};
const KEY_BYTES: usize = 13;
/// A group commit is split into Kafka records of at most this many bytes of frames.
const CHUNK_BYTES_MAX: usize = MESSAGE_BYTES_MAX - 64 * 1024;
/// The index keeps one entry per this many bytes of log: small (100 GB of history is 100 k entries)
/// and a read starts at most this far before the LSN it wants.
const INDEX_STRIDE_BYTES: u64 = 1024 * 1024;
/// A read that gets nothing from Kafka for this long gives up (the partition's leader is gone and no
/// other broker took over, or a transaction left open holds back what it may read).
const READ_STALL_MAX: Duration = Duration::from_secs(60);

/// How often the writer looks whether librdkafka has let go of a delivered record (microseconds after its
/// delivery report, see `await_deliveries`).
const RELEASE_CHECK_INTERVAL: Duration = Duration::from_micros(20);

/// What a Kafka record's key says of its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordKey {
    pub first_lsn: Lsn,
    pub record_count: u32,
}

impl RecordKey {
    fn encode(self) -> [u8; KEY_BYTES] {
        let mut key = [0; KEY_BYTES];
        key[0] = KEY_VERSION;
        key[1..9].copy_from_slice(&self.first_lsn.to_le_bytes());
        key[9..13].copy_from_slice(&self.record_count.to_le_bytes());
        key
    }

    /// The key of a record of any version up to this binary's ([`KEY_VERSION`]); every version so far
    /// has the same layout.
    pub(crate) fn decode(key: Option<&[u8]>) -> Result<Self, KeyError> {
        let key = key.ok_or(KeyError::Malformed("a record without a key".into()))?;
        if key.len() != KEY_BYTES {
            return Err(KeyError::Malformed(format!(
                "a key of {} bytes, expected {KEY_BYTES}",
                key.len()
            )));
        }
        match key[0] {
            0 => return Err(KeyError::Malformed("a key of format version 0".into())),
            newer if newer > KEY_VERSION => return Err(KeyError::Newer(newer)),
            _ => {}
        }
        Ok(Self {
            first_lsn: u64::from_le_bytes(key[1..9].try_into().expect("8 bytes")),
            record_count: u32::from_le_bytes(key[9..13].try_into().expect("4 bytes")),
        })
    }
}

/// Why a record's key is not read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// Not a key any version of spate writes.
    Malformed(String),
    /// A key of this data format version, newer than [`KEY_VERSION`].
    Newer(u8),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Malformed(reason) => f.write_str(reason),
            Self::Newer(version) => write!(
                f,
                "a record of data format version {version}; this binary reads versions 1 to {KEY_VERSION}"
            ),
        }
    }
}

/// Some records' offsets by first LSN, ascending. Reads start from the entry at or below the LSN they
/// want and skip forward; without one they start at the beginning of the partition.
#[derive(Debug, Default)]
pub(crate) struct OffsetIndex {
    entries: Vec<(Lsn, i64)>,
    bytes_since_entry: u64,
}

impl OffsetIndex {
    fn note(&mut self, first_lsn: Lsn, offset: i64, bytes: usize) {
        if self
            .entries
            .last()
            .is_some_and(|&(lsn, _)| lsn >= first_lsn)
        {
            return;
        }
        if self.entries.is_empty() || self.bytes_since_entry >= INDEX_STRIDE_BYTES {
            self.entries.push((first_lsn, offset));
            self.bytes_since_entry = 0;
        }
        self.bytes_since_entry += bytes as u64;
    }

    pub(crate) fn start_for(&self, lsn: Lsn) -> Offset {
        match self.entry_at_or_below(lsn) {
            None => Offset::Beginning,
            Some((_, offset)) => Offset::Offset(offset),
        }
    }

    /// The entry a read of `lsn` starts from: (first LSN, offset) of a record at or below it.
    pub(crate) fn entry_at_or_below(&self, lsn: Lsn) -> Option<JournalStart> {
        match self.entries.partition_point(|&(first, _)| first <= lsn) {
            0 => None,
            after => Some(self.entries[after - 1]),
        }
    }

    /// Takes a start learnt elsewhere (a snapshot's), if it is past every entry: the scan at open then
    /// starts there instead of at the beginning of the partition.
    fn learn(&mut self, (first_lsn, offset): JournalStart) {
        if self
            .entries
            .last()
            .is_none_or(|&(lsn, known)| lsn < first_lsn && known < offset)
        {
            self.entries.push((first_lsn, offset));
            self.bytes_since_entry = 0;
        }
    }
}

/// Delivery reports of the open transaction: where each record landed, and whether any failed. They
/// arrive on the producer's polling thread; the writer waits for them on `delivered`.
struct Deliveries {
    state: Mutex<Delivered>,
    delivered: Condvar,
}

#[derive(Default)]
struct Delivered {
    /// Reports received, successful or not.
    count: usize,
    failure: Option<KafkaError>,
    /// (first LSN, offset, bytes) of each record delivered, for the index.
    records: Vec<(Lsn, i64, usize)>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut state = self.state.lock().expect("no panics while held");
        match result {
            Ok(message) => {
                if let Ok(key) = RecordKey::decode(message.key()) {
                    state
                        .records
                        .push((key.first_lsn, message.offset(), message.payload_len()));
                }
            }
            Err((error, _)) => state.failure = Some(error.clone()),
        }
        state.count += 1;
        self.delivered.notify_all();
    }
}

pub struct KafkaLog {
    partition: PartitionId,
    /// Its own thread serves delivery reports: `BaseProducer::poll` spins or sleeps out its whole
    /// timeout, which cost a core, or 100 ms, per group commit.
    producer: ThreadedProducer<Deliveries>,
    first_lsn: Lsn,
    next_lsn: Lsn,
    index: Arc<Mutex<OffsetIndex>>,
    config: KafkaConfig,
    failed: bool,
    snapshots: Arc<Uploader>,
    /// Stops the replay of a takeover still under way when the node stops: once the node stops, no
    /// replay of any of its logs succeeds (only recovery replays a Kafka log, at a takeover).
    takeovers: TakeoversStop,
}

fn replicated(partition: PartitionId, what: &str, error: impl std::fmt::Display) -> JournalError {
    JournalError::Replicated(format!("partition {partition}: {what}: {error}"))
}

impl KafkaLog {
    /// Takes ownership of `partition`'s log (fencing any earlier owner), brings its newest snapshot on
    /// Kafka into `snapshot_dir` and reads the log to its end (from that snapshot's start, if it has one).
    pub(crate) fn open(
        config: &KafkaConfig,
        partition: PartitionId,
        index: Arc<Mutex<OffsetIndex>>,
        snapshots: Arc<Uploader>,
        ends: &LogEnds,
        takeovers: &TakeoversStop,
        snapshot_dir: &Path,
    ) -> Result<Self, JournalError> {
        // A start begun as the node stops would fence the log's owner for nothing.
        let stopping = || {
            replicated(
                partition,
                "taking the partition over",
                "the node is stopping",
            )
        };
        if takeovers.is_set() {
            return Err(stopping());
        }
        let commit_timeout_ms = config.commit_timeout.as_millis().to_string();
        let producer: ThreadedProducer<Deliveries> = config
            .client()
            .set(
                "transactional.id",
                format!("spate.{}.p{partition}", config.topic),
            )
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            // A transaction's partition is registered while the coordinator may still be writing the
            // markers of the one before, which it answers with a retriable error: retry soon, since the
            // next group commit waits on it.
            .set("retry.backoff.ms", "5")
            .set("retry.backoff.max.ms", "100")
            .set("message.max.bytes", (MESSAGE_BYTES_MAX + 4096).to_string())
            .set("batch.size", (MESSAGE_BYTES_MAX + 4096).to_string())
            // Twice a commit's bound (`commit`): the cluster aborts a transaction only once its writer
            // has given it up, never under a commit still within its time (the abort bumps the
            // producer's epoch, and the late commit would read as fenced by another owner).
            .set(
                "transaction.timeout.ms",
                (2 * config.commit_timeout.as_millis()).to_string(),
            )
            .set("message.timeout.ms", &commit_timeout_ms)
            .create_with_context(Deliveries {
                state: Mutex::new(Delivered::default()),
                delivered: Condvar::new(),
            })
            .map_err(|e| replicated(partition, "creating the producer", e))?;
        // Fences every earlier producer of this partition and aborts the transaction it left open, so
        // that what is read next is all there will ever be below the next append.
        producer
            .init_transactions(config.connect_timeout)
            .map_err(|e| replicated(partition, "taking ownership (init_transactions)", e))?;
        if let Some(start) =
            crate::snapshots::fetch_newest(config, partition, snapshot_dir, takeovers)
        {
            index.lock().expect("no panics while held").learn(start);
        }
        if takeovers.is_set() {
            return Err(stopping());
        }
        let (first_lsn, next_lsn) = scan(config, partition, &index, ends, takeovers)?;
        tracing::info!(
            partition,
            topic = %config.topic,
            first_lsn,
            next_lsn,
            "took ownership of the partition's Kafka log"
        );
        Ok(Self {
            partition,
            producer,
            first_lsn,
            next_lsn,
            index,
            config: config.clone(),
            failed: false,
            snapshots,
            takeovers: takeovers.clone(),
        })
    }

    fn send(
        &self,
        key: &[u8; KEY_BYTES],
        frames: &[u8],
        deadline: Instant,
    ) -> Result<(), KafkaError> {
        let record = BaseRecord::to(&self.config.topic)
            .partition(i32::from(self.partition))
            .key(&key[..])
            .payload(frames);
        send_waiting_for_room(&self.producer, record, deadline)
    }

    /// One group commit as one transaction, given up (an error) once it has taken `commit_timeout`
    /// in all.
    fn commit(&mut self, frames: &[u8], record_count: u64) -> Result<(), KafkaError> {
        let deadline = Instant::now() + self.config.commit_timeout;
        self.producer.begin_transaction()?;
        let mut first_lsn = self.next_lsn;
        let pieces = chunks(frames, record_count);
        for &(chunk, count) in &pieces {
            let key = RecordKey {
                first_lsn,
                record_count: count,
            };
            self.send(&key.encode(), chunk, deadline)?;
            first_lsn += u64::from(count);
        }
        self.await_deliveries(pieces.len(), deadline)?;
        (self.producer).commit_transaction(deadline.saturating_duration_since(Instant::now()))
    }

    /// Waits until each of the `sent` records of this transaction is acknowledged (`acks=all`) and
    /// librdkafka has let go of it, so that `commit_transaction`'s own flush finds nothing to wait for
    /// (it would poll in 100 ms slices); until `deadline` at most.
    fn await_deliveries(&self, sent: usize, deadline: Instant) -> Result<(), KafkaError> {
        let timed_out = || KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut);
        let context = self.producer.context();
        let state = context.state.lock().expect("no panics while held");
        let wait_at_most = deadline.saturating_duration_since(Instant::now());
        let (mut state, wait) = context
            .delivered
            .wait_timeout_while(state, wait_at_most, |state| state.count < sent)
            .expect("no panics while held");
        if wait.timed_out() {
            return Err(timed_out());
        }
        state.count = 0;
        if let Some(failure) = state.failure.take() {
            return Err(failure);
        }
        drop(state);
        while self.producer.in_flight_count() > 0 {
            if Instant::now() >= deadline {
                return Err(timed_out());
            }
            std::thread::sleep(RELEASE_CHECK_INTERVAL);
        }
        Ok(())
    }
}

/// Hands `record` to the producer, waiting while its queue is full, until `deadline`.
pub(crate) fn send_waiting_for_room<C: ProducerContext>(
    producer: &ThreadedProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8], C::DeliveryOpaque>,
    deadline: Instant,
) -> Result<(), KafkaError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                if Instant::now() < deadline =>
            {
                record = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((error, _)) => return Err(error),
        }
    }
}

/// Splits a group commit at frame boundaries into pieces of at most [`CHUNK_BYTES_MAX`] bytes (a single
/// larger frame travels alone; Kafka refuses it if it is over the topic's limit). One piece, the whole
/// batch, in the common case.
fn chunks(frames: &[u8], record_count: u64) -> Vec<(&[u8], u32)> {
    if frames.len() <= CHUNK_BYTES_MAX {
        let count =
            u32::try_from(record_count).expect("a group commit holds fewer than 2^32 records");
        return vec![(frames, count)];
    }
    let mut pieces = Vec::new();
    let (mut start, mut at, mut count) = (0, 0, 0u32);
    while at < frames.len() {
        let length = u32::from_le_bytes(frames[at..at + 4].try_into().expect("4 bytes")) as usize;
        let end = at + FRAME_HEADER_BYTES + length;
        if end - start > CHUNK_BYTES_MAX && count > 0 {
            pieces.push((&frames[start..at], count));
            (start, count) = (at, 0);
        }
        (at, count) = (end, count + 1);
    }
    pieces.push((&frames[start..], count));
    debug_assert_eq!(
        pieces.iter().map(|(_, c)| u64::from(*c)).sum::<u64>(),
        record_count
    );
    pieces
}

impl Log for KafkaLog {
    fn next_lsn(&self) -> Lsn {
        self.next_lsn
    }

    fn first_lsn(&self) -> Lsn {
        self.first_lsn
    }

    fn append(&mut self, frames: &[u8], record_count: u64) -> Result<(), JournalError> {
        if self.failed {
            return Err(JournalError::Failed);
        }
        if let Err(error) = self.commit(frames, record_count) {
            // Whether the transaction committed is unknown (a timeout), or it was refused (fenced by a
            // new owner): either way nothing more may be acknowledged from this log.
            self.failed = true;
            let fatal = self.producer.client().fatal_error();
            let codes = [
                error.rdkafka_error_code(),
                fatal.as_ref().map(|(code, _)| *code),
            ];
            if codes.into_iter().flatten().any(is_fenced) {
                return Err(JournalError::Fenced(format!(
                    "partition {}: committing a group commit: {error}",
                    self.partition
                )));
            }
            return Err(replicated(
                self.partition,
                "committing a group commit",
                error,
            ));
        }
        self.next_lsn += record_count;
        let delivered = std::mem::take(
            &mut self
                .producer
                .context()
                .state
                .lock()
                .expect("no panics while held")
                .records,
        );
        let mut index = self.index.lock().expect("no panics while held");
        for (first_lsn, offset, bytes) in delivered {
            index.note(first_lsn, offset, bytes);
        }
        Ok(())
    }

    /// A commit is a transaction of three replicated round trips (tens of milliseconds here): a batch
    /// waits on the partition, taking what comes meanwhile, until the writer is idle.
    fn queues_batches(&self) -> bool {
        false
    }

    fn replay(&self, from: Lsn, visit: &mut Visit<'_>) -> Result<(), JournalError> {
        read(
            &self.config,
            self.partition,
            &self.index,
            Some(&self.takeovers),
            from,
            self.next_lsn,
            visit,
        )
    }

    /// Kafka keeps the records (the topic's retention is unlimited): only the index lets go of entries
    /// no read will start from.
    fn release_before(&mut self, lsn: Lsn) -> Result<(), JournalError> {
        let mut index = self.index.lock().expect("no panics while held");
        let keep_from = index.entries.partition_point(|&(first, _)| first <= lsn);
        if keep_from > 1 {
            index.entries.drain(..keep_from - 1);
        }
        Ok(())
    }

    /// Every append is already replicated when it returns.
    fn sync(&mut self) -> Result<(), JournalError> {
        if self.failed {
            return Err(JournalError::Failed);
        }
        Ok(())
    }

    /// Queues a copy for the snapshot topic, with where a read of the records after it may start. A
    /// failed log (fenced, or unsure of its last commit) publishes nothing.
    fn snapshot_written(&mut self, lsn: Lsn, path: &Path) {
        if self.failed {
            return;
        }
        // Recovery reads from the record the snapshot ends at (it checks it), one before `lsn`.
        let start = self
            .index
            .lock()
            .expect("no panics while held")
            .entry_at_or_below(lsn.saturating_sub(1));
        self.snapshots.publish(self.partition, lsn, path, start);
    }
}

/// A reader's client context: reaching the end of the partition is how every read ends, not an error.
pub(crate) struct ReaderContext;

impl ClientContext for ReaderContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
            tracing::warn!(%error, reason, "Kafka reader");
        }
    }
}

impl ConsumerContext for ReaderContext {}

pub(crate) type Reader = BaseConsumer<ReaderContext>;

fn reader(
    config: &KafkaConfig,
    partition: PartitionId,
    start: Offset,
) -> Result<Reader, JournalError> {
    let consumer =
        unassigned_reader(config).map_err(|e| replicated(partition, "creating a reader", e))?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&config.topic, i32::from(partition), start)
        .map_err(|e| replicated(partition, "assigning the reader", e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| replicated(partition, "assigning the reader", e))?;
    Ok(consumer)
}

/// A consumer of committed group commits that the caller assigns partitions to.
pub(crate) fn unassigned_reader(config: &KafkaConfig) -> Result<Reader, KafkaError> {
    config
        .client()
        .set("group.id", format!("spate.{}.reader", config.topic))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // Only committed transactions: a fenced owner's aborted group commits are never read.
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        // A read never skips records silently: an offset Kafka no longer has is an error.
        .set("auto.offset.reset", "error")
        .set(
            "max.partition.fetch.bytes",
            (MESSAGE_BYTES_MAX + 4096).to_string(),
        )
        .set("fetch.max.bytes", (4 * MESSAGE_BYTES_MAX).to_string())
        .create_with_context(ReaderContext)
}

/// Reads the whole partition once (at open): where it starts and ends, and the index on the way.
///
/// With an index entry (from this node's earlier time as owner, or from a snapshot), the scan starts at
/// the last one: every entry is a committed record, so the record there starts at the entry's LSN; if it
/// does not, the index is dropped and the scan starts again at the beginning.
fn scan(
    config: &KafkaConfig,
    partition: PartitionId,
    index: &Mutex<OffsetIndex>,
    ends: &LogEnds,
    takeovers: &TakeoversStop,
) -> Result<(Lsn, Lsn), JournalError> {
    let watermarks = ends.watermarks(config, partition)?;
    let last_entry = index
        .lock()
        .expect("no panics while held")
        .entries
        .last()
        .copied();
    if let Some((entry_lsn, offset)) = last_entry {
        let start = Offset::Offset(offset);
        let (first_seen, next_lsn) =
            scan_from(config, partition, index, takeovers, start, watermarks)?;
        if first_seen == Some(entry_lsn) {
            return Ok((first_lsn(config, partition, takeovers)?, next_lsn));
        }
        tracing::warn!(
            partition,
            entry_lsn,
            offset,
            ?first_seen,
            "the log index does not match the log; scanning it from the beginning"
        );
        *index.lock().expect("no panics while held") = OffsetIndex::default();
    }
    let (first_lsn, next_lsn) = scan_from(
        config,
        partition,
        index,
        takeovers,
        Offset::Beginning,
        watermarks,
    )?;
    Ok((first_lsn.unwrap_or(0), next_lsn))
}

/// The first LSN the partition holds (0 if it is empty).
fn first_lsn(
    config: &KafkaConfig,
    partition: PartitionId,
    takeovers: &TakeoversStop,
) -> Result<Lsn, JournalError> {
    let consumer = reader(config, partition, Offset::Beginning)?;
    let mut first = 0;
    each_record(&consumer, partition, Some(takeovers), |key, _, _| {
        first = key.first_lsn;
        Ok(Continue::No)
    })?;
    Ok(first)
}

/// Reads from `start` to the end, noting records in the index: the first LSN seen (if any) and the LSN
/// after the last record.
///
/// The end is the partition's high watermark, which `scan` asks for after `init_transactions` fenced
/// every earlier owner: every acknowledged group commit lies below it. Kafka's end-of-partition
/// signal is not enough on its own: it comes at the end a broker knows of, and a leader elected a
/// moment ago may not yet know the old leader's; so does an end held back by a transaction another
/// producer left open. Either way the scan reads on, and gives up only when nothing comes for
/// [`READ_STALL_MAX`].
fn scan_from(
    config: &KafkaConfig,
    partition: PartitionId,
    index: &Mutex<OffsetIndex>,
    takeovers: &TakeoversStop,
    start: Offset,
    (low_watermark, high_watermark): (i64, i64),
) -> Result<(Option<Lsn>, Lsn), JournalError> {
    let consumer = reader(config, partition, start)?;
    let mut first_lsn = None;
    let mut next_lsn = 0;
    let mut note = |key: RecordKey, offset: i64, frames: &[u8]| {
        // The first record read may start anywhere; each later one where the one before ended.
        if first_lsn.is_some() && key.first_lsn != next_lsn {
            return Err(format!(
                "offset {offset} holds records from LSN {}, but {next_lsn} was expected next",
                key.first_lsn
            ));
        }
        first_lsn.get_or_insert(key.first_lsn);
        next_lsn = key.first_lsn + u64::from(key.record_count);
        index
            .lock()
            .expect("no panics while held")
            .note(key.first_lsn, offset, frames.len());
        Ok(Continue::Yes)
    };
    loop {
        each_record(&consumer, partition, Some(takeovers), &mut note)?;
        let reached = position(&consumer, config, partition)?.unwrap_or(low_watermark);
        if reached >= high_watermark {
            return Ok((first_lsn, next_lsn));
        }
        tracing::warn!(
            partition,
            reached,
            high_watermark,
            "Kafka reported the end of the partition below its high watermark at takeover; reading on"
        );
    }
}

/// Asks where the journal's partitions end. One client serves every opening: a client's start and
/// end cost hundreds of milliseconds, a query a round trip.
pub(crate) struct LogEnds {
    client: BaseConsumer,
}

impl LogEnds {
    pub(crate) fn new(config: &KafkaConfig) -> Result<Self, KafkaError> {
        let client = config
            .client()
            // Records of open transactions count: the end is every record the partition holds.
            .set("isolation.level", "read_uncommitted")
            .create()?;
        Ok(Self { client })
    }

    /// The partition's (low, high) watermarks. A leader elected moments ago whose high watermark may
    /// lag the old leader's answers OFFSET_NOT_AVAILABLE (KIP-207): asked again until it knows.
    fn watermarks(
        &self,
        config: &KafkaConfig,
        partition: PartitionId,
    ) -> Result<(i64, i64), JournalError> {
        let deadline = Instant::now() + config.connect_timeout;
        loop {
            let asked = self.client.fetch_watermarks(
                &config.topic,
                i32::from(partition),
                config.connect_timeout,
            );
            match asked {
                Ok(watermarks) => return Ok(watermarks),
                Err(error)
                    if Instant::now() < deadline
                        && (is_transient(&error)
                            || error.rdkafka_error_code()
                                == Some(RDKafkaErrorCode::OffsetNotAvailable)) =>
                {
                    tracing::debug!(partition, %error, "the partition's end is not known yet; asking again");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(error) => return Err(replicated(partition, "reading the log's end", error)),
            }
        }
    }
}

/// The offset after the last record or transaction marker `consumer` has read of `partition`, if it
/// has read any.
fn position(
    consumer: &Reader,
    config: &KafkaConfig,
    partition: PartitionId,
) -> Result<Option<i64>, JournalError> {
    let positions = consumer
        .position()
        .map_err(|e| replicated(partition, "reading the reader's position", e))?;
    Ok(positions
        .find_partition(&config.topic, i32::from(partition))
        .and_then(|element| match element.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        }))
}

/// Calls `visit` with every record `from..until` of `partition`, checking that LSNs follow on. A
/// takeover's read (its replay) passes its `takeover` stop.
pub(crate) fn read(
    config: &KafkaConfig,
    partition: PartitionId,
    index: &Mutex<OffsetIndex>,
    takeover: Option<&TakeoversStop>,
    from: Lsn,
    until: Lsn,
    visit: &mut Visit<'_>,
) -> Result<(), JournalError> {
    if from >= until {
        return Ok(());
    }
    let start = index.lock().expect("no panics while held").start_for(from);
    let consumer = reader(config, partition, start)?;
    let mut expected: Option<Lsn> = None;
    let mut visit_error = None;
    each_record(&consumer, partition, takeover, |key, offset, frames| {
        let end = key.first_lsn + u64::from(key.record_count);
        match expected {
            Some(expected) if key.first_lsn != expected => {
                return Err(format!(
                    "offset {offset} holds records from LSN {}, but {expected} was expected next",
                    key.first_lsn
                ));
            }
            None if key.first_lsn > from => {
                return Err(format!(
                    "the log starts at LSN {} (offset {offset}), after the requested {from}",
                    key.first_lsn
                ));
            }
            _ => {}
        }
        expected = Some(end);
        if end <= from {
            return Ok(Continue::Yes);
        }
        let mut lsn = key.first_lsn;
        let mut at = 0;
        while at < frames.len() && lsn < until {
            match read_frame(&frames[at..]) {
                Frame::Valid {
                    kind,
                    body,
                    total_bytes,
                } => {
                    if lsn >= from
                        && let Err(error) = visit(lsn, kind, body)
                    {
                        visit_error = Some(error);
                        return Ok(Continue::No);
                    }
                    at += total_bytes;
                    lsn += 1;
                }
                Frame::Incomplete | Frame::Corrupt => {
                    return Err(format!("offset {offset}: record {lsn} is damaged"));
                }
            }
        }
        if lsn < until && lsn != end {
            return Err(format!(
                "offset {offset} says it holds records {}..{end} but ends at {lsn}",
                key.first_lsn
            ));
        }
        Ok(if lsn >= until {
            Continue::No
        } else {
            Continue::Yes
        })
    })?;
    if let Some(error) = visit_error {
        return Err(error);
    }
    let reached = expected.unwrap_or(0);
    if reached < until {
        return Err(JournalError::Gap(format!(
            "partition {partition}'s Kafka log ends at LSN {reached}, below {until}"
        )));
    }
    Ok(())
}

enum Continue {
    Yes,
    No,
}

/// Polls `consumer` until the end of its partition (or until `each` says stop), handing each record's
/// key, offset and value to `each`; fails once `takeover` is set.
fn each_record(
    consumer: &Reader,
    partition: PartitionId,
    takeover: Option<&TakeoversStop>,
    mut each: impl FnMut(RecordKey, i64, &[u8]) -> Result<Continue, String>,
) -> Result<(), JournalError> {
    let mut last_progress = Instant::now();
    loop {
        if takeover.is_some_and(TakeoversStop::is_set) {
            return Err(replicated(
                partition,
                "taking the partition over",
                "the node is stopping",
            ));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {
                if last_progress.elapsed() > READ_STALL_MAX {
                    return Err(replicated(
                        partition,
                        "reading the log",
                        format!("nothing new from Kafka for {} s", READ_STALL_MAX.as_secs()),
                    ));
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(()),
            // A broker gone or a leader moving: the client finds the new leader by itself.
            Some(Err(error)) if is_transient(&error) => {
                tracing::debug!(partition, %error, "Kafka read interrupted; retrying");
                if last_progress.elapsed() > READ_STALL_MAX {
                    return Err(replicated(partition, "reading the log", error));
                }
            }
            Some(Err(error)) => return Err(replicated(partition, "reading the log", error)),
            Some(Ok(message)) => {
                last_progress = Instant::now();
                let offset = message.offset();
                let path = || format!("Kafka partition {partition}").into();
                let corrupt = |reason: String| JournalError::Corrupt {
                    path: path(),
                    offset: offset as u64,
                    reason,
                };
                let key = RecordKey::decode(message.key()).map_err(|error| match error {
                    KeyError::Newer(found) => JournalError::NewerFormat {
                        path: path(),
                        offset: offset as u64,
                        found: u32::from(found),
                        readable: DATA_FORMAT_VERSION,
                    },
                    KeyError::Malformed(reason) => corrupt(reason),
                })?;
                let frames = message.payload().unwrap_or_default();
                match each(key, offset, frames).map_err(corrupt)? {
                    Continue::Yes => {}
                    Continue::No => return Ok(()),
                }
            }
        }
    }
}

/// Errors that say another producer with the same `transactional.id` took the log over.
fn is_fenced(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    )
}

/// Errors a read outlives: the client reconnects and finds the partition's new leader itself.
pub(crate) fn is_transient(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::NetworkException
                | RDKafkaErrorCode::NotEnoughReplicas
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_engine::record::{Envelope, Origin, begin_record, finish_record};

    fn frames(count: usize, payload_bytes: usize) -> Vec<u8> {
        let mut buf = Vec::new();
        for i in 0..count {
            let envelope = Envelope {
                app: 1,
                origin: Origin::Client { command_id: None },
                timestamp_ms: i as u64,
                random: 0,
            };
            let start = begin_record(&mut buf, &envelope, &vec![7; payload_bytes]);
            finish_record(&mut buf, start);
        }
        buf
    }

    #[test]
    fn key_round_trips_and_refuses_newer_versions() {
        let key = RecordKey {
            first_lsn: u64::MAX - 3,
            record_count: 77,
        };
        assert_eq!(RecordKey::decode(Some(&key.encode())), Ok(key));
        let mut newer = key.encode();
        newer[0] = KEY_VERSION + 1;
        let refused = RecordKey::decode(Some(&newer)).unwrap_err();
        assert_eq!(refused, KeyError::Newer(KEY_VERSION + 1));
        assert_eq!(
            refused.to_string(),
            format!(
                "a record of data format version {}; this binary reads versions 1 to {KEY_VERSION}",
                KEY_VERSION + 1
            )
        );
        let mut unversioned = key.encode();
        unversioned[0] = 0;
        assert!(matches!(
            RecordKey::decode(Some(&unversioned)),
            Err(KeyError::Malformed(_))
        ));
        assert!(RecordKey::decode(Some(&newer[..12])).is_err());
        assert!(RecordKey::decode(None).is_err());
    }

    #[test]
    fn chunks_split_at_frame_boundaries_and_keep_every_record() {
        let small = frames(3, 10);
        assert_eq!(chunks(&small, 3), vec![(&small[..], 3)]);
        // 40 records of 1 MiB: several chunks, none over the limit, all records kept in order.
        let big = frames(40, 1024 * 1024);
        let pieces = chunks(&big, 40);
        assert!(pieces.len() > 1);
        assert!(
            pieces
                .iter()
                .all(|(bytes, _)| bytes.len() <= CHUNK_BYTES_MAX)
        );
        assert_eq!(pieces.iter().map(|(_, c)| *c).sum::<u32>(), 40);
        assert_eq!(
            pieces.iter().map(|(b, _)| b.len()).sum::<usize>(),
            big.len()
        );
        for (bytes, count) in pieces {
            let mut at = 0;
            for _ in 0..count {
                let Frame::Valid { total_bytes, .. } = read_frame(&bytes[at..]) else {
                    panic!("a chunk does not start at a frame boundary");
                };
                at += total_bytes;
            }
            assert_eq!(at, bytes.len());
        }
    }

    #[test]
    fn index_starts_reads_at_or_below_the_lsn() {
        let mut index = OffsetIndex::default();
        assert_eq!(index.start_for(5), Offset::Beginning);
        index.note(0, 0, 10);
        // Within the stride: not indexed.
        index.note(10, 2, 10);
        index.note(20, 4, INDEX_STRIDE_BYTES as usize);
        index.note(30, 6, 10);
        assert_eq!(index.entries, vec![(0, 0), (30, 6)]);
        assert_eq!(index.start_for(25), Offset::Offset(0));
        assert_eq!(index.start_for(30), Offset::Offset(6));
        assert_eq!(index.start_for(1_000), Offset::Offset(6));
        // An LSN already indexed (a replay noting what the writer noted) changes nothing.
        index.note(30, 6, 10);
        assert_eq!(index.entries.len(), 2);
        // A snapshot's start is taken only past every entry, so a scan never starts earlier than it could.
        index.learn((25, 5));
        assert_eq!(index.entries, vec![(0, 0), (30, 6)]);
        index.learn((40, 9));
        assert_eq!(index.start_for(1_000), Offset::Offset(9));
        let mut fresh = OffsetIndex::default();
        fresh.learn((40, 9));
        assert_eq!(fresh.start_for(39), Offset::Beginning);
        assert_eq!(fresh.entry_at_or_below(45), Some((40, 9)));
    }
}
