//! The one way transactions enter the engine, shared by HTTP, the acknowledged stream and the pull bridge:
//! split a batch by partition, queue one encrypted command per partition in order, await them all.

use crate::APP_ID;
use crate::cipher::CardCipher;
use crate::command::{BatchReply, Command};
use crate::record::Txn;
use crate::state::card_key;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spate_engine::{EngineError, EngineHandle, PartitionId, Pending, Reply};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use thiserror::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchKind {
    Score { want_verdicts: bool },
    Import,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabel {
    pub rule: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

#[derive(Clone)]
pub struct FraudMetrics {
    scored: Counter,
    flagged: Family<RuleLabel, Counter>,
    rejected_records: Family<SourceLabel, Counter>,
    ingest_lag_ms: Gauge,
}

impl FraudMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            scored: Counter::default(),
            flagged: Family::default(),
            rejected_records: Family::default(),
            ingest_lag_ms: Gauge::default(),
        };
        let sub = registry.sub_registry_with_prefix("spate_fraud");
        sub.register(
            "transactions_scored",
            "Transactions scored and durable",
            metrics.scored.clone(),
        );
        sub.register(
            "transactions_flagged",
            "Transactions flagged, by rule",
            metrics.flagged.clone(),
        );
        sub.register(
            "records_rejected",
            "Malformed records skipped, by ingest path",
            metrics.rejected_records.clone(),
        );
        sub.register(
            "ingest_lag_ms",
            "Wall clock minus the newest timestamp of the last acknowledged batch",
            metrics.ingest_lag_ms.clone(),
        );
        metrics
    }

    pub fn scored_total(&self) -> u64 {
        self.scored.get()
    }

    pub fn rejected(&self, source: &str, count: u64) {
        self.rejected_records
            .get_or_create(&SourceLabel {
                source: source.to_string(),
            })
            .inc_by(count);
    }
}

#[derive(Debug, Error)]
pub enum IngestError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("a batch with this id is still being applied; retry shortly")]
    InFlight,
    #[error("this batch id was used before for different transactions")]
    Conflict,
    #[error("rejected: {0}")]
    Rejected(String),
}

/// The merged result of a batch; `verdicts` are in input order when they were asked for.
#[derive(Debug, Clone, Default)]
pub struct BatchOutcome {
    pub scored: u64,
    pub stored: u64,
    pub flagged: u64,
    pub verdicts: Vec<u8>,
}

#[derive(Clone)]
pub struct Ingest {
    engine: EngineHandle,
    cipher: Arc<CardCipher>,
    metrics: FraudMetrics,
}

/// A batch whose commands are queued; await [`QueuedBatch::outcome`] for the durable result.
pub struct QueuedBatch {
    parts: Vec<(Vec<u32>, Pending)>,
    len: usize,
    want_verdicts: bool,
    newest_ms: u64,
    metrics: FraudMetrics,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Ingest {
    pub fn new(engine: EngineHandle, cipher: Arc<CardCipher>, metrics: FraudMetrics) -> Self {
        Self {
            engine,
            cipher,
            metrics,
        }
    }

    pub fn engine(&self) -> &EngineHandle {
        &self.engine
    }

    pub fn metrics(&self) -> &FraudMetrics {
        &self.metrics
    }

    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        self.cipher.seal(plaintext)
    }

    /// Queues `txns` as one command per partition, in order on each partition. A full queue is waited
    /// out for up to `patience` (`None`: as long as it takes), then the rest of the batch is refused
    /// with [`EngineError::Overloaded`]; commands already queued stay queued, so retry with the same
    /// `batch_id` to finish the batch without applying any part twice.
    pub async fn enqueue(
        &self,
        kind: BatchKind,
        batch_id: Option<u128>,
        txns: &[Txn],
        patience: Option<Duration>,
    ) -> Result<QueuedBatch, EngineError> {
        let partitions = self.engine.partition_count();
        let mut split: Vec<(Vec<u32>, Vec<Txn>)> =
            vec![(Vec::new(), Vec::new()); usize::from(partitions)];
        for (index, txn) in txns.iter().enumerate() {
            let partition = spate_engine::partition_of(&card_key(txn.card), partitions);
            let (indices, part) = &mut split[usize::from(partition)];
            indices.push(index as u32);
            part.push(*txn);
        }
        let deadline = patience.map(|p| Instant::now() + p);
        let mut parts = Vec::with_capacity(split.len());
        for (partition, (indices, part)) in split.into_iter().enumerate() {
            if part.is_empty() {
                continue;
            }
            let partition = partition as PartitionId;
            let command = match kind {
                BatchKind::Score { want_verdicts } => Command::Score {
                    want_verdicts,
                    txns: part,
                },
                BatchKind::Import => Command::Import { txns: part },
            };
            let payload = self.cipher.seal(&command.encode());
            let command_id = batch_id.map(|id| part_id(id, partition));
            let pending = self
                .enqueue_sealed(partition, command_id, payload, deadline)
                .await?;
            parts.push((indices, pending));
        }
        Ok(QueuedBatch {
            parts,
            len: txns.len(),
            want_verdicts: matches!(
                kind,
                BatchKind::Score {
                    want_verdicts: true
                }
            ),
            newest_ms: txns.iter().map(Txn::timestamp_ms).max().unwrap_or(0),
            metrics: self.metrics.clone(),
        })
    }

    /// Queues one sealed command on `partition`, waiting out a full queue until `deadline` (`None`: as
    /// long as it takes), then refusing with [`EngineError::Overloaded`].
    pub async fn enqueue_sealed(
        &self,
        partition: PartitionId,
        command_id: Option<u128>,
        mut payload: Vec<u8>,
        deadline: Option<Instant>,
    ) -> Result<Pending, EngineError> {
        loop {
            match self.engine.enqueue(partition, APP_ID, command_id, payload) {
                Ok(pending) => return Ok(pending),
                Err(refused)
                    if refused.error == EngineError::Overloaded
                        && deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    payload = refused.payload;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(refused) => return Err(refused.error),
            }
        }
    }
}

/// The command id of part `part` of a generated history on `partition`.
pub fn generation_part_id(request_id: u128, part: u32, partition: PartitionId) -> u128 {
    let mut key = [0u8; 24];
    key[0] = APP_ID;
    key[1] = b'g';
    key[2..18].copy_from_slice(&request_id.to_le_bytes());
    key[18..22].copy_from_slice(&part.to_le_bytes());
    key[22..].copy_from_slice(&partition.to_le_bytes());
    xxhash_rust::xxh3::xxh3_128(&key)
}

/// The command id of one partition's part of a batch.
fn part_id(batch_id: u128, partition: PartitionId) -> u128 {
    let mut key = [0u8; 19];
    key[0] = APP_ID;
    key[1..17].copy_from_slice(&batch_id.to_le_bytes());
    key[17..].copy_from_slice(&partition.to_le_bytes());
    xxhash_rust::xxh3::xxh3_128(&key)
}

impl QueuedBatch {
    pub async fn outcome(self) -> Result<BatchOutcome, IngestError> {
        let mut outcome = BatchOutcome {
            verdicts: if self.want_verdicts {
                vec![0; self.len]
            } else {
                Vec::new()
            },
            ..BatchOutcome::default()
        };
        for (indices, pending) in self.parts {
            let (bytes, fresh) = match pending.reply().await? {
                Reply::Applied(bytes) => (bytes, true),
                Reply::Duplicate(bytes) => (bytes, false),
                Reply::InFlight => return Err(IngestError::InFlight),
                Reply::Conflict => return Err(IngestError::Conflict),
            };
            let reply = BatchReply::decode(&bytes)
                .map_err(|e| IngestError::Rejected(format!("unreadable reply: {e}")))?;
            if let Some(error) = reply.error {
                return Err(IngestError::Rejected(error));
            }
            outcome.scored += u64::from(reply.scored);
            outcome.stored += u64::from(reply.stored);
            outcome.flagged += u64::from(reply.flagged());
            if self.want_verdicts {
                for (index, verdict) in indices.iter().zip(&reply.verdicts) {
                    outcome.verdicts[*index as usize] = *verdict;
                }
            }
            // Duplicates were counted when first applied.
            if fresh {
                self.metrics.scored.inc_by(u64::from(reply.scored));
                for (rule, count) in &reply.flagged_by_rule {
                    self.metrics
                        .flagged
                        .get_or_create(&RuleLabel {
                            rule: u32::from(*rule),
                        })
                        .inc_by(u64::from(*count));
                }
            }
        }
        if self.newest_ms > 0 {
            self.metrics
                .ingest_lag_ms
                .set(now_ms().saturating_sub(self.newest_ms) as i64);
        }
        Ok(outcome)
    }
}
