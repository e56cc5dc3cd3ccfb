//! The payments partition's snapshot, written in steps while apply goes on: the settlement book (batches
//! and counters) encoded whole when the snapshot begins, then the payments a segment at a time
//! (`spate_engine::SegmentedMap`), then the card histories (`HistoryStore`, in steps of its own).
//!
//! Format: [`STEPPED_FORMAT`], the book (postcard behind its u32 length), the payments' map, then the
//! histories. Snapshots from before (the whole ledger as one postcard value behind its u32 length, then
//! the histories) are still read.

use super::{Batch, Ledger};
use crate::command::{Payment, PaymentId, decode, encode};
use serde::{Deserialize, Serialize};
use spate_engine::wire::{ReadLe, WriteLe};
use spate_engine::{EntryCodec, SegmentedMap};
use std::collections::{BTreeMap, HashMap};
use std::io;

/// Marks a snapshot written in steps. Older snapshots begin with their ledger's length, below it.
const STEPPED_FORMAT: u32 = u32::MAX;
/// Segments of the payments' map: at a million payments on a partition, about 250 (100 KB) each,
/// which bounds what a step or a change forced to write first costs.
pub(crate) const PAYMENT_SEGMENTS: usize = 4096;
/// Bounds on what one length may ask for, so that damaged bytes cannot ask for gigabytes. A payment
/// holds up to 65,536 captures.
const PAYMENT_BYTES_MAX: usize = 16 << 20;
const SECTION_BYTES_MAX: usize = u32::MAX as usize - 1;

pub(crate) type Payments = SegmentedMap<PaymentId, Box<Payment>, PaymentCodec>;

/// A payment is written without its key, which is its id.
pub(crate) struct PaymentCodec;

impl EntryCodec<PaymentId, Box<Payment>> for PaymentCodec {
    fn write(id: &PaymentId, payment: &Box<Payment>, out: &mut dyn io::Write) -> io::Result<()> {
        debug_assert_eq!(*id, payment.id);
        out.write_bytes_le(&encode(payment))
    }

    fn read(input: &mut dyn io::Read) -> io::Result<(PaymentId, Box<Payment>)> {
        let payment: Box<Payment> =
            decode(&input.read_bytes_le(PAYMENT_BYTES_MAX)?).map_err(invalid)?;
        Ok((payment.id, payment))
    }
}

fn invalid(error: postcard::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

/// What the snapshot holds of the ledger besides its payments, as written.
#[derive(Serialize)]
struct BookRef<'a> {
    batches: &'a BTreeMap<u64, Batch>,
    next_capture_seq: u64,
    authorizations: u64,
}

/// The same, as read.
#[derive(Deserialize)]
struct Book {
    batches: BTreeMap<u64, Batch>,
    next_capture_seq: u64,
    authorizations: u64,
}

/// The format before steps: the whole ledger as one postcard value.
#[derive(Serialize, Deserialize)]
struct WholeLedger {
    payments: HashMap<PaymentId, Box<Payment>>,
    batches: BTreeMap<u64, Batch>,
    next_capture_seq: u64,
    authorizations: u64,
}

impl Ledger {
    /// The format and the book, as they are now.
    fn snapshot_start(&self) -> Vec<u8> {
        let book = encode(&BookRef {
            batches: &self.batches,
            next_capture_seq: self.next_capture_seq,
            authorizations: self.authorizations,
        });
        let mut start = Vec::with_capacity(8 + book.len());
        start.extend_from_slice(&STEPPED_FORMAT.to_le_bytes());
        start.extend_from_slice(&(book.len() as u32).to_le_bytes());
        start.extend_from_slice(&book);
        start
    }

    /// Writes the whole ledger at once.
    pub fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_all(&self.snapshot_start())?;
        self.payments.write_all(out)
    }

    /// Starts a snapshot of the ledger as it is now and returns its first bytes (the format and the
    /// book); `self.payments.snapshot_step` writes the rest.
    pub fn begin_snapshot(&mut self) -> Vec<u8> {
        self.payments.begin_snapshot();
        self.snapshot_start()
    }

    /// Reads what [`Self::write_snapshot`] or a snapshot in steps wrote, or a snapshot in the format
    /// before steps.
    pub fn read_snapshot(input: &mut dyn io::Read) -> io::Result<Self> {
        let format_or_len = input.read_u32_le()?;
        if format_or_len == STEPPED_FORMAT {
            let book: Book = decode(&input.read_bytes_le(SECTION_BYTES_MAX)?).map_err(invalid)?;
            return Ok(Self {
                payments: Payments::read(input, PAYMENT_SEGMENTS)?,
                batches: book.batches,
                next_capture_seq: book.next_capture_seq,
                authorizations: book.authorizations,
            });
        }
        let mut bytes = vec![0; format_or_len as usize];
        input.read_exact(&mut bytes)?;
        let whole: WholeLedger = decode(&bytes).map_err(invalid)?;
        let mut payments = Payments::new(PAYMENT_SEGMENTS);
        for (id, payment) in whole.payments {
            payments.insert(id, payment);
        }
        Ok(Self {
            payments,
            batches: whole.batches,
            next_capture_seq: whole.next_capture_seq,
            authorizations: whole.authorizations,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::authorized_payment;

    /// Snapshots written whole before steps existed read back, and the section after them too.
    #[test]
    fn a_snapshot_in_the_format_before_steps_is_read() {
        let payment = authorized_payment();
        let whole = WholeLedger {
            payments: HashMap::from([(payment.id, Box::new(payment.clone()))]),
            batches: BTreeMap::from([(
                5,
                Batch {
                    captures: Vec::new(),
                    confirmed: 0,
                },
            )]),
            next_capture_seq: 3,
            authorizations: 9,
        };
        let mut bytes = Vec::new();
        bytes.write_bytes_le(&encode(&whole)).unwrap();
        bytes.extend_from_slice(b"the histories");

        let mut input = bytes.as_slice();
        let read = Ledger::read_snapshot(&mut input).unwrap();
        assert_eq!(input, b"the histories", "it reads exactly its own bytes");
        assert_eq!(read.payments.get(&payment.id).map(|p| &**p), Some(&payment));
        assert_eq!(read.batches.keys().collect::<Vec<_>>(), [&5]);
        assert_eq!((read.next_capture_seq, read.authorizations), (3, 9));
    }
}
