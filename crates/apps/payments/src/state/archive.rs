//! Final payments and closed settlement batches leave the partition's memory for the engine's archive
//! (see ARCHITECTURE.md, "Archive"), where reads, duplicate checks and later refunds still find them.
//!
//! A payment is final once no command but a refund or a cancel of failed captures can change it (see
//! [`is_final`]); such a change leaves it final. The archive never changes what it holds, so a change
//! to an archived payment is archived as its next revision: keys are the payment's id then the
//! revision, numbered 0, 1, 2... without gaps, and the newest is found in O(log revisions) lookups.

use super::CaptureRef;
use crate::command::{CaptureStatus, PAYMENT_ID_BYTES, Payment, PaymentId, Status, decode};
use spate_engine::Effects;

/// Where final payments go: the engine's archive on the partition, a map in unit tests.
pub trait PaymentsArchive {
    /// Archives `value` under `key`, which is archived at most once.
    fn put(&mut self, key: &[u8], value: &[u8]);
    /// What was archived under `key` by an earlier command.
    fn get(&self, key: &[u8]) -> Option<Vec<u8>>;
}

impl PaymentsArchive for Effects<'_> {
    fn put(&mut self, key: &[u8], value: &[u8]) {
        self.archive(key, value);
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.archived(key)
    }
}

/// True when nothing can capture or expire the payment any more: it is not authorized and none of its
/// captures waits for settlement.
pub fn is_final(payment: &Payment) -> bool {
    payment.status != Status::Authorized
        && !(payment.captures.iter()).any(|capture| capture.status == CaptureStatus::Pending)
}

/// The archive key of revision `revision` of payment `id`.
pub fn payment_key(id: &PaymentId, revision: u32) -> [u8; PAYMENT_ID_BYTES + 4] {
    let mut key = [0; PAYMENT_ID_BYTES + 4];
    key[..PAYMENT_ID_BYTES].copy_from_slice(&id.0);
    key[PAYMENT_ID_BYTES..].copy_from_slice(&revision.to_be_bytes());
    key
}

/// The archive key of a closed batch's captures on this partition: `b` then the batch's id. Shorter
/// than a payment's, so never one.
pub fn batch_key(batch: u64) -> [u8; 9] {
    let mut key = [b'b'; 9];
    key[1..].copy_from_slice(&batch.to_be_bytes());
    key
}

fn decode_payment(bytes: &[u8]) -> Payment {
    decode(bytes).expect("payments archives only payments it encoded")
}

/// A closed batch's captures, as [`batch_key`] holds them.
pub fn decode_batch(bytes: &[u8]) -> Vec<CaptureRef> {
    decode(bytes).expect("payments archives only batches it encoded")
}

/// The newest revision of payment `id` in the archive, and the payment as it holds it.
pub fn latest_archived<E>(
    id: &PaymentId,
    get: impl Fn(&[u8]) -> Result<Option<Vec<u8>>, E>,
) -> Result<Option<(u32, Payment)>, E> {
    let Some(mut newest) = get(&payment_key(id, 0))? else {
        return Ok(None);
    };
    // Revisions `..=found` exist and `absent` does not: double the step until a revision is missing,
    // then halve the gap.
    let (mut found, mut step) = (0u32, 1u32);
    let mut absent = loop {
        let probe = found.saturating_add(step);
        match get(&payment_key(id, probe))? {
            Some(bytes) if probe > found => (found, newest, step) = (probe, bytes, step * 2),
            _ => break probe,
        }
    };
    while absent - found > 1 {
        let middle = found + (absent - found) / 2;
        match get(&payment_key(id, middle))? {
            Some(bytes) => (found, newest) = (middle, bytes),
            None => absent = middle,
        }
    }
    Ok(Some((found, decode_payment(&newest))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::encode;
    use crate::state::tests::authorized_payment;
    use std::cell::Cell;
    use std::collections::HashMap;

    #[test]
    fn the_newest_revision_is_found_in_a_logarithmic_number_of_lookups() {
        let mut payment = authorized_payment();
        for revisions in [1u32, 2, 3, 7, 8, 9, 100, 1000] {
            let mut archive = HashMap::new();
            for revision in 0..revisions {
                payment.amount = u64::from(revision);
                archive.insert(payment_key(&payment.id, revision), encode(&payment));
            }
            let lookups = Cell::new(0);
            let get = |key: &[u8]| {
                lookups.set(lookups.get() + 1);
                Ok::<_, ()>(archive.get(key).cloned())
            };
            let (revision, found) = latest_archived(&payment.id, get).unwrap().unwrap();
            assert_eq!(revision, revisions - 1);
            assert_eq!(found.amount, u64::from(revisions - 1));
            assert!(
                lookups.get() <= 2 + 2 * (32 - revisions.leading_zeros()),
                "{} lookups for {revisions} revisions",
                lookups.get()
            );
        }
        let get = |_: &[u8]| Ok::<_, ()>(None);
        assert_eq!(latest_archived(&payment.id, get), Ok(None));
    }
}
