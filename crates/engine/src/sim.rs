//! A deterministic simulation of one partition's life, from a seed, in one thread: client commands
//! (some retried, some with a reused key and another body), group commits to the real journal,
//! snapshots written in steps while commands go on (`SteppedSnapshot`, as the partition thread writes
//! them) and published as `partition.rs` publishes them, crashes at any step, and a fault on disk at
//! each crash: a torn write, a write that was acknowledged and then lost, a flipped byte in a journal
//! record or in the newest snapshot. After every crash the partition is recovered as start-up recovers
//! it (`FileJournal::open` and `recover_partition` on the same files), and the outcome is checked
//! against a model of what was acknowledged:
//!
//! - a crash or a torn write loses nothing acknowledged, and keeps of the group commit in flight exactly
//!   its whole records;
//! - a damaged snapshot is never used: the partition comes back whole from an older one and the journal;
//! - a damaged journal record is refused, or cut with the loss reported (the last records of the
//!   journal, from the damaged one), or never read (a snapshot covers it): never misread;
//! - a lost acknowledged write is refused when a snapshot proves it, else the partition is the state
//!   of the journal that is left;
//! - the state is the state of exactly the records recovered, each applied once: every balance is the
//!   sum of its records' amounts, every acknowledged key answers its first reply (and another body
//!   under it is refused), and every record archived is found.
//!
//! `cargo test -p spate-engine sim` runs [`SEEDS_DEFAULT`] seeds; `SPATE_SIM_SEEDS=N` runs N of them and
//! `SPATE_SIM_SEED=S` runs seed S alone. A failure names its seed and the steps that led to it;
//! `SPATE_SIM_KEEP=DIR` keeps a copy of its files in DIR.
//!
//! Not simulated yet: the partition thread's queues and the writer thread themselves (the simulation
//! stands in for both, with the same calls in the same order), several partitions and their
//! follow-ups, the archive's store on disk, a journal on Kafka.

use crate::app::{AppSpec, Command, Effects, StateMachine};
use crate::archive::ArchiveStore;
use crate::core::{Admission, Core};
use crate::idempotency::IdempotencyTable;
use crate::journal::{Durability, FileJournal, JournalConfig, Log, Lsn};
use crate::record::{Envelope, Origin, begin_record, finish_record};
use crate::segmented::{EntryCodec, SegmentedMap};
use crate::snapshot::{ChunkReceiver, ChunkSender};
use crate::stepped_snapshot::SteppedSnapshot;
use crate::wire::{ReadLe, WriteLe};
use crate::{AppId, CommandId};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Seeds `cargo test` runs.
const SEEDS_DEFAULT: u64 = 300;
/// Steps of one seed's run.
const STEPS: usize = 400;
const APP: AppId = 1;
const ACCOUNTS: u32 = 12;
/// The steps kept to explain a failure.
const TRACE_STEPS_MAX: usize = 60;

/// The simulated app: balances of a few accounts, in a map written in steps like the real apps'.
struct Balances {
    accounts: SegmentedMap<u32, i64, BalanceCodec>,
    /// Commands applied, and its value when the snapshot in progress began.
    applied: u64,
    applied_at_snapshot: Option<u64>,
}

struct BalanceCodec;

impl EntryCodec<u32, i64> for BalanceCodec {
    fn write(key: &u32, value: &i64, out: &mut dyn Write) -> io::Result<()> {
        out.write_u32_le(*key)?;
        out.write_u64_le(*value as u64)
    }
    fn read(input: &mut dyn Read) -> io::Result<(u32, i64)> {
        Ok((input.read_u32_le()?, input.read_u64_le()? as i64))
    }
}

const SEGMENTS: usize = 4;

/// A command's payload: `account: u32 | amount: i64`.
fn payload(account: u32, amount: i64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(12);
    bytes.extend_from_slice(&account.to_le_bytes());
    bytes.extend_from_slice(&amount.to_le_bytes());
    bytes
}

impl StateMachine for Balances {
    fn apply(&mut self, command: &Command<'_>, effects: &mut Effects<'_>) {
        let account = u32::from_le_bytes(command.payload[..4].try_into().unwrap());
        let amount = i64::from_le_bytes(command.payload[4..12].try_into().unwrap());
        let balance = self.accounts.get_or_insert_with(account, || 0);
        *balance += amount;
        let balance = *balance;
        self.applied += 1;
        effects.reply().extend_from_slice(&balance.to_le_bytes());
        effects.emit(command.payload);
        // Some records become final: archived under the command's position.
        if amount.rem_euclid(5) == 0 {
            effects.archive(&self.applied.to_le_bytes(), command.payload);
        }
    }

    fn write_snapshot(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_u64_le(self.applied)?;
        self.accounts.write_all(out)
    }

    fn begin_snapshot(&mut self) -> bool {
        self.accounts.begin_snapshot();
        self.applied_at_snapshot = Some(self.applied);
        true
    }

    fn write_snapshot_step(&mut self, out: &mut dyn Write, budget: usize) -> io::Result<bool> {
        if let Some(applied) = self.applied_at_snapshot.take() {
            out.write_u64_le(applied)?;
        }
        self.accounts.snapshot_step(out, budget)
    }
}

fn spec() -> AppSpec {
    AppSpec {
        id: APP,
        name: "balances",
        new_state: Box::new(|_| {
            Box::new(Balances {
                accounts: SegmentedMap::new(SEGMENTS),
                applied: 0,
                applied_at_snapshot: None,
            })
        }),
        restore: Box::new(|_, input| {
            let applied = input.read_u64_le()?;
            let accounts = SegmentedMap::read(input, SEGMENTS)?;
            Ok(Box::new(Balances {
                accounts,
                applied,
                applied_at_snapshot: None,
            }))
        }),
        archives: false,
        projection: None,
    }
}

/// One command the partition applied, at its LSN.
#[derive(Clone, Debug)]
struct Applied {
    command_id: Option<CommandId>,
    account: u32,
    amount: i64,
    reply: Vec<u8>,
}

/// A fault on disk at a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The process stops; the group commit in flight is lost.
    Crash,
    /// The group commit in flight reached the disk in part.
    TornWrite,
    /// The last group commit was acknowledged, then lost (a disk that lied about its flush).
    LostAfterSuccess,
    /// One byte of an acknowledged journal record changed.
    FlippedRecord,
    /// One byte of the newest snapshot changed.
    FlippedSnapshot,
}

/// What recovery must show, given the fault.
#[derive(Debug)]
enum Expect {
    /// Exactly this many records, nothing refused.
    Records(Lsn),
    /// Refused, or `Records(lsn)` with the loss from `damaged` reported, or every acknowledged record.
    RefusedOrCut { acknowledged: Lsn, damaged: Lsn },
    /// Refused (a snapshot proves the loss), or exactly the records the journal still holds.
    RefusedOr(Lsn, bool),
    /// Refused: what is left cannot rebuild the partition.
    Refused,
}

struct Sim {
    seed: u64,
    rng: SmallRng,
    _dir: tempfile::TempDir,
    journal_dir: PathBuf,
    snapshot_dir: PathBuf,
    config: JournalConfig,
    specs: Vec<AppSpec>,
    empty_idempotency: IdempotencyTable,
    journal: FileJournal,
    core: Core,
    clock_ms: u64,
    next_command_id: CommandId,
    /// Every record the partition applied, by LSN; those from `acknowledged` on are in flight.
    applied: Vec<Applied>,
    acknowledged: Lsn,
    /// The group commit being built.
    batch: Vec<u8>,
    /// Each acknowledged group commit: its first LSN and its frames.
    commits: Vec<(Lsn, Vec<u8>)>,
    snapshot: Option<(Lsn, SteppedSnapshot<ChunkSender>, ChunkReceiver)>,
    snapshot_step_bytes: usize,
    trace: Vec<String>,
    crashes: u32,
    /// A damaged record recovery did not read (a snapshot covered it): while the journal holds it, a
    /// later recovery that needs it (its snapshot damaged, say) must refuse.
    latent_damage: Option<Lsn>,
    /// The idempotency table's bound on entries: it remembers the newest this many keys applied.
    keys_remembered: usize,
    /// A snapshot of records the journal never got, at its LSN, with its file's bytes: what an owner
    /// fenced off its partition's log wrote once (the cluster test's lost add, 0512d1a). Kept out of
    /// the snapshot directory until the journal holds other records past its LSN, then put there
    /// before a crash, as the newest snapshot: recovery must set it aside ([`Sim::place_phantom`]).
    phantom: Option<(Lsn, Vec<u8>)>,
    /// Phantom snapshots placed and set aside, over the run.
    phantoms_set_aside: u32,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let dir = scratch_dir();
        let config = JournalConfig {
            durability: Durability::Fsync,
            // Small segments, so that segments roll and are released behind snapshots.
            segment_bytes: rng.random_range(256..4096),
            keep_all: false,
        };
        let journal_dir = dir.path().join("journal");
        let snapshot_dir = dir.path().join("snapshots");
        let specs = vec![spec()];
        // Few keys, so that the table evicts while snapshots are written.
        let keys_remembered = rng.random_range(4..64);
        let empty_idempotency = IdempotencyTable::new(u64::MAX / 2, keys_remembered, usize::MAX);
        let (journal, _) = FileJournal::open(&journal_dir, config.clone()).unwrap();
        let core = crate::recovery::recover_partition(
            0,
            1,
            &specs,
            &empty_idempotency,
            &None::<ArchiveStore>,
            &journal,
            &snapshot_dir,
        )
        .unwrap()
        .0;
        Self {
            seed,
            snapshot_step_bytes: rng.random_range(16..512),
            rng,
            _dir: dir,
            journal_dir,
            snapshot_dir,
            config,
            specs,
            empty_idempotency,
            journal,
            core,
            clock_ms: 1_000,
            next_command_id: 1,
            applied: Vec::new(),
            acknowledged: 0,
            batch: Vec::new(),
            commits: Vec::new(),
            snapshot: None,
            trace: Vec::new(),
            crashes: 0,
            latent_damage: None,
            keys_remembered,
            phantom: None,
            phantoms_set_aside: 0,
        }
    }

    fn note(&mut self, step: String) {
        if self.trace.len() == TRACE_STEPS_MAX {
            self.trace.remove(0);
        }
        self.trace.push(step);
    }

    fn fail(&self, what: String) -> ! {
        if let Ok(keep) = std::env::var("SPATE_SIM_KEEP") {
            // The files as the failure left them, to look at.
            let _ = std::process::Command::new("cp")
                .arg("-r")
                .arg(self._dir.path())
                .arg(&keep)
                .status();
        }
        panic!(
            "simulation seed {} failed (rerun: SPATE_SIM_SEED={} cargo test -p spate-engine sim): {what}\nlast steps:\n  {}",
            self.seed,
            self.seed,
            self.trace.join("\n  ")
        )
    }

    fn run(&mut self) -> Outcome {
        for _ in 0..STEPS {
            let roll = self.rng.random_range(0..100);
            match roll {
                0..50 => self.submit_new(),
                50..58 => self.retry_acknowledged(),
                58..75 => self.commit(),
                75..80 if self.snapshot.is_none() => self.begin_snapshot(),
                75..90 if self.snapshot.is_some() => self.step_snapshot(),
                90..92 if self.snapshot.is_none() && self.phantom.is_none() => self.write_phantom(),
                75..96 => self.submit_new(),
                _ => {
                    if !self.crash_and_recover() {
                        return Outcome::Refused;
                    }
                }
            }
        }
        Outcome::Ran
    }

    fn submit_new(&mut self) {
        let account = self.rng.random_range(0..ACCOUNTS);
        let amount = self.rng.random_range(-50..=50i64);
        let command_id = self.rng.random_bool(0.8).then(|| {
            self.next_command_id += 1;
            self.next_command_id
        });
        self.note(format!(
            "submit {command_id:?} account {account} amount {amount}"
        ));
        self.apply(command_id, account, amount);
    }

    fn apply(&mut self, command_id: Option<CommandId>, account: u32, amount: i64) {
        let body = payload(account, amount);
        if !matches!(self.core.admit(command_id, &body), Admission::Apply) {
            self.fail(format!("the new key {command_id:?} was taken for a retry"));
        }
        self.clock_ms += self.rng.random_range(0..3);
        let envelope = Envelope {
            app: APP,
            origin: Origin::Client { command_id },
            timestamp_ms: self.clock_ms,
            random: self.rng.next_u64(),
        };
        let start = begin_record(&mut self.batch, &envelope, &body);
        let (mut sent, mut archived) = (Vec::new(), Vec::new());
        let reply = (self.core)
            .apply(&envelope, &body, &mut self.batch, &mut sent, &mut archived)
            .to_vec();
        finish_record(&mut self.batch, start);
        assert!(sent.is_empty(), "this app sends no follow-up");
        self.applied.push(Applied {
            command_id,
            account,
            amount,
            reply,
        });
    }

    /// A client retries an acknowledged command: it gets the first reply; with another body, a refusal.
    /// The LSNs of the keyed commands the idempotency table remembers: the newest it can hold.
    fn remembered(&self) -> Vec<usize> {
        let mut keyed: Vec<usize> = (0..self.applied.len())
            .filter(|&i| self.applied[i].command_id.is_some())
            .collect();
        keyed.drain(..keyed.len().saturating_sub(self.keys_remembered));
        keyed
    }

    fn retry_acknowledged(&mut self) {
        let acknowledged = self.acknowledged as usize;
        let with_keys: Vec<usize> = (self.remembered().into_iter())
            .filter(|&i| i < acknowledged)
            .collect();
        if with_keys.is_empty() {
            return self.submit_new();
        }
        let index = with_keys[self.rng.random_range(0..with_keys.len())];
        let first = self.applied[index].clone();
        let command_id = first.command_id;
        self.note(format!("retry {command_id:?}"));
        match self.core.admit(command_id, &payload(first.account, first.amount)) {
            Admission::Duplicate { reply, lsn } if reply == first.reply && lsn == index as Lsn => {}
            Admission::Duplicate { reply, lsn } => self.fail(format!(
                "a retry of {command_id:?} got reply {reply:?} of LSN {lsn}, not {:?} of LSN {index}",
                first.reply
            )),
            _ => self.fail(format!("a retry of {command_id:?} was not recognised")),
        }
        let other = payload(first.account, first.amount + 1);
        if !matches!(self.core.admit(command_id, &other), Admission::Conflict) {
            self.fail(format!("{command_id:?} with another body was not refused"));
        }
    }

    /// The writer's group commit: durable, then acknowledged.
    fn commit(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let count = self.applied.len() as Lsn - self.acknowledged;
        self.note(format!(
            "commit {count} records from LSN {}",
            self.acknowledged
        ));
        if let Err(error) = self.journal.append(&self.batch, count) {
            self.fail(format!("append: {error}"));
        }
        self.commits
            .push((self.acknowledged, std::mem::take(&mut self.batch)));
        self.acknowledged = self.applied.len() as Lsn;
    }

    fn begin_snapshot(&mut self) {
        let lsn = self.core.next_lsn;
        self.note(format!("begin snapshot at LSN {lsn}"));
        let (out, file_chunks) = crate::snapshot::chunk_pipe(None).unwrap();
        let stepped = SteppedSnapshot::begin(&mut self.core, out);
        self.snapshot = Some((lsn, stepped, file_chunks));
    }

    fn step_snapshot(&mut self) {
        let budget = self.snapshot_step_bytes;
        let (_, stepped, _) = self.snapshot.as_mut().unwrap();
        if !stepped.step(&mut self.core, budget) {
            return;
        }
        let (lsn, stepped, file_chunks) = self.snapshot.take().unwrap();
        // As `publish_snapshot`: once what it holds is durable, then the two newest are kept and the
        // journal behind the older is released.
        self.commit();
        let dir = self.snapshot_dir.clone();
        let path = self.write_snapshot_file(&dir, lsn, stepped, file_chunks);
        let (restored, loaded) = crate::recovery::load_snapshot(
            &path,
            0,
            1,
            &self.specs,
            &self.empty_idempotency,
            &None,
        );
        if let Err(error) = loaded {
            self.fail(format!(
                "the snapshot just published at LSN {lsn} is unreadable: {error}"
            ));
        }
        assert_eq!(restored.next_lsn, lsn);
        let kept = crate::snapshot::list(&self.snapshot_dir).unwrap();
        for (_, path) in kept.iter().skip(2) {
            std::fs::remove_file(path).unwrap();
        }
        let floor = if kept.len() >= 2 { kept[1].0 } else { 0 };
        self.journal.release_before(floor).unwrap();
        self.note(format!(
            "published snapshot at LSN {lsn}, released before {floor}"
        ));
    }

    /// Ends a whole snapshot's steps and publishes its file in `dir`, as `publish_snapshot` writes it.
    fn write_snapshot_file(
        &self,
        dir: &Path,
        lsn: Lsn,
        stepped: SteppedSnapshot<ChunkSender>,
        file_chunks: ChunkReceiver,
    ) -> PathBuf {
        let (chunks, failed) = stepped.finish();
        if let Some(error) = failed {
            self.fail(error);
        }
        chunks.finish().unwrap();
        let file =
            crate::snapshot::write_streamed(dir, lsn, file_chunks).unwrap_or_else(|e| self.fail(e));
        file.publish().unwrap()
    }

    /// As an owner fenced off its partition's log does: writes a whole snapshot that holds the
    /// records in flight, which then never reach the journal (the process stops). The file is kept
    /// aside until [`Self::place_phantom`].
    fn write_phantom(&mut self) {
        if self.applied.len() as Lsn == self.acknowledged {
            return;
        }
        let lsn = self.core.next_lsn;
        let (out, file_chunks) = crate::snapshot::chunk_pipe(None).unwrap();
        let mut stepped = SteppedSnapshot::begin(&mut self.core, out);
        while !stepped.step(&mut self.core, usize::MAX) {}
        let aside = self._dir.path().join("phantom");
        let path = self.write_snapshot_file(&aside, lsn, stepped, file_chunks);
        self.phantom = Some((lsn, std::fs::read(&path).unwrap()));
        std::fs::remove_file(path).unwrap();
        self.note(format!(
            "a phantom snapshot at LSN {lsn} of {} records in flight",
            lsn - self.acknowledged
        ));
        if !self.crash_with(Fault::Crash) {
            self.fail("a crash with nothing damaged was refused".into());
        }
    }

    /// Puts the phantom snapshot into the snapshot directory once it would be the newest there and
    /// the journal holds other records up to its LSN; its LSN if so.
    fn place_phantom(&mut self) -> Option<Lsn> {
        let (lsn, _) = self.phantom.as_ref()?;
        let lsn = *lsn;
        let newest = (crate::snapshot::list(&self.snapshot_dir).unwrap().first())
            .map_or(0, |(newest, _)| *newest);
        if lsn > self.acknowledged || lsn <= newest {
            // Past the journal's end it would prove a loss (recovery refuses); not the newest, it
            // would never be read.
            return None;
        }
        let (_, bytes) = self.phantom.take().unwrap();
        let path = self.snapshot_dir.join(crate::snapshot::file_name(lsn));
        std::fs::create_dir_all(&self.snapshot_dir).unwrap();
        std::fs::write(&path, bytes).unwrap();
        self.note(format!("the phantom snapshot at LSN {lsn} placed"));
        Some(lsn)
    }

    /// Crashes with a fault, recovers, checks; false if recovery refused, as it had to.
    fn crash_and_recover(&mut self) -> bool {
        // Faults that may end a run by a refusal are rarer, so that most runs go on through many crashes.
        let fault = match self.rng.random_range(0..100) {
            0..40 => Fault::Crash,
            40..75 => Fault::TornWrite,
            75..88 => Fault::FlippedSnapshot,
            88..94 => Fault::LostAfterSuccess,
            _ => Fault::FlippedRecord,
        };
        self.crash_with(fault)
    }

    /// Crashes with `fault`, recovers, checks; false if recovery refused, as it had to.
    fn crash_with(&mut self, fault: Fault) -> bool {
        self.crashes += 1;
        let expect = self.inject(fault);
        let phantom = if fault == Fault::Crash {
            self.place_phantom()
        } else {
            None
        };
        let snapshots: Vec<Lsn> = (crate::snapshot::list(&self.snapshot_dir).unwrap().iter())
            .map(|(lsn, _)| *lsn)
            .collect();
        self.note(format!(
            "crash: {fault:?}, expecting {expect:?}; snapshots at {snapshots:?}, journal from LSN {}",
            self.journal.first_lsn()
        ));
        self.snapshot = None;
        self.batch.clear();
        let recovered = match FileJournal::open(&self.journal_dir, self.config.clone()) {
            Err(error) => Err(error.to_string()),
            Ok((journal, report)) => crate::recovery::recover_partition(
                0,
                1,
                &self.specs,
                &self.empty_idempotency,
                &None::<ArchiveStore>,
                &journal,
                &self.snapshot_dir,
            )
            .map(|(core, _)| (journal, report, core))
            .map_err(|error| error.to_string()),
        };
        let latent = (self.latent_damage).filter(|&lsn| lsn >= self.journal.first_lsn());
        let (journal, report, core) = match (recovered, &expect) {
            (Ok(recovered), _) => recovered,
            (Err(error), Expect::RefusedOrCut { .. } | Expect::RefusedOr(..) | Expect::Refused) => {
                self.note(format!("refused, as it may: {error}"));
                return false;
            }
            (Err(error), Expect::Records(_)) if latent.is_some() => {
                self.note(format!("refused, as it may: {error}"));
                return false;
            }
            (Err(error), Expect::Records(_)) => self.fail(format!("recovery refused: {error}")),
        };
        let lsn = core.next_lsn;
        match expect {
            Expect::Records(expected) if lsn == expected => {}
            Expect::RefusedOrCut { acknowledged, .. } if lsn == acknowledged => {}
            Expect::RefusedOrCut { damaged, .. }
                if lsn == damaged && report.cut_records > 0 && report.cut_from_lsn == damaged => {}
            Expect::RefusedOr(expected, false) if lsn == expected => {}
            _ => self.fail(format!(
                "recovered {lsn} records, expected {expect:?} (journal report {report:?})"
            )),
        }
        if let Expect::RefusedOrCut {
            acknowledged,
            damaged,
        } = expect
            && lsn == acknowledged
        {
            self.latent_damage = Some(damaged);
        }
        self.journal = journal;
        self.core = core;
        // What was in flight and survived is durable now; what was cut never happened.
        self.applied.truncate(lsn as usize);
        self.acknowledged = lsn;
        self.commits.retain(|(first, _)| *first < lsn);
        self.note(format!("recovered {lsn} records"));
        self.check_state();
        if let Some(phantom) = phantom {
            let path = self.snapshot_dir.join(crate::snapshot::file_name(phantom));
            let mut aside = path.clone().into_os_string();
            aside.push(".damaged");
            if path.exists() || !Path::new(&aside).exists() {
                self.fail(format!(
                    "the phantom snapshot at LSN {phantom} was not set aside"
                ));
            }
            self.phantoms_set_aside += 1;
        }
        true
    }

    /// Damages the files as `fault` does; what recovery must then show.
    fn inject(&mut self, fault: Fault) -> Expect {
        let acknowledged = self.acknowledged;
        match fault {
            Fault::Crash => Expect::Records(acknowledged),
            Fault::TornWrite => {
                if self.batch.is_empty() {
                    return Expect::Records(acknowledged);
                }
                // The writer wrote the group commit, and the crash came before all of it reached the
                // disk, and before its segment rolled: its bytes from `cut` on are not there.
                let cut = self.rng.random_range(1..self.batch.len());
                let whole = whole_records(&self.batch, cut);
                let count = self.applied.len() as Lsn - acknowledged;
                self.journal.append(&self.batch, count).unwrap();
                let frames = std::mem::take(&mut self.batch);
                if !self.erase_in_journal(&frames, cut) {
                    self.fail("the group commit just written is in no segment".into());
                }
                Expect::Records(acknowledged + whole as Lsn)
            }
            Fault::LostAfterSuccess => {
                self.commit();
                let Some((first, frames)) = self.commits.last().cloned() else {
                    return Expect::Records(self.acknowledged);
                };
                if !self.erase_in_journal(&frames, 0) {
                    return Expect::Records(self.acknowledged);
                }
                let newest_snapshot = crate::snapshot::list(&self.snapshot_dir)
                    .unwrap()
                    .first()
                    .map_or(0, |(lsn, _)| *lsn);
                Expect::RefusedOr(first, newest_snapshot > first)
            }
            Fault::FlippedRecord => {
                self.commit();
                let commits: Vec<_> = (self.commits.iter())
                    .filter(|(first, _)| *first >= self.journal.first_lsn())
                    .cloned()
                    .collect();
                if commits.is_empty() {
                    return Expect::Records(self.acknowledged);
                }
                let (first, frames) = &commits[self.rng.random_range(0..commits.len())];
                let record = self.rng.random_range(0..count_records(frames));
                let (start, end) = record_span(frames, record);
                let at = self.rng.random_range(start..end);
                if !self.flip_in_journal(frames, at) {
                    return Expect::Records(self.acknowledged);
                }
                Expect::RefusedOrCut {
                    acknowledged: self.acknowledged,
                    damaged: first + record as Lsn,
                }
            }
            Fault::FlippedSnapshot => {
                self.commit();
                let snapshots = crate::snapshot::list(&self.snapshot_dir).unwrap();
                let Some((_, path)) = snapshots.first() else {
                    return Expect::Records(self.acknowledged);
                };
                let mut bytes = std::fs::read(path).unwrap();
                let at = self.rng.random_range(0..bytes.len());
                bytes[at] ^= 1 << self.rng.random_range(0..8);
                std::fs::write(path, bytes).unwrap();
                // Recovery sets damaged snapshots aside, so the others are whole. Without one, only
                // a whole journal can rebuild the partition.
                if snapshots.len() == 1 && self.journal.first_lsn() > 0 {
                    Expect::Refused
                } else {
                    Expect::Records(self.acknowledged)
                }
            }
        }
    }

    /// The journal's segment files, newest first, with their bytes.
    fn segments(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut paths: Vec<_> = (std::fs::read_dir(&self.journal_dir).unwrap())
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "seg"))
            .collect();
        paths.sort();
        paths.reverse();
        (paths.into_iter())
            .map(|path| {
                let bytes = std::fs::read(&path).unwrap();
                (path, bytes)
            })
            .collect()
    }

    /// Zeroes what follows the first `keep` bytes of `frames` in the segment that holds them (a
    /// preallocated segment reads as zeros where nothing was written), and removes the segments after
    /// it; false if no segment holds them.
    fn erase_in_journal(&self, frames: &[u8], keep: usize) -> bool {
        let segments = self.segments();
        let Some(holder) =
            (segments.iter()).position(|(_, bytes)| find_last(bytes, frames).is_some())
        else {
            return false;
        };
        for (path, _) in &segments[..holder] {
            std::fs::remove_file(path).unwrap();
        }
        let (path, mut bytes) = segments[holder].clone();
        let at = find_last(&bytes, frames).unwrap();
        bytes[at + keep..].fill(0);
        std::fs::write(&path, bytes).unwrap();
        true
    }

    /// Flips one bit of the byte `offset` into `frames`, where a segment holds them.
    fn flip_in_journal(&mut self, frames: &[u8], offset: usize) -> bool {
        let bit = self.rng.random_range(0..8);
        for (path, mut bytes) in self.segments() {
            if let Some(at) = find_last(&bytes, frames) {
                bytes[at + offset] ^= 1 << bit;
                std::fs::write(&path, bytes).unwrap();
                return true;
            }
        }
        false
    }

    /// The recovered state is the state of exactly the records recovered, each applied once.
    fn check_state(&self) {
        let lsn = self.core.next_lsn as usize;
        assert_eq!(lsn, self.applied.len());
        let state = self.core.app_state(APP).expect("the app has state");
        let balances = (state as &dyn std::any::Any)
            .downcast_ref::<Balances>()
            .expect("the app's state is Balances");
        let mut expected: HashMap<u32, i64> = HashMap::new();
        for applied in &self.applied {
            *expected.entry(applied.account).or_default() += applied.amount;
        }
        for account in 0..ACCOUNTS {
            let found = balances.accounts.get(&account).copied();
            if found != expected.get(&account).copied() {
                self.fail(format!(
                    "account {account} holds {found:?}, but its {lsn} records sum to {:?}",
                    expected.get(&account)
                ));
            }
        }
        if balances.applied != lsn as u64 {
            self.fail(format!(
                "{} commands applied, {lsn} recovered",
                balances.applied
            ));
        }
        let remembered = self.remembered();
        for (index, applied) in self.applied.iter().enumerate() {
            if let Some(command_id) = applied.command_id {
                let body = payload(applied.account, applied.amount);
                match self.core.admit(Some(command_id), &body) {
                    Admission::Duplicate { reply, lsn }
                        if reply == applied.reply
                            && lsn == index as Lsn
                            && remembered.contains(&index) => {}
                    Admission::Apply if !remembered.contains(&index) => {}
                    _ => self.fail(format!(
                        "key {command_id} of LSN {index}: remembered {}, but the table says otherwise",
                        remembered.contains(&index)
                    )),
                }
            }
            if applied.amount.rem_euclid(5) == 0 {
                let key = (index as u64 + 1).to_le_bytes();
                let found = self
                    .core
                    .archive
                    .get(APP, &key, self.core.next_lsn)
                    .unwrap();
                if found.as_deref() != Some(&payload(applied.account, applied.amount)[..]) {
                    self.fail(format!("the record archived by LSN {index} is {found:?}"));
                }
            }
        }
    }
}

/// Found by the simulation (seed 167 of the first runs): a snapshot that recovery found damaged stayed
/// in the directory and counted among the two kept, so the journal was released behind it, and the
/// next damaged snapshot left nothing to recover from. Recovery now sets damaged snapshots aside.
#[test]
fn a_damaged_snapshot_is_not_counted_among_the_two_kept() {
    let mut sim = Sim::new(0);
    let published_snapshot = |sim: &mut Sim| {
        for _ in 0..20 {
            sim.submit_new();
        }
        sim.commit();
        sim.begin_snapshot();
        while sim.snapshot.is_some() {
            sim.step_snapshot();
        }
    };
    published_snapshot(&mut sim);
    published_snapshot(&mut sim);
    assert!(
        sim.crash_with(Fault::FlippedSnapshot),
        "the older snapshot is whole"
    );
    published_snapshot(&mut sim);
    assert!(
        sim.crash_with(Fault::FlippedSnapshot),
        "the oldest snapshot and the journal behind it are whole"
    );
}

enum Outcome {
    Ran,
    Refused,
}

/// The frames' records: (start, end) of record `index`.
fn record_span(frames: &[u8], index: usize) -> (usize, usize) {
    let mut at = 0;
    for i in 0.. {
        let length = u32::from_le_bytes(frames[at..at + 4].try_into().unwrap()) as usize;
        let end = at + crate::record::FRAME_HEADER_BYTES + length;
        if i == index {
            return (at, end);
        }
        at = end;
    }
    unreachable!()
}

fn count_records(frames: &[u8]) -> usize {
    whole_records(frames, frames.len())
}

/// How many records of `frames` are whole when only its first `cut` bytes are written and the rest
/// reads as zeros: those that end within them, and one that ends in zeros where it was cut (what was
/// lost is what was there).
pub(crate) fn whole_records(frames: &[u8], cut: usize) -> usize {
    let (mut at, mut whole) = (0, 0);
    while at < cut {
        let length = u32::from_le_bytes(frames[at..at + 4].try_into().unwrap()) as usize;
        at += crate::record::FRAME_HEADER_BYTES + length;
        if at <= cut || frames[cut..at].iter().all(|&b| b == 0) {
            whole += 1;
        }
    }
    whole
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    (haystack
        .windows(needle.len())
        .rposition(|window| window == needle))
    .filter(|_| !needle.is_empty())
}

/// A directory for a seed's files: in memory where the machine has a tmpfs, since a simulation is
/// mostly fsyncs.
pub(crate) fn scratch_dir() -> tempfile::TempDir {
    let in_memory = Path::new("/dev/shm");
    if in_memory.is_dir() {
        tempfile::tempdir_in(in_memory).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// The seeds to run: `SPATE_SIM_SEED` alone, or the first `SPATE_SIM_SEEDS` (`default` without it).
pub(crate) fn seeds(default: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("SPATE_SIM_SEED") {
        return vec![seed.parse().expect("SPATE_SIM_SEED is a number")];
    }
    let count = std::env::var("SPATE_SIM_SEEDS")
        .map(|n| n.parse().expect("SPATE_SIM_SEEDS is a number"))
        .unwrap_or(default);
    (0..count).collect()
}

#[test]
fn every_seed_keeps_what_was_acknowledged_exactly_once() {
    let (mut refused, mut crashes, mut phantoms) = (0, 0, 0);
    let seeds = seeds(SEEDS_DEFAULT);
    for &seed in &seeds {
        let mut sim = Sim::new(seed);
        if let Outcome::Refused = sim.run() {
            refused += 1;
        }
        crashes += sim.crashes;
        phantoms += sim.phantoms_set_aside;
    }
    eprintln!(
        "simulated {} seeds: {crashes} crashes, {refused} runs ended by a refusal they had to make, \
         {phantoms} phantom snapshots set aside",
        seeds.len()
    );
    assert!(crashes > seeds.len() as u32, "the runs crash");
    if seeds.len() as u64 >= SEEDS_DEFAULT {
        assert!(phantoms > 0, "the runs place phantom snapshots");
    }
}
