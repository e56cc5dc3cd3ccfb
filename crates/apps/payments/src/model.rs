//! The read model over every partition, built by a projection from the payments' events: every payment
//! (for listing with filters) and the events feed. Single payments are read from their partition, so a
//! client reads its own writes; lists and the feed may lag by the projection's lag (`spate_projection_lag`).
//!
//! The feed's cursor is a position per partition (journal LSN and the event's index in its record), so
//! it is exact across restarts: events of different partitions have no global order, but each
//! partition's do, and a cursor says how far each partition was read.

use crate::command::{CaptureStatus, Event, EventKind, Payment, PaymentId, Status, decode, encode};
use serde::{Deserialize, Serialize};
use spate_engine::wire::{ReadLe, WriteLe};
use spate_engine::{Lsn, PartitionId, Projection};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io;
use std::sync::{Arc, RwLock};

/// Events kept per partition for the feed; older ones are dropped (a cursor before them gets 410).
pub const FEED_EVENTS_PER_PARTITION_DEFAULT: usize = 1_000_000;
const CHECKPOINT_BYTES_MAX: usize = u32::MAX as usize;

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

#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    /// Boxed, as in the partition state: growing the table moves pointers, not payments.
    payments: HashMap<PaymentId, Box<Payment>>,
    feeds: Vec<VecDeque<FeedEntry>>,
    /// Per partition, the newest position dropped from the feed.
    dropped: Vec<Option<FeedPosition>>,
    last: Vec<Option<FeedPosition>>,
}

#[derive(Debug, Default)]
pub struct PaymentsModel {
    saved: Saved,
    /// Newest first when iterated in reverse.
    by_created: BTreeSet<(u64, PaymentId)>,
    by_merchant: HashMap<String, BTreeSet<(u64, PaymentId)>>,
    statuses: HashMap<Status, u64>,
    feed_per_partition_max: usize,
}

/// A page of the payments list.
pub struct Page<'a> {
    pub payments: Vec<&'a Payment>,
    pub has_more: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub merchant: Option<String>,
    pub status: Option<Status>,
    /// Only payments created at or after this time.
    pub created_from_ms: Option<u64>,
    /// Continue after this payment (the last of the previous page).
    pub starting_after: Option<PaymentId>,
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
    pub fn new(feed_per_partition_max: usize) -> Self {
        assert!(feed_per_partition_max > 0);
        Self {
            feed_per_partition_max,
            ..Self::default()
        }
    }

    pub fn payment(&self, id: &PaymentId) -> Option<&Payment> {
        self.saved.payments.get(id).map(Box::as_ref)
    }

    pub fn len(&self) -> usize {
        self.saved.payments.len()
    }

    pub fn is_empty(&self) -> bool {
        self.saved.payments.is_empty()
    }

    /// Payments by status.
    pub fn count(&self, status: Status) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }

    /// Adds a new payment to the indexes (the fields they need, so no payment is copied for them).
    fn index(&mut self, key: (u64, PaymentId), merchant: &str, status: Status) {
        *self.statuses.entry(status).or_default() += 1;
        self.by_created.insert(key);
        match self.by_merchant.get_mut(merchant) {
            Some(index) => {
                index.insert(key);
            }
            None => {
                self.by_merchant
                    .insert(merchant.to_string(), BTreeSet::from([key]));
            }
        }
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
        let (kind, payment, capture) = match event {
            Event::Changed { kind, payment } => {
                let (id, status) = (payment.id, payment.status);
                let key = (payment.created_ms, id);
                let merchant = payment.merchant.clone();
                match saved.payments.insert(id, payment) {
                    Some(old) => {
                        *self.statuses.entry(old.status).or_default() -= 1;
                        *self.statuses.entry(status).or_default() += 1;
                    }
                    None => self.index(key, &merchant, status),
                }
                (FeedKind::Payment(kind), id, None)
            }
            Event::CaptureSettled {
                payment,
                capture,
                status,
                ..
            } => {
                if let Some(p) = saved.payments.get_mut(&payment) {
                    p.captures[usize::from(capture)].status = status;
                }
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
    pub fn list(&self, filter: &ListFilter) -> Page<'_> {
        let empty = BTreeSet::new();
        let index = match &filter.merchant {
            Some(merchant) => self.by_merchant.get(merchant).unwrap_or(&empty),
            None => &self.by_created,
        };
        let upper = filter
            .starting_after
            .and_then(|id| self.saved.payments.get(&id))
            .map(|p| (p.created_ms, p.id));
        let from = filter.created_from_ms.unwrap_or(0);
        let mut matching = index
            .range(..upper.unwrap_or((u64::MAX, PaymentId([0xff; 20]))))
            .rev()
            .take_while(|(created, _)| *created >= from)
            .map(|(_, id)| self.saved.payments[id].as_ref())
            .filter(|p| filter.status.is_none_or(|s| p.status == s));
        let payments: Vec<&Payment> = matching.by_ref().take(filter.limit).collect();
        let has_more = matching.next().is_some();
        Page { payments, has_more }
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

impl PaymentsProjection {
    fn write_model(&self) -> std::sync::RwLockWriteGuard<'_, PaymentsModel> {
        self.model
            .write()
            .expect("the payments model lock is never poisoned")
    }
}

impl Projection for PaymentsProjection {
    fn apply(&mut self, partition: PartitionId, lsn: Lsn, timestamp_ms: u64, event: &[u8]) {
        let event: Event = decode(event).expect("the payments app emits only events it encoded");
        self.write_model()
            .apply(partition, lsn, timestamp_ms, event);
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        let model = self
            .model
            .read()
            .expect("the payments model lock is never poisoned");
        out.write_bytes_le(&encode(&model.saved))
    }

    fn restore(&mut self, input: &mut dyn io::Read) -> io::Result<()> {
        let bytes = input.read_bytes_le(CHECKPOINT_BYTES_MAX)?;
        let saved: Saved =
            decode(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut model = self.write_model();
        let mut restored = PaymentsModel::new(model.feed_per_partition_max);
        let keys: Vec<_> = saved
            .payments
            .values()
            .map(|p| ((p.created_ms, p.id), p.merchant.clone(), p.status))
            .collect();
        restored.saved = saved;
        for (key, merchant, status) in keys {
            restored.index(key, &merchant, status);
        }
        *model = restored;
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

    fn changed(p: Payment) -> Event {
        Event::Changed {
            kind: EventKind::Authorized,
            payment: Box::new(p),
        }
    }

    #[test]
    fn lists_newest_first_with_filters_and_pages() {
        let mut model = PaymentsModel::new(10);
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
        let ids = |page: Page<'_>| {
            page.payments
                .iter()
                .map(|p| p.created_ms)
                .collect::<Vec<_>>()
        };
        let all = ListFilter {
            limit: 10,
            ..ListFilter::default()
        };
        assert_eq!(
            ids(model.list(&all)),
            vec![1005, 1004, 1003, 1002, 1001, 1000]
        );
        let a = ListFilter {
            merchant: Some("a".into()),
            limit: 2,
            ..ListFilter::default()
        };
        let first = model.list(&a);
        assert!(first.has_more);
        let last = first.payments[1].id;
        assert_eq!(ids(model.list(&a)), vec![1004, 1002]);
        let rest = ListFilter {
            starting_after: Some(last),
            ..a.clone()
        };
        let page = model.list(&rest);
        assert_eq!((ids(page), model.list(&rest).has_more), (vec![1000], false));
        let declined = ListFilter {
            status: Some(Status::Declined),
            limit: 10,
            ..ListFilter::default()
        };
        assert_eq!(ids(model.list(&declined)), vec![1004]);
        let recent = ListFilter {
            created_from_ms: Some(1003),
            limit: 10,
            ..ListFilter::default()
        };
        assert_eq!(ids(model.list(&recent)), vec![1005, 1004, 1003]);
    }

    #[test]
    fn the_feed_reads_every_partition_exactly_once_across_pages_and_expires_old_cursors() {
        let mut model = PaymentsModel::new(4);
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
}
