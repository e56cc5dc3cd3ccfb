//! The ledger's invariants under random interleavings: several partitions, follow-ups grouped per
//! destination as the app sends them and delivered in a random order across pairs of partitions (in
//! order within a pair, as the engine guarantees), with prepares, fulfils, rejects (alone or in client
//! batches), ticks, cap changes, snapshot steps and the clock moving on in between.

use crate::domain::{
    AbortReason, Amount, Command, Context, Entry, EntryLog, ErrorCode, Event, LedgerArchive,
    LedgerPartition, Output, Owner, Reply, Transfer, TransferId, TransferSpec, TransferState,
    group_follow_ups,
};
use proptest::prelude::*;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

const PARTITIONS: usize = 3;
const PARTICIPANTS: [&str; 4] = ["dfsp0", "dfsp1", "dfsp2", "dfsp3"];

fn partition_of(owner: &Owner) -> usize {
    let key = match owner {
        Owner::Transfer(id) => *id as usize,
        Owner::Participant(name) => name.bytes().map(usize::from).sum::<usize>() * 7,
    };
    key % PARTITIONS
}

fn fulfilment_of(n: usize) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&(n as u64).to_le_bytes());
    bytes[31] = 0xA5;
    bytes
}

#[derive(Debug, Clone)]
enum Op {
    Prepare {
        payer: usize,
        payee: usize,
        amount: Amount,
        expires_in_ms: u64,
        /// Sent as the server does once its read model has seen the payee (every payee here exists).
        payee_known: bool,
    },
    Fulfil {
        transfer: usize,
        right_fulfilment: bool,
        by_payee: bool,
    },
    Reject {
        transfer: usize,
    },
    Tick,
    Advance {
        ms: u64,
    },
    Deliver {
        pick: usize,
    },
    SetNdc {
        participant: usize,
        ndc: Amount,
    },
    /// Prepares, fulfils and rejects sent as one client batch, a `Batch` command per partition.
    Batch(Vec<Op>),
    /// Begins a snapshot of a partition, or writes its next step of about `budget` bytes.
    SnapshotStep {
        partition: usize,
        budget: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let single = single_op();
    prop_oneof![
        20 => single_op(),
        2 => prop::collection::vec(single, 1..12).prop_map(Op::Batch),
    ]
}

fn single_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4usize, 0..4usize, 1..400i128, 1..300u64, any::<bool>()).prop_map(|(payer, payee, amount, expires_in_ms, payee_known)| Op::Prepare { payer, payee, amount, expires_in_ms, payee_known }),
        3 => (0..64usize, prop::bool::weighted(0.9), prop::bool::weighted(0.9)).prop_map(|(transfer, right_fulfilment, by_payee)| Op::Fulfil { transfer, right_fulfilment, by_payee }),
        1 => (0..64usize).prop_map(|transfer| Op::Reject { transfer }),
        1 => Just(Op::Tick),
        2 => (1..100u64).prop_map(|ms| Op::Advance { ms }),
        8 => any::<usize>().prop_map(|pick| Op::Deliver { pick }),
        1 => (0..4usize, 0..3000i128).prop_map(|(participant, ndc)| Op::SetNdc { participant, ndc }),
        3 => (0..PARTITIONS, 1..3000usize).prop_map(|(partition, budget)| Op::SnapshotStep { partition, budget }),
    ]
}

/// A partition's archive, in memory: the engine's is tested in the engine.
#[derive(Default)]
struct Archive {
    transfers: HashMap<TransferId, Transfer>,
    entries: HashMap<(String, u64), Vec<Entry>>,
}

impl LedgerArchive for Archive {
    fn put_transfer(&mut self, transfer: &Transfer) {
        assert!(
            transfer.state.is_final(),
            "only final transfers are archived"
        );
        let earlier = self.transfers.insert(transfer.spec.id, transfer.clone());
        assert!(earlier.is_none(), "a transfer is archived once");
    }

    fn transfer(&self, id: TransferId) -> Option<Transfer> {
        self.transfers.get(&id).cloned()
    }

    fn put_entries(&mut self, participant: &str, chunk: u64, entries: &[Entry]) {
        assert_eq!(
            entries.len(),
            EntryLog::CHUNK_ENTRIES,
            "only full chunks leave"
        );
        let earlier = (self.entries).insert((participant.into(), chunk), entries.to_vec());
        assert!(earlier.is_none(), "a chunk is archived once");
    }
}

impl Archive {
    /// `participant`'s whole entry log, archived chunks included.
    fn entries(&self, participant: &str, log: &EntryLog) -> Vec<Entry> {
        let chunk = |index| -> Result<Vec<Entry>, ()> {
            Ok(self.entries[&(participant.to_string(), index)].clone())
        };
        log.page(0, usize::MAX, chunk).unwrap()
    }
}

/// A snapshot of a partition being written in steps, and what it must read back as.
struct SnapshotCheck {
    written: Vec<u8>,
    first_step_due: bool,
    /// The partition written whole when the snapshot began.
    expected: Vec<u8>,
    expected_expiries: BTreeSet<(u64, TransferId)>,
}

struct Sim {
    partitions: Vec<LedgerPartition>,
    archives: Vec<Archive>,
    snapshots: Vec<Option<SnapshotCheck>>,
    /// Follow-ups in flight, in order per (source, destination).
    lanes: BTreeMap<(usize, usize), VecDeque<Command>>,
    now_ms: u64,
    /// Every state each transfer went through, in order.
    history: HashMap<TransferId, Vec<TransferState>>,
    prepared: Vec<TransferSpec>,
    /// Prepares attempted so far: the next transfer's number, which gives its id and fulfilment.
    attempts: usize,
}

/// The fulfilment of the transfer with this id.
fn fulfilment_for(id: TransferId) -> [u8; 32] {
    fulfilment_of((id - 0x1000) as usize)
}

impl Sim {
    fn new(ndcs: &[Amount]) -> Self {
        let mut sim = Self {
            partitions: (0..PARTITIONS)
                .map(|_| LedgerPartition::default())
                .collect(),
            archives: (0..PARTITIONS).map(|_| Archive::default()).collect(),
            snapshots: (0..PARTITIONS).map(|_| None).collect(),
            lanes: BTreeMap::new(),
            now_ms: 1_000,
            history: HashMap::new(),
            prepared: Vec::new(),
            attempts: 0,
        };
        for (name, ndc) in PARTICIPANTS.iter().zip(ndcs) {
            let create = Command::CreateParticipant {
                name: (*name).into(),
                currency: "USD".into(),
                ndc: *ndc,
            };
            let reply = sim.apply(&Owner::Participant((*name).into()), create);
            assert_eq!(reply, Reply::Participant((*name).into()));
        }
        sim
    }

    /// Applies `command` on partition `at` as the engine would: at the current time, with the owners
    /// that partition holds.
    fn apply_at(&mut self, at: usize, command: Command) -> Output {
        let here = |owner: &Owner| partition_of(owner) == at;
        let mut context = Context {
            now_ms: self.now_ms,
            here: &here,
            archive: &mut self.archives[at],
        };
        self.partitions[at].apply(command, &mut context)
    }

    fn apply(&mut self, owner: &Owner, command: Command) -> Reply {
        let at = partition_of(owner);
        let out = self.apply_at(at, command);
        self.record(at, out)
    }

    /// Notes the transfers' state changes and queues the follow-ups, grouped as the app sends them.
    fn record(&mut self, at: usize, out: Output) -> Reply {
        for event in &out.events {
            if let Event::TransferChanged { id, state } = event {
                self.history.entry(*id).or_default().push(*state);
            }
        }
        for (to, follow_up) in group_follow_ups(out.follow_ups, partition_of) {
            self.lanes
                .entry((at, partition_of(&to)))
                .or_default()
                .push_back(follow_up);
        }
        out.reply.expect("every command is answered")
    }

    fn deliver(&mut self, pick: usize) -> bool {
        let busy: Vec<(usize, usize)> = self
            .lanes
            .iter()
            .filter(|(_, queue)| !queue.is_empty())
            .map(|(lane, _)| *lane)
            .collect();
        if busy.is_empty() {
            return false;
        }
        let lane = busy[pick % busy.len()];
        let command = self.lanes.get_mut(&lane).unwrap().pop_front().unwrap();
        let out = self.apply_at(lane.1, command);
        match self.record(lane.1, out) {
            Reply::Done => {}
            Reply::Batch(replies) => assert!(replies.iter().all(|r| *r == Reply::Done)),
            other => panic!("follow-ups answer nobody, got {other:?}"),
        }
        true
    }

    /// The command a client operation sends, and the transfer it prepares, if it is a prepare.
    fn client_command(&mut self, op: &Op) -> Option<(Owner, Command, Option<TransferSpec>)> {
        match *op {
            Op::Prepare {
                payer,
                payee,
                amount,
                expires_in_ms,
                payee_known,
            } => {
                let n = self.attempts;
                self.attempts += 1;
                let spec = TransferSpec {
                    id: 0x1000 + n as u128,
                    payer: PARTICIPANTS[payer].into(),
                    payee: PARTICIPANTS[payee].into(),
                    currency: "USD".into(),
                    amount,
                    condition: Sha256::digest(fulfilment_of(n)).into(),
                    expiration_ms: self.now_ms + expires_in_ms,
                    content_hash: n as u64,
                };
                let owner = Owner::Transfer(spec.id);
                let command = if payee_known {
                    Command::PrepareKnownPayee(spec.clone())
                } else {
                    Command::Prepare(spec.clone())
                };
                Some((owner, command, Some(spec)))
            }
            Op::Fulfil {
                transfer,
                right_fulfilment,
                by_payee,
            } => {
                let spec = self.prepared.get(transfer % self.prepared.len().max(1))?;
                let mut fulfilment = fulfilment_for(spec.id);
                if !right_fulfilment {
                    fulfilment[0] ^= 1;
                }
                let source = if by_payee { &spec.payee } else { &spec.payer };
                let command = Command::Fulfil {
                    id: spec.id,
                    source: source.clone(),
                    fulfilment,
                };
                Some((Owner::Transfer(spec.id), command, None))
            }
            Op::Reject { transfer } => {
                let spec = self.prepared.get(transfer % self.prepared.len().max(1))?;
                let command = Command::Reject {
                    id: spec.id,
                    source: spec.payee.clone(),
                };
                Some((Owner::Transfer(spec.id), command, None))
            }
            _ => None,
        }
    }

    /// A client batch: each partition gets its share as one `Batch`, answered item by item.
    fn run_batch(&mut self, ops: &[Op]) {
        let mut shares: BTreeMap<usize, Vec<(Command, Option<TransferSpec>)>> = BTreeMap::new();
        for op in ops {
            if let Some((owner, command, spec)) = self.client_command(op) {
                shares
                    .entry(partition_of(&owner))
                    .or_default()
                    .push((command, spec));
            }
        }
        for (at, share) in shares {
            let (commands, specs): (Vec<_>, Vec<_>) = share.into_iter().unzip();
            let out = self.apply_at(at, Command::Batch(commands));
            let Reply::Batch(replies) = self.record(at, out) else {
                panic!("a batch is answered with a batch");
            };
            assert_eq!(replies.len(), specs.len(), "one reply per command");
            for (spec, reply) in specs.into_iter().zip(replies) {
                if let Some(spec) = spec
                    && matches!(reply, Reply::Transfer(id, _) if id == spec.id)
                {
                    self.prepared.push(spec);
                }
            }
        }
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Prepare {
                payer,
                payee,
                payee_known,
                ..
            } => {
                let (owner, command, spec) = self.client_command(op).expect("a prepare");
                let spec = spec.expect("a prepare prepares");
                let reply = self.apply(&owner, command);
                if payer == payee {
                    assert!(matches!(reply, Reply::Refused(r) if r.code == ErrorCode::Validation));
                } else {
                    // Taken at once when the payee is known and the payer is on the transfer's
                    // partition; otherwise the reservation is on its way.
                    let payer_here = partition_of(&Owner::Participant(spec.payer.clone()))
                        == partition_of(&owner);
                    let refused =
                        TransferState::Aborted(AbortReason::Refused(ErrorCode::PayerLiquidity));
                    match reply {
                        Reply::Transfer(id, state) if payee_known && payer_here => {
                            assert_eq!(id, spec.id);
                            assert!(
                                state == TransferState::Reserved || state == refused,
                                "{state:?}"
                            );
                            assert_eq!(self.state_of(id), state);
                        }
                        reply => {
                            assert_eq!(reply, Reply::Transfer(spec.id, TransferState::Received))
                        }
                    }
                    // A resent prepare answers the current state; a modified one is refused.
                    let again = self.apply(&owner, Command::Prepare(spec.clone()));
                    assert!(matches!(again, Reply::Transfer(id, _) if id == spec.id));
                    let mut modified = spec.clone();
                    modified.content_hash ^= 1;
                    let refused = self.apply(&owner, Command::Prepare(modified));
                    assert!(
                        matches!(refused, Reply::Refused(r) if r.code == ErrorCode::ModifiedRequest)
                    );
                    self.prepared.push(spec);
                }
            }
            Op::Fulfil {
                right_fulfilment,
                by_payee,
                ..
            } => {
                let Some((owner, command, _)) = self.client_command(op) else {
                    return;
                };
                let Owner::Transfer(id) = owner else {
                    unreachable!("a fulfil is sent to its transfer")
                };
                let spec = self.prepared.iter().find(|s| s.id == id).unwrap().clone();
                let before = self.state_of(id);
                let reply = self.apply(&owner, command);
                let committed = reply == Reply::Transfer(id, TransferState::Committed);
                if committed && before != TransferState::Committed {
                    assert!(before == TransferState::Reserved && right_fulfilment && by_payee);
                    assert!(spec.expiration_ms > self.now_ms);
                }
            }
            Op::Reject { .. } => {
                if let Some((owner, command, _)) = self.client_command(op) {
                    self.apply(&owner, command);
                }
            }
            Op::Batch(ref ops) => self.run_batch(ops),
            Op::Tick => {
                for partition in 0..PARTITIONS {
                    let out = self.apply_at(partition, Command::Tick);
                    self.record(partition, out);
                }
            }
            Op::Advance { ms } => self.now_ms += ms,
            Op::Deliver { pick } => {
                self.deliver(pick);
            }
            Op::SetNdc { participant, ndc } => {
                let name: crate::domain::Name = PARTICIPANTS[participant].into();
                self.apply(
                    &Owner::Participant(name.clone()),
                    Command::SetNdc { name, ndc },
                );
            }
            Op::SnapshotStep { partition, budget } => self.snapshot_step(partition, budget),
        }
    }

    /// Begins a snapshot of partition `at`, or writes its next step. A finished snapshot must read
    /// back as the partition was when it began, whatever apply did between the steps.
    fn snapshot_step(&mut self, at: usize, budget: usize) {
        let partition = &mut self.partitions[at];
        let Some(check) = &mut self.snapshots[at] else {
            let mut expected = Vec::new();
            partition.write_snapshot(&mut expected).unwrap();
            partition.begin_snapshot();
            self.snapshots[at] = Some(SnapshotCheck {
                written: Vec::new(),
                first_step_due: true,
                expected,
                expected_expiries: partition.expiries.clone(),
            });
            return;
        };
        let first = std::mem::take(&mut check.first_step_due);
        if !(partition.snapshot_step(&mut check.written, budget, first)).unwrap() {
            return;
        }
        let check = self.snapshots[at].take().expect("in progress");
        let restored = LedgerPartition::read_snapshot(&mut check.written.as_slice()).unwrap();
        let mut rewritten = Vec::new();
        restored.write_snapshot(&mut rewritten).unwrap();
        assert!(
            rewritten == check.expected,
            "partition {at}: the snapshot differs from the state it began with"
        );
        assert_eq!(restored.expiries, check.expected_expiries);
    }

    fn finish_snapshots(&mut self) {
        for at in 0..PARTITIONS {
            while self.snapshots[at].is_some() {
                self.snapshot_step(at, 4096);
            }
        }
    }

    /// The state of a prepared transfer: open in its partition's memory, or final in its archive,
    /// never both.
    fn state_of(&self, id: TransferId) -> TransferState {
        let at = partition_of(&Owner::Transfer(id));
        match (
            self.partitions[at].open_transfer(id),
            self.archives[at].transfer(id),
        ) {
            (Some(open), None) => {
                assert!(!open.state.is_final(), "a final transfer leaves memory");
                open.state
            }
            (None, Some(archived)) => archived.state,
            (open, archived) => panic!(
                "transfer {id:x} open: {}, archived: {}",
                open.is_some(),
                archived.is_some()
            ),
        }
    }

    fn participant(&self, name: &str) -> &crate::domain::Participant {
        self.partitions[partition_of(&Owner::Participant(name.into()))]
            .participant(name)
            .expect("created")
    }

    /// Holds at every step, follow-ups in flight or not.
    fn check_always(&self) {
        for name in PARTICIPANTS {
            let p = self.participant(name);
            assert!(p.position + p.reserved <= p.ndc, "{name}: {p:?}");
            assert!(p.reserved >= 0);
        }
        for (id, states) in &self.history {
            assert_eq!(states[0], TransferState::Received, "{id}");
            let finals = states.iter().filter(|s| s.is_final()).count();
            assert!(finals <= 1, "transfer {id} went through {states:?}");
            if finals == 1 {
                assert!(states.last().unwrap().is_final(), "{id}: {states:?}");
            }
        }
    }

    /// Holds once no follow-up is in flight.
    fn check_quiescent(&self) {
        let mut reserved: HashMap<&str, Amount> = HashMap::new();
        let mut position: HashMap<&str, Amount> = HashMap::new();
        for spec in &self.prepared {
            match self.state_of(spec.id) {
                TransferState::Received => {
                    panic!("{} still RECEIVED with nothing in flight", spec.id)
                }
                TransferState::Reserved => *reserved.entry(&spec.payer).or_default() += spec.amount,
                TransferState::Committed => {
                    *position.entry(&spec.payer).or_default() += spec.amount;
                    *position.entry(&spec.payee).or_default() -= spec.amount;
                }
                TransferState::Aborted(_) => {}
            }
        }
        let mut sum = 0;
        for name in PARTICIPANTS {
            let p = self.participant(name);
            assert_eq!(
                p.reserved,
                reserved.get(name).copied().unwrap_or(0),
                "{name} reserved"
            );
            assert_eq!(
                p.position,
                position.get(name).copied().unwrap_or(0),
                "{name} position"
            );
            let at = partition_of(&Owner::Participant(name.into()));
            let entries = self.archives[at].entries(name, &p.entries);
            assert_eq!(entries.iter().map(|e| e.change).sum::<Amount>(), p.position);
            assert_eq!(p.entries.len(), entries.len());
            sum += p.position;
        }
        assert_eq!(sum, 0, "positions always sum to what they started at");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn invariants_hold_under_random_interleavings(
        ndcs in prop::collection::vec(0..2000i128, 4),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let mut sim = Sim::new(&ndcs);
        for op in &ops {
            sim.run(op);
            sim.check_always();
        }
        // Let everything in flight land, then expire what is due and let that land too.
        while sim.deliver(0) {}
        sim.now_ms += 1_000;
        sim.run(&Op::Tick);
        while sim.deliver(0) {}
        sim.check_always();
        sim.check_quiescent();
        sim.finish_snapshots();
        for spec in &sim.prepared {
            let state = sim.state_of(spec.id);
            prop_assert!(state.is_final(), "{} ended {state:?}", spec.id);
        }
    }
}

#[test]
fn a_reservation_over_the_cap_is_refused_with_4001_and_frees_nothing() {
    let mut sim = Sim::new(&[100, 100, 100, 100]);
    sim.run(&Op::Prepare {
        payer: 0,
        payee: 1,
        amount: 60,
        expires_in_ms: 500,
        payee_known: false,
    });
    sim.run(&Op::Prepare {
        payer: 0,
        payee: 2,
        amount: 50,
        expires_in_ms: 500,
        payee_known: false,
    });
    while sim.deliver(0) {}
    let states: Vec<TransferState> = sim.prepared.iter().map(|s| sim.state_of(s.id)).collect();
    let refused = TransferState::Aborted(AbortReason::Refused(ErrorCode::PayerLiquidity));
    assert!(
        states == [TransferState::Reserved, refused]
            || states == [refused, TransferState::Reserved],
        "{states:?}"
    );
    let expected = if states[0] == TransferState::Reserved {
        60
    } else {
        50
    };
    assert_eq!(sim.participant("dfsp0").reserved, expected);
}

#[test]
fn fulfil_after_expiry_gets_3303_and_releases_the_reservation() {
    let mut sim = Sim::new(&[100, 100, 100, 100]);
    sim.run(&Op::Prepare {
        payer: 0,
        payee: 1,
        amount: 40,
        expires_in_ms: 50,
        payee_known: true,
    });
    while sim.deliver(0) {}
    let spec = sim.prepared[0].clone();
    assert_eq!(sim.state_of(spec.id), TransferState::Reserved);
    sim.now_ms += 50;
    let reply = sim.apply(
        &Owner::Transfer(spec.id),
        Command::Fulfil {
            id: spec.id,
            source: spec.payee.clone(),
            fulfilment: fulfilment_of(0),
        },
    );
    assert!(matches!(reply, Reply::Refused(r) if r.code == ErrorCode::Expired));
    while sim.deliver(0) {}
    assert_eq!(
        sim.state_of(spec.id),
        TransferState::Aborted(AbortReason::Expired)
    );
    assert_eq!(sim.participant("dfsp0").reserved, 0);
    sim.check_quiescent();
}

#[test]
fn unknown_payee_and_payer_are_refused_without_moving_money() {
    let mut sim = Sim::new(&[100, 100, 100, 100]);
    for (n, (payer, payee, code)) in [
        ("dfsp0", "nobody", ErrorCode::PayeeNotFound),
        ("nobody", "dfsp0", ErrorCode::PayerNotFound),
    ]
    .into_iter()
    .enumerate()
    {
        let spec = TransferSpec {
            id: 7 + n as u128,
            payer: payer.into(),
            payee: payee.into(),
            currency: "USD".into(),
            amount: 5,
            condition: [0; 32],
            expiration_ms: sim.now_ms + 100,
            content_hash: 1,
        };
        sim.apply(&Owner::Transfer(spec.id), Command::Prepare(spec.clone()));
        while sim.deliver(0) {}
        assert_eq!(
            sim.state_of(spec.id),
            TransferState::Aborted(AbortReason::Refused(code))
        );
    }
    for name in PARTICIPANTS {
        assert_eq!(sim.participant(name).reserved, 0);
    }
}

#[test]
fn the_entry_log_pages_across_its_chunks_in_memory_and_archived() {
    let mut log = EntryLog::default();
    assert!(log.is_empty());
    let mut archived = HashMap::new();
    let count = 10_000;
    for n in 0..count {
        let full = log.push(Entry {
            transfer: n as TransferId,
            change: 1,
            position_after: n as Amount + 1,
            timestamp_ms: n,
        });
        if let Some((chunk, entries)) = full {
            assert_eq!(entries.len(), EntryLog::CHUNK_ENTRIES);
            assert!(archived.insert(chunk, entries).is_none());
        }
    }
    assert_eq!(log.len(), count as usize);
    assert_eq!(
        archived.len(),
        2,
        "the two full chunks left, the third is filling"
    );
    let chunk = |index| archived.get(&index).cloned().ok_or(index);
    for offset in [0, 1, 4095, 4096, 4097, 8191, 8192, 9999] {
        let page: Vec<u64> = (log.page(offset, 3, chunk).unwrap().iter())
            .map(|e| e.timestamp_ms)
            .collect();
        let expected: Vec<u64> = (offset as u64..count).take(3).collect();
        assert_eq!(page, expected, "page at {offset}");
    }
    let across = log.page(4000, 5000, chunk).unwrap();
    assert_eq!(across.len(), 5000);
    assert!(across.iter().zip(4000..).all(|(e, n)| e.timestamp_ms == n));
    assert!(log.page(count as usize, 3, chunk).unwrap().is_empty());
    assert!(log.page(usize::MAX / 2, 3, chunk).unwrap().is_empty());
}

/// See the same test in payments' model: an event the read model cannot read is an error for the
/// engine to report, not a panic and never skipped.
#[test]
fn an_event_the_model_cannot_read_is_an_error() {
    use spate_engine::Projection;
    let mut projection = crate::model::LedgerProjection {
        model: Default::default(),
        waiters: Default::default(),
    };
    let error = projection.apply(0, 7, 0, &[0xff; 3]).unwrap_err();
    assert!(error.to_string().contains("a ledger event"), "{error}");
}
