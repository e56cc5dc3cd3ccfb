//! The acknowledged binary stream: producers send batches of 100-byte records over TCP and get one ack per
//! batch, sent only once every record of it is durable.
//!
//! Frames are little-endian and length-prefixed.
//! - Batch (producer → server): `len u32 | kind u8 (1 score, 2 history) | producer u64 | seq u64 | records`,
//!   where `len` counts everything after itself and records are whole 100-byte records.
//! - Ack (server → producer): `len u32 | seq u64 | status u8 | scored u32 | flagged u32 | malformed u32 |
//!   message`. Status 0: durable. 1: not applied, resend later (server stopping, journal failed).
//!   2: invalid batch, do not resend.
//!
//! `(producer, seq)` is the batch's idempotency key, so a producer that lost its connection resends every
//! unacknowledged batch and the engine applies each exactly once. Batches of one connection are queued
//! in the order they arrive; acks may overtake each other.

use crate::ingest::{BatchKind, Ingest, IngestError};
use crate::record::{RECORD_BYTES, Txn, mask_card, parse_record};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

pub const KIND_SCORE: u8 = 1;
pub const KIND_HISTORY: u8 = 2;
pub const STATUS_DURABLE: u8 = 0;
pub const STATUS_RETRY: u8 = 1;
pub const STATUS_INVALID: u8 = 2;
const BATCH_HEADER_BYTES: usize = 1 + 8 + 8;
/// Records per batch; larger frames are refused before they are read.
pub const BATCH_RECORDS_MAX: usize = 40_000;
const FRAME_BYTES_MAX: usize = BATCH_HEADER_BYTES + BATCH_RECORDS_MAX * RECORD_BYTES;
/// Batches of one connection queued or being applied at once; reading pauses beyond it.
const BATCHES_IN_FLIGHT_MAX: usize = 64;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ack {
    pub seq: u64,
    pub status: u8,
    pub scored: u32,
    pub flagged: u32,
    pub malformed: u32,
    pub message: String,
}

impl Ack {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(33 + self.message.len());
        out.extend_from_slice(&((8 + 1 + 12 + self.message.len()) as u32).to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.push(self.status);
        out.extend_from_slice(&self.scored.to_le_bytes());
        out.extend_from_slice(&self.flagged.to_le_bytes());
        out.extend_from_slice(&self.malformed.to_le_bytes());
        out.extend_from_slice(self.message.as_bytes());
        out
    }

    /// Decodes the bytes after the length prefix.
    pub fn decode(body: &[u8]) -> Option<Self> {
        if body.len() < 21 {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        Some(Self {
            seq: u64::from_le_bytes(body[..8].try_into().expect("8 bytes")),
            status: body[8],
            scored: u32_at(9),
            flagged: u32_at(13),
            malformed: u32_at(17),
            message: String::from_utf8_lossy(&body[21..]).into_owned(),
        })
    }
}

/// Encodes one batch frame. The server refuses a batch that is not whole 100-byte records.
pub fn encode_batch(kind: u8, producer: u64, seq: u64, records: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(4 + BATCH_HEADER_BYTES + records.len());
    frame.extend_from_slice(&((BATCH_HEADER_BYTES + records.len()) as u32).to_le_bytes());
    frame.push(kind);
    frame.extend_from_slice(&producer.to_le_bytes());
    frame.extend_from_slice(&seq.to_le_bytes());
    frame.extend_from_slice(records);
    frame
}

/// Accepts producers until the task is dropped.
pub async fn serve(listener: TcpListener, ingest: Ingest) {
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                let ingest = ingest.clone();
                tokio::spawn(async move {
                    if let Err(error) = connection(socket, ingest).await {
                        tracing::info!(%peer, %error, "stream producer disconnected");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accepting a stream producer failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Parses the records of a batch; malformed ones are counted, logged (card masked) and skipped.
fn parse_batch(records: &[u8], stream_offset: u64, ingest: &Ingest) -> (Vec<Txn>, u32) {
    let mut txns = Vec::with_capacity(records.len() / RECORD_BYTES);
    let mut malformed = 0u32;
    for (index, record) in records.chunks(RECORD_BYTES).enumerate() {
        match parse_record(record) {
            Ok(txn) => txns.push(txn),
            Err(error) => {
                malformed += 1;
                let card = std::str::from_utf8(&record[..record.len().min(14)])
                    .ok()
                    .and_then(|digits| digits.parse::<u64>().ok())
                    .map_or_else(|| "unreadable".to_string(), mask_card);
                tracing::warn!(
                    offset = stream_offset + (index * RECORD_BYTES) as u64,
                    card,
                    %error,
                    "skipping a malformed record"
                );
            }
        }
    }
    if malformed > 0 {
        ingest.metrics().rejected("stream", u64::from(malformed));
    }
    (txns, malformed)
}

/// Answers batch `seq` as invalid: the producer must not resend it.
async fn refuse(acks: &mpsc::Sender<Ack>, seq: u64, message: String) {
    let ack = Ack {
        seq,
        status: STATUS_INVALID,
        message,
        ..Ack::default()
    };
    let _ = acks.send(ack).await;
}

async fn connection(socket: TcpStream, ingest: Ingest) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    let (reader, mut writer) = socket.into_split();
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let (acks, mut outbox) = mpsc::channel::<Ack>(BATCHES_IN_FLIGHT_MAX);
    let writer_task = tokio::spawn(async move {
        while let Some(ack) = outbox.recv().await {
            if writer.write_all(&ack.encode()).await.is_err() {
                break;
            }
        }
    });
    let in_flight = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT_MAX));
    let mut stream_offset = 0u64;
    let mut frame = Vec::new();
    let result = loop {
        let len = match reader.read_u32_le().await {
            Ok(len) => len as usize,
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(error) => break Err(error),
        };
        if !(BATCH_HEADER_BYTES..=FRAME_BYTES_MAX).contains(&len) {
            let message = format!(
                "frame of {len} bytes; a batch is {BATCH_HEADER_BYTES}..={FRAME_BYTES_MAX}"
            );
            // The frame cannot be skipped without its length: answer, then close the connection.
            refuse(&acks, 0, message.clone()).await;
            break Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                message,
            ));
        }
        frame.resize(len, 0);
        if let Err(error) = reader.read_exact(&mut frame).await {
            break Err(error);
        }
        let kind = frame[0];
        let producer = u64::from_le_bytes(frame[1..9].try_into().expect("8 bytes"));
        let seq = u64::from_le_bytes(frame[9..17].try_into().expect("8 bytes"));
        let records = &frame[BATCH_HEADER_BYTES..];
        let record_offset = stream_offset + 4 + BATCH_HEADER_BYTES as u64;
        stream_offset += 4 + len as u64;
        let kind = match kind {
            KIND_SCORE => BatchKind::Score {
                want_verdicts: false,
            },
            KIND_HISTORY => BatchKind::Import,
            other => {
                refuse(&acks, seq, format!("unknown batch kind {other}")).await;
                continue;
            }
        };
        if !records.len().is_multiple_of(RECORD_BYTES) {
            let whole = format!("a whole number of {RECORD_BYTES}-byte records");
            refuse(
                &acks,
                seq,
                format!("{} record bytes is not {whole}", records.len()),
            )
            .await;
            continue;
        }
        let (txns, malformed) = parse_batch(records, record_offset, &ingest);
        let batch_id = (u128::from(producer) << 64) | u128::from(seq);
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        // Queued here, before the next frame is read, so a connection's batches apply in order.
        let queued = ingest.enqueue(kind, Some(batch_id), &txns, None).await;
        let acks = acks.clone();
        let ingest = ingest.clone();
        tokio::spawn(async move {
            let mut ack = Ack {
                seq,
                malformed,
                ..Ack::default()
            };
            let mut attempt = queued.map_err(IngestError::from);
            let outcome = loop {
                match attempt {
                    Ok(batch) => match batch.outcome().await {
                        // An earlier copy of this batch (from a lost connection) is still being applied.
                        Err(IngestError::InFlight) => {
                            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                            attempt = ingest
                                .enqueue(kind, Some(batch_id), &txns, None)
                                .await
                                .map_err(IngestError::from);
                        }
                        other => break other,
                    },
                    Err(error) => break Err(error),
                }
            };
            match outcome {
                Ok(outcome) => {
                    ack.status = STATUS_DURABLE;
                    ack.scored = outcome.scored as u32;
                    ack.flagged = outcome.flagged as u32;
                }
                Err(error @ IngestError::Conflict) => {
                    ack.status = STATUS_INVALID;
                    ack.message = error.to_string();
                }
                Err(error) => {
                    ack.status = STATUS_RETRY;
                    ack.message = error.to_string();
                }
            }
            let _ = acks.send(ack).await;
            drop(permit);
        });
    };
    drop(acks);
    let _ = writer_task.await;
    result
}
