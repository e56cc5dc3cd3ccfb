//! Partition snapshots on Kafka, so that a node that never had a partition's disk takes it over from a
//! snapshot and replays only the journal after it.
//!
//! Every snapshot file a partition's owner writes is copied, by the node's uploader thread, to the
//! snapshot topic (`<journal topic>-snapshots`, one partition per engine partition, replicated like the
//! journal, records kept for [`RETENTION`]) as consecutive records of at most [`CHUNK_BYTES`] each, from an
//! idempotent producer with `acks=all`. Each record's key says which snapshot and chunk it is, and where in
//! the journal topic a read of the records after the snapshot may start.
//!
//! A reader takes the partition's last record, steps back to the first chunk of that snapshot, and checks
//! that the records in between are its chunks in order. A snapshot cut short (its writer died) or
//! interleaved with another (an old owner still publishing) fails that check, and the reader tries the one
//! before it, a few times at most. Nothing here is needed for correctness: the journal topic keeps every
//! record, so without a snapshot a new owner replays all of it. The file's own section checksums are
//! checked again when recovery loads it.

use crate::log::{Reader, is_transient, unassigned_reader};
use crate::topic::{self, Keep};
use crate::{KafkaConfig, TakeoversStop};
use crate::{MESSAGE_BYTES_MAX, SetupError};
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use spate_engine::PartitionId;
use spate_engine::journal::Lsn;
use spate_engine::snapshot;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The largest chunk of a snapshot file in one Kafka record.
pub(crate) const CHUNK_BYTES: usize = 4 * 1024 * 1024;
/// How long the snapshot topic keeps a record. Snapshots are full copies, so keeping them forever would
/// grow without bound; a partition idle for longer than this loses its snapshot on Kafka, and a new owner
/// then replays its whole journal (slower, never wrong).
pub(crate) const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Snapshots waiting for the uploader; more are dropped with a warning (a later one supersedes them).
const UPLOADS_QUEUED_MAX: usize = 64;
/// How many snapshots, newest first, a reader tries before it gives up and the journal is replayed whole.
const CANDIDATES_MAX: usize = 4;
/// The longest an upload or a read of one snapshot may go without progress.
const STALL_MAX: Duration = Duration::from_secs(30);

const KEY_VERSION: u8 = 1;
const KEY_BYTES: usize = 33;

/// Where a read of the journal topic may start to find the records from an LSN on: the offset of a
/// record whose first LSN is `lsn` or lower. Offsets only grow with LSNs, so this stays a safe start for
/// every LSN at or above `lsn`.
pub(crate) type JournalStart = (Lsn, i64);

/// What a snapshot record's key says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChunkKey {
    /// The snapshot's LSN: the state after every record below it.
    lsn: Lsn,
    chunk_index: u32,
    chunk_count: u32,
    journal_start: Option<JournalStart>,
}

impl ChunkKey {
    fn encode(self) -> [u8; KEY_BYTES] {
        let (start_lsn, start_offset) = self.journal_start.unwrap_or((0, -1));
        let mut key = [0; KEY_BYTES];
        key[0] = KEY_VERSION;
        key[1..9].copy_from_slice(&self.lsn.to_le_bytes());
        key[9..13].copy_from_slice(&self.chunk_index.to_le_bytes());
        key[13..17].copy_from_slice(&self.chunk_count.to_le_bytes());
        key[17..25].copy_from_slice(&start_lsn.to_le_bytes());
        key[25..33].copy_from_slice(&start_offset.to_le_bytes());
        key
    }

    fn decode(key: Option<&[u8]>) -> Result<Self, String> {
        let key = key.ok_or("a snapshot record without a key")?;
        if key.len() != KEY_BYTES || key[0] != KEY_VERSION {
            return Err(format!(
                "a snapshot record key of {} bytes, version {:?}; this binary reads {KEY_BYTES} bytes, version {KEY_VERSION}",
                key.len(),
                key.first()
            ));
        }
        let u32_at = |at: usize| u32::from_le_bytes(key[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(key[at..at + 8].try_into().expect("8 bytes"));
        let (chunk_index, chunk_count) = (u32_at(9), u32_at(13));
        if chunk_index >= chunk_count {
            return Err(format!("chunk {chunk_index} of {chunk_count}"));
        }
        let start_offset = u64_at(25) as i64;
        Ok(Self {
            lsn: u64_at(1),
            chunk_index,
            chunk_count,
            journal_start: (start_offset >= 0).then_some((u64_at(17), start_offset)),
        })
    }
}

/// The snapshot topic's client settings: the journal's, on the snapshot topic.
pub(crate) fn topic_config(journal: &KafkaConfig) -> KafkaConfig {
    KafkaConfig {
        topic: format!("{}-snapshots", journal.topic),
        ..journal.clone()
    }
}

/// A snapshot file to copy to Kafka.
struct Upload {
    partition: PartitionId,
    lsn: Lsn,
    path: PathBuf,
    journal_start: Option<JournalStart>,
}

/// The node's one uploader thread and its bounded queue.
pub(crate) struct Uploader {
    queue: Mutex<Option<SyncSender<Upload>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Uploader {
    /// Makes sure the snapshot topic exists and starts the uploader thread.
    pub(crate) fn start(
        journal: &KafkaConfig,
        partition_count: u16,
    ) -> Result<Arc<Self>, SetupError> {
        let config = topic_config(journal);
        topic::ensure(&config, partition_count, Keep::For(RETENTION))?;
        let producer: ThreadedProducer<UploadReports> = config
            .client()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.max.bytes", (MESSAGE_BYTES_MAX + 4096).to_string())
            // One chunk per produce batch: the topic's limit applies to a whole batch, and two chunks
            // together could pass it.
            .set("batch.size", (CHUNK_BYTES + 64 * 1024).to_string())
            .set("message.timeout.ms", STALL_MAX.as_millis().to_string())
            .create_with_context(UploadReports::default())?;
        let (queue, uploads) = sync_channel(UPLOADS_QUEUED_MAX);
        let thread = std::thread::Builder::new()
            .name("snapshot-uploader".into())
            .spawn(move || upload_all(&config, &producer, uploads))
            .map_err(|e| SetupError::Membership(format!("spawning the snapshot uploader: {e}")))?;
        Ok(Arc::new(Self {
            queue: Mutex::new(Some(queue)),
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Queues a copy of the snapshot file at `path` without waiting for it.
    pub(crate) fn publish(
        &self,
        partition: PartitionId,
        lsn: Lsn,
        path: &Path,
        journal_start: Option<JournalStart>,
    ) {
        let queue = self.queue.lock().expect("no panics while held");
        let Some(queue) = queue.as_ref() else {
            return;
        };
        let upload = Upload {
            partition,
            lsn,
            path: path.to_path_buf(),
            journal_start,
        };
        if let Err(TrySendError::Full(_)) = queue.try_send(upload) {
            tracing::warn!(
                partition,
                lsn,
                "snapshot uploads are behind; this one stays local"
            );
        }
    }

    /// Uploads what is queued, then stops the thread (at shutdown: the last snapshots reach Kafka).
    pub(crate) fn finish(&self) {
        self.queue.lock().expect("no panics while held").take();
        if let Some(thread) = self.thread.lock().expect("no panics while held").take()
            && thread.join().is_err()
        {
            tracing::error!("the snapshot uploader panicked");
        }
    }
}

/// Delivery reports of the uploader's producer: how many came, and the first failure.
#[derive(Default)]
struct UploadReports {
    state: Mutex<(usize, Option<KafkaError>)>,
}

impl ClientContext for UploadReports {}

impl ProducerContext for UploadReports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut state = self.state.lock().expect("no panics while held");
        state.0 += 1;
        if let Err((error, _)) = result
            && state.1.is_none()
        {
            state.1 = Some(error.clone());
        }
    }
}

fn upload_all(
    config: &KafkaConfig,
    producer: &ThreadedProducer<UploadReports>,
    uploads: Receiver<Upload>,
) {
    for upload in uploads {
        let started = Instant::now();
        match upload_one(config, producer, &upload) {
            Ok(Some(bytes)) => tracing::info!(
                partition = upload.partition,
                lsn = upload.lsn,
                bytes,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "snapshot copied to Kafka"
            ),
            Ok(None) => tracing::debug!(
                partition = upload.partition,
                lsn = upload.lsn,
                "snapshot replaced before it was copied"
            ),
            Err(error) => tracing::warn!(
                partition = upload.partition,
                lsn = upload.lsn,
                %error,
                "could not copy a snapshot to Kafka; the next one will be"
            ),
        }
    }
}

/// Sends the file's chunks and waits until every one is acknowledged; the bytes sent, or `None` if the
/// file was already gone (a newer snapshot replaced it).
fn upload_one(
    config: &KafkaConfig,
    producer: &ThreadedProducer<UploadReports>,
    upload: &Upload,
) -> Result<Option<u64>, String> {
    let mut file = match File::open(&upload.path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("opening {}: {error}", upload.path.display())),
    };
    let bytes = file.metadata().map_err(|e| e.to_string())?.len();
    let chunk_count = u32::try_from(bytes.div_ceil(CHUNK_BYTES as u64).max(1))
        .map_err(|_| format!("a snapshot of {bytes} bytes has too many chunks"))?;
    *producer
        .context()
        .state
        .lock()
        .expect("no panics while held") = (0, None);
    let mut chunk = vec![0; CHUNK_BYTES];
    let mut left = bytes;
    for chunk_index in 0..chunk_count {
        let length = left.min(CHUNK_BYTES as u64) as usize;
        file.read_exact(&mut chunk[..length])
            .map_err(|e| format!("reading {}: {e}", upload.path.display()))?;
        left -= length as u64;
        let key = ChunkKey {
            lsn: upload.lsn,
            chunk_index,
            chunk_count,
            journal_start: upload.journal_start,
        }
        .encode();
        let record = BaseRecord::to(&config.topic)
            .partition(i32::from(upload.partition))
            .key(&key[..])
            .payload(&chunk[..length]);
        crate::log::send_waiting_for_room(producer, record, Instant::now() + STALL_MAX)
            .map_err(|e| format!("sending chunk {chunk_index}: {e}"))?;
    }
    producer
        .flush(STALL_MAX)
        .map_err(|e| format!("waiting for the chunks' acknowledgements: {e}"))?;
    let (reports, failure) = std::mem::take(&mut *producer.context().state.lock().expect("held"));
    match failure {
        Some(error) => Err(format!("a chunk was refused: {error}")),
        None if reports != chunk_count as usize => {
            Err(format!("{reports} of {chunk_count} chunks acknowledged"))
        }
        None => Ok(Some(bytes)),
    }
}

/// Copies the newest complete snapshot of `partition` on Kafka into `dir`, unless `dir` holds one at
/// least as new; returns where the journal may be read from after it. Problems are logged and answered
/// with `None`: the journal alone is enough to recover.
pub(crate) fn fetch_newest(
    journal: &KafkaConfig,
    partition: PartitionId,
    dir: &Path,
    takeovers: &TakeoversStop,
) -> Option<JournalStart> {
    let config = topic_config(journal);
    match fetch(&config, partition, dir, takeovers) {
        Ok(start) => start,
        // The takeover gives up: no replay follows.
        Err(_) if takeovers.is_set() => None,
        Err(error) => {
            tracing::warn!(partition, %error, "no snapshot from Kafka; the journal is replayed from its start");
            None
        }
    }
}

fn fetch(
    config: &KafkaConfig,
    partition: PartitionId,
    dir: &Path,
    takeovers: &TakeoversStop,
) -> Result<Option<JournalStart>, String> {
    let (low, high) = unassigned_reader(config)
        .map_err(|e| e.to_string())?
        .fetch_watermarks(&config.topic, i32::from(partition), STALL_MAX)
        .map_err(|e| format!("reading the snapshot topic's offsets: {e}"))?;
    let local_newest = snapshot::list(dir)
        .map_err(|e| e.to_string())?
        .first()
        .map(|&(lsn, _)| lsn);
    let mut last = high - 1;
    for _ in 0..CANDIDATES_MAX {
        if last < low {
            break;
        }
        if takeovers.is_set() {
            return Err("the node is stopping".into());
        }
        let reader = reader_at(config, partition, last)?;
        let last_key = next_record(&reader, partition, last, takeovers, |key, _| Ok(key))?;
        let first = last - i64::from(last_key.chunk_index);
        if last_key.chunk_index + 1 != last_key.chunk_count || first < low {
            // The end of a snapshot whose writer stopped half-way: look before its first chunk.
            last = first - 1;
            continue;
        }
        if local_newest >= Some(last_key.lsn) {
            return Ok(last_key.journal_start);
        }
        let copied = snapshot::install_copy(dir, last_key.lsn, |file| {
            copy_chunks(config, partition, first, last_key, takeovers, file)
        });
        match copied {
            Ok(path) => {
                tracing::info!(partition, lsn = last_key.lsn, path = %path.display(), "snapshot copied from Kafka");
                return Ok(last_key.journal_start);
            }
            Err(_) if takeovers.is_set() => return Err("the node is stopping".into()),
            Err(error) => {
                tracing::warn!(partition, lsn = last_key.lsn, %error, "snapshot on Kafka unusable; trying an older one");
                last = first - 1;
            }
        }
    }
    Ok(None)
}

/// Writes the chunks at `first..` of the snapshot `last_key` ends, checking that each is the next.
fn copy_chunks(
    config: &KafkaConfig,
    partition: PartitionId,
    first: i64,
    last_key: ChunkKey,
    takeovers: &TakeoversStop,
    out: &mut impl Write,
) -> io::Result<()> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let reader = reader_at(config, partition, first).map_err(invalid)?;
    for chunk_index in 0..last_key.chunk_count {
        let offset = first + i64::from(chunk_index);
        next_record(&reader, partition, offset, takeovers, |key, payload| {
            if (key.lsn, key.chunk_index, key.chunk_count)
                != (last_key.lsn, chunk_index, last_key.chunk_count)
            {
                return Err(format!(
                    "offset {offset} holds chunk {} of {} of snapshot {}, not chunk {chunk_index} of snapshot {}",
                    key.chunk_index, key.chunk_count, key.lsn, last_key.lsn
                ));
            }
            out.write_all(payload).map_err(|e| e.to_string())
        })
        .map_err(invalid)?;
    }
    Ok(())
}

/// A new reader of the snapshot partition from `offset` (a new one for each position, so that nothing
/// fetched for an earlier position is ever mistaken for this one's).
fn reader_at(config: &KafkaConfig, partition: PartitionId, offset: i64) -> Result<Reader, String> {
    let reader = unassigned_reader(config).map_err(|e| e.to_string())?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&config.topic, i32::from(partition), Offset::Offset(offset))
        .and_then(|()| reader.assign(&assignment))
        .map_err(|e| format!("assigning the snapshot reader: {e}"))?;
    Ok(reader)
}

/// Polls the reader's next record, which must be at `offset`, and hands it to `each`; fails once
/// `takeovers` is set.
fn next_record<T>(
    reader: &Reader,
    partition: PartitionId,
    offset: i64,
    takeovers: &TakeoversStop,
    each: impl FnOnce(ChunkKey, &[u8]) -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + STALL_MAX;
    loop {
        if takeovers.is_set() {
            return Err(format!(
                "reading snapshot partition {partition}: the node is stopping"
            ));
        }
        match reader.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                if message.offset() != offset {
                    return Err(format!(
                        "asked for offset {offset} of snapshot partition {partition}, got {}",
                        message.offset()
                    ));
                }
                let key = ChunkKey::decode(message.key())?;
                return each(key, message.payload().unwrap_or_default());
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {
                return Err(format!(
                    "snapshot partition {partition} ends before offset {offset}"
                ));
            }
            Some(Err(error))
                if !is_transient(&error)
                    && error.rdkafka_error_code() != Some(RDKafkaErrorCode::OperationTimedOut) =>
            {
                return Err(format!("reading snapshot partition {partition}: {error}"));
            }
            _ if Instant::now() > deadline => {
                return Err(format!(
                    "no answer from Kafka for {} s reading snapshot partition {partition}",
                    STALL_MAX.as_secs()
                ));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_keys_round_trip_and_refuse_nonsense() {
        let key = ChunkKey {
            lsn: 1 << 40,
            chunk_index: 2,
            chunk_count: 3,
            journal_start: Some((1 << 39, 12_345)),
        };
        assert_eq!(ChunkKey::decode(Some(&key.encode())), Ok(key));
        let without_start = ChunkKey {
            journal_start: None,
            ..key
        };
        assert_eq!(
            ChunkKey::decode(Some(&without_start.encode())),
            Ok(without_start)
        );
        let mut newer = key.encode();
        newer[0] = KEY_VERSION + 1;
        assert!(ChunkKey::decode(Some(&newer)).is_err());
        assert!(ChunkKey::decode(Some(&key.encode()[..20])).is_err());
        assert!(ChunkKey::decode(None).is_err());
        let past_the_end = ChunkKey {
            chunk_index: 3,
            ..key
        };
        assert!(ChunkKey::decode(Some(&past_the_end.encode())).is_err());
    }
}
