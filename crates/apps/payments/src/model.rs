//! The read model over every partition, built by a projection from the payments' events: the list's
//! indexes (on disk, `store.rs`) and the events feed (in memory, bounded). Both name payments; the
//! payments themselves are read from their partitions, so a client reads its own writes, while which
//! payments a page or the feed holds may lag by the projection's lag (`spate_projection_lag`).
//!
//! The feed's cursor is a position per partition (journal LSN and the event's index in its record), so
//! it is exact across restarts: events of different partitions have no global order, but each
//! partition's do, and a cursor says how far each partition was read.

use crate::command::{CaptureStatus, Event, EventKind, Payment, PaymentId, Status, decode, encode};
use serde::{Deserialize, Serialize};
use spate_engine::wire::{ReadLe, WriteLe};
use spate_engine::{Lsn, PartitionId, Projection};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Arc, RwLock};

mod store;
pub use store::{ListChange, ModelStore, STORE_CACHE_BYTES_DEFAULT, StoreError};

/// Events kept per partition for the feed; older ones are dropped (a cursor before them gets 410).
pub const FEED_EVENTS_PER_PARTITION_DEFAULT: usize = 1_000_000;
/// Marks a checkpoint of the feed alone, the payments being in the store. Checkpoints from before the
/// store begin with the length of the whole model, below it.
const FEED_CHECKPOINT_FORMAT: u32 = u32::MAX;
const CHECKPOINT_BYTES_MAX: usize = u32::MAX as usize - 1;

/// A position in one partition's events.
pub type FeedPosition = (Lsn, u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FeedKind {
    Payment(EventKind),
    CaptureSucceeded,
    CaptureFailed,
}

impl FeedKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Payment(kind) => kind.name(),
            Self::CaptureSucceeded => "capture.succeeded",
            Self::CaptureFailed => "capture.failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedEntry {
    pub position: FeedPosition,
    pub created_ms: u64,
    pub kind: FeedKind,
    pub payment: PaymentId,
    /// The capture a settlement event is about.
    pub capture: Option<u16>,
}

/// The part of the model in memory, which its checkpoint holds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    feeds: Vec<VecDeque<FeedEntry>>,
    /// Per partition, the newest position dropped from the feed.
    dropped: Vec<Option<FeedPosition>>,
    /// Per partition, the position of the newest event applied.
    last: Vec<Option<FeedPosition>>,
}

/// A checkpoint from before the store: the payments were in memory.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct SavedWithPayments {
    payments: HashMap<PaymentId, Box<Payment>>,
    feeds: Vec<VecDeque<FeedEntry>>,
    dropped: Vec<Option<FeedPosition>>,
    last: Vec<Option<FeedPosition>>,
}

pub struct PaymentsModel {
    saved: Saved,
    store: ModelStore,
    feed_per_partition_max: usize,
}

pub use store::Listed as Page;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub merchant: Option<String>,
    pub status: Option<Status>,
    /// Only payments created at or after this time.
    pub created_from_ms: Option<u64>,
    /// Continue after this payment (the last of the previous page): its creation time and id.
    pub starting_after: Option<(u64, PaymentId)>,
    pub limit: usize,
}

/// A page of the events feed and the cursor after it.
pub struct FeedPage<'a> {
    pub events: Vec<(PartitionId, &'a FeedEntry)>,
    pub cursor: Vec<Option<FeedPosition>>,
    pub has_more: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct CursorExpired {
    pub partition: PartitionId,
}

impl PaymentsModel {
    pub fn new(feed_per_partition_max: usize, store: ModelStore) -> Self {
        assert!(feed_per_partition_max > 0);
        Self {
            saved: Saved::default(),
            store,
            feed_per_partition_max,
        }
    }

    /// Payments by status, as of the store's last flush.
    pub fn count(&self, status: Status) -> u64 {
        self.store.count(status)
    }

    /// See [`ModelStore::authorized`].
    pub fn authorized(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.store.authorized()
    }

    /// Records what an event at `position` did to a payment, unless the store holds it already (it may
    /// be ahead of the checkpoint the model restarted from).
    fn store(&mut self, partition: PartitionId, position: FeedPosition, event: &Event) {
        if self.store.applied(partition) >= Some(position) {
            return;
        }
        let change = match event {
            Event::Changed {
                kind: EventKind::Authorized | EventKind::Declined,
                payment,
            } => ListChange::Created(payment),
            Event::Changed { payment, .. } => ListChange::Changed(payment),
            // A capture's settlement changes no payment's status.
            Event::CaptureSettled { .. } => ListChange::Nothing,
        };
        // The model cannot go on without its store: each later event may depend on this one.
        (self.store.change(partition, position, change)).unwrap_or_else(|error| panic!("{error}"));
    }

    fn apply(&mut self, partition: PartitionId, lsn: Lsn, timestamp_ms: u64, event: Event) {
        let p = usize::from(partition);
        let saved = &mut self.saved;
        if saved.feeds.len() <= p {
            saved.feeds.resize_with(p + 1, VecDeque::new);
            saved.dropped.resize(p + 1, None);
            saved.last.resize(p + 1, None);
        }
        let index = match saved.last[p] {
            Some((last_lsn, last_index)) if last_lsn == lsn => last_index + 1,
            _ => 0,
        };
        let position = (lsn, index);
        saved.last[p] = Some(position);
        self.store(partition, position, &event);
        let (kind, payment, capture) = match event {
            Event::Changed { kind, payment } => (FeedKind::Payment(kind), payment.id, None),
            Event::CaptureSettled {
                payment,
                capture,
                status,
                ..
            } => {
                let kind = if status == CaptureStatus::Succeeded {
                    FeedKind::CaptureSucceeded
                } else {
                    FeedKind::CaptureFailed
                };
                (kind, payment, Some(capture))
            }
        };
        let feed = &mut self.saved.feeds[p];
        feed.push_back(FeedEntry {
            position,
            created_ms: timestamp_ms,
            kind,
            payment,
            capture,
        });
        if feed.len() > self.feed_per_partition_max {
            let dropped = feed.pop_front().expect("the feed is over its bound");
            self.saved.dropped[p] = Some(dropped.position);
        }
    }

    /// Newest first, filtered; pages continue with `starting_after`.
    pub fn list(&self, filter: &ListFilter) -> Result<Page, StoreError> {
        self.store.list(
            filter.merchant.as_deref(),
            filter.status,
            filter.created_from_ms.unwrap_or(0),
            filter.starting_after,
            filter.limit,
        )
    }

    /// Up to `limit` events after `cursor` (a position per partition; missing ones start at the
    /// beginning), oldest first by time, then partition and position.
    pub fn feed(
        &self,
        cursor: &[Option<FeedPosition>],
        limit: usize,
    ) -> Result<FeedPage<'_>, CursorExpired> {
        let partitions = self.saved.feeds.len();
        let mut starts = Vec::with_capacity(partitions);
        for (p, feed) in self.saved.feeds.iter().enumerate() {
            let after = cursor.get(p).copied().flatten();
            if let Some(dropped) = self.saved.dropped[p]
                && after.is_none_or(|a| a < dropped)
            {
                return Err(CursorExpired {
                    partition: p as PartitionId,
                });
            }
            starts.push(match after {
                Some(a) => feed.partition_point(|e| e.position <= a),
                None => 0,
            });
        }
        let mut next: Vec<Option<FeedPosition>> = (0..partitions)
            .map(|p| cursor.get(p).copied().flatten())
            .collect();
        let mut events = Vec::with_capacity(limit.min(1024));
        while events.len() < limit {
            let candidate = (0..partitions)
                .filter_map(|p| {
                    self.saved.feeds[p]
                        .get(starts[p])
                        .map(|e| ((e.created_ms, p, e.position), p, e))
                })
                .min_by_key(|(key, _, _)| *key);
            let Some((_, p, entry)) = candidate else {
                break;
            };
            starts[p] += 1;
            next[p] = Some(entry.position);
            events.push((p as PartitionId, entry));
        }
        let has_more = (0..partitions).any(|p| starts[p] < self.saved.feeds[p].len());
        Ok(FeedPage {
            events,
            cursor: next,
            has_more,
        })
    }
}

pub struct PaymentsProjection {
    pub model: Arc<RwLock<PaymentsModel>>,
}

fn invalid(error: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error.to_string())
}

impl PaymentsProjection {
    fn write_model(&self) -> std::sync::RwLockWriteGuard<'_, PaymentsModel> {
        self.model
            .write()
            .expect("the payments model lock is never poisoned")
    }
}

impl Projection for PaymentsProjection {
    fn apply(
        &mut self,
        partition: PartitionId,
        lsn: Lsn,
        timestamp_ms: u64,
        event: &[u8],
    ) -> io::Result<()> {
        let event: Event = decode(event).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("a payments event: {e}"))
        })?;
        self.write_model()
            .apply(partition, lsn, timestamp_ms, event);
        Ok(())
    }

    fn flush(&mut self) {
        let mut model = self.write_model();
        // As in `store`: the model cannot go on without its store.
        model
            .store
            .flush()
            .unwrap_or_else(|error| panic!("{error}"));
    }

    /// The store first, so that it holds at least what the checkpoint's positions cover.
    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        let model = self
            .model
            .read()
            .expect("the payments model lock is never poisoned");
        model.store.persist().map_err(io::Error::other)?;
        out.write_u32_le(FEED_CHECKPOINT_FORMAT)?;
        out.write_bytes_le(&encode(&model.saved))
    }

    fn restore(&mut self, input: &mut dyn io::Read, _positions: &[Lsn]) -> io::Result<()> {
        let mut model = self.write_model();
        let format_or_len = input.read_u32_le()?;
        if format_or_len == FEED_CHECKPOINT_FORMAT {
            model.saved = decode(&input.read_bytes_le(CHECKPOINT_BYTES_MAX)?).map_err(invalid)?;
        } else {
            // A damaged length must not become an allocation (as in `PaymentsState::restore`).
            let bytes = input.read_len_bytes(u64::from(format_or_len))?;
            let whole: SavedWithPayments = decode(&bytes).map_err(invalid)?;
            model.import(whole).map_err(invalid)?;
        }
        for (partition, last) in model.saved.last.iter().enumerate() {
            let stored = model.store.applied(partition as PartitionId);
            if stored < *last {
                return Err(invalid(format!(
                    "the payments read model's store holds events of partition {partition} through \
                     {stored:?}, its checkpoint through {last:?}: the store was damaged or replaced"
                )));
            }
        }
        Ok(())
    }
}

impl PaymentsModel {
    /// Moves the payments of a checkpoint from before the store into it.
    fn import(&mut self, whole: SavedWithPayments) -> Result<(), StoreError> {
        (self.store).import(whole.payments.values().map(|p| &**p), &whole.last)?;
        self.saved = Saved {
            feeds: whole.feeds,
            dropped: whole.dropped,
            last: whole.last,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{StoredCard, Tax};
    use crate::keys::SealedCard;

    fn payment(n: u8, created_ms: u64, merchant: &str, status: Status) -> Payment {
        Payment {
            id: PaymentId::new([n; 8], [n; 12]),
            created_ms,
            merchant: merchant.to_string(),
            amount: 100,
            currency: "usd".to_string(),
            card: StoredCard {
                token: [n; 16],
                masked: "424242******4242".to_string(),
                sealed: SealedCard {
                    key_id: 1,
                    bytes: vec![],
                },
                exp_month: 1,
                exp_year: 2030,
            },
            tax: Tax {
                category: "general".to_string(),
                jurisdiction: "DE".to_string(),
                rate_ppm: 0,
                amount: 0,
            },
            status,
            decline_reason: None,
            fraud_rule: 0,
            capture_before_ms: created_ms,
            amount_capturable: 0,
            captures: vec![],
            refunds: vec![],
            metadata: vec![],
        }
    }

    fn model(feed_per_partition_max: usize) -> (PaymentsModel, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = ModelStore::open(dir.path(), STORE_CACHE_BYTES_DEFAULT).unwrap();
        (PaymentsModel::new(feed_per_partition_max, store), dir)
    }

    impl PaymentsModel {
        /// Lists what was applied so far, flushed first.
        fn list_ok(&mut self, filter: &ListFilter) -> Page {
            self.store.flush().unwrap();
            self.list(filter).unwrap()
        }
    }

    fn changed(p: Payment) -> Event {
        Event::Changed {
            kind: EventKind::Authorized,
            payment: Box::new(p),
        }
    }

    #[test]
    fn lists_newest_first_with_filters_and_pages() {
        let (mut model, _dir) = model(10);
        for n in 0..6u8 {
            let merchant = if n % 2 == 0 { "a" } else { "b" };
            let status = if n == 4 {
                Status::Declined
            } else {
                Status::Authorized
            };
            model.apply(
                0,
                u64::from(n),
                0,
                changed(payment(n, 1000 + u64::from(n), merchant, status)),
            );
        }
        // Payment `n` was created at 1000 + n.
        let ids = |page: Page| {
            page.ids
                .iter()
                .map(|id| 1000 + u64::from(id.0[0]))
                .collect::<Vec<_>>()
        };
        let all = ListFilter {
            limit: 10,
            ..ListFilter::default()
        };
        assert_eq!(
            ids(model.list_ok(&all)),
            vec![1005, 1004, 1003, 1002, 1001, 1000]
        );
        let a = ListFilter {
            merchant: Some("a".into()),
            limit: 2,
            ..ListFilter::default()
        };
        let first = model.list_ok(&a);
        assert!(first.has_more);
        let last = (1002, first.ids[1]);
        assert_eq!(ids(model.list_ok(&a)), vec![1004, 1002]);
        let rest = ListFilter {
            starting_after: Some(last),
            ..a.clone()
        };
        let page = model.list_ok(&rest);
        assert_eq!(
            (ids(page), model.list_ok(&rest).has_more),
            (vec![1000], false)
        );
        let declined = ListFilter {
            status: Some(Status::Declined),
            limit: 10,
            ..ListFilter::default()
        };
        assert_eq!(ids(model.list_ok(&declined)), vec![1004]);
        let recent = ListFilter {
            created_from_ms: Some(1003),
            limit: 10,
            ..ListFilter::default()
        };
        assert_eq!(ids(model.list_ok(&recent)), vec![1005, 1004, 1003]);
    }

    #[test]
    fn the_feed_reads_every_partition_exactly_once_across_pages_and_expires_old_cursors() {
        let (mut model, _dir) = model(4);
        // Partition 0: two events in record 7; partition 1: one event in record 3, then one in 4.
        model.apply(0, 7, 10, changed(payment(1, 10, "a", Status::Authorized)));
        model.apply(0, 7, 10, changed(payment(2, 10, "a", Status::Authorized)));
        model.apply(1, 3, 5, changed(payment(3, 5, "a", Status::Authorized)));
        model.apply(1, 4, 20, changed(payment(4, 20, "a", Status::Authorized)));
        let first = model.feed(&[], 2).unwrap();
        let seen: Vec<_> = first.events.iter().map(|(p, e)| (*p, e.position)).collect();
        assert_eq!(seen, vec![(1, (3, 0)), (0, (7, 0))]);
        assert!(first.has_more);
        let cursor = first.cursor.clone();
        let second = model.feed(&cursor, 10).unwrap();
        let seen: Vec<_> = second
            .events
            .iter()
            .map(|(p, e)| (*p, e.position))
            .collect();
        assert_eq!(seen, vec![(0, (7, 1)), (1, (4, 0))]);
        assert!(!second.has_more);
        for n in 5..10u8 {
            model.apply(
                0,
                8 + u64::from(n),
                30,
                changed(payment(n, 30, "a", Status::Authorized)),
            );
        }
        assert_eq!(
            model.feed(&cursor, 10).err(),
            Some(CursorExpired { partition: 0 })
        );
        assert_eq!(
            model.feed(&[], 10).err(),
            Some(CursorExpired { partition: 0 })
        );
    }

    fn projection(model: PaymentsModel) -> PaymentsProjection {
        PaymentsProjection {
            model: Arc::new(RwLock::new(model)),
        }
    }

    /// An event the read model cannot read is an error for the engine to report (a refused start,
    /// naming the record), not a panic and never skipped.
    #[test]
    fn an_event_it_cannot_read_is_an_error() {
        let (model, _dir) = model(16);
        let error = projection(model).apply(0, 7, 0, &[0xff; 3]).unwrap_err();
        assert!(error.to_string().contains("a payments event"), "{error}");
    }

    fn checkpoint(projection: &mut PaymentsProjection) -> Vec<u8> {
        projection.flush();
        let mut bytes = Vec::new();
        projection.write_snapshot(&mut bytes).unwrap();
        bytes
    }

    /// The numbers of the payments listed (`payment(n, ..)`), newest first.
    fn listed(projection: &PaymentsProjection, status: Option<Status>) -> Vec<u8> {
        let mut model = projection.model.write().unwrap();
        let filter = ListFilter {
            status,
            limit: 100,
            ..ListFilter::default()
        };
        let page = model.list_ok(&filter);
        page.ids.iter().map(|id| id.0[0]).collect()
    }

    /// After a crash the store may hold events the checkpoint does not: replayed, they count once.
    #[test]
    fn a_restart_replays_onto_a_store_ahead_of_the_checkpoint_without_counting_twice() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            PaymentsModel::new(
                10,
                ModelStore::open(dir.path(), STORE_CACHE_BYTES_DEFAULT).unwrap(),
            )
        };
        // Three payments authorized, then the three canceled.
        let events: Vec<Event> = (0..6u8)
            .map(|n| {
                let (kind, status) = match n / 3 {
                    0 => (EventKind::Authorized, Status::Authorized),
                    _ => (EventKind::Canceled, Status::Canceled),
                };
                let payment = payment(n % 3, 100 + u64::from(n % 3), "a", status);
                Event::Changed {
                    kind,
                    payment: Box::new(payment),
                }
            })
            .collect();
        let (first, second) = events.split_at(2);
        let mut before_crash = projection(open());
        for (lsn, event) in first.iter().enumerate() {
            before_crash
                .apply(0, lsn as Lsn, 0, &encode(event))
                .unwrap();
        }
        let at_checkpoint = checkpoint(&mut before_crash);
        for (lsn, event) in second.iter().enumerate() {
            before_crash
                .apply(0, (first.len() + lsn) as Lsn, 0, &encode(event))
                .unwrap();
        }
        before_crash.flush();
        let expected = listed(&before_crash, None);
        drop(before_crash);

        let mut restarted = projection(open());
        restarted.restore(&mut &at_checkpoint[..], &[]).unwrap();
        for (lsn, event) in second.iter().enumerate() {
            restarted
                .apply(0, (first.len() + lsn) as Lsn, 0, &encode(event))
                .unwrap();
        }
        restarted.flush();
        assert_eq!(listed(&restarted, None), expected);
        assert_eq!(listed(&restarted, Some(Status::Canceled)), vec![2, 1, 0]);
        assert!(listed(&restarted, Some(Status::Authorized)).is_empty());
        let model = restarted.model.read().unwrap();
        assert_eq!(
            (
                model.count(Status::Canceled),
                model.count(Status::Authorized)
            ),
            (3, 0)
        );
        assert_eq!(
            model.feed(&[], 100).unwrap().events.len(),
            6,
            "the feed has every event once"
        );
    }

    /// A store that holds less than the checkpoint covers (lost, or another one) is refused.
    #[test]
    fn a_store_behind_its_checkpoint_is_refused() {
        let (written, _dir) = model(10);
        let mut written = projection(written);
        written
            .apply(
                0,
                7,
                0,
                &encode(&changed(payment(1, 10, "a", Status::Authorized))),
            )
            .unwrap();
        let at_checkpoint = checkpoint(&mut written);
        let (empty, _other_dir) = model(10);
        let error = projection(empty)
            .restore(&mut &at_checkpoint[..], &[])
            .unwrap_err();
        assert!(error.to_string().contains("damaged or replaced"), "{error}");
    }

    /// A checkpoint from before the store, the payments in it, is moved into the store.
    #[test]
    fn a_checkpoint_from_before_the_store_is_imported() {
        let (old, _dir) = model(10);
        let mut old = projection(old);
        let payments = [
            payment(1, 10, "a", Status::Authorized),
            payment(2, 20, "b", Status::Declined),
        ];
        for (lsn, payment) in payments.iter().enumerate() {
            old.apply(0, lsn as Lsn, 0, &encode(&changed(payment.clone())))
                .unwrap();
        }
        let old_model = old.model.read().unwrap();
        let whole = SavedWithPayments {
            payments: payments.map(|p| (p.id, Box::new(p))).into(),
            feeds: old_model.saved.feeds.clone(),
            dropped: old_model.saved.dropped.clone(),
            last: old_model.saved.last.clone(),
        };
        let mut bytes = Vec::new();
        bytes.write_bytes_le(&encode(&whole)).unwrap();

        let (new, _new_dir) = model(10);
        let mut new = projection(new);
        new.restore(&mut &bytes[..], &[]).unwrap();
        assert_eq!(listed(&new, None), vec![2, 1]);
        assert_eq!(new.model.read().unwrap().count(Status::Declined), 1);
        let restored = new.model.read().unwrap();
        assert_eq!(restored.feed(&[], 10).unwrap().events.len(), 2);
    }
}
