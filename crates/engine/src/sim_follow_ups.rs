//! The simulation of two partitions and the follow-ups between them (see `sim.rs` for one partition
//! and its disk): transfers debit an account on one partition and credit one on the other through a
//! follow-up, which the network between them may deliver late, out of order, twice or never, while
//! either partition crashes (a torn group commit at times) and recovers from its own files. Messages
//! leave a partition only once the group commit that made them is durable, a follow-up is applied when
//! it is the next of its lane and acknowledged after the group commit that holds it is, and every lane
//! is resent after a recovery and from time to time, as `partition.rs` does. At the end the network
//! delivers everything and the partitions are checked: every lane acknowledged, every follow-up applied
//! exactly once (the money deposited is all there, none twice), every record that survived counted.
//!
//! `cargo test -p spate-engine sim_follow_ups` runs `SEEDS_DEFAULT` seeds; `SPATE_SIM_SEEDS` and
//! `SPATE_SIM_SEED` work as in `sim.rs`.

use crate::app::{AppSpec, Command, Effects, StateMachine};
use crate::archive::ArchiveStore;
use crate::core::{Core, FollowUp};
use crate::idempotency::IdempotencyTable;
use crate::journal::{Durability, FileJournal, JournalConfig, Log, Lsn};
use crate::record::{Envelope, Origin, begin_record, finish_record};
use crate::stepped_snapshot::SteppedSnapshot;
use crate::wire::{ReadLe, WriteLe};
use crate::{AppId, PartitionId};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::PathBuf;

const SEEDS_DEFAULT: u64 = 200;
const STEPS: usize = 500;
const APP: AppId = 1;
const PARTITIONS: u16 = 2;
const ACCOUNTS: u8 = 8;
const DEPOSIT: u8 = 0;
const TRANSFER: u8 = 1;
const CREDIT: u8 = 2;

/// Balances by account; a transfer debits here and sends the credit to the account's partition.
#[derive(Default)]
struct Accounts {
    balances: BTreeMap<u8, i64>,
}

impl StateMachine for Accounts {
    fn apply(&mut self, command: &Command<'_>, effects: &mut Effects<'_>) {
        let [kind, account, to, amount] = command.payload[..] else {
            panic!("the simulation sends only its own commands");
        };
        let amount = i64::from(amount);
        match kind {
            DEPOSIT | CREDIT => *self.balances.entry(account).or_default() += amount,
            TRANSFER => {
                *self.balances.entry(account).or_default() -= amount;
                effects.follow_up(&[to], vec![CREDIT, to, 0, amount as u8]);
            }
            _ => panic!("unknown kind {kind}"),
        }
    }

    fn write_snapshot(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_u32_le(self.balances.len() as u32)?;
        for (account, balance) in &self.balances {
            out.write_u8_le(*account)?;
            out.write_u64_le(*balance as u64)?;
        }
        Ok(())
    }
}

fn spec() -> AppSpec {
    AppSpec {
        id: APP,
        name: "accounts",
        new_state: Box::new(|_| Box::new(Accounts::default())),
        restore: Box::new(|_, input: &mut dyn Read| {
            let mut accounts = Accounts::default();
            for _ in 0..input.read_u32_le()? {
                let account = input.read_u8_le()?;
                accounts
                    .balances
                    .insert(account, input.read_u64_le()? as i64);
            }
            Ok(Box::new(accounts))
        }),
        archives: false,
        projection: None,
    }
}

/// What travels between the partitions.
#[derive(Clone, Debug)]
enum Message {
    FollowUp {
        destination: PartitionId,
        follow_up: FollowUp,
    },
    Ack {
        source: PartitionId,
        destination: PartitionId,
        seq: u64,
    },
}

/// One partition: its files, its core, the group commit it builds and what waits for it.
struct Partition {
    id: PartitionId,
    journal_dir: PathBuf,
    snapshot_dir: PathBuf,
    journal: FileJournal,
    core: Core,
    batch: Vec<u8>,
    batch_records: u64,
    /// Released once the batch is durable.
    outbox: Vec<Message>,
    /// Every record applied, by LSN: its payload.
    records: Vec<[u8; 4]>,
}

struct World {
    seed: u64,
    rng: SmallRng,
    _dir: tempfile::TempDir,
    config: JournalConfig,
    specs: Vec<AppSpec>,
    empty_idempotency: IdempotencyTable,
    partitions: Vec<Partition>,
    network: Vec<Message>,
    clock_ms: u64,
    trace: Vec<String>,
    crashes: u32,
    delivered: u64,
}

impl World {
    fn new(seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let dir = crate::sim::scratch_dir();
        let config = JournalConfig {
            durability: Durability::Fsync,
            segment_bytes: rng.random_range(256..2048),
            keep_all: false,
        };
        let specs = vec![spec()];
        let empty_idempotency = IdempotencyTable::new(60_000, 1_024, usize::MAX);
        let mut world = Self {
            seed,
            rng,
            _dir: dir,
            config,
            specs,
            empty_idempotency,
            partitions: Vec::new(),
            network: Vec::new(),
            clock_ms: 1_000,
            trace: Vec::new(),
            crashes: 0,
            delivered: 0,
        };
        for id in 0..PARTITIONS {
            let base = world._dir.path().join(format!("p{id}"));
            let (journal_dir, snapshot_dir) = (base.join("journal"), base.join("snapshots"));
            let (journal, core) = world.recover(id, &journal_dir, &snapshot_dir);
            world.partitions.push(Partition {
                id,
                journal_dir,
                snapshot_dir,
                journal,
                core,
                batch: Vec::new(),
                batch_records: 0,
                outbox: Vec::new(),
                records: Vec::new(),
            });
        }
        world
    }

    fn recover(
        &self,
        id: PartitionId,
        journal_dir: &std::path::Path,
        snapshot_dir: &std::path::Path,
    ) -> (FileJournal, Core) {
        let (journal, _) = FileJournal::open(journal_dir, self.config.clone())
            .unwrap_or_else(|e| self.fail(format!("partition {id}: opening its journal: {e}")));
        let (core, _) = crate::recovery::recover_partition(
            id,
            PARTITIONS,
            &self.specs,
            &self.empty_idempotency,
            &None::<ArchiveStore>,
            &journal,
            snapshot_dir,
        )
        .unwrap_or_else(|e| self.fail(format!("partition {id}: recovery refused: {e}")));
        (journal, core)
    }

    fn note(&mut self, step: String) {
        if self.trace.len() == 60 {
            self.trace.remove(0);
        }
        self.trace.push(step);
    }

    fn fail(&self, what: String) -> ! {
        panic!(
            "follow-up simulation seed {} failed (rerun: SPATE_SIM_SEED={} cargo test -p spate-engine sim_follow_ups): {what}\nlast steps:\n  {}",
            self.seed,
            self.seed,
            self.trace.join("\n  ")
        )
    }

    fn run(&mut self) {
        for _ in 0..STEPS {
            let p = self.rng.random_range(0..PARTITIONS);
            match self.rng.random_range(0..100) {
                0..20 => self.client(p, DEPOSIT),
                20..45 => self.client(p, TRANSFER),
                45..65 => self.commit(p),
                65..85 => self.deliver(true),
                85..89 => self.resend(p),
                89..94 => self.snapshot(p),
                _ => self.crash(p),
            }
        }
        self.quiesce();
        self.check();
    }

    /// A client command on partition `p` for an account it owns.
    fn client(&mut self, p: PartitionId, kind: u8) {
        let owned: Vec<u8> = (0..ACCOUNTS)
            .filter(|a| crate::partition_of(&[*a], PARTITIONS) == p)
            .collect();
        let Some(&account) = owned.get(self.rng.random_range(0..owned.len().max(1))) else {
            return;
        };
        let to = self.rng.random_range(0..ACCOUNTS);
        let amount = self.rng.random_range(1..100);
        self.note(format!(
            "p{p}: client {kind} account {account} to {to} amount {amount}"
        ));
        self.apply(
            p,
            Origin::Client { command_id: None },
            [kind, account, to, amount],
        );
    }

    fn apply(&mut self, p: PartitionId, origin: Origin, payload: [u8; 4]) {
        if let Origin::FollowUp { source, seq } = origin {
            let expected = self.partitions[usize::from(p)]
                .core
                .next_follow_up_from(source);
            if seq != expected {
                self.fail(format!(
                    "p{p}: follow-up {seq} from p{source} applied, expected {expected}"
                ));
            }
        }
        self.clock_ms += 1;
        let envelope = Envelope {
            app: APP,
            origin,
            timestamp_ms: self.clock_ms,
            random: self.rng.next_u64(),
        };
        let partition = &mut self.partitions[usize::from(p)];
        let start = begin_record(&mut partition.batch, &envelope, &payload);
        let (mut sent, mut archived) = (Vec::new(), Vec::new());
        (partition.core).apply(
            &envelope,
            &payload,
            &mut partition.batch,
            &mut sent,
            &mut archived,
        );
        finish_record(&mut partition.batch, start);
        partition.batch_records += 1;
        partition.records.push(payload);
        for outgoing in sent {
            if outgoing.destination == p {
                // To this partition: applied in the same group commit, as `route_follow_ups` does.
                let FollowUp { source, seq, .. } = outgoing.follow_up;
                let payload = (*outgoing.follow_up.payload).try_into().unwrap();
                self.apply(p, Origin::FollowUp { source, seq }, payload);
                self.partitions[usize::from(p)].core.acknowledge(p, seq);
            } else {
                (self.partitions[usize::from(p)].outbox).push(Message::FollowUp {
                    destination: outgoing.destination,
                    follow_up: outgoing.follow_up,
                });
            }
        }
    }

    /// The writer's group commit: durable, then what waited for it leaves.
    fn commit(&mut self, p: PartitionId) {
        let partition = &mut self.partitions[usize::from(p)];
        if partition.batch_records > 0 {
            let batch = std::mem::take(&mut partition.batch);
            if let Err(error) = partition.journal.append(&batch, partition.batch_records) {
                self.fail(format!("p{p}: append: {error}"));
            }
            let count = std::mem::take(&mut partition.batch_records);
            self.note(format!("p{p}: commit {count} records"));
        }
        let partition = &mut self.partitions[usize::from(p)];
        self.network.append(&mut partition.outbox);
    }

    /// Takes a message off the network, in any order; with `faults`, it may also be delivered and kept
    /// (a duplicate) or lost.
    fn deliver(&mut self, faults: bool) {
        if self.network.is_empty() {
            return;
        }
        let index = self.rng.random_range(0..self.network.len());
        let roll = if faults {
            self.rng.random_range(0..10)
        } else {
            9
        };
        let message = match roll {
            0 => {
                self.network.swap_remove(index);
                self.note("lost a message".into());
                return;
            }
            1 => self.network[index].clone(),
            _ => self.network.swap_remove(index),
        };
        self.delivered += 1;
        match message {
            Message::FollowUp {
                destination,
                follow_up,
            } => {
                let expected = self.partitions[usize::from(destination)]
                    .core
                    .next_follow_up_from(follow_up.source);
                self.note(format!(
                    "p{destination}: follow-up {} from p{} (expects {expected})",
                    follow_up.seq, follow_up.source
                ));
                if follow_up.seq > expected {
                    return;
                }
                if follow_up.seq == expected {
                    let payload = (*follow_up.payload).try_into().unwrap();
                    let origin = Origin::FollowUp {
                        source: follow_up.source,
                        seq: follow_up.seq,
                    };
                    self.apply(destination, origin, payload);
                }
                // Acknowledged once the group commit holding it is durable; an old one at once with it.
                (self.partitions[usize::from(destination)].outbox).push(Message::Ack {
                    source: follow_up.source,
                    destination,
                    seq: follow_up.seq,
                });
            }
            Message::Ack {
                source,
                destination,
                seq,
            } => {
                self.note(format!("p{source}: ack {seq} from p{destination}"));
                self.partitions[usize::from(source)]
                    .core
                    .acknowledge(destination, seq)
            }
        }
    }

    /// Sends every unacknowledged follow-up of `p` again, in order, once the group commit being built
    /// is durable (as `resend_stalled` does): some may come from it, and leave only with it.
    fn resend(&mut self, p: PartitionId) {
        let partition = &mut self.partitions[usize::from(p)];
        let resent: Vec<Message> = (partition.core.unacknowledged())
            .filter(|outgoing| outgoing.destination != p)
            .map(|outgoing| Message::FollowUp {
                destination: outgoing.destination,
                follow_up: outgoing.follow_up,
            })
            .collect();
        partition.outbox.extend(resent);
    }

    /// A snapshot of `p`, in steps, published once what it holds is durable.
    fn snapshot(&mut self, p: PartitionId) {
        let budget = self.rng.random_range(8..256);
        let partition = &mut self.partitions[usize::from(p)];
        let lsn = partition.core.next_lsn;
        let (out, file_chunks) = crate::snapshot::chunk_pipe(None).unwrap();
        let mut stepped = SteppedSnapshot::begin(&mut partition.core, out);
        while !stepped.step(&mut partition.core, budget) {}
        let (chunks, failed) = stepped.finish();
        assert!(failed.is_none(), "{failed:?}");
        chunks.finish().unwrap();
        self.commit(p);
        let partition = &mut self.partitions[usize::from(p)];
        let file =
            crate::snapshot::write_streamed(&partition.snapshot_dir, lsn, file_chunks).unwrap();
        file.publish().unwrap();
        let kept = crate::snapshot::list(&partition.snapshot_dir).unwrap();
        for (_, path) in kept.iter().skip(2) {
            std::fs::remove_file(path).unwrap();
        }
        let floor = if kept.len() >= 2 { kept[1].0 } else { 0 };
        partition.journal.release_before(floor).unwrap();
        self.note(format!("p{p}: snapshot at LSN {lsn}"));
    }

    /// Crashes `p` (its group commit in flight lost, or torn), recovers it and resends its lanes.
    fn crash(&mut self, p: PartitionId) {
        self.crashes += 1;
        let torn = self.rng.random_bool(0.5);
        let partition = &mut self.partitions[usize::from(p)];
        let acknowledged = partition.journal.next_lsn();
        let mut expected = acknowledged;
        if torn && partition.batch_records > 0 {
            // Written up to a random byte; only whole records of it count, as in `sim.rs`.
            let cut = self.rng.random_range(1..partition.batch.len());
            let whole = crate::sim::whole_records(&partition.batch, cut);
            partition
                .journal
                .append(&partition.batch[..cut], partition.batch_records)
                .unwrap();
            expected += whole as Lsn;
        }
        let (journal_dir, snapshot_dir) = (
            partition.journal_dir.clone(),
            partition.snapshot_dir.clone(),
        );
        self.note(format!(
            "p{p}: crash (torn: {torn}), expecting {expected} records"
        ));
        let (journal, core) = self.recover(p, &journal_dir, &snapshot_dir);
        if core.next_lsn != expected {
            self.fail(format!(
                "p{p} recovered {} records, expected {expected}",
                core.next_lsn
            ));
        }
        let partition = &mut self.partitions[usize::from(p)];
        partition.journal = journal;
        partition.core = core;
        partition.batch.clear();
        partition.batch_records = 0;
        partition.outbox.clear();
        partition.records.truncate(expected as usize);
        // As `PartitionThread::run` starts: the follow-ups to itself that a torn group commit cut
        // from their cause are applied first, then the others are sent again.
        let local: Vec<FollowUp> = (partition.core.unacknowledged_to(p))
            .map(|outgoing| outgoing.follow_up)
            .collect();
        for follow_up in local {
            let core = &self.partitions[usize::from(p)].core;
            if !core.already_applied(p, follow_up.seq) {
                let payload = (*follow_up.payload).try_into().unwrap();
                let origin = Origin::FollowUp {
                    source: p,
                    seq: follow_up.seq,
                };
                self.apply(p, origin, payload);
            }
            self.partitions[usize::from(p)]
                .core
                .acknowledge(p, follow_up.seq);
        }
        self.resend(p);
    }

    /// Everything committed, delivered and acknowledged, without faults.
    fn quiesce(&mut self) {
        for round in 0.. {
            assert!(round < 10_000, "the network never quiesced");
            for p in 0..PARTITIONS {
                self.commit(p);
            }
            while !self.network.is_empty() {
                self.deliver(false);
            }
            let idle = (0..PARTITIONS).all(|p| {
                let partition = &self.partitions[usize::from(p)];
                partition.batch_records == 0 && partition.outbox.is_empty()
            });
            let acknowledged = (self.partitions.iter()).all(|p| p.core.unacknowledged_max() == 0);
            if idle && acknowledged {
                return;
            }
            for p in 0..PARTITIONS {
                self.resend(p);
            }
        }
    }

    fn check(&self) {
        for p in &self.partitions {
            let state = p.core.app_state(APP).unwrap();
            let accounts = (state as &dyn std::any::Any)
                .downcast_ref::<Accounts>()
                .unwrap();
            let held: i64 = accounts.balances.values().sum();
            let recorded: i64 = (p.records.iter())
                .map(|r| match r[0] {
                    TRANSFER => -i64::from(r[3]),
                    _ => i64::from(r[3]),
                })
                .sum();
            if held != recorded {
                self.fail(format!(
                    "p{} holds {held}, but its {} records sum to {recorded}",
                    p.id,
                    p.records.len()
                ));
            }
        }
        let balances: i64 = (self.partitions.iter())
            .map(|p| {
                let state = p.core.app_state(APP).unwrap();
                let accounts = (state as &dyn std::any::Any)
                    .downcast_ref::<Accounts>()
                    .unwrap();
                accounts.balances.values().sum::<i64>()
            })
            .sum();
        let deposited: i64 = (self.partitions.iter())
            .flat_map(|p| p.records.iter())
            .filter(|record| record[0] == DEPOSIT)
            .map(|record| i64::from(record[3]))
            .sum();
        let sum_of = |kind: u8| -> (usize, i64) {
            let records: Vec<_> = (self.partitions.iter())
                .flat_map(|p| p.records.iter())
                .filter(|r| r[0] == kind)
                .collect();
            (records.len(), records.iter().map(|r| i64::from(r[3])).sum())
        };
        if balances != deposited {
            self.fail(format!(
                "the balances sum to {balances}, the deposits that survived to {deposited}: a follow-up \
                 was lost or applied twice (transfers {:?}, credits {:?}, as count and sum)",
                sum_of(TRANSFER),
                sum_of(CREDIT)
            ));
        }
        for p in &self.partitions {
            let transfers_out = |destination: PartitionId| {
                (p.records.iter())
                    .filter(|r| {
                        r[0] == TRANSFER && crate::partition_of(&[r[2]], PARTITIONS) == destination
                    })
                    .count() as u64
            };
            for other in &self.partitions {
                let applied_from_p = other.core.next_follow_up_from(p.id) - 1;
                if applied_from_p != transfers_out(other.id) {
                    self.fail(format!(
                        "p{} applied {applied_from_p} follow-ups from p{}, which sent {}",
                        other.id,
                        p.id,
                        transfers_out(other.id)
                    ));
                }
            }
        }
    }
}

#[test]
fn every_follow_up_is_applied_exactly_once_across_crashes_and_a_faulty_network() {
    let seeds = crate::sim::seeds(SEEDS_DEFAULT);
    let (mut crashes, mut delivered) = (0, 0);
    for &seed in &seeds {
        let mut world = World::new(seed);
        world.run();
        crashes += world.crashes;
        delivered += world.delivered;
    }
    eprintln!(
        "simulated {} seeds of two partitions: {crashes} crashes, {delivered} messages delivered",
        seeds.len()
    );
    assert!(crashes > seeds.len() as u32);
}
