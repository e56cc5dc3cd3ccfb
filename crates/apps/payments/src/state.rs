//! One partition's payments: the rules of authorization, capture, cancel, refund, expiry and settlement,
//! applied by the partition's single thread. A payment lives on its card's partition (its id starts with
//! the card token's route bytes), next to the card's fraud history, so an authorization is scored and
//! recorded in one place without a lock or a cross-partition step.
//!
//! Invariants (asserted by `check`, exercised by the property test):
//! - captured (pending + succeeded) + capturable <= amount, and capturable is 0 unless `authorized`;
//! - refunded <= settled (succeeded captures);
//! - after cancel, final capture, full capture or expiry, nothing more is capturable;
//! - the spool holds exactly the pending captures that are in no batch;
//! - no final payment ([`archive::is_final`]) stays in memory after a command: it is in the archive,
//!   and so are the captures of every closed batch.

use crate::card::expired_at;
use crate::command::{
    Authorize, Capture, CaptureStatus, Command, Event, EventKind, Payment, PaymentId, Refund,
    Refusal, Reply, Status, decode, encode, encode_in, encode_into,
};
use serde::{Deserialize, Serialize};
use spate_cards::history::HistoryStore;
use spate_cards::record::{Digits, Txn};
use spate_cards::rules::RuleSet;
use spate_engine::{Effects, StateMachine};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;

pub mod archive;
mod snapshot;
/// Captures one payment may have: a capture is found in the settlement spool by its index in the
/// payment (a `u16`), and a payment with thousands of partial captures is a client's loop, not a sale.
pub const CAPTURES_PER_PAYMENT_MAX: usize = 1_000;

use archive::{PaymentsArchive, batch_key, decode_batch, is_final, latest_archived, payment_key};
use snapshot::{BatchesCursor, PAYMENT_SEGMENTS, Payments};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CaptureRef {
    pub payment: PaymentId,
    pub index: u16,
}

/// A settlement batch as this partition knows it: its captures in the order they were assigned.
/// Once all are confirmed the batch is closed: its captures move to the archive ([`batch_key`]) and
/// it stays here empty, so that its id is never used again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub captures: Vec<CaptureRef>,
    /// How many of `captures` are confirmed.
    pub confirmed: usize,
}

/// One detail record of a settlement file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detail {
    pub merchant: String,
    pub currency: String,
    pub payment: PaymentId,
    pub capture_id: String,
    pub amount: u64,
    pub masked: String,
}

/// Why a batch's details cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub enum DetailsError<E> {
    /// The archive failed to answer.
    Archive(E),
    /// A payment the batch names is neither in memory nor in the archive: the archive's store lost it.
    PaymentMissing { batch: u64, payment: PaymentId },
}

impl<E: std::fmt::Display> std::fmt::Display for DetailsError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Archive(error) => write!(f, "the archive failed: {error}"),
            Self::PaymentMissing { batch, payment } => write!(
                f,
                "batch {batch} names payment {payment}, found neither in memory nor in the archive"
            ),
        }
    }
}

/// What the app asks a partition wherever it is applied ([`StateMachine::read`], postcard bytes):
/// settlement runs on one node and the list shows payments of every partition, which in a cluster live
/// on several nodes. New variants go last: nodes of two versions may ask each other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionQuery {
    /// Answered with [`Batches`].
    Batches,
    /// Answered with [`Details`]: up to `limit` detail records of `batch` from `offset` on.
    Details { batch: u64, offset: u64, limit: u64 },
    /// Answered with a `Vec<Option<Payment>>`: each payment, in memory or archived.
    Payments(Vec<PaymentId>),
    /// Answered with a `u64`: the pending captures in no settlement batch yet.
    Spooled,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batches {
    /// Batches assigned but not confirmed (a run that stopped half-way).
    pub open: Vec<u64>,
    /// See [`PaymentsState::last_batch`].
    pub last: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Details {
    pub details: Vec<Detail>,
    /// The batch's detail records on this partition, all pages together.
    pub total: u64,
}

/// The part of the partition state kept in the snapshot besides the fraud history; the indexes are
/// rebuilt from it.
#[derive(Debug)]
pub(crate) struct Ledger {
    /// Boxed: a payment is a few hundred bytes, and a segment of them inline would move all of them
    /// each time it grows. Segmented, so that a snapshot writes them in steps (see `snapshot.rs`).
    pub payments: Payments,
    pub batches: BTreeMap<u64, Batch>,
    pub next_capture_seq: u64,
    pub authorizations: u64,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            payments: Payments::new(PAYMENT_SEGMENTS),
            batches: BTreeMap::new(),
            next_capture_seq: 0,
            authorizations: 0,
        }
    }
}

impl PartialEq for Ledger {
    fn eq(&self, other: &Self) -> bool {
        fn sorted(payments: &Payments) -> Vec<(&PaymentId, &Payment)> {
            let mut all: Vec<_> = payments.iter().map(|(id, p)| (id, &**p)).collect();
            all.sort_unstable_by_key(|(id, _)| **id);
            all
        }
        sorted(&self.payments) == sorted(&other.payments)
            && (&self.batches, self.next_capture_seq, self.authorizations)
                == (&other.batches, other.next_capture_seq, other.authorizations)
    }
}

pub struct PaymentsState {
    ledger: Ledger,
    /// Authorized payments by `capture_before`.
    deadlines: BTreeSet<(u64, PaymentId)>,
    /// Pending captures in no batch yet, by sequence: the capture spool.
    spool: BTreeMap<u64, CaptureRef>,
    history: HistoryStore,
    rules: Arc<dyn RuleSet>,
    window: Vec<Txn>,
    /// The start of the snapshot in progress (see `snapshot.rs`), until its first step writes it.
    snapshot_start: Option<Vec<u8>>,
    /// How far the snapshot in progress wrote the batches' captures, until they are all written.
    snapshot_batches: Option<BatchesCursor>,
    /// Whether final payments and closed batches go to the archive; always, but in the unit tests that
    /// compare a state that archives with one that keeps everything.
    archives_final: bool,
    /// An archived payment a command brought back into memory, until the command ends.
    revived: Option<Revived>,
    /// The payments the command in progress changed: those final at its end go to the archive.
    changed: Vec<PaymentId>,
    /// Kept between commands for the bytes of each event and archived payment, so that encoding one
    /// allocates nothing once the buffer has grown (a closed batch's captures, rare and up to millions,
    /// get a vector of their own).
    encoded: Vec<u8>,
}

/// An archived payment in memory while a command may change it.
#[derive(Debug)]
struct Revived {
    id: PaymentId,
    revision: u32,
    archived: Payment,
}

impl PaymentsState {
    pub fn new(rules: Arc<dyn RuleSet>, entries_per_card_max: usize) -> Self {
        Self::with_ledger(
            Ledger::default(),
            HistoryStore::new(entries_per_card_max),
            rules,
        )
    }

    fn with_ledger(ledger: Ledger, history: HistoryStore, rules: Arc<dyn RuleSet>) -> Self {
        let mut state = Self {
            ledger,
            deadlines: BTreeSet::new(),
            spool: BTreeMap::new(),
            history,
            rules,
            window: Vec::new(),
            snapshot_start: None,
            snapshot_batches: None,
            archives_final: true,
            revived: None,
            changed: Vec::new(),
            encoded: Vec::new(),
        };
        for (_, payment) in state.ledger.payments.iter() {
            if payment.status == Status::Authorized {
                state
                    .deadlines
                    .insert((payment.capture_before_ms, payment.id));
            }
            for (index, capture) in payment.captures.iter().enumerate() {
                if capture.status == CaptureStatus::Pending && capture.batch.is_none() {
                    state.spool.insert(
                        capture.seq,
                        CaptureRef {
                            payment: payment.id,
                            index: u16::try_from(index)
                                .expect("captures per payment are bounded below u16::MAX"),
                        },
                    );
                }
            }
        }
        state
    }

    /// A payment still in memory: one that is not final.
    pub fn payment(&self, id: &PaymentId) -> Option<&Payment> {
        self.ledger.payments.get(id).map(Box::as_ref)
    }

    /// The payment `id`, in memory or archived; `get` reads the archive.
    pub fn find_payment<E>(
        &self,
        id: &PaymentId,
        get: impl Fn(&[u8]) -> Result<Option<Vec<u8>>, E>,
    ) -> Result<Option<Payment>, E> {
        match self.payment(id) {
            Some(payment) => Ok(Some(payment.clone())),
            None => Ok(latest_archived(id, get)?.map(|(_, payment)| payment)),
        }
    }

    pub fn spooled(&self) -> usize {
        self.spool.len()
    }

    /// The newest batch id this partition has seen (0 if none): a new batch must be newer, or it would
    /// reopen a closed one.
    pub fn last_batch(&self) -> u64 {
        self.ledger.batches.keys().next_back().copied().unwrap_or(0)
    }

    /// Batches with captures not yet confirmed.
    pub fn open_batches(&self) -> Vec<u64> {
        self.ledger
            .batches
            .iter()
            .filter(|(_, b)| b.confirmed < b.captures.len())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Up to `limit` detail records of `batch` from `offset`, in assignment order, and the batch's size;
    /// `get` reads the archive (closed batches and final payments).
    pub fn batch_details<E>(
        &self,
        batch: u64,
        offset: usize,
        limit: usize,
        get: impl Fn(&[u8]) -> Result<Option<Vec<u8>>, E>,
    ) -> Result<(Vec<Detail>, usize), DetailsError<E>> {
        let Some(batch_here) = self.ledger.batches.get(&batch) else {
            return Ok((Vec::new(), 0));
        };
        let closed;
        let captures = if batch_here.captures.is_empty() {
            closed = get(&batch_key(batch))
                .map_err(DetailsError::Archive)?
                .map_or_else(Vec::new, |bytes| decode_batch(&bytes));
            &closed
        } else {
            &batch_here.captures
        };
        let mut details = Vec::with_capacity(limit.min(captures.len()));
        for capture in captures.iter().skip(offset).take(limit) {
            // Not `find_payment`: a payment in memory is read in place, not copied.
            let archived;
            let payment = match self.payment(&capture.payment) {
                Some(payment) => payment,
                None => {
                    archived = latest_archived(&capture.payment, &get)
                        .map_err(DetailsError::Archive)?
                        .ok_or_else(|| DetailsError::PaymentMissing {
                            batch,
                            payment: capture.payment,
                        })?
                        .1;
                    &archived
                }
            };
            let index = usize::from(capture.index);
            details.push(Detail {
                merchant: payment.merchant.clone(),
                currency: payment.currency.clone(),
                payment: payment.id,
                capture_id: payment.capture_id(index),
                amount: payment.captures[index].amount,
                masked: payment.card.masked.clone(),
            });
        }
        Ok((details, captures.len()))
    }

    /// Applies one command at `now_ms`, emitting events through `emit`; final payments go to `archive`.
    pub fn apply_command(
        &mut self,
        command: Command,
        now_ms: u64,
        archive: &mut dyn PaymentsArchive,
        emit: &mut dyn FnMut(Event),
    ) -> Reply {
        let reply = match command {
            Command::Authorize(authorize) => self.authorize(*authorize, now_ms, archive, emit),
            Command::Capture {
                payment,
                amount,
                final_capture,
            } => self.capture(payment, amount, final_capture, now_ms, archive, emit),
            Command::Cancel { payment } => self.cancel(payment, now_ms, archive, emit),
            Command::Refund { payment, amount } => {
                self.refund(payment, amount, now_ms, archive, emit)
            }
            Command::Tick => Reply::Ticked {
                expired: self.expire_due(now_ms, emit),
            },
            Command::SettleAssign {
                batch,
                suspended,
                limit,
            } => self.settle_assign(batch, &suspended, limit, emit),
            Command::SettleConfirm { batch, limit } => {
                self.settle_confirm(batch, limit, archive, emit)
            }
        };
        self.archive_final_payments(archive);
        reply
    }

    /// At the end of a command, moves the payments it changed that are final to the archive: revision
    /// 0, or for a payment it brought back from there, the next revision if it changed it.
    fn archive_final_payments(&mut self, archive: &mut dyn PaymentsArchive) {
        let revived = self.revived.take();
        // Taken for the loop and given back empty, so that its capacity serves the next command.
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        for &id in &changed {
            if !self.archives_final || revived.as_ref().is_some_and(|r| r.id == id) {
                continue;
            }
            let Some(payment) = self.ledger.payments.get(&id) else {
                continue;
            };
            if is_final(payment) {
                archive.put(&payment_key(&id, 0), encode_in(payment, &mut self.encoded));
                self.ledger.payments.remove(&id);
            }
        }
        changed.clear();
        self.changed = changed;
        if let Some(revived) = revived {
            let payment = (self.ledger.payments.remove(&revived.id)).expect("revived in memory");
            assert!(
                is_final(&payment),
                "{}: a final payment stays final",
                revived.id
            );
            if *payment != revived.archived {
                archive.put(
                    &payment_key(&revived.id, revived.revision + 1),
                    encode_in(&payment, &mut self.encoded),
                );
            }
        }
    }

    /// Emits the event of a change to payment `id` and answers with the payment.
    fn changed(&mut self, kind: EventKind, id: PaymentId, emit: &mut dyn FnMut(Event)) -> Reply {
        self.changed.push(id);
        let payment = self
            .ledger
            .payments
            .get(&id)
            .expect("a known payment")
            .clone();
        emit(Event::Changed {
            kind,
            payment: payment.clone(),
        });
        Reply::Payment(payment)
    }

    fn authorize(
        &mut self,
        a: Authorize,
        now_ms: u64,
        archive: &mut dyn PaymentsArchive,
        emit: &mut dyn FnMut(Event),
    ) -> Reply {
        if self.ledger.payments.contains_key(&a.payment)
            || archive.get(&payment_key(&a.payment, 0)).is_some()
        {
            return Reply::Refused(Refusal::Exists);
        }
        let txn = Txn {
            card: a.card.history_card(),
            timestamp: Digits::of(now_ms),
            country: a.scoring.country,
            response: 0,
            amount: Digits::of(a.amount),
            currency: a.currency_numeric,
            merchant: a.scoring.mcc,
            city: a.scoring.city,
            code: Digits::of((self.ledger.authorizations + 1) % 10_000_000_000),
        };
        // The edge bounds every field; a command that did not pass it (a damaged record whose
        // checksum still matched, another node's bug) is refused before it changes anything. Found by
        // the fuzz target `app_command`, where it failed an assertion.
        if let Err(error) = txn.validate() {
            return Reply::Refused(Refusal::Malformed(format!(
                "an authorization out of bounds: {error}"
            )));
        }
        self.ledger.authorizations += 1;
        let fraud_rule = if a.scoring.enabled {
            self.history
                .score_and_store(&txn, &*self.rules, &mut self.window)
        } else {
            0
        };
        let decline_reason = if expired_at(a.card.exp_month, a.card.exp_year, now_ms) {
            Some("expired_card".to_string())
        } else if !a.cvc_matches {
            Some("incorrect_cvc".to_string())
        } else if fraud_rule != 0 && a.scoring.decline {
            Some(format!("fraud_rule_{fraud_rule}"))
        } else {
            None
        };
        let authorized = decline_reason.is_none();
        let payment = Payment {
            id: a.payment,
            created_ms: now_ms,
            merchant: a.merchant,
            amount: a.amount,
            currency: a.currency,
            card: a.card,
            tax: a.tax,
            status: if authorized {
                Status::Authorized
            } else {
                Status::Declined
            },
            decline_reason,
            fraud_rule,
            capture_before_ms: if authorized {
                now_ms.saturating_add(a.capture_window_ms)
            } else {
                now_ms
            },
            amount_capturable: if authorized { a.amount } else { 0 },
            captures: Vec::new(),
            refunds: Vec::new(),
            metadata: a.metadata,
        };
        if authorized {
            self.deadlines
                .insert((payment.capture_before_ms, payment.id));
        }
        self.ledger.payments.insert(payment.id, Box::new(payment));
        let kind = if authorized {
            EventKind::Authorized
        } else {
            EventKind::Declined
        };
        let reply = self.changed(kind, a.payment, emit);
        if authorized && a.capture_now {
            return self.capture(a.payment, None, true, now_ms, archive, emit);
        }
        reply
    }

    /// Ends the authorization of `id` if its deadline has passed; true when it did.
    fn expire_if_due(&mut self, id: PaymentId, now_ms: u64, emit: &mut dyn FnMut(Event)) -> bool {
        let payment = self
            .ledger
            .payments
            .get_mut(&id)
            .expect("only known payments are expired");
        if payment.status != Status::Authorized || now_ms < payment.capture_before_ms {
            return false;
        }
        self.deadlines.remove(&(payment.capture_before_ms, id));
        payment.amount_capturable = 0;
        payment.status = if payment.amount_captured() > 0 {
            Status::Captured
        } else {
            Status::Expired
        };
        self.changed(EventKind::Expired, id, emit);
        true
    }

    fn expire_due(&mut self, now_ms: u64, emit: &mut dyn FnMut(Event)) -> u64 {
        let due: Vec<PaymentId> = self
            .deadlines
            .range(..(now_ms.saturating_add(1), PaymentId([0; 20])))
            .map(|(_, id)| *id)
            .collect();
        let mut expired = 0;
        for id in due {
            expired += u64::from(self.expire_if_due(id, now_ms, emit));
        }
        expired
    }

    /// Brings payment `id` into memory, from the archive if it is final, and expires it first if its
    /// deadline passed; or why not.
    fn live(
        &mut self,
        id: PaymentId,
        now_ms: u64,
        archive: &mut dyn PaymentsArchive,
        emit: &mut dyn FnMut(Event),
    ) -> Result<(), Refusal> {
        if !self.ledger.payments.contains_key(&id) {
            let get = |key: &[u8]| Ok::<_, std::convert::Infallible>(archive.get(key));
            let Ok(Some((revision, payment))) = latest_archived(&id, get) else {
                return Err(Refusal::NotFound);
            };
            self.ledger.payments.insert(id, Box::new(payment.clone()));
            self.revived = Some(Revived {
                id,
                revision,
                archived: payment,
            });
            return Ok(());
        }
        self.expire_if_due(id, now_ms, emit);
        Ok(())
    }

    fn capture(
        &mut self,
        id: PaymentId,
        amount: Option<u64>,
        final_capture: bool,
        now_ms: u64,
        archive: &mut dyn PaymentsArchive,
        emit: &mut dyn FnMut(Event),
    ) -> Reply {
        if let Err(refusal) = self.live(id, now_ms, archive, emit) {
            return Reply::Refused(refusal);
        }
        let payment = self.ledger.payments.get_mut(&id).expect("checked by live");
        if payment.status != Status::Authorized {
            return Reply::Refused(Refusal::WrongStatus {
                status: payment.status,
                action: "captured".to_string(),
            });
        }
        let capturable = payment.amount_capturable;
        let amount = amount.unwrap_or(capturable);
        if amount == 0 {
            return Reply::Refused(Refusal::Malformed("amount must be at least 1".to_string()));
        }
        if amount > capturable {
            return Reply::Refused(Refusal::ExceedsCapturable { capturable });
        }
        if payment.captures.len() >= CAPTURES_PER_PAYMENT_MAX {
            return Reply::Refused(Refusal::TooManyCaptures {
                captures_max: CAPTURES_PER_PAYMENT_MAX as u32,
            });
        }
        let seq = self.ledger.next_capture_seq;
        self.ledger.next_capture_seq += 1;
        payment.captures.push(Capture {
            seq,
            amount,
            status: CaptureStatus::Pending,
            batch: None,
            created_ms: now_ms,
        });
        self.spool.insert(
            seq,
            CaptureRef {
                payment: id,
                index: u16::try_from(payment.captures.len() - 1)
                    .expect("captures per payment are bounded below u16::MAX"),
            },
        );
        payment.amount_capturable -= amount;
        if final_capture || payment.amount_capturable == 0 {
            payment.amount_capturable = 0;
            payment.status = Status::Captured;
            self.deadlines.remove(&(payment.capture_before_ms, id));
        }
        self.changed(EventKind::CaptureRequested, id, emit)
    }

    fn cancel(
        &mut self,
        id: PaymentId,
        now_ms: u64,
        archive: &mut dyn PaymentsArchive,
        emit: &mut dyn FnMut(Event),
    ) -> Reply {
        if let Err(refusal) = self.live(id, now_ms, archive, emit) {
            return Reply::Refused(refusal);
        }
        let payment = self.ledger.payments.get_mut(&id).expect("checked by live");
        if !matches!(payment.status, Status::Authorized | Status::Captured) {
            return Reply::Refused(Refusal::WrongStatus {
                status: payment.status,
                action: "canceled".to_string(),
            });
        }
        if payment
            .captures
            .iter()
            .any(|c| c.status == CaptureStatus::Succeeded)
        {
            return Reply::Refused(Refusal::AlreadySettled);
        }
        if payment
            .captures
            .iter()
            .any(|c| c.status == CaptureStatus::Pending && c.batch.is_some())
        {
            return Reply::Refused(Refusal::SettlementInProgress);
        }
        for capture in &mut payment.captures {
            if capture.status == CaptureStatus::Pending {
                capture.status = CaptureStatus::Canceled;
                self.spool.remove(&capture.seq);
            }
        }
        self.deadlines.remove(&(payment.capture_before_ms, id));
        payment.amount_capturable = 0;
        payment.status = Status::Canceled;
        self.changed(EventKind::Canceled, id, emit)
    }

    fn refund(
        &mut self,
        id: PaymentId,
        amount: Option<u64>,
        now_ms: u64,
        archive: &mut dyn PaymentsArchive,
        emit: &mut dyn FnMut(Event),
    ) -> Reply {
        if let Err(refusal) = self.live(id, now_ms, archive, emit) {
            return Reply::Refused(refusal);
        }
        let payment = self.ledger.payments.get_mut(&id).expect("checked by live");
        let refundable = payment.amount_refundable();
        let amount = amount.unwrap_or(refundable);
        if amount == 0 || amount > refundable {
            return Reply::Refused(Refusal::ExceedsRefundable { refundable });
        }
        payment.refunds.push(Refund {
            amount,
            created_ms: now_ms,
        });
        self.changed(EventKind::Refunded, id, emit)
    }

    fn settle_assign(
        &mut self,
        batch_id: u64,
        suspended: &[String],
        limit: u32,
        emit: &mut dyn FnMut(Event),
    ) -> Reply {
        if (self.ledger.batches.get(&batch_id)).is_some_and(|batch| batch.captures.is_empty()) {
            return Reply::Refused(Refusal::Malformed(format!(
                "settlement batch {batch_id} is closed"
            )));
        }
        let (mut assigned, mut failed) = (0, 0);
        let mut taken = Vec::new();
        for (seq, capture) in &self.spool {
            if taken.len() == limit as usize {
                break;
            }
            let payment = &self
                .ledger
                .payments
                .get(&capture.payment)
                .expect("a known payment");
            if payment.captures[usize::from(capture.index)].created_ms > batch_id {
                break;
            }
            taken.push((*seq, *capture));
        }
        for (seq, capture) in &taken {
            self.spool.remove(seq);
            let payment = self
                .ledger
                .payments
                .get_mut(&capture.payment)
                .expect("the spool names known payments");
            let entry = &mut payment.captures[usize::from(capture.index)];
            entry.batch = Some(batch_id);
            if suspended.contains(&payment.merchant) {
                entry.status = CaptureStatus::Failed;
                failed += 1;
                emit(Event::CaptureSettled {
                    payment: capture.payment,
                    capture: capture.index,
                    status: CaptureStatus::Failed,
                    batch: batch_id,
                });
                self.changed.push(capture.payment);
            } else {
                assigned += 1;
                self.ledger
                    .batches
                    .entry(batch_id)
                    .or_insert_with(|| Batch {
                        captures: Vec::new(),
                        confirmed: 0,
                    })
                    .captures
                    .push(*capture);
            }
        }
        let more = self.spool.first_key_value().is_some_and(|(_, capture)| {
            let payment = &self
                .ledger
                .payments
                .get(&capture.payment)
                .expect("a known payment");
            payment.captures[usize::from(capture.index)].created_ms <= batch_id
        });
        Reply::Assigned {
            assigned,
            failed,
            more,
        }
    }

    fn settle_confirm(
        &mut self,
        batch_id: u64,
        limit: u32,
        archive: &mut dyn PaymentsArchive,
        emit: &mut dyn FnMut(Event),
    ) -> Reply {
        let Some(batch) = self.ledger.batches.get(&batch_id) else {
            return Reply::Confirmed {
                confirmed: 0,
                more: false,
            };
        };
        let (start, end) = (
            batch.confirmed,
            (batch.confirmed + limit as usize).min(batch.captures.len()),
        );
        let confirming = batch.captures[start..end].to_vec();
        for capture in confirming {
            let payment =
                self.ledger.payments.get_mut(&capture.payment).expect(
                    "a batch's unconfirmed captures are pending: their payments are in memory",
                );
            let entry = &mut payment.captures[usize::from(capture.index)];
            assert_eq!(
                entry.status,
                CaptureStatus::Pending,
                "a capture settles once"
            );
            entry.status = CaptureStatus::Succeeded;
            emit(Event::CaptureSettled {
                payment: capture.payment,
                capture: capture.index,
                status: CaptureStatus::Succeeded,
                batch: batch_id,
            });
            self.changed.push(capture.payment);
        }
        let batch = self.ledger.batches.get_mut(&batch_id).expect("found above");
        batch.confirmed = end;
        let more = end < batch.captures.len();
        if !more && self.archives_final && !batch.captures.is_empty() {
            let captures = std::mem::take(&mut batch.captures);
            batch.confirmed = 0;
            archive.put(&batch_key(batch_id), &encode(&captures));
            if let Some(cursor) = &mut self.snapshot_batches {
                cursor.keep_closed(batch_id, captures);
            }
        }
        Reply::Confirmed {
            confirmed: (end - start) as u64,
            more,
        }
    }

    /// Checks every invariant of the module comment; for tests.
    pub fn check(&self) {
        assert!(
            self.revived.is_none() && self.changed.is_empty(),
            "a command's changes outlived it"
        );
        let mut spooled = 0;
        for (_, payment) in self.ledger.payments.iter() {
            assert!(
                !self.archives_final || !is_final(payment),
                "{}: final and still in memory",
                payment.id
            );
            let captured = payment.amount_captured();
            assert!(
                captured + payment.amount_capturable <= payment.amount,
                "{}: captured {captured} + capturable {} > amount {}",
                payment.id,
                payment.amount_capturable,
                payment.amount
            );
            if payment.status != Status::Authorized {
                assert_eq!(payment.amount_capturable, 0, "{}", payment.id);
            }
            assert!(payment.amount_refunded() <= payment.amount_settled());
            for capture in &payment.captures {
                if capture.status == CaptureStatus::Pending && capture.batch.is_none() {
                    spooled += 1;
                    assert!(self.spool.contains_key(&capture.seq));
                }
            }
        }
        assert_eq!(spooled, self.spool.len());
    }

    pub fn restore(input: &mut dyn io::Read, rules: Arc<dyn RuleSet>) -> io::Result<Self> {
        let ledger = Ledger::read_snapshot(input)?;
        let history = HistoryStore::restore(input)?;
        Ok(Self::with_ledger(ledger, history, rules))
    }
}

impl StateMachine for PaymentsState {
    fn apply(&mut self, command: &spate_engine::Command<'_>, effects: &mut Effects<'_>) {
        let now_ms = command.envelope.timestamp_ms;
        let reply = match decode::<Command>(command.payload) {
            Ok(decoded) => {
                let mut events = Vec::new();
                let reply =
                    self.apply_command(decoded, now_ms, effects, &mut |event| events.push(event));
                for event in &events {
                    effects.emit(encode_in(event, &mut self.encoded));
                }
                reply
            }
            Err(error) => Reply::Refused(Refusal::Malformed(format!(
                "undecodable payments command: {error}"
            ))),
        };
        encode_into(&reply, effects.reply());
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        self.ledger.write_snapshot(out)?;
        self.history.write_snapshot(out)
    }

    /// The book is encoded now; the batches' captures, the payments and the card histories follow in
    /// steps.
    fn begin_snapshot(&mut self) -> bool {
        let (start, batches) = self.ledger.begin_snapshot();
        self.snapshot_start = Some(start);
        self.snapshot_batches = Some(batches);
        self.history.begin_snapshot();
        true
    }

    fn write_snapshot_step(
        &mut self,
        out: &mut dyn io::Write,
        bytes_budget: usize,
    ) -> io::Result<bool> {
        if let Some(start) = self.snapshot_start.take() {
            out.write_all(&start)?;
        }
        if let Some(cursor) = &mut self.snapshot_batches {
            if self.ledger.batches_step(cursor, out, bytes_budget)? {
                self.snapshot_batches = None;
            }
            return Ok(false);
        }
        if self.ledger.payments.snapshot_in_progress() {
            self.ledger.payments.snapshot_step(out, bytes_budget)?;
            return Ok(false);
        }
        self.history.snapshot_step(out, bytes_budget)
    }

    fn read(&self, query: &[u8], archive: &spate_engine::ArchiveReader<'_>) -> Vec<u8> {
        match decode::<PartitionQuery>(query) {
            Ok(PartitionQuery::Batches) => encode(&Batches {
                open: self.open_batches(),
                last: self.last_batch(),
            }),
            Ok(PartitionQuery::Details {
                batch,
                offset,
                limit,
            }) => {
                let details = self.batch_details(
                    batch,
                    usize::try_from(offset).unwrap_or(usize::MAX),
                    usize::try_from(limit).unwrap_or(usize::MAX),
                    |key| archive.get(key),
                );
                match details {
                    Ok((details, total)) => encode(&Details {
                        details,
                        total: total as u64,
                    }),
                    Err(error) => {
                        // An empty answer: the settler reports the batch unreadable.
                        tracing::error!(%error, batch, "settlement details unreadable");
                        Vec::new()
                    }
                }
            }
            Ok(PartitionQuery::Payments(ids)) => {
                let found: Result<Vec<Option<Payment>>, _> = (ids.iter())
                    .map(|id| self.find_payment(id, |key| archive.get(key)))
                    .collect();
                match found {
                    Ok(payments) => encode(&payments),
                    Err(error) => {
                        // An empty answer: the caller reports the payments unreadable.
                        tracing::error!(%error, "payments by id: the archive failed");
                        Vec::new()
                    }
                }
            }
            Ok(PartitionQuery::Spooled) => encode(&(self.spooled() as u64)),
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
