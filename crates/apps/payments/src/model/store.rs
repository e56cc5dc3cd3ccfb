//! The payments list on disk, in a fjall database of its own (`<data dir>/payments/model`), so that the
//! model's memory does not grow with the payments ever made: two indexes, newest first (by creation, and
//! by merchant then creation), whose values hold the payment's status so that a filter on it reads no
//! payment, and the count of payments by status. The payments themselves have one home, their partition
//! (in memory while they can change, then in the archive), which the list asks for the page it shows.
//!
//! Changes gather in memory (`pending`) and go to disk in one atomic write per [`ModelStore::flush`]
//! (after each pass of the read model over its feed, or every [`PENDING_MAX`] payments), which also
//! records, per partition, the position of the newest event the store holds (`applied`). After a crash the store may
//! be ahead of the model's checkpoint: events replayed from the journal that it already holds are
//! skipped. It is never behind: a checkpoint flushes and persists the store first, and start-up refuses
//! a store that holds less than the checkpoint says.

use super::FeedPosition;
use crate::command::{PAYMENT_ID_BYTES, Payment, PaymentId, Status, decode, encode};
use spate_engine::PartitionId;
use std::collections::HashMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The block cache's default size (`--payments-store-cache-mb`): the indexes' recent blocks.
pub const STORE_CACHE_BYTES_DEFAULT: u64 = 16 << 20;
/// The memtables of each index and of the counts and positions (fjall's default is 64 MiB each).
const MEMTABLE_BYTES: [u64; 2] = [16 << 20, 1 << 20];
const APPLIED_KEY: &[u8] = b"applied";
const STATUSES_KEY: &[u8] = b"statuses";
/// Bytes after an index key's prefix: the creation time (big-endian, so keys sort by it), then the id.
const CREATED_ID_BYTES: usize = 8 + PAYMENT_ID_BYTES;
/// Payments changed and not yet written, at most: a replay at start-up writes every so many.
const PENDING_MAX: usize = 16_384;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the payments read model's store failed: {0}")]
    Fjall(#[from] fjall::Error),
    #[error("the payments read model's store holds damaged bytes: {0}")]
    Damaged(#[from] postcard::Error),
    #[error("the payments read model's store holds an unknown status {0}")]
    UnknownStatus(u8),
}

/// A payment changed since the last flush: what its index keys need, and its status in the store
/// (none if it is new there).
struct Pending {
    created_ms: u64,
    merchant: String,
    status: Status,
    stored_status: Option<Status>,
}

pub struct ModelStore {
    db: fjall::Database,
    by_created: fjall::Keyspace,
    by_merchant: fjall::Keyspace,
    meta: fjall::Keyspace,
    /// Payments by status, in the order of `Status::ALL`, as of the last flush.
    statuses: [u64; Status::ALL.len()],
    /// The authorized ones, for readers that must not wait for the model's lock.
    authorized: Arc<AtomicU64>,
    /// Per partition, the position of the newest event the store holds, pending ones included.
    applied: Vec<Option<FeedPosition>>,
    /// `applied` moved since the last flush.
    applied_moved: bool,
    pending: HashMap<PaymentId, Pending>,
}

fn status_byte(status: Status) -> u8 {
    Status::ALL
        .iter()
        .position(|s| *s == status)
        .expect("in ALL") as u8
}

fn merchant_prefix(merchant: &str) -> Vec<u8> {
    let mut prefix = Vec::with_capacity(2 + merchant.len() + CREATED_ID_BYTES);
    prefix.extend_from_slice(&(merchant.len() as u16).to_be_bytes());
    prefix.extend_from_slice(merchant.as_bytes());
    prefix
}

fn index_key(prefix: &[u8], created_ms: u64, id: &PaymentId) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + CREATED_ID_BYTES);
    key.extend_from_slice(prefix);
    key.extend_from_slice(&created_ms.to_be_bytes());
    key.extend_from_slice(&id.0);
    key
}

/// What an event did to the list.
pub enum ListChange<'p> {
    /// A payment's first event (authorized or declined): the store cannot hold it yet.
    Created(&'p Payment),
    /// A later event, which may have changed the payment's status.
    Changed(&'p Payment),
    /// Nothing the list shows (a capture's settlement).
    Nothing,
}

/// A page of the list: payment ids, newest first, and whether more follow.
#[derive(Debug, PartialEq, Eq)]
pub struct Listed {
    pub ids: Vec<PaymentId>,
    pub has_more: bool,
}

impl ModelStore {
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        // Persisted by hand before each checkpoint: the journal replays whatever a crash lost since.
        // One worker: its flushes and compactions never take every core from the partitions.
        let db = spate_engine::store::open(|| {
            fjall::Database::builder(dir)
                .cache_size(cache_bytes)
                .worker_threads(1)
                .manual_journal_persist(true)
                .open()
        })?;
        let keyspace = |name: &str, memtable_bytes: u64| {
            db.keyspace(name, || {
                fjall::KeyspaceCreateOptions::default().max_memtable_size(memtable_bytes)
            })
        };
        let [index_memtable, meta_memtable] = MEMTABLE_BYTES;
        let (by_created, by_merchant, meta) = (
            keyspace("by_created", index_memtable)?,
            keyspace("by_merchant", index_memtable)?,
            keyspace("meta", meta_memtable)?,
        );
        let statuses = match meta.get(STATUSES_KEY)? {
            Some(bytes) => decode(&bytes)?,
            None => [0; Status::ALL.len()],
        };
        let applied = match meta.get(APPLIED_KEY)? {
            Some(bytes) => decode(&bytes)?,
            None => Vec::new(),
        };
        Ok(Self {
            db,
            by_created,
            by_merchant,
            meta,
            authorized: Arc::new(AtomicU64::new(
                statuses[usize::from(status_byte(Status::Authorized))],
            )),
            statuses,
            applied,
            applied_moved: false,
            pending: HashMap::new(),
        })
    }

    /// The database, for the engine's scrub to read back.
    pub fn database(&self) -> fjall::Database {
        self.db.clone()
    }

    /// The position of the newest event of `partition` the store holds.
    pub fn applied(&self, partition: PartitionId) -> Option<FeedPosition> {
        self.applied.get(usize::from(partition)).copied().flatten()
    }

    /// Payments with `status`, as of the last flush.
    pub fn count(&self, status: Status) -> u64 {
        self.statuses[usize::from(status_byte(status))]
    }

    /// The count of authorized payments as of the last flush, readable without the model's lock (which
    /// a flush holds while fjall writes, or waits).
    pub fn authorized(&self) -> Arc<AtomicU64> {
        self.authorized.clone()
    }

    /// The status the store holds for the payment `id` created at `created_ms`.
    fn stored_status(&self, created_ms: u64, id: &PaymentId) -> Result<Option<Status>, StoreError> {
        match self
            .by_created
            .get(index_key(&[], created_ms, id))?
            .as_deref()
        {
            None => Ok(None),
            Some([byte]) => (Status::ALL.get(usize::from(*byte)).copied())
                .map(Some)
                .ok_or(StoreError::UnknownStatus(*byte)),
            Some(_) => Err(StoreError::UnknownStatus(u8::MAX)),
        }
    }

    /// Records what the event at `position` of `partition` did to the list.
    pub fn change(
        &mut self,
        partition: PartitionId,
        position: FeedPosition,
        change: ListChange<'_>,
    ) -> Result<(), StoreError> {
        assert!(
            self.applied(partition) < Some(position),
            "events reach the store once, in order"
        );
        let p = usize::from(partition);
        if self.applied.len() <= p {
            self.applied.resize(p + 1, None);
        }
        self.applied[p] = Some(position);
        self.applied_moved = true;
        match change {
            ListChange::Created(payment) => self.stage(payment, true),
            ListChange::Changed(payment) => self.stage(payment, false),
            ListChange::Nothing => Ok(()),
        }
    }

    /// Adds `payment` to the pending changes; `created` spares looking up a status it cannot have.
    fn stage(&mut self, payment: &Payment, created: bool) -> Result<(), StoreError> {
        let stored_status = match self.pending.remove(&payment.id) {
            Some(pending) => pending.stored_status,
            None if created => None,
            None => self.stored_status(payment.created_ms, &payment.id)?,
        };
        self.pending.insert(
            payment.id,
            Pending {
                created_ms: payment.created_ms,
                merchant: payment.merchant.clone(),
                status: payment.status,
                stored_status,
            },
        );
        if self.pending.len() >= PENDING_MAX {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the pending changes to the indexes, the counts and the positions reached, in one write.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        if self.pending.is_empty() && !self.applied_moved {
            return Ok(());
        }
        self.applied_moved = false;
        let mut batch = self.db.batch();
        for (id, pending) in self.pending.drain() {
            if pending.stored_status == Some(pending.status) {
                continue;
            }
            let status = [status_byte(pending.status)];
            let by_created = index_key(&[], pending.created_ms, &id);
            batch.insert(&self.by_created, by_created, status);
            let by_merchant =
                index_key(&merchant_prefix(&pending.merchant), pending.created_ms, &id);
            batch.insert(&self.by_merchant, by_merchant, status);
            if let Some(old) = pending.stored_status {
                self.statuses[usize::from(status_byte(old))] -= 1;
            }
            self.statuses[usize::from(status[0])] += 1;
        }
        batch.insert(&self.meta, APPLIED_KEY, encode(&self.applied));
        batch.insert(&self.meta, STATUSES_KEY, encode(&self.statuses));
        batch.commit()?;
        let authorized = self.statuses[usize::from(status_byte(Status::Authorized))];
        self.authorized.store(authorized, Ordering::Relaxed);
        Ok(())
    }

    /// Indexes the payments of a checkpoint from before the store, which covered the events through
    /// `applied`, unless an earlier start-up did.
    pub fn import<'p>(
        &mut self,
        payments: impl Iterator<Item = &'p Payment>,
        applied: &[Option<FeedPosition>],
    ) -> Result<(), StoreError> {
        let done =
            (applied.iter().enumerate()).all(|(p, last)| self.applied(p as PartitionId) >= *last);
        if done {
            return Ok(());
        }
        for payment in payments {
            self.stage(payment, false)?;
        }
        self.applied = applied.to_vec();
        self.applied_moved = true;
        self.flush()
    }

    /// Up to `limit` payments newest first, of `merchant` if given, created at or after `from_ms`,
    /// before `before` (a payment's creation and id), with `status` if given; as of the last flush.
    pub fn list(
        &self,
        merchant: Option<&str>,
        status: Option<Status>,
        from_ms: u64,
        before: Option<(u64, PaymentId)>,
        limit: usize,
    ) -> Result<Listed, StoreError> {
        let (index, prefix) = match merchant {
            Some(merchant) => (&self.by_merchant, merchant_prefix(merchant)),
            None => (&self.by_created, Vec::new()),
        };
        let lower = index_key(&prefix, from_ms, &PaymentId([0; PAYMENT_ID_BYTES]));
        let upper = match before {
            Some((created_ms, id)) => index_key(&prefix, created_ms, &id),
            // Above every key with this prefix, all of which are `CREATED_ID_BYTES` longer.
            None => [&prefix[..], &[0xff; CREATED_ID_BYTES + 1]].concat(),
        };
        let wanted = status.map(status_byte);
        let mut ids = Vec::with_capacity(limit.min(1024) + 1);
        for entry in index
            .range::<Vec<u8>, _>((Bound::Included(lower), Bound::Excluded(upper)))
            .rev()
        {
            let (key, value) = entry.into_inner()?;
            if wanted.is_some_and(|wanted| value.first() != Some(&wanted)) {
                continue;
            }
            let id = key[key.len() - PAYMENT_ID_BYTES..]
                .try_into()
                .expect("index keys end with an id");
            ids.push(PaymentId(id));
            if ids.len() > limit {
                break;
            }
        }
        let has_more = ids.len() > limit;
        ids.truncate(limit);
        Ok(Listed { ids, has_more })
    }

    /// Makes every write so far durable; the pending changes must have been flushed.
    pub fn persist(&self) -> Result<(), StoreError> {
        assert!(
            self.pending.is_empty() && !self.applied_moved,
            "a checkpoint follows a flush"
        );
        Ok(self.db.persist(fjall::PersistMode::SyncAll)?)
    }
}
