//! The payments partition's snapshot, written in steps while apply goes on: the book (counters and each
//! settlement batch's size) when the snapshot begins, then the batches' captures, then the payments a
//! segment at a time (`spate_engine::SegmentedMap`), then the card histories (`HistoryStore`, in steps
//! of its own). Captures are only appended to an open batch, so the first `captures` of a batch's head
//! are the ones it had when the snapshot began, and they are written in steps without a copy; a batch
//! that closes meanwhile hands its captures to the snapshot on their way to the archive.
//!
//! Format: [`STEPPED_FORMAT`], the book (postcard behind its u32 length), each batch's captures
//! ([`CAPTURE_REF_BYTES`] each, in the book's order), the payments' map, then the histories. Snapshots
//! from before (the whole ledger as one postcard value behind its u32 length, then the histories) are
//! still read.

use super::{Batch, CaptureRef, Ledger};
use crate::command::{PAYMENT_ID_BYTES, Payment, PaymentId, decode, encode, encode_into, reuse};
use serde::{Deserialize, Serialize};
use spate_engine::wire::ReadLe;
use spate_engine::{EntryCodec, SegmentedMap};
use std::cell::RefCell;
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
/// A capture in a batch: its payment's id and its index in the payment.
const CAPTURE_REF_BYTES: usize = PAYMENT_ID_BYTES + 2;

pub(crate) type Payments = SegmentedMap<PaymentId, Box<Payment>, PaymentCodec>;

/// A payment is written without its key, which is its id.
pub(crate) struct PaymentCodec;

impl EntryCodec<PaymentId, Box<Payment>> for PaymentCodec {
    /// The payment behind its u32 length, encoded in a buffer the thread keeps and written at once.
    fn write(id: &PaymentId, payment: &Box<Payment>, out: &mut dyn io::Write) -> io::Result<()> {
        debug_assert_eq!(*id, payment.id);
        thread_local! {
            static ENCODED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        ENCODED.with_borrow_mut(|encoded| {
            reuse(encoded);
            encoded.extend_from_slice(&[0; 4]);
            encode_into(payment, encoded);
            let len = u32::try_from(encoded.len() - 4).map_err(io::Error::other)?;
            encoded[..4].copy_from_slice(&len.to_le_bytes());
            out.write_all(encoded)
        })
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

/// A settlement batch as it was when the snapshot began.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct BatchHead {
    id: u64,
    captures: u64,
    confirmed: u64,
}

/// What the snapshot holds of the ledger besides the batches' captures and the payments.
#[derive(Serialize, Deserialize)]
struct Book {
    next_capture_seq: u64,
    authorizations: u64,
    batches: Vec<BatchHead>,
}

/// How far a snapshot in steps has written the batches' captures.
#[derive(Debug)]
pub(crate) struct BatchesCursor {
    heads: Vec<BatchHead>,
    /// The head being written, and how many of its captures are.
    batch: usize,
    written: usize,
    /// The captures of batches that closed (and left the ledger for the archive) before the snapshot
    /// wrote them.
    closed: HashMap<u64, Vec<CaptureRef>>,
}

impl BatchesCursor {
    /// Keeps the captures of `batch`, which just closed, if the snapshot has yet to write them.
    pub fn keep_closed(&mut self, batch: u64, captures: Vec<CaptureRef>) {
        if self.heads[self.batch..].iter().any(|head| head.id == batch) {
            self.closed.insert(batch, captures);
        }
    }
}

fn write_captures(captures: &[CaptureRef], out: &mut dyn io::Write) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(captures.len() * CAPTURE_REF_BYTES);
    for capture in captures {
        bytes.extend_from_slice(&capture.payment.0);
        bytes.extend_from_slice(&capture.index.to_le_bytes());
    }
    out.write_all(&bytes)
}

fn read_captures(count: u64, input: &mut dyn io::Read) -> io::Result<Vec<CaptureRef>> {
    // Bounded, so that a damaged count cannot reserve gigabytes before the bytes run out.
    let mut captures = Vec::with_capacity(count.min(1 << 20) as usize);
    let mut bytes = [0; CAPTURE_REF_BYTES];
    for _ in 0..count {
        input.read_exact(&mut bytes)?;
        let (id, index) = bytes.split_at(PAYMENT_ID_BYTES);
        captures.push(CaptureRef {
            payment: PaymentId(id.try_into().expect("PAYMENT_ID_BYTES")),
            index: u16::from_le_bytes(index.try_into().expect("2 bytes")),
        });
    }
    Ok(captures)
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
    /// The format and the book, as they are now, and the batches' heads.
    fn snapshot_start(&self) -> (Vec<u8>, Vec<BatchHead>) {
        let heads: Vec<BatchHead> = (self.batches.iter())
            .map(|(&id, batch)| BatchHead {
                id,
                captures: batch.captures.len() as u64,
                confirmed: batch.confirmed as u64,
            })
            .collect();
        let book = encode(&Book {
            next_capture_seq: self.next_capture_seq,
            authorizations: self.authorizations,
            batches: heads.clone(),
        });
        let mut start = Vec::with_capacity(8 + book.len());
        start.extend_from_slice(&STEPPED_FORMAT.to_le_bytes());
        start.extend_from_slice(&(book.len() as u32).to_le_bytes());
        start.extend_from_slice(&book);
        (start, heads)
    }

    /// Writes the whole ledger at once.
    pub fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_all(&self.snapshot_start().0)?;
        for batch in self.batches.values() {
            write_captures(&batch.captures, out)?;
        }
        self.payments.write_all(out)
    }

    /// Starts a snapshot of the ledger as it is now and returns its first bytes (the format and the
    /// book); [`Self::batches_step`], then `self.payments.snapshot_step`, write the rest.
    pub fn begin_snapshot(&mut self) -> (Vec<u8>, BatchesCursor) {
        self.payments.begin_snapshot();
        let (start, heads) = self.snapshot_start();
        let cursor = BatchesCursor {
            heads,
            batch: 0,
            written: 0,
            closed: HashMap::new(),
        };
        (start, cursor)
    }

    /// Writes about `bytes_budget` bytes of the batches' captures as they were when the snapshot began;
    /// true once all are written.
    pub fn batches_step(
        &self,
        cursor: &mut BatchesCursor,
        out: &mut dyn io::Write,
        bytes_budget: usize,
    ) -> io::Result<bool> {
        let mut budget = bytes_budget.div_ceil(CAPTURE_REF_BYTES);
        while let Some(head) = cursor.heads.get(cursor.batch) {
            let captures = match cursor.closed.get(&head.id) {
                Some(closed) => closed,
                None => &self.batches[&head.id].captures,
            };
            let captures = &captures[..head.captures as usize];
            let end = (cursor.written + budget).min(captures.len());
            write_captures(&captures[cursor.written..end], out)?;
            budget -= end - cursor.written;
            cursor.written = end;
            if end < captures.len() {
                return Ok(false);
            }
            cursor.batch += 1;
            cursor.written = 0;
        }
        Ok(true)
    }

    /// Reads what [`Self::write_snapshot`] or a snapshot in steps wrote, or a snapshot in the format
    /// before steps.
    pub fn read_snapshot(input: &mut dyn io::Read) -> io::Result<Self> {
        let format_or_len = input.read_u32_le()?;
        if format_or_len == STEPPED_FORMAT {
            let book: Book = decode(&input.read_bytes_le(SECTION_BYTES_MAX)?).map_err(invalid)?;
            let mut batches = BTreeMap::new();
            for head in book.batches {
                let captures = read_captures(head.captures, input)?;
                let confirmed = usize::try_from(head.confirmed)
                    .ok()
                    .filter(|&confirmed| confirmed <= captures.len())
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad batch head"))?;
                batches.insert(
                    head.id,
                    Batch {
                        captures,
                        confirmed,
                    },
                );
            }
            return Ok(Self {
                payments: Payments::read(input, PAYMENT_SEGMENTS)?,
                batches,
                next_capture_seq: book.next_capture_seq,
                authorizations: book.authorizations,
            });
        }
        // The length is the snapshot's word, which may be damaged: read what is there, never
        // allocate what it claims (the fuzz target `snapshot_restore` asked for 2.4 GB).
        let bytes = input.read_len_bytes(u64::from(format_or_len))?;
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
    use spate_engine::wire::WriteLe;

    /// A payment's entry is its encoding behind its u32 length, as written before the kept buffer; a
    /// payment large enough that the buffer is let go afterwards changes nothing for the next one.
    #[test]
    fn a_payment_entry_is_its_encoding_behind_its_length() {
        let small = authorized_payment();
        let mut large = small.clone();
        large.metadata = (0..2000)
            .map(|n| (format!("key {n}"), "v".repeat(40)))
            .collect();
        for payment in [&small, &large, &small] {
            let mut written = Vec::new();
            PaymentCodec::write(&payment.id, &Box::new(payment.clone()), &mut written).unwrap();
            let mut expected = Vec::new();
            expected.write_bytes_le(&encode(payment)).unwrap();
            assert_eq!(written, expected);
            assert_eq!(
                PaymentCodec::read(&mut written.as_slice())
                    .unwrap()
                    .1
                    .as_ref(),
                payment
            );
        }
    }

    /// Captures appended and confirmed while a snapshot's steps write a batch are not in it: the batch
    /// reads back as it was when the snapshot began.
    #[test]
    fn a_batch_that_grows_between_steps_is_written_as_it_began() {
        let capture = |n: u8| CaptureRef {
            payment: PaymentId::new([n; 8], [n; 12]),
            index: u16::from(n),
        };
        let mut ledger = Ledger::default();
        let at_start: Vec<CaptureRef> = (0..100).map(capture).collect();
        ledger.batches.insert(
            7,
            Batch {
                captures: at_start.clone(),
                confirmed: 40,
            },
        );
        let (mut bytes, mut cursor) = ledger.begin_snapshot();
        let mut steps = 0;
        while !ledger.batches_step(&mut cursor, &mut bytes, 100).unwrap() {
            let batch = ledger.batches.get_mut(&7).unwrap();
            batch.captures.push(capture(200));
            batch.confirmed += 1;
            steps += 1;
        }
        assert!(steps > 10, "the batch took {steps} steps");
        while !ledger.payments.snapshot_step(&mut bytes, 100).unwrap() {}

        let read = Ledger::read_snapshot(&mut bytes.as_slice()).unwrap();
        assert_eq!(read.batches[&7].captures, at_start);
        assert_eq!(read.batches[&7].confirmed, 40);
    }

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

    /// Found by the fuzz target `snapshot_restore`: a damaged length of a snapshot in the old format
    /// was allocated as it said (2.4 GB) before a byte was read. It is an error at the input's end.
    #[test]
    fn a_damaged_length_is_an_error_at_the_end_of_the_input() {
        let mut bytes = 0x8f8f_8f8fu32.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0x8f; 40]);
        let error = Ledger::read_snapshot(&mut bytes.as_slice()).err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{error}");
    }
}
