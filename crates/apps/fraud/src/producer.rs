//! A producer for the acknowledged stream: sends batches with a bounded window of unacknowledged ones,
//! and after losing the connection reconnects and resends every unacknowledged batch, in order.

use crate::stream::{Ack, STATUS_DURABLE, STATUS_INVALID, encode_batch};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

pub struct ProducerConfig {
    pub server: String,
    pub kind: u8,
    pub producer_id: u64,
    /// Unacknowledged batches allowed at once.
    pub window: usize,
    /// Give up after being unable to reach the server for this long.
    pub reconnect_for: Duration,
}

#[derive(Debug, Default, Clone)]
pub struct ProducerReport {
    pub batches: u64,
    pub records: u64,
    pub scored: u64,
    pub flagged: u64,
    pub malformed: u64,
    pub reconnects: u64,
    pub resent_batches: u64,
    /// Send-to-ack latency of each batch's last (acknowledged) send, microseconds.
    pub ack_latency_us: Vec<u64>,
}

struct Unacked {
    frame: Vec<u8>,
    records: u64,
    sent_at: Instant,
}

/// Sends every batch `next_batch` yields (record bytes, whole 100-byte records; `None` ends the stream)
/// and returns once all are acknowledged as durable.
pub async fn run(
    config: &ProducerConfig,
    mut next_batch: impl FnMut() -> Option<Vec<u8>>,
) -> Result<ProducerReport, ProducerError> {
    let mut report = ProducerReport::default();
    let mut unacked: BTreeMap<u64, Unacked> = BTreeMap::new();
    let mut next_seq = 0u64;
    let mut exhausted = false;
    let mut first_connection = true;
    while !(exhausted && unacked.is_empty()) {
        let socket = connect(&config.server, config.reconnect_for).await?;
        if !first_connection {
            report.reconnects += 1;
        }
        first_connection = false;
        socket.set_nodelay(true).ok();
        let (reader, mut writer) = socket.into_split();
        let (ack_tx, mut ack_rx) = mpsc::channel::<Ack>(1024);
        let reader_task = tokio::spawn(read_acks(reader, ack_tx));
        let mut failed = false;
        // Resend what the previous connection left unacknowledged, oldest first.
        for pending in unacked.values_mut() {
            report.resent_batches += 1;
            pending.sent_at = Instant::now();
            if writer.write_all(&pending.frame).await.is_err() {
                failed = true;
                break;
            }
        }
        while !(failed || exhausted && unacked.is_empty()) {
            while let Ok(ack) = ack_rx.try_recv() {
                failed |= !settle(ack, &mut unacked, &mut report)?;
            }
            if failed || (exhausted && unacked.is_empty()) {
                break;
            }
            if !exhausted && unacked.len() < config.window {
                match next_batch() {
                    Some(records) => {
                        let frame =
                            encode_batch(config.kind, config.producer_id, next_seq, &records);
                        let count = (records.len() / crate::record::RECORD_BYTES) as u64;
                        unacked.insert(
                            next_seq,
                            Unacked {
                                frame,
                                records: count,
                                sent_at: Instant::now(),
                            },
                        );
                        report.batches += 1;
                        report.records += count;
                        if writer.write_all(&unacked[&next_seq].frame).await.is_err() {
                            failed = true;
                        }
                        next_seq += 1;
                    }
                    None => exhausted = true,
                }
                continue;
            }
            match ack_rx.recv().await {
                Some(ack) => failed |= !settle(ack, &mut unacked, &mut report)?,
                None => failed = true,
            }
        }
        reader_task.abort();
        if failed {
            // Give a restarting or recovering server a moment before reconnecting and resending.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(report)
}

#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    #[error("cannot reach {server} for {seconds:.0} s: {reason}")]
    Unreachable {
        server: String,
        seconds: f64,
        reason: String,
    },
    #[error("batch {seq} refused: {message}")]
    Refused { seq: u64, message: String },
}

/// Applies an ack; `Ok(false)` means the server could not apply the batch now and it must be resent.
fn settle(
    ack: Ack,
    unacked: &mut BTreeMap<u64, Unacked>,
    report: &mut ProducerReport,
) -> Result<bool, ProducerError> {
    match ack.status {
        STATUS_DURABLE => {
            if let Some(done) = unacked.remove(&ack.seq) {
                report
                    .ack_latency_us
                    .push(done.sent_at.elapsed().as_micros() as u64);
                report.scored += u64::from(ack.scored);
                report.flagged += u64::from(ack.flagged);
                report.malformed += u64::from(ack.malformed);
                debug_assert!(u64::from(ack.scored + ack.malformed) <= done.records);
            }
            Ok(true)
        }
        STATUS_INVALID => Err(ProducerError::Refused {
            seq: ack.seq,
            message: ack.message,
        }),
        _ => {
            tracing::warn!(seq = ack.seq, message = %ack.message, "batch not applied; will resend");
            Ok(false)
        }
    }
}

async fn read_acks(reader: tokio::net::tcp::OwnedReadHalf, acks: mpsc::Sender<Ack>) {
    let mut reader = BufReader::new(reader);
    let mut body = Vec::new();
    loop {
        let Ok(len) = reader.read_u32_le().await else {
            return;
        };
        if len as usize > 1 << 16 {
            return;
        }
        body.resize(len as usize, 0);
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let Some(ack) = Ack::decode(&body) else {
            return;
        };
        if acks.send(ack).await.is_err() {
            return;
        }
    }
}

async fn connect(server: &str, patience: Duration) -> Result<TcpStream, ProducerError> {
    let started = Instant::now();
    let mut delay = Duration::from_millis(10);
    loop {
        match TcpStream::connect(server).await {
            Ok(socket) => return Ok(socket),
            Err(error) if started.elapsed() < patience => {
                tracing::debug!(%error, "stream server not reachable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            Err(error) => {
                return Err(ProducerError::Unreachable {
                    server: server.to_string(),
                    seconds: patience.as_secs_f64(),
                    reason: error.to_string(),
                });
            }
        }
    }
}
