//! Requests waiting for prepared transfers to leave RECEIVED. A request registers its prepares before
//! it submits them, so that no settlement can be missed; the projection settles each as it applies the
//! event that moves it on; the request then waits for those its partitions answered RECEIVED, up to a
//! deadline.
//!
//! One registration serves a whole request, a batch of 8,000 prepares as well as a single one: the
//! states land in one table the request reads, and each settlement wakes the request at most once.

use crate::domain::{TransferId, TransferState};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Every registered prepare, by transfer id. Ids are chosen by clients: the hasher is seeded per
/// process.
#[derive(Default)]
pub struct Waiters {
    by_id: Mutex<HashMap<TransferId, SmallVec<[Waiter; 1]>, foldhash::fast::RandomState>>,
}

/// One request's prepare of a transfer: where its state goes.
struct Waiter {
    request: Arc<Settlements>,
    slot: usize,
}

/// One request's prepares, by the slot the request gave each.
struct Settlements {
    slots: Mutex<Vec<Slot>>,
    settled: tokio::sync::Notify,
}

#[derive(Clone, Copy, PartialEq)]
enum Slot {
    /// Not a registered prepare: nothing will settle it.
    Unregistered,
    Waiting,
    Settled(TransferState),
}

impl Waiters {
    /// Registers `prepares` (slot, transfer id) of a request that has `slots` of them at most.
    pub fn register(&self, slots: usize, prepares: Vec<(usize, TransferId)>) -> Registration<'_> {
        let mut table = vec![Slot::Unregistered; slots];
        for &(slot, _) in &prepares {
            table[slot] = Slot::Waiting;
        }
        let settlements = Arc::new(Settlements {
            slots: Mutex::new(table),
            settled: tokio::sync::Notify::new(),
        });
        let mut by_id = self
            .by_id
            .lock()
            .expect("the waiters lock is never poisoned");
        for &(slot, id) in &prepares {
            by_id.entry(id).or_default().push(Waiter {
                request: settlements.clone(),
                slot,
            });
        }
        drop(by_id);
        Registration {
            waiters: self,
            prepares,
            settlements,
        }
    }

    /// The transfer `id` left RECEIVED for `state`: every request waiting for it learns it.
    pub fn settle(&self, id: TransferId, state: TransferState) {
        let waiting = (self.by_id.lock())
            .expect("the waiters lock is never poisoned")
            .remove(&id);
        for waiter in waiting.into_iter().flatten() {
            waiter.request.slots.lock().expect("never poisoned")[waiter.slot] =
                Slot::Settled(state);
            waiter.request.settled.notify_one();
        }
    }
}

/// A request's registered prepares; those not settled are forgotten when it is dropped, answered or not.
pub struct Registration<'a> {
    waiters: &'a Waiters,
    prepares: Vec<(usize, TransferId)>,
    settlements: Arc<Settlements>,
}

impl Registration<'_> {
    /// Waits until every one of `slots`, each a registered prepare, is settled, or until `deadline`.
    pub async fn wait_for(&self, slots: &[usize], deadline: tokio::time::Instant) {
        let mut settled = 0;
        loop {
            // Made before the check: a settlement after it leaves a permit, so none is missed.
            let woken = self.settlements.settled.notified();
            let unregistered = {
                let table = self.settlements.slots.lock().expect("never poisoned");
                loop {
                    match slots.get(settled).map(|&slot| (slot, table[slot])) {
                        Some((_, Slot::Settled(_))) => settled += 1,
                        Some((slot, Slot::Unregistered)) => break Some(slot),
                        Some((_, Slot::Waiting)) | None => break None,
                    }
                }
            };
            // Asserted once the lock is released, so that the registration's drop can take it.
            if let Some(slot) = unregistered {
                panic!("slot {slot} is not a registered prepare");
            }
            if settled == slots.len() || tokio::time::timeout_at(deadline, woken).await.is_err() {
                return;
            }
        }
    }

    /// The state the prepare in `slot` settled in, if it did.
    pub fn state(&self, slot: usize) -> Option<TransferState> {
        match self.settlements.slots.lock().expect("never poisoned")[slot] {
            Slot::Settled(state) => Some(state),
            Slot::Waiting | Slot::Unregistered => None,
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let unsettled: Vec<TransferId> = {
            let table = self.settlements.slots.lock().expect("never poisoned");
            (self.prepares.iter())
                .filter(|(slot, _)| table[*slot] == Slot::Waiting)
                .map(|&(_, id)| id)
                .collect()
        };
        if unsettled.is_empty() {
            return;
        }
        let mut by_id = (self.waiters.by_id.lock()).expect("the waiters lock is never poisoned");
        for id in unsettled {
            if let Some(waiting) = by_id.get_mut(&id) {
                waiting.retain(|waiter| !Arc::ptr_eq(&waiter.request, &self.settlements));
                if waiting.is_empty() {
                    by_id.remove(&id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn deadline_in(ms: u64) -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn a_request_learns_the_states_of_its_prepares_settled_before_or_while_it_waits() {
        let waiters = Arc::new(Waiters::default());
        let registration = waiters.register(4, vec![(0, 10), (2, 12), (3, 13)]);
        waiters.settle(12, TransferState::Reserved);
        let settler = waiters.clone();
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            settler.settle(10, TransferState::Committed);
        });
        registration.wait_for(&[0, 2], deadline_in(10_000)).await;
        later.await.unwrap();
        assert_eq!(registration.state(0), Some(TransferState::Committed));
        assert_eq!(registration.state(2), Some(TransferState::Reserved));
        assert_eq!(registration.state(1), None);
        assert_eq!(registration.state(3), None, "13 was never settled");
    }

    #[tokio::test]
    #[should_panic(expected = "slot 1 is not a registered prepare")]
    async fn waiting_for_a_slot_that_is_no_prepare_is_a_bug() {
        let waiters = Waiters::default();
        let registration = waiters.register(2, vec![(0, 1)]);
        waiters.settle(1, TransferState::Reserved);
        registration.wait_for(&[0, 1], deadline_in(10)).await;
    }

    #[tokio::test]
    async fn a_wait_ends_at_its_deadline_with_what_was_settled() {
        let waiters = Waiters::default();
        let registration = waiters.register(2, vec![(0, 1), (1, 2)]);
        waiters.settle(2, TransferState::Reserved);
        registration.wait_for(&[0, 1], deadline_in(30)).await;
        assert_eq!(registration.state(0), None);
        assert_eq!(registration.state(1), Some(TransferState::Reserved));
    }

    #[test]
    fn two_requests_for_one_id_both_learn_it_and_a_dropped_one_is_forgotten() {
        let waiters = Waiters::default();
        let first = waiters.register(1, vec![(0, 7)]);
        let second = waiters.register(1, vec![(0, 7)]);
        let gone = waiters.register(1, vec![(0, 8)]);
        drop(gone);
        assert!(!waiters.by_id.lock().unwrap().contains_key(&8));
        waiters.settle(7, TransferState::Reserved);
        assert_eq!(first.state(0), Some(TransferState::Reserved));
        assert_eq!(second.state(0), Some(TransferState::Reserved));
        let third = waiters.register(1, vec![(0, 9)]);
        drop(first);
        drop(second);
        assert_eq!(
            waiters.by_id.lock().unwrap().keys().collect::<Vec<_>>(),
            [&9],
            "only the request still waiting is left"
        );
        drop(third);
        assert!(waiters.by_id.lock().unwrap().is_empty());
    }
}
