//! The read model's payments on disk, in a fjall database of their own (`<data dir>/payments/model`), so
//! that the model's memory does not grow with the payments ever made: every payment as its newest event
//! left it, and two indexes for the list, newest first (by creation, and by merchant then creation),
//! whose values hold the payment's status so that a filter on it reads no payment.
//!
//! Each event is one atomic write that also records, per partition, the position of the newest event the
//! store holds (`applied`). After a crash the store may be ahead of the model's checkpoint: events replayed
//! from the journal that it already holds are skipped. It is never behind: a checkpoint persists the store
//! first, and start-up refuses a store that holds less than the checkpoint says.

use super::FeedPosition;
use crate::command::{PAYMENT_ID_BYTES, Payment, PaymentId, Status, decode, encode};
use spate_engine::PartitionId;
use std::ops::Bound;
use std::path::Path;

/// The block cache: the indexes' recent blocks and the payments asked for most.
const CACHE_BYTES: u64 = 32 << 20;
const APPLIED_KEY: &[u8] = b"applied";
const STATUSES_KEY: &[u8] = b"statuses";
/// Bytes after an index key's prefix: the creation time (big-endian, so keys sort by it), then the id.
const CREATED_ID_BYTES: usize = 8 + PAYMENT_ID_BYTES;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the payments read model's store failed: {0}")]
    Fjall(#[from] fjall::Error),
    #[error("the payments read model's store holds damaged bytes: {0}")]
    Damaged(#[from] postcard::Error),
}

pub struct ModelStore {
    db: fjall::Database,
    payments: fjall::Keyspace,
    by_created: fjall::Keyspace,
    by_merchant: fjall::Keyspace,
    meta: fjall::Keyspace,
    /// Payments by status, in the order of `Status::ALL`.
    statuses: [u64; Status::ALL.len()],
    /// Per partition, the position of the newest event the store holds.
    applied: Vec<Option<FeedPosition>>,
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

/// What [`ModelStore::list`] returns: a page, newest first, and whether more follow.
pub struct Listed {
    pub payments: Vec<Payment>,
    pub has_more: bool,
}

impl ModelStore {
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        // Persisted by hand before each checkpoint: the journal replays whatever a crash lost since.
        let db = fjall::Database::builder(dir)
            .cache_size(CACHE_BYTES)
            .manual_journal_persist(true)
            .open()?;
        let keyspace = |name: &str| db.keyspace(name, Default::default);
        let (payments, by_created, by_merchant, meta) = (
            keyspace("payments")?,
            keyspace("by_created")?,
            keyspace("by_merchant")?,
            keyspace("meta")?,
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
            payments,
            by_created,
            by_merchant,
            meta,
            statuses,
            applied,
        })
    }

    /// The position of the newest event of `partition` the store holds.
    pub fn applied(&self, partition: PartitionId) -> Option<FeedPosition> {
        self.applied.get(usize::from(partition)).copied().flatten()
    }

    pub fn count(&self, status: Status) -> u64 {
        self.statuses[usize::from(status_byte(status))]
    }

    pub fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, StoreError> {
        match self.payments.get(id.0)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// Stores `payment` as the event at `position` of `partition` left it, in one write.
    pub fn put(
        &mut self,
        partition: PartitionId,
        position: FeedPosition,
        payment: &Payment,
    ) -> Result<(), StoreError> {
        assert!(
            self.applied(partition) < Some(position),
            "events reach the store once, in order"
        );
        let mut batch = self.db.batch();
        self.write_payment(&mut batch, payment)?;
        let p = usize::from(partition);
        if self.applied.len() <= p {
            self.applied.resize(p + 1, None);
        }
        self.applied[p] = Some(position);
        self.write_meta(&mut batch);
        Ok(batch.commit()?)
    }

    /// Stores the payments of a checkpoint from before the store, which covered the events through
    /// `applied`, unless an earlier start-up did.
    pub fn import(
        &mut self,
        payments: impl Iterator<Item = Box<Payment>>,
        applied: &[Option<FeedPosition>],
    ) -> Result<(), StoreError> {
        let done =
            (applied.iter().enumerate()).all(|(p, last)| self.applied(p as PartitionId) >= *last);
        if done {
            return Ok(());
        }
        for payment in payments {
            let mut batch = self.db.batch();
            self.write_payment(&mut batch, &payment)?;
            self.write_meta(&mut batch);
            batch.commit()?;
        }
        let mut batch = self.db.batch();
        self.applied = applied.to_vec();
        self.write_meta(&mut batch);
        Ok(batch.commit()?)
    }

    /// Adds `payment`, its index keys if its status changed, and its place in the counts to `batch`.
    fn write_payment(
        &mut self,
        batch: &mut fjall::OwnedWriteBatch,
        payment: &Payment,
    ) -> Result<(), StoreError> {
        let old_status = self.payment(&payment.id)?.map(|old| old.status);
        batch.insert(&self.payments, payment.id.0, encode(payment));
        if old_status != Some(payment.status) {
            let status = [status_byte(payment.status)];
            let (created_ms, id) = (payment.created_ms, &payment.id);
            batch.insert(&self.by_created, index_key(&[], created_ms, id), status);
            let by_merchant = index_key(&merchant_prefix(&payment.merchant), created_ms, id);
            batch.insert(&self.by_merchant, by_merchant, status);
            if let Some(old) = old_status {
                self.statuses[usize::from(status_byte(old))] -= 1;
            }
            self.statuses[usize::from(status[0])] += 1;
        }
        Ok(())
    }

    fn write_meta(&self, batch: &mut fjall::OwnedWriteBatch) {
        batch.insert(&self.meta, APPLIED_KEY, encode(&self.applied));
        batch.insert(&self.meta, STATUSES_KEY, encode(&self.statuses));
    }

    /// Up to `limit` payments newest first, of `merchant` if given, created at or after `from_ms`,
    /// before `before` (a payment's creation and id), with `status` if given.
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
        let mut payments = Vec::with_capacity(ids.len());
        for id in &ids {
            payments.push(self.payment(id)?.expect("indexed payments are stored"));
        }
        Ok(Listed { payments, has_more })
    }

    /// Makes every write so far durable.
    pub fn persist(&self) -> Result<(), StoreError> {
        Ok(self.db.persist(fjall::PersistMode::SyncAll)?)
    }
}
