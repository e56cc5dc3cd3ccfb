//! Settlement: pending captures become a batch, the batch becomes one file per (merchant, currency), and
//! only once the files are durable do its captures become `succeeded`.
//!
//! Exactly once across crashes: a capture enters one batch by a journaled command (`SettleAssign`), and
//! the batch remembers its captures in order. A run first finishes every batch a crashed run left open:
//! it writes the same files again (the content is a function of the journaled batch, so the bytes are
//! identical) and confirms them. A batch id is its cutoff time in ms, and the header's `created`.

use crate::command::{Command, Reply, encode};
use crate::keys::{Keyring, write_durably};
use crate::reference::Reference;
use crate::state::{Batches, Detail, Details, PartitionQuery};
use crate::{APP_ID, command::decode};
use serde::Serialize;
use spate_engine::{EngineError, EngineHandle};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Captures moved or confirmed per command: bounds a record's size (a few MB of events).
const CAPTURES_PER_COMMAND_MAX: u32 = 50_000;
/// Detail records read per query.
const DETAILS_PER_QUERY_MAX: u64 = 100_000;
const OVERLOAD_RETRIES_MAX: u32 = 100;

/// A settlement file written.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FileReport {
    /// Where it is on the server.
    #[schema(value_type = String)]
    pub path: PathBuf,
    pub merchant: String,
    pub currency: String,
    /// Captures in it.
    pub records: u64,
    /// The sum of their amounts, in minor units.
    pub amount_total: u64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BatchReport {
    #[schema(pattern = "^stl_[0-9]+$")]
    pub batch: String,
    /// A batch a crashed run left open, finished now.
    pub recovered: bool,
    /// Captures settled in it.
    pub captures: u64,
    /// Captures that failed (a suspended merchant's).
    pub failed: u64,
    pub files: Vec<FileReport>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SettleReport {
    pub batches: Vec<BatchReport>,
}

pub fn batch_name(batch: u64) -> String {
    format!("stl_{batch}")
}

pub struct Settler {
    engine: EngineHandle,
    keyring: Arc<Keyring>,
    reference: Arc<Reference>,
    dir: PathBuf,
    /// One run at a time; holds the last batch id used.
    last_batch: tokio::sync::Mutex<u64>,
}

impl Settler {
    pub fn new(
        engine: EngineHandle,
        keyring: Arc<Keyring>,
        reference: Arc<Reference>,
        dir: PathBuf,
    ) -> Self {
        Self {
            engine,
            keyring,
            reference,
            dir,
            last_batch: tokio::sync::Mutex::new(0),
        }
    }

    async fn submit(&self, partition: u16, command: &Command) -> Result<Reply, String> {
        let payload = encode(command);
        for _ in 0..OVERLOAD_RETRIES_MAX {
            match self
                .engine
                .submit(partition, APP_ID, None, payload.clone())
                .await
            {
                Ok(reply) => {
                    let bytes = spate_server::api::reply_bytes(reply).map_err(|e| e.message)?;
                    return decode(&bytes).map_err(|e| e.to_string());
                }
                Err(EngineError::Overloaded) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(error) => return Err(error.to_string()),
            }
        }
        Err("the partition stayed overloaded".to_string())
    }

    /// Asks `partition`, wherever it is applied, and decodes its answer.
    async fn read<A: serde::de::DeserializeOwned>(
        &self,
        partition: u16,
        query: &PartitionQuery,
    ) -> Result<A, String> {
        let query = encode(query);
        for _ in 0..OVERLOAD_RETRIES_MAX {
            match self.engine.read(partition, APP_ID, query.clone()).await {
                Ok(answer) => {
                    return decode(&answer).map_err(|e| {
                        format!("partition {partition} answered settlement badly: {e}")
                    });
                }
                Err(EngineError::Overloaded) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(error) => return Err(error.to_string()),
            }
        }
        Err("the partition stayed overloaded".to_string())
    }

    fn partitions(&self) -> std::ops::Range<u16> {
        0..self.engine.partition_count()
    }

    /// Finishes the batches a crashed run left open, then settles every capture spooled up to now.
    pub async fn run(&self) -> Result<SettleReport, String> {
        let mut last_batch = self.last_batch.lock().await;
        let mut open = std::collections::BTreeSet::new();
        for partition in self.partitions() {
            let here: Batches = self.read(partition, &PartitionQuery::Batches).await?;
            open.extend(here.open);
            // After a restart (or a clock step back) the next id still follows every batch made so far.
            *last_batch = (*last_batch).max(here.last);
        }
        let mut batches = Vec::new();
        for batch in open {
            let files = self.write_files(batch).await?;
            let captures = self.confirm(batch).await?;
            batches.push(BatchReport {
                batch: batch_name(batch),
                recovered: true,
                captures,
                failed: 0,
                files,
            });
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_millis() as u64;
        let batch = now_ms.max(*last_batch + 1);
        *last_batch = batch;
        let suspended: Vec<String> = {
            let reference = self.reference.current();
            let mut names: Vec<String> = reference
                .merchants
                .iter()
                .filter(|(_, m)| m.suspended)
                .map(|(name, _)| name.clone())
                .collect();
            names.sort();
            names
        };
        let (mut assigned, mut failed) = (0, 0);
        for partition in self.partitions() {
            loop {
                let command = Command::SettleAssign {
                    batch,
                    suspended: suspended.clone(),
                    limit: CAPTURES_PER_COMMAND_MAX,
                };
                match self.submit(partition, &command).await? {
                    Reply::Assigned {
                        assigned: a,
                        failed: f,
                        more,
                    } => {
                        assigned += a;
                        failed += f;
                        if !more {
                            break;
                        }
                    }
                    other => return Err(format!("unexpected reply to SettleAssign: {other:?}")),
                }
            }
        }
        let files = if assigned > 0 {
            let files = self.write_files(batch).await?;
            self.confirm(batch).await?;
            files
        } else {
            Vec::new()
        };
        batches.push(BatchReport {
            batch: batch_name(batch),
            recovered: false,
            captures: assigned,
            failed,
            files,
        });
        Ok(SettleReport { batches })
    }

    async fn confirm(&self, batch: u64) -> Result<u64, String> {
        let mut confirmed = 0;
        for partition in self.partitions() {
            loop {
                let command = Command::SettleConfirm {
                    batch,
                    limit: CAPTURES_PER_COMMAND_MAX,
                };
                match self.submit(partition, &command).await? {
                    Reply::Confirmed { confirmed: c, more } => {
                        confirmed += c;
                        if !more {
                            break;
                        }
                    }
                    other => return Err(format!("unexpected reply to SettleConfirm: {other:?}")),
                }
            }
        }
        Ok(confirmed)
    }

    /// Writes (or writes again, byte for byte) the files of `batch`.
    pub async fn write_files(&self, batch: u64) -> Result<Vec<FileReport>, String> {
        let mut groups: BTreeMap<(String, String), Vec<Detail>> = BTreeMap::new();
        for partition in self.partitions() {
            let mut offset = 0;
            loop {
                let query = PartitionQuery::Details {
                    batch,
                    offset,
                    limit: DETAILS_PER_QUERY_MAX,
                };
                let Details { details, total } = self.read(partition, &query).await?;
                offset += details.len() as u64;
                for detail in details {
                    groups
                        .entry((detail.merchant.clone(), detail.currency.clone()))
                        .or_default()
                        .push(detail);
                }
                if offset >= total {
                    break;
                }
            }
        }
        let dir = self.dir.join(batch_name(batch));
        let keyring = self.keyring.clone();
        tokio::task::spawn_blocking(move || {
            groups
                .into_iter()
                .map(|((merchant, currency), mut details)| {
                    details.sort_by(|a, b| {
                        (a.payment, &a.capture_id).cmp(&(b.payment, &b.capture_id))
                    });
                    let bytes = render(batch, &merchant, &currency, &details, &keyring);
                    let path = dir.join(format!("{merchant}_{currency}.stl"));
                    write_durably(&path, &bytes)
                        .map_err(|e| format!("writing {}: {e}", path.display()))?;
                    Ok(FileReport {
                        path,
                        merchant,
                        currency,
                        records: details.len() as u64,
                        amount_total: details.iter().map(|d| d.amount).sum(),
                    })
                })
                .collect()
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

fn format_time_ms(ms: u64) -> String {
    let time = time::OffsetDateTime::UNIX_EPOCH + time::Duration::milliseconds(ms as i64);
    time.format(&time::format_description::well_known::Rfc3339)
        .expect("a time after 1970 formats")
}

/// The settlement file:
/// ```text
/// H|<batch>|<merchant>|<currency>|<created, RFC 3339>|mac-<key id>
/// D|<payment id>|<capture id>|<amount>|<currency>|<masked card>     (one per capture)
/// T|<record count>|<amount total>|<HMAC-SHA-256 of every byte before this line, hex>
/// ```
pub fn render(
    batch: u64,
    merchant: &str,
    currency: &str,
    details: &[Detail],
    keyring: &Keyring,
) -> Vec<u8> {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(96 * (details.len() + 2));
    let (key_id, _) = keyring.mac(b"");
    let _ = writeln!(
        text,
        "H|{}|{merchant}|{currency}|{}|mac-{key_id}",
        batch_name(batch),
        format_time_ms(batch)
    );
    let mut total = 0u64;
    for d in details {
        total += d.amount;
        let _ = writeln!(
            text,
            "D|{}|{}|{}|{}|{}",
            d.payment, d.capture_id, d.amount, d.currency, d.masked
        );
    }
    let (_, mac) = keyring.mac(text.as_bytes());
    let _ = writeln!(text, "T|{}|{total}|{}", details.len(), hex::encode(mac));
    text.into_bytes()
}

/// Checks a settlement file's trailer (count, total and MAC); returns (records, amount total).
pub fn verify(bytes: &[u8], keyring: &Keyring) -> Result<(u64, u64), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    let body_end = text
        .trim_end_matches('\n')
        .rfind('\n')
        .map(|i| i + 1)
        .ok_or("no trailer")?;
    let (body, trailer) = text.split_at(body_end);
    let fields: Vec<&str> = trailer.trim_end().split('|').collect();
    let ["T", count, total, mac] = fields[..] else {
        return Err("the last line is not a trailer".to_string());
    };
    if hex::encode(keyring.mac(body.as_bytes()).1) != mac {
        return Err("the MAC does not match".to_string());
    }
    let details: Vec<u64> = body
        .lines()
        .filter(|l| l.starts_with("D|"))
        .map(|l| {
            l.rsplit('|')
                .nth(2)
                .and_then(|a| a.parse().ok())
                .ok_or("bad detail")
        })
        .collect::<Result<_, _>>()?;
    let (count, total): (u64, u64) = (
        count.parse().map_err(|_| "bad count")?,
        total.parse().map_err(|_| "bad total")?,
    );
    if count != details.len() as u64 || total != details.iter().sum::<u64>() {
        return Err("the trailer's count or total does not match the details".to_string());
    }
    Ok((count, total))
}

/// Every settlement file under `dir`, for scans and tests.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(batches) = std::fs::read_dir(dir) else {
        return files;
    };
    for batch in batches.flatten() {
        if let Ok(entries) = std::fs::read_dir(batch.path()) {
            files.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "stl")),
            );
        }
    }
    files.sort();
    files
}
