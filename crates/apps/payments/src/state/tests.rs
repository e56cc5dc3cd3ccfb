use super::*;
use crate::command::{Scoring, StoredCard, Tax};
use crate::keys::SealedCard;
use proptest::prelude::*;
use spate_cards::rules::CaseStudyRules;
use std::collections::HashMap;

const HOUR_MS: u64 = 3_600_000;
/// 2026-11-22T00:00:00Z
const START_MS: u64 = 1_795_305_600_000;

/// A state that keeps final payments in memory: the rules, apart from the archive.
fn state() -> PaymentsState {
    PaymentsState {
        archives_final: false,
        ..archiving_state()
    }
}

/// A state as the engine runs it, moving final payments to the archive.
fn archiving_state() -> PaymentsState {
    PaymentsState::new(Arc::new(CaseStudyRules), 32)
}

/// A partition's archive in memory, with the engine's rules: a key is archived once, and a command
/// finds only what earlier commands archived. The engine's archive is tested in the engine.
#[derive(Debug, Default)]
struct MemoryArchive {
    stored: HashMap<Vec<u8>, Vec<u8>>,
    this_command: Vec<(Vec<u8>, Vec<u8>)>,
}

impl PaymentsArchive for MemoryArchive {
    fn put(&mut self, key: &[u8], value: &[u8]) {
        assert!(
            !self.stored.contains_key(key) && self.this_command.iter().all(|(k, _)| k != key),
            "{key:?} archived twice"
        );
        self.this_command.push((key.to_vec(), value.to_vec()));
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.stored.get(key).cloned()
    }
}

impl MemoryArchive {
    fn get_stored(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ()> {
        Ok(self.stored.get(key).cloned())
    }

    fn run(&mut self, state: &mut PaymentsState, command: Command, now_ms: u64) -> Reply {
        let reply = state.apply_command(command, now_ms, self, &mut |_| {});
        self.stored.extend(self.this_command.drain(..));
        state.check();
        reply
    }
}

fn id(n: u8) -> PaymentId {
    PaymentId::new([n; 8], [n; 12])
}

fn authorize(n: u8, amount: u64) -> Command {
    Command::Authorize(Box::new(Authorize {
        payment: id(n),
        merchant: format!("m{}", n % 3),
        amount,
        currency: "usd".to_string(),
        currency_numeric: 840,
        card: StoredCard {
            token: [n; 16],
            masked: "424242******4242".to_string(),
            sealed: SealedCard {
                key_id: 1,
                bytes: vec![n; 40],
            },
            exp_month: 12,
            exp_year: 2030,
        },
        cvc_matches: true,
        tax: Tax {
            category: "general".to_string(),
            jurisdiction: "US-CA".to_string(),
            rate_ppm: 72_500,
            amount: 0,
        },
        capture_window_ms: 24 * HOUR_MS,
        // Scoring off: these tests are about the payment rules; `fraud_rules_decline` covers scoring.
        scoring: Scoring {
            enabled: false,
            decline: true,
            mcc: 5311,
            country: 840,
            city: 94107,
        },
        metadata: Vec::new(),
        capture_now: false,
    }))
}

/// `authorize(n, amount)` with `change` made to it.
fn authorize_with(n: u8, amount: u64, change: impl FnOnce(&mut Authorize)) -> Command {
    let mut command = authorize(n, amount);
    let Command::Authorize(a) = &mut command else {
        unreachable!("authorize makes an Authorize")
    };
    change(a);
    command
}

fn capture(n: u8, amount: Option<u64>, final_capture: bool) -> Command {
    Command::Capture {
        payment: id(n),
        amount,
        final_capture,
    }
}

/// A payment as an authorization leaves it, for the tests of other modules.
pub(super) fn authorized_payment() -> Payment {
    let mut s = state();
    run(&mut s, authorize(1, 1000), START_MS);
    s.payment(&id(1)).expect("authorized").clone()
}

fn run(state: &mut PaymentsState, command: Command, now_ms: u64) -> Reply {
    let reply = state.apply_command(command, now_ms, &mut MemoryArchive::default(), &mut |_| {});
    state.check();
    reply
}

/// The archive of a state that keeps everything in memory.
fn no_archive(_: &[u8]) -> Result<Option<Vec<u8>>, ()> {
    Ok(None)
}

fn payment(reply: Reply) -> Payment {
    match reply {
        Reply::Payment(p) => *p,
        other => panic!("expected a payment, got {other:?}"),
    }
}

/// Found by the fuzz target `app_command`: an authorization with a field out of the bounds the edge
/// enforces failed an assertion inside apply. It is refused before it changes anything.
#[test]
fn an_authorization_out_of_bounds_is_refused_and_changes_nothing() {
    let mut s = state();
    let mut command = authorize(1, 1000);
    if let Command::Authorize(a) = &mut command {
        a.scoring.city = 1_000_000;
    }
    let reply = run(&mut s, command, START_MS);
    assert!(
        matches!(&reply, Reply::Refused(Refusal::Malformed(m)) if m.contains("out of bounds")),
        "{reply:?}"
    );
    assert_eq!(s.ledger.authorizations, 0);
    assert_eq!(
        payment(run(&mut s, authorize(1, 1000), START_MS + 1)).status,
        Status::Authorized,
        "the refused one left no trace"
    );
}

#[test]
fn partial_captures_then_final_capture_close_the_authorization() {
    let mut s = state();
    let t = START_MS;
    assert_eq!(
        payment(run(&mut s, authorize(1, 1000), t)).status,
        Status::Authorized
    );
    let capture = |amount, final_capture| Command::Capture {
        payment: id(1),
        amount: Some(amount),
        final_capture,
    };
    let p = payment(run(&mut s, capture(300, false), t + 1));
    assert_eq!((p.amount_capturable, p.amount_captured()), (700, 300));
    assert_eq!(
        run(&mut s, capture(701, false), t + 2),
        Reply::Refused(Refusal::ExceedsCapturable { capturable: 700 })
    );
    let p = payment(run(&mut s, capture(200, true), t + 3));
    assert_eq!(
        (p.status, p.amount_capturable, p.amount_captured()),
        (Status::Captured, 0, 500)
    );
    assert!(matches!(
        run(&mut s, capture(1, false), t + 4),
        Reply::Refused(Refusal::WrongStatus {
            status: Status::Captured,
            ..
        })
    ));
    assert_eq!(s.spooled(), 2);
}

/// Found by reading the code while describing the API: a capture's place in its payment was kept as a
/// `u16`, with no bound on captures, so the 65,537th would have pointed at the first and settled it
/// twice. A payment takes at most `CAPTURES_PER_PAYMENT_MAX`; the next is refused and changes nothing.
#[test]
fn a_payment_takes_a_bounded_number_of_captures() {
    let mut s = state();
    let t = START_MS;
    let amount = CAPTURES_PER_PAYMENT_MAX as u64 + 10;
    run(&mut s, authorize(1, amount), t);
    for n in 0..CAPTURES_PER_PAYMENT_MAX as u64 {
        payment(run(&mut s, capture(1, Some(1), false), t + 1 + n));
    }
    let reply = run(&mut s, capture(1, Some(1), false), t + 2_000);
    assert_eq!(
        reply,
        Reply::Refused(Refusal::TooManyCaptures {
            captures_max: CAPTURES_PER_PAYMENT_MAX as u32
        })
    );
    let p = s.payment(&id(1)).expect("still live").clone();
    assert_eq!((p.status, p.amount_capturable), (Status::Authorized, 10));
    assert_eq!(s.spooled(), CAPTURES_PER_PAYMENT_MAX);
}

#[test]
fn automatic_capture_spools_the_whole_amount_with_the_authorization() {
    let mut s = state();
    let command = authorize_with(1, 1000, |a| a.capture_now = true);
    let mut events = Vec::new();
    let reply = s.apply_command(command, START_MS, &mut MemoryArchive::default(), &mut |e| {
        events.push(e)
    });
    s.check();
    let p = payment(reply);
    assert_eq!(
        (p.status, p.amount_captured(), p.amount_capturable),
        (Status::Captured, 1000, 0)
    );
    assert_eq!((events.len(), s.spooled()), (2, 1));
}

#[test]
fn refunds_need_settled_captures_and_never_exceed_them() {
    let mut s = state();
    let t = START_MS;
    run(&mut s, authorize(1, 1000), t);
    run(&mut s, capture(1, Some(600), true), t);
    let refund = |amount| Command::Refund {
        payment: id(1),
        amount: Some(amount),
    };
    assert_eq!(
        run(&mut s, refund(1), t + 1),
        Reply::Refused(Refusal::ExceedsRefundable { refundable: 0 })
    );
    let batch = t + 10;
    let assign = Command::SettleAssign {
        batch,
        suspended: Vec::new(),
        limit: 10,
    };
    assert_eq!(
        run(&mut s, assign, batch),
        Reply::Assigned {
            assigned: 1,
            failed: 0,
            more: false
        }
    );
    assert_eq!((s.open_batches(), s.last_batch()), (vec![batch], batch));
    assert_eq!(
        run(&mut s, Command::Cancel { payment: id(1) }, batch),
        Reply::Refused(Refusal::SettlementInProgress)
    );
    let (details, total) = s.batch_details(batch, 0, 10, no_archive).unwrap();
    assert_eq!((details.len(), total, details[0].amount), (1, 1, 600));
    run(&mut s, Command::SettleConfirm { batch, limit: 10 }, batch);
    assert!(s.open_batches().is_empty());
    assert_eq!(
        payment(run(&mut s, refund(250), t + 20)).amount_refunded(),
        250
    );
    assert_eq!(
        run(&mut s, refund(351), t + 21),
        Reply::Refused(Refusal::ExceedsRefundable { refundable: 350 })
    );
    assert_eq!(
        payment(run(
            &mut s,
            Command::Refund {
                payment: id(1),
                amount: None
            },
            t + 22
        ))
        .amount_refunded(),
        600
    );
    assert_eq!(
        run(&mut s, Command::Cancel { payment: id(1) }, t + 23),
        Reply::Refused(Refusal::AlreadySettled)
    );
}

#[test]
fn cancel_voids_unsettled_captures_and_expiry_ends_the_rest() {
    let mut s = state();
    let t = START_MS;
    run(&mut s, authorize(1, 1000), t);
    run(&mut s, capture(1, Some(100), false), t);
    let p = payment(run(&mut s, Command::Cancel { payment: id(1) }, t + 1));
    assert_eq!(
        (p.status, p.amount_captured(), s.spooled()),
        (Status::Canceled, 0, 0)
    );
    assert_eq!(p.captures[0].status, CaptureStatus::Canceled);

    run(&mut s, authorize(2, 500), t);
    run(&mut s, authorize(3, 500), t);
    run(&mut s, capture(3, Some(100), false), t);
    assert_eq!(
        run(&mut s, Command::Tick, t + 24 * HOUR_MS - 1),
        Reply::Ticked { expired: 0 }
    );
    assert_eq!(
        run(&mut s, Command::Tick, t + 24 * HOUR_MS),
        Reply::Ticked { expired: 2 }
    );
    assert_eq!(s.payment(&id(2)).unwrap().status, Status::Expired);
    let partly = s.payment(&id(3)).unwrap();
    assert_eq!(
        (partly.status, partly.amount_capturable),
        (Status::Captured, 0)
    );
}

#[test]
fn a_capture_after_the_deadline_expires_the_payment_even_without_a_tick() {
    let mut s = state();
    run(&mut s, authorize(1, 1000), START_MS);
    let late = START_MS + 24 * HOUR_MS;
    let mut events = Vec::new();
    let reply = s.apply_command(
        capture(1, None, true),
        late,
        &mut MemoryArchive::default(),
        &mut |e| events.push(e),
    );
    assert!(matches!(
        reply,
        Reply::Refused(Refusal::WrongStatus {
            status: Status::Expired,
            ..
        })
    ));
    assert!(matches!(
        &events[..],
        [Event::Changed {
            kind: EventKind::Expired,
            ..
        }]
    ));
}

#[test]
fn suspended_merchants_fail_settlement_and_batches_page() {
    let mut s = state();
    let t = START_MS;
    for n in 0..6 {
        run(&mut s, authorize(n, 100), t);
        run(&mut s, capture(n, None, true), t);
    }
    let batch = t + 1;
    let assign = |limit| Command::SettleAssign {
        batch,
        suspended: vec!["m0".to_string()],
        limit,
    };
    // merchants m0, m1, m2, m0, m1, m2 in capture order
    assert_eq!(
        run(&mut s, assign(4), batch),
        Reply::Assigned {
            assigned: 2,
            failed: 2,
            more: true
        }
    );
    assert_eq!(
        run(&mut s, assign(4), batch),
        Reply::Assigned {
            assigned: 2,
            failed: 0,
            more: false
        }
    );
    assert_eq!(s.batch_details(batch, 1, 2, no_archive).unwrap().0.len(), 2);
    assert_eq!(s.batch_details(batch, 0, 100, no_archive).unwrap().1, 4);
    assert_eq!(
        run(&mut s, Command::SettleConfirm { batch, limit: 3 }, batch),
        Reply::Confirmed {
            confirmed: 3,
            more: true
        }
    );
    assert_eq!(
        run(&mut s, Command::SettleConfirm { batch, limit: 3 }, batch),
        Reply::Confirmed {
            confirmed: 1,
            more: false
        }
    );
    let failed = s.payment(&id(0)).unwrap();
    assert_eq!(
        (failed.captures[0].status, failed.amount_captured()),
        (CaptureStatus::Failed, 0)
    );
    // A capture made after the batch's cutoff waits for the next batch.
    run(&mut s, authorize(9, 100), batch + 5);
    run(&mut s, capture(9, None, true), batch + 5);
    assert_eq!(
        run(&mut s, assign(10), batch + 6),
        Reply::Assigned {
            assigned: 0,
            failed: 0,
            more: false
        }
    );
    assert_eq!(s.spooled(), 1);
}

/// Authorizes card `n` every 10 s with scoring on (each time a new payment) until a rule fires;
/// returns that payment.
fn until_a_rule_fires(s: &mut PaymentsState, n: u8, decline: bool) -> Payment {
    for attempt in 0..50u8 {
        let command = authorize_with(n, 1000, |a| {
            a.payment = PaymentId::new([n; 8], [attempt; 12]);
            a.scoring.enabled = true;
            a.scoring.decline = decline;
        });
        let p = payment(run(s, command, START_MS + u64::from(attempt) * 10_000));
        if p.fraud_rule != 0 {
            return p;
        }
        assert_eq!(p.status, Status::Authorized);
    }
    panic!("50 authorizations of one card in 8 minutes fired no rule");
}

#[test]
fn fraud_rules_decline_and_shadow_mode_only_records() {
    let mut s = state();
    // The case study's velocity rules fire on many transactions of one card in a short time.
    let declined = until_a_rule_fires(&mut s, 1, true);
    assert_eq!(declined.status, Status::Declined);
    assert_eq!(
        declined.decline_reason,
        Some(format!("fraud_rule_{}", declined.fraud_rule))
    );
    assert_eq!(declined.amount_capturable, 0);
    let shadow = until_a_rule_fires(&mut s, 2, false);
    assert_eq!(
        (shadow.status, shadow.decline_reason, shadow.fraud_rule),
        (Status::Authorized, None, declined.fraud_rule)
    );
}

#[test]
fn expired_cards_and_wrong_cvcs_are_declined() {
    let mut s = state();
    let expired = authorize_with(1, 1000, |a| {
        a.card.exp_year = 2026;
        a.card.exp_month = 10;
    });
    let p = payment(run(&mut s, expired, START_MS));
    assert_eq!(
        (p.status, p.decline_reason.as_deref()),
        (Status::Declined, Some("expired_card"))
    );
    let wrong_cvc = authorize_with(2, 1000, |a| a.cvc_matches = false);
    let p = payment(run(&mut s, wrong_cvc, START_MS));
    assert_eq!(p.decline_reason.as_deref(), Some("incorrect_cvc"));
    assert_eq!(p.amount_capturable, 0);
}

#[test]
fn snapshots_restore_the_same_state_and_indexes() {
    let mut s = state();
    run(&mut s, authorize(1, 1000), START_MS);
    run(&mut s, authorize(2, 1000), START_MS);
    run(&mut s, capture(1, Some(10), false), START_MS);
    let mut bytes = Vec::new();
    s.write_snapshot(&mut bytes).unwrap();
    bytes.extend_from_slice(b"next app");
    let mut input = &bytes[..];
    let restored = PaymentsState::restore(&mut input, Arc::new(CaseStudyRules)).unwrap();
    assert_eq!(input, b"next app");
    assert_eq!(restored.ledger, s.ledger);
    assert_eq!(restored.deadlines, s.deadlines);
    assert_eq!(restored.spool, s.spool);
}

#[test]
fn final_payments_leave_memory_and_are_still_found_refunded_and_settled() {
    let (mut s, mut archive) = (archiving_state(), MemoryArchive::default());
    let t = START_MS;
    let declined = authorize_with(2, 500, |a| a.card.exp_year = 2020);
    let p = payment(archive.run(&mut s, declined, t));
    assert_eq!(p.status, Status::Declined);
    assert!(s.payment(&id(2)).is_none(), "declined is final");
    assert_eq!(
        archive.run(&mut s, authorize(2, 500), t + 1),
        Reply::Refused(Refusal::Exists)
    );

    archive.run(&mut s, authorize(1, 1000), t);
    archive.run(&mut s, capture(1, Some(400), false), t);
    archive.run(&mut s, capture(1, Some(300), true), t);
    let batch = t + 10;
    let assign = Command::SettleAssign {
        batch,
        suspended: Vec::new(),
        limit: 10,
    };
    archive.run(&mut s, assign.clone(), batch);
    let details = |s: &PaymentsState, archive: &MemoryArchive| {
        s.batch_details(batch, 0, 10, |key| archive.get_stored(key))
            .unwrap()
    };
    let before_close = details(&s, &archive);
    assert_eq!(before_close.1, 2);
    let confirm = Command::SettleConfirm { batch, limit: 1 };
    assert_eq!(
        archive.run(&mut s, confirm.clone(), batch),
        Reply::Confirmed {
            confirmed: 1,
            more: true
        }
    );
    assert!(s.payment(&id(1)).is_some(), "a capture still pending");
    archive.run(&mut s, confirm, batch);
    assert!(s.payment(&id(1)).is_none(), "settled is final");
    assert!(
        s.ledger.batches[&batch].captures.is_empty(),
        "closed: archived"
    );
    assert_eq!(details(&s, &archive), before_close);
    // An archive that lost what the batch names: an error, not a panic of the partition thread.
    let mut lost = archive.stored.clone();
    lost.retain(|key, _| key.as_slice() == &batch_key(batch)[..]);
    let from_lost = |key: &[u8]| Ok::<_, ()>(lost.get(key).cloned());
    assert_eq!(
        s.batch_details(batch, 0, 10, from_lost),
        Err(DetailsError::PaymentMissing {
            batch,
            payment: id(1)
        })
    );
    assert!(matches!(
        archive.run(&mut s, assign, batch),
        Reply::Refused(Refusal::Malformed(_))
    ));

    assert!(matches!(
        archive.run(&mut s, capture(1, Some(1), false), t + 20),
        Reply::Refused(Refusal::WrongStatus {
            status: Status::Captured,
            ..
        })
    ));
    let refund = |amount| Command::Refund {
        payment: id(1),
        amount: Some(amount),
    };
    for (revision, refunded) in [(1, 100), (2, 150), (3, 175)] {
        let amount = refunded - [0, 100, 150][revision as usize - 1];
        let p = payment(archive.run(&mut s, refund(amount), t + 20));
        assert_eq!(p.amount_refunded(), refunded);
        assert!(s.payment(&id(1)).is_none(), "a refund leaves it final");
        assert!(
            archive
                .stored
                .contains_key(&payment_key(&id(1), revision)[..])
        );
    }
    assert_eq!(
        archive.run(&mut s, refund(526), t + 21),
        Reply::Refused(Refusal::ExceedsRefundable { refundable: 525 })
    );
    assert!(!archive.stored.contains_key(&payment_key(&id(1), 4)[..]));
    let found = s.find_payment(&id(1), |key| archive.get_stored(key));
    assert_eq!(found.unwrap().map(|p| p.amount_refunded()), Some(175));
}

/// A batch that closes (its captures leaving for the archive) while a snapshot's steps write it is
/// written as it was when the snapshot began.
#[test]
fn a_batch_that_closes_between_snapshot_steps_is_written_as_it_began() {
    let (mut s, mut archive) = (archiving_state(), MemoryArchive::default());
    for n in 0..50 {
        archive.run(&mut s, authorize(n, 100), START_MS);
        archive.run(&mut s, capture(n, None, true), START_MS);
    }
    let batch = START_MS + 1;
    let assign = Command::SettleAssign {
        batch,
        suspended: Vec::new(),
        limit: 100,
    };
    archive.run(&mut s, assign, batch);
    let mut at_start = Vec::new();
    s.write_snapshot(&mut at_start).unwrap();

    assert!(s.begin_snapshot());
    let mut bytes = Vec::new();
    assert!(!s.write_snapshot_step(&mut bytes, 100).unwrap());
    let confirm = Command::SettleConfirm { batch, limit: 100 };
    archive.run(&mut s, confirm, batch);
    assert!(s.ledger.batches[&batch].captures.is_empty(), "closed");
    while !s.write_snapshot_step(&mut bytes, 100).unwrap() {}

    let restore = |bytes: &[u8]| PaymentsState::restore(&mut &bytes[..], Arc::new(CaseStudyRules));
    let restored = restore(&bytes).unwrap();
    assert_eq!(restored.ledger, restore(&at_start).unwrap().ledger);
    assert_eq!(restored.ledger.batches[&batch].captures.len(), 50);
}

/// A command that finds its payment's deadline passed expires it first; if that makes it final, it
/// leaves memory when the command ends.
#[test]
fn a_late_capture_expires_and_archives_the_payment_it_finds() {
    let (mut s, mut archive) = (archiving_state(), MemoryArchive::default());
    archive.run(&mut s, authorize(1, 1000), START_MS);
    let late = START_MS + 25 * HOUR_MS;
    assert!(matches!(
        archive.run(&mut s, capture(1, None, true), late),
        Reply::Refused(Refusal::WrongStatus {
            status: Status::Expired,
            ..
        })
    ));
    assert!(s.payment(&id(1)).is_none(), "expired is final");
    let found = s.find_payment(&id(1), |key| archive.get_stored(key));
    assert_eq!(found.unwrap().map(|p| p.status), Some(Status::Expired));
}

#[derive(Debug, Clone)]
enum Op {
    Authorize(u8, u64),
    Capture(u8, Option<u64>, bool),
    Cancel(u8),
    Refund(u8, Option<u64>),
    Wait(u64),
    /// Time passes without a tick: a command may be the first to find a deadline passed.
    Pass(u64),
    Assign(u32),
    Confirm(u32),
    /// A step of a snapshot in steps (the first one begins it), with this budget in bytes.
    SnapshotStep(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let n = 0..8u8;
    prop_oneof![
        (n.clone(), 1..2_000u64).prop_map(|(n, a)| Op::Authorize(n, a)),
        (n.clone(), proptest::option::of(1..1_500u64), any::<bool>())
            .prop_map(|(n, a, f)| Op::Capture(n, a, f)),
        n.clone().prop_map(Op::Cancel),
        (n, proptest::option::of(1..1_500u64)).prop_map(|(n, a)| Op::Refund(n, a)),
        (0..12 * HOUR_MS).prop_map(Op::Wait),
        (0..12 * HOUR_MS).prop_map(Op::Pass),
        (1..5u32).prop_map(Op::Assign),
        (1..5u32).prop_map(Op::Confirm),
        (1..600usize).prop_map(Op::SnapshotStep),
    ]
}

proptest! {
    /// Random interleavings keep every invariant (`check` runs after each step); nothing is captured
    /// after cancel, final capture or expiry; a state that archives final payments answers every
    /// command and read as one that keeps them all; and a snapshot in steps restores the state as it
    /// was when the snapshot began.
    #[test]
    fn invariants_hold_under_random_operations(ops in proptest::collection::vec(op(), 1..120)) {
        let (mut s, mut archive) = (archiving_state(), MemoryArchive::default());
        let mut kept = state();
        let mut now = START_MS;
        let mut batch = None;
        let mut closed = HashMap::new();
        // The snapshot in steps being written: its bytes so far, and the state as it was at its start.
        let mut snapshot: Option<(Vec<u8>, PaymentsState)> = None;
        let whole = |s: &PaymentsState| {
            let mut bytes = Vec::new();
            s.write_snapshot(&mut bytes).unwrap();
            PaymentsState::restore(&mut &bytes[..], Arc::new(CaseStudyRules)).unwrap()
        };
        for op in ops {
            now += 1;
            if let Op::Pass(ms) = op {
                now += ms;
                continue;
            }
            if let Op::SnapshotStep(budget) = op {
                let (mut bytes, at_start) = match snapshot.take() {
                    Some(started) => started,
                    None => {
                        let at_start = whole(&s);
                        prop_assert!(s.begin_snapshot());
                        (Vec::new(), at_start)
                    }
                };
                if s.write_snapshot_step(&mut bytes, budget).unwrap() {
                    let restored = PaymentsState::restore(&mut &bytes[..], Arc::new(CaseStudyRules)).unwrap();
                    prop_assert_eq!(&restored.ledger, &at_start.ledger);
                    prop_assert_eq!(&restored.spool, &at_start.spool);
                    prop_assert_eq!(&restored.deadlines, &at_start.deadlines);
                } else {
                    snapshot = Some((bytes, at_start));
                }
                continue;
            }
            let command = match op {
                Op::Authorize(n, amount) => authorize(n, amount),
                Op::Capture(n, amount, final_capture) => Command::Capture { payment: id(n), amount, final_capture },
                Op::Cancel(n) => Command::Cancel { payment: id(n) },
                Op::Refund(n, amount) => Command::Refund { payment: id(n), amount },
                Op::Wait(ms) => { now += ms; Command::Tick }
                Op::Assign(limit) => {
                    let id = *batch.get_or_insert(now);
                    Command::SettleAssign { batch: id, suspended: vec!["m2".to_string()], limit }
                }
                Op::Confirm(limit) => match batch {
                    Some(id) => Command::SettleConfirm { batch: id, limit },
                    None => Command::Tick,
                },
                Op::SnapshotStep(_) | Op::Pass(_) => unreachable!("handled above"),
            };
            let was_capture = matches!(command, Command::Capture { .. });
            let target = match &command {
                Command::Capture { payment, .. } => Some(*payment),
                _ => None,
            };
            let reply = archive.run(&mut s, command.clone(), now);
            prop_assert_eq!(&reply, &run(&mut kept, command, now));
            if let Reply::Confirmed { more: false, .. } = reply {
                batch = None;
            }
            if was_capture {
                let id = target.expect("a capture names its payment");
                if closed.get(&id).copied().unwrap_or(false) {
                    prop_assert!(matches!(reply, Reply::Refused(_)), "captured after close: {reply:?}");
                }
            }
            for (id, payment) in kept.ledger.payments.iter() {
                let is_closed = payment.status != Status::Authorized;
                prop_assert!(!closed.get(id).copied().unwrap_or(false) || is_closed, "{id} reopened");
                closed.insert(*id, is_closed);
                let found = s.find_payment(id, |key| archive.get_stored(key)).unwrap();
                prop_assert_eq!(found.as_ref(), Some(&**payment));
            }
            for (id, _) in s.ledger.payments.iter() {
                prop_assert!(kept.ledger.payments.contains_key(id), "{id} in memory only where archived");
            }
            prop_assert_eq!((s.open_batches(), s.last_batch()), (kept.open_batches(), kept.last_batch()));
            for &batch in kept.ledger.batches.keys() {
                prop_assert_eq!(
                    s.batch_details(batch, 0, usize::MAX, |key| archive.get_stored(key)),
                    kept.batch_details(batch, 0, usize::MAX, no_archive)
                );
            }
        }
        if let Some((mut bytes, at_start)) = snapshot {
            while !s.write_snapshot_step(&mut bytes, 1 << 20).unwrap() {}
            let restored = PaymentsState::restore(&mut &bytes[..], Arc::new(CaseStudyRules)).unwrap();
            prop_assert_eq!(&restored.ledger, &at_start.ledger);
        }
        let restored = whole(&s);
        prop_assert_eq!(&restored.ledger, &s.ledger);
        prop_assert_eq!(&restored.spool, &s.spool);
    }
}
