//! The ledger's rules, as one partition applies them: pure and deterministic, with time given by the
//! caller (the engine's command timestamp), so replay rebuilds the same state.
//!
//! A transfer touches three owners, each on the partition its key hashes to: the transfer itself (keyed
//! by its id), the payer and the payee (keyed by name). No partition ever locks another; the steps travel
//! as follow-ups, which the engine delivers exactly once, in order per pair of partitions:
//!
//! ```text
//! Prepare ─▶ [transfer] RECEIVED ─CheckPayee─▶ [payee] exists, same currency (or 3203 / 3100)
//!                                               ─Reserve─▶ [payer] reserved += amount (or 4001 / 3202 / 3100)
//!                       RESERVED ◀──────ReserveResult─────── (a refusal: ABORTED)
//! Fulfil  ─▶ [transfer] COMMITTED ─CommitPayer─▶ [payer] reserved -= amount, position += amount
//!                                 ─CreditPayee─▶ [payee] position -= amount
//! Reject / expiry ─▶ [transfer] ABORTED ──Release──▶ [payer] reserved -= amount
//! ```
//!
//! Two shortcuts, both exact: `PrepareKnownPayee` (the server's read model has seen the payee created
//! with this currency, which holds forever) skips `CheckPayee`; and when the payer is also on the
//! transfer's partition ([`Context::here`]) that prepare reserves at once and answers RESERVED or the
//! refusal, with no step sent at all.
//!
//! The transfer's partition decides every state change, once; the participants' partitions only move
//! money as told. So a transfer reaches COMMITTED or ABORTED at most once, and the positions of all
//! participants sum to the same total whenever no follow-up is in flight.
//!
//! A transfer that reaches COMMITTED or ABORTED never changes again: it leaves the partition's memory
//! for the archive ([`Context::archive`]), where duplicate checks and reads still find it.

use crate::snapshot::{OpenTransfers, PARTICIPANT_SEGMENTS, Participants, TRANSFER_SEGMENTS};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::BTreeSet;

/// A participant's name or a currency: short, so held inline without an allocation (up to 24 bytes;
/// names are at most 32), which matters when every step of a transfer carries two of them.
pub type Name = compact_str::CompactString;

/// Money in the currency's minor units (cents for USD). Never floating point.
pub type Amount = i128;
/// A transfer id: the UUID of FSPIOP's `transferId`, as a number.
pub type TransferId = u128;

/// FSPIOP error codes this ledger answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// 3100: generic validation error.
    Validation,
    /// 3106: the id was used before with different content.
    ModifiedRequest,
    /// 3202: the payer FSP is unknown.
    PayerNotFound,
    /// 3203: the payee FSP is unknown.
    PayeeNotFound,
    /// 3208: no transfer with this id.
    TransferNotFound,
    /// 3303: the transfer expired.
    Expired,
    /// 4001: the payer's position plus reservations would exceed its net debit cap.
    PayerLiquidity,
    /// 3003 (add party information error, used here for "participant exists").
    ParticipantExists,
    /// 3201: the participant is unknown.
    ParticipantNotFound,
    /// 2003: the server cannot take this now (the ledger holds as many transfers as it may).
    ServiceUnavailable,
}

impl ErrorCode {
    pub fn code(self) -> u16 {
        match self {
            Self::Validation => 3100,
            Self::ModifiedRequest => 3106,
            Self::PayerNotFound => 3202,
            Self::PayeeNotFound => 3203,
            Self::TransferNotFound => 3208,
            Self::Expired => 3303,
            Self::PayerLiquidity => 4001,
            Self::ParticipantExists => 3003,
            Self::ParticipantNotFound => 3201,
            Self::ServiceUnavailable => 2003,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

fn refuse<T>(code: ErrorCode, message: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        code,
        message: message.into(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AbortReason {
    /// The payee rejected it.
    Rejected,
    /// Its expiration passed while it was reserved (or before its reservation came back).
    Expired,
    /// The reservation was refused.
    Refused(ErrorCode),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransferState {
    /// Prepared; the payer's reservation is on its way.
    Received,
    Reserved,
    Committed,
    Aborted(AbortReason),
}

impl TransferState {
    /// FSPIOP's `transferState`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Received => "RECEIVED",
            Self::Reserved => "RESERVED",
            Self::Committed => "COMMITTED",
            Self::Aborted(_) => "ABORTED",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Self::Committed | Self::Aborted(_))
    }
}

/// What a prepare asks for; `content_hash` covers every field of the request, so a resent prepare can be
/// told from a modified one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferSpec {
    pub id: TransferId,
    pub payer: Name,
    pub payee: Name,
    pub currency: Name,
    pub amount: Amount,
    pub condition: [u8; 32],
    pub expiration_ms: u64,
    pub content_hash: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    pub spec: TransferSpec,
    pub state: TransferState,
    pub fulfilment: Option<[u8; 32]>,
}

/// One change of a participant's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub transfer: TransferId,
    pub change: Amount,
    pub position_after: Amount,
    pub timestamp_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Participant {
    pub currency: Name,
    pub ndc: Amount,
    pub position: Amount,
    pub reserved: Amount,
    pub entries: EntryLog,
}

/// A participant's position changes, oldest first, in chunks of fixed capacity: appending never moves
/// what is already there, where one growing vector of millions of entries would copy them all (and stall
/// the partition) each time it doubles. A full chunk moves to the archive when the next one starts; its
/// place stays, empty, so that positions and the snapshot's encoding stay as they were (a snapshot from
/// before archiving, with every chunk in it, reads the same way).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryLog {
    chunks: Vec<Vec<Entry>>,
}

/// A chunk of an entry log that left memory: its index in the log and its entries.
pub type FullChunk = (u64, Vec<Entry>);

impl EntryLog {
    pub const CHUNK_ENTRIES: usize = 4096;

    /// Appends `entry`; returns the chunk that filled up before it, to be archived.
    #[must_use]
    pub fn push(&mut self, entry: Entry) -> Option<FullChunk> {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < Self::CHUNK_ENTRIES => {
                chunk.push(entry);
                None
            }
            last => {
                let full = last.map(std::mem::take);
                let mut chunk = Vec::with_capacity(Self::CHUNK_ENTRIES);
                chunk.push(entry);
                self.chunks.push(chunk);
                full.map(|entries| ((self.chunks.len() - 2) as u64, entries))
            }
        }
    }

    pub fn len(&self) -> usize {
        self.chunks.last().map_or(0, |last| {
            (self.chunks.len() - 1) * Self::CHUNK_ENTRIES + last.len()
        })
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Up to `limit` entries from position `offset` on, oldest first; chunks that left memory are read
    /// with `archived`.
    pub fn page<E>(
        &self,
        offset: usize,
        limit: usize,
        archived: impl Fn(u64) -> Result<Vec<Entry>, E>,
    ) -> Result<Vec<Entry>, E> {
        let mut page = Vec::new();
        let (mut index, mut within) = (offset / Self::CHUNK_ENTRIES, offset % Self::CHUNK_ENTRIES);
        while page.len() < limit && index < self.chunks.len() {
            let chunk = &self.chunks[index];
            let taken = limit - page.len();
            if chunk.is_empty() {
                let stored = archived(index as u64)?;
                page.extend(stored.iter().skip(within).take(taken));
            } else {
                page.extend(chunk.iter().skip(within).take(taken));
            }
            (index, within) = (index + 1, 0);
        }
        Ok(page)
    }
}

/// Everything a partition can be asked to do. The six after `Tick` only ever arrive as follow-ups.
/// New variants go last: journals and snapshots hold these by their index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    CreateParticipant {
        name: Name,
        currency: Name,
        ndc: Amount,
    },
    SetNdc {
        name: Name,
        ndc: Amount,
    },
    Prepare(TransferSpec),
    /// `source` is the FSP asking (FSPIOP-Source); only the payee may fulfil or reject.
    Fulfil {
        id: TransferId,
        source: Name,
        fulfilment: [u8; 32],
    },
    Reject {
        id: TransferId,
        source: Name,
    },
    /// Expires what is due; the server sends one to every partition periodically.
    Tick,
    CheckPayee {
        id: TransferId,
        payee: Name,
        payer: Name,
        currency: Name,
        amount: Amount,
    },
    Reserve {
        id: TransferId,
        payer: Name,
        currency: Name,
        amount: Amount,
    },
    ReserveResult {
        id: TransferId,
        refusal: Option<ErrorCode>,
    },
    CommitPayer {
        id: TransferId,
        payer: Name,
        amount: Amount,
    },
    CreditPayee {
        id: TransferId,
        payee: Name,
        amount: Amount,
    },
    Release {
        id: TransferId,
        payer: Name,
        amount: Amount,
    },
    /// Several commands applied in order, as if one by one, in one journal record: a client's batch
    /// (for the transfers this partition owns) or the steps one command sent to this partition. A batch
    /// never holds a batch.
    Batch(Vec<Command>),
    /// A prepare whose payee the server has seen created with the transfer's currency. Participants are
    /// never removed and their currency never changes, so the payee check is skipped: the payer's
    /// reservation is the only step before the answer.
    PrepareKnownPayee(TransferSpec),
}

/// Where a follow-up goes: the partition that owns this key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Owner {
    Transfer(TransferId),
    Participant(Name),
}

/// What a command changed, for the read model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    ParticipantCreated {
        name: Name,
        currency: Name,
        ndc: Amount,
    },
    NdcChanged {
        name: Name,
        ndc: Amount,
    },
    /// `reserved` and `position` are the participant's figures after the change.
    ParticipantChanged {
        name: Name,
        transfer: TransferId,
        position: Amount,
        reserved: Amount,
    },
    /// A transfer was prepared (followed by its `TransferChanged` to RECEIVED).
    TransferPrepared {
        id: TransferId,
        payer: Name,
        payee: Name,
        currency: Name,
        amount: Amount,
    },
    TransferChanged {
        id: TransferId,
        state: TransferState,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Participant(Name),
    Transfer(TransferId, TransferState),
    Refused(Refusal),
    /// A follow-up or a tick: nobody waits for it.
    Done,
    /// One reply per command of a batch, in order.
    Batch(Vec<Reply>),
}

/// What a partition knows besides a command: the time (the command's timestamp), which owners it
/// holds, so a step whose owner is here can be taken at once instead of sent, and its archive of final
/// transfers.
pub struct Context<'a> {
    pub now_ms: u64,
    pub here: &'a dyn Fn(&Owner) -> bool,
    pub archive: &'a mut dyn LedgerArchive,
}

/// Where what a partition holds for good goes when it leaves memory: final transfers, and full chunks
/// of participants' entry logs.
pub trait LedgerArchive {
    /// Keeps `transfer`, which is final, for good.
    fn put_transfer(&mut self, transfer: &Transfer);
    /// A transfer given to [`Self::put_transfer`] before.
    fn transfer(&self, id: TransferId) -> Option<Transfer>;
    /// Keeps a full chunk of `participant`'s entry log (see [`EntryLog::page`]).
    fn put_entries(&mut self, participant: &str, chunk: u64, entries: &[Entry]);
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Output {
    pub reply: Option<Reply>,
    pub events: Vec<Event>,
    pub follow_ups: Vec<(Owner, Command)>,
}

/// Groups follow-ups into one command per destination partition (a `Batch` when there are several),
/// keeping their order per destination; each goes to the first owner of its group. A batch of 8,000
/// prepares then costs each partition a few journal records and applies instead of 8,000 of each.
pub fn group_follow_ups<P: PartialEq>(
    follow_ups: Vec<(Owner, Command)>,
    partition_of: impl Fn(&Owner) -> P,
) -> Vec<(Owner, Command)> {
    let mut groups: Vec<(P, Owner, Vec<Command>)> = Vec::new();
    for (owner, command) in follow_ups {
        let partition = partition_of(&owner);
        match groups.iter_mut().find(|(p, _, _)| *p == partition) {
            Some((_, _, commands)) => commands.push(command),
            None => groups.push((partition, owner, vec![command])),
        }
    }
    groups
        .into_iter()
        .map(|(_, owner, mut commands)| {
            let command = if commands.len() == 1 {
                commands.pop().expect("one command")
            } else {
                Command::Batch(commands)
            };
            (owner, command)
        })
        .collect()
}

/// SHA-256 of the fulfilment must equal the condition (the interledger crypto-condition).
pub fn fulfils(fulfilment: &[u8; 32], condition: &[u8; 32]) -> bool {
    Sha256::digest(fulfilment).as_slice() == condition
}

/// The state one partition owns: some participants and its open transfers. Both maps are segmented,
/// so that a snapshot is written in steps while apply goes on (see `crate::snapshot`).
#[derive(Debug)]
pub struct LedgerPartition {
    pub(crate) participants: Participants,
    /// Boxed, so growing a segment moves pointers, not transfers.
    pub(crate) transfers: OpenTransfers,
    /// (expiration, id) of every open transfer (RECEIVED or RESERVED): all of them may still expire.
    /// Not in snapshots: it is rebuilt from `transfers`.
    pub(crate) expiries: BTreeSet<(u64, TransferId)>,
}

impl Default for LedgerPartition {
    fn default() -> Self {
        Self {
            participants: Participants::new(PARTICIPANT_SEGMENTS),
            transfers: OpenTransfers::new(TRANSFER_SEGMENTS),
            expiries: BTreeSet::new(),
        }
    }
}

impl LedgerPartition {
    pub fn participant(&self, name: &str) -> Option<&Participant> {
        self.participants.get(name)
    }

    /// A transfer still open (RECEIVED or RESERVED); final ones are in the archive.
    pub fn open_transfer(&self, id: TransferId) -> Option<&Transfer> {
        self.transfers.get(&id).map(|transfer| &**transfer)
    }

    pub fn participants(&self) -> impl Iterator<Item = (&Name, &Participant)> {
        self.participants.iter()
    }

    /// The open transfers.
    pub fn open_transfers(&self) -> impl Iterator<Item = &Transfer> {
        self.transfers.iter().map(|(_, transfer)| &**transfer)
    }

    /// The transfer `id`, open or archived.
    fn lookup<'s>(&'s self, id: TransferId, at: &Context<'_>) -> Option<Cow<'s, Transfer>> {
        match self.transfers.get(&id) {
            Some(open) => Some(Cow::Borrowed(&**open)),
            None => at.archive.transfer(id).map(Cow::Owned),
        }
    }

    /// Applies one command at `now_ms`. Client commands get a reply; follow-ups and ticks get `Done`.
    pub fn apply(&mut self, command: Command, at: &mut Context<'_>) -> Output {
        let mut out = Output::default();
        let reply = match command {
            Command::Batch(commands) => Reply::Batch(
                commands
                    .into_iter()
                    .map(|command| match command {
                        Command::Batch(_) => Reply::Refused(Refusal {
                            code: ErrorCode::Validation,
                            message: "a batch cannot hold a batch".into(),
                        }),
                        command => self.apply_one(command, at, &mut out),
                    })
                    .collect(),
            ),
            command => self.apply_one(command, at, &mut out),
        };
        out.reply = Some(reply);
        out
    }

    fn apply_one(&mut self, command: Command, at: &mut Context<'_>, out: &mut Output) -> Reply {
        match command {
            Command::Batch(_) => unreachable!("apply unpacks batches"),
            Command::CreateParticipant {
                name,
                currency,
                ndc,
            } => self.create_participant(name, currency, ndc, out),
            Command::SetNdc { name, ndc } => self.set_ndc(name, ndc, out),
            Command::Prepare(spec) => self.prepare(spec, false, at, out),
            Command::PrepareKnownPayee(spec) => self.prepare(spec, true, at, out),
            Command::Fulfil {
                id,
                source,
                fulfilment,
            } => self.fulfil(id, &source, fulfilment, at, out),
            Command::Reject { id, source } => self.reject(id, &source, at, out),
            Command::Tick => {
                self.expire_due(at, out);
                Reply::Done
            }
            Command::CheckPayee {
                id,
                payee,
                payer,
                currency,
                amount,
            } => {
                match self.participants.get(&payee) {
                    None => Self::answer(id, Some(ErrorCode::PayeeNotFound), out),
                    Some(p) if p.currency != currency => {
                        Self::answer(id, Some(ErrorCode::Validation), out)
                    }
                    Some(_) => out.follow_ups.push((
                        Owner::Participant(payer.clone()),
                        Command::Reserve {
                            id,
                            payer,
                            currency,
                            amount,
                        },
                    )),
                }
                Reply::Done
            }
            Command::Reserve {
                id,
                payer,
                currency,
                amount,
            } => {
                let refusal = self.reserve(id, &payer, &currency, amount, out);
                Self::answer(id, refusal, out);
                Reply::Done
            }
            Command::ReserveResult { id, refusal } => {
                self.reserve_result(id, refusal, at, out);
                Reply::Done
            }
            Command::CommitPayer { id, payer, amount } => {
                self.move_money(&payer, id, amount, -amount, at, out);
                Reply::Done
            }
            Command::CreditPayee { id, payee, amount } => {
                self.move_money(&payee, id, -amount, 0, at, out);
                Reply::Done
            }
            Command::Release { id, payer, amount } => {
                self.move_money(&payer, id, 0, -amount, at, out);
                Reply::Done
            }
        }
    }

    /// Sends the outcome of a reservation back to the transfer's partition.
    fn answer(id: TransferId, refusal: Option<ErrorCode>, out: &mut Output) {
        out.follow_ups
            .push((Owner::Transfer(id), Command::ReserveResult { id, refusal }));
    }

    fn create_participant(
        &mut self,
        name: Name,
        currency: Name,
        ndc: Amount,
        out: &mut Output,
    ) -> Reply {
        if self.participants.contains_key(&name) {
            return Reply::Refused(Refusal {
                code: ErrorCode::ParticipantExists,
                message: format!("participant {name} exists"),
            });
        }
        if ndc < 0 {
            return Reply::Refused(Refusal {
                code: ErrorCode::Validation,
                message: "ndc must not be negative".into(),
            });
        }
        out.events.push(Event::ParticipantCreated {
            name: name.clone(),
            currency: currency.clone(),
            ndc,
        });
        self.participants.insert(
            name.clone(),
            Participant {
                currency,
                ndc,
                position: 0,
                reserved: 0,
                entries: EntryLog::default(),
            },
        );
        Reply::Participant(name)
    }

    fn set_ndc(&mut self, name: Name, ndc: Amount, out: &mut Output) -> Reply {
        let Some(participant) = self.participants.get_mut(&name) else {
            return Reply::Refused(Refusal {
                code: ErrorCode::ParticipantNotFound,
                message: format!("no participant {name}"),
            });
        };
        // Lowering the cap below what is already used would break the invariant the cap exists for.
        let used = participant.position + participant.reserved;
        if ndc < 0 || ndc < used {
            return Reply::Refused(Refusal {
                code: ErrorCode::Validation,
                message: format!(
                    "ndc must be at least position + reserved ({used}) and not negative"
                ),
            });
        }
        participant.ndc = ndc;
        out.events.push(Event::NdcChanged {
            name: name.clone(),
            ndc,
        });
        Reply::Participant(name)
    }

    fn prepare(
        &mut self,
        spec: TransferSpec,
        payee_known: bool,
        at: &mut Context<'_>,
        out: &mut Output,
    ) -> Reply {
        let (now_ms, here) = (at.now_ms, at.here);
        if let Some(existing) = self.lookup(spec.id, at) {
            return if existing.spec.content_hash == spec.content_hash {
                Reply::Transfer(spec.id, existing.state)
            } else {
                Reply::Refused(Refusal {
                    code: ErrorCode::ModifiedRequest,
                    message: "this transferId was prepared before with different content".into(),
                })
            };
        }
        if spec.expiration_ms <= now_ms {
            return Reply::Refused(Refusal {
                code: ErrorCode::Expired,
                message: "expiration is not in the future".into(),
            });
        }
        if spec.payer == spec.payee || spec.amount <= 0 {
            return Reply::Refused(Refusal {
                code: ErrorCode::Validation,
                message: "payer and payee must differ and the amount must be positive".into(),
            });
        }
        let id = spec.id;
        let (payer, payee, currency, amount) = (
            spec.payer.clone(),
            spec.payee.clone(),
            spec.currency.clone(),
            spec.amount,
        );
        self.expiries.insert((spec.expiration_ms, id));
        out.events.push(Event::TransferPrepared {
            id,
            payer: payer.clone(),
            payee: payee.clone(),
            currency: currency.clone(),
            amount,
        });
        self.transfers.insert(
            id,
            Box::new(Transfer {
                spec,
                state: TransferState::Received,
                fulfilment: None,
            }),
        );
        out.events.push(Event::TransferChanged {
            id,
            state: TransferState::Received,
        });
        let payer_owner = Owner::Participant(payer.clone());
        if payee_known && here(&payer_owner) {
            // The payer is on this partition too: reserve now and answer with the outcome, no steps.
            let refusal = self.reserve(id, &payer, &currency, amount, out);
            let state = self.reserve_result(id, refusal, at, out);
            return Reply::Transfer(id, state);
        }
        let first_step = if payee_known {
            (
                payer_owner,
                Command::Reserve {
                    id,
                    payer,
                    currency,
                    amount,
                },
            )
        } else {
            (
                Owner::Participant(payee.clone()),
                Command::CheckPayee {
                    id,
                    payee,
                    payer,
                    currency,
                    amount,
                },
            )
        };
        out.follow_ups.push(first_step);
        Reply::Transfer(id, TransferState::Received)
    }

    /// The payer's side of a prepare: `None` if the amount is now reserved.
    fn reserve(
        &mut self,
        id: TransferId,
        payer: &str,
        currency: &str,
        amount: Amount,
        out: &mut Output,
    ) -> Option<ErrorCode> {
        let Some(participant) = self.participants.get_mut(payer) else {
            return Some(ErrorCode::PayerNotFound);
        };
        if participant.currency != currency {
            return Some(ErrorCode::Validation);
        }
        if participant.position + participant.reserved + amount > participant.ndc {
            return Some(ErrorCode::PayerLiquidity);
        }
        participant.reserved += amount;
        out.events.push(Event::ParticipantChanged {
            name: payer.into(),
            transfer: id,
            position: participant.position,
            reserved: participant.reserved,
        });
        None
    }

    /// Moves an open transfer to RESERVED.
    fn reserve_transfer(&mut self, id: TransferId, out: &mut Output) {
        let transfer = self.transfers.get_mut(&id).expect("the caller found it");
        debug_assert_eq!(transfer.state, TransferState::Received);
        transfer.state = TransferState::Reserved;
        out.events.push(Event::TransferChanged {
            id,
            state: TransferState::Reserved,
        });
    }

    /// Gives an open transfer its final state and moves it to the archive.
    fn finish(
        &mut self,
        id: TransferId,
        state: TransferState,
        at: &mut Context<'_>,
        out: &mut Output,
    ) -> Box<Transfer> {
        debug_assert!(state.is_final());
        let mut transfer = self.transfers.remove(&id).expect("the caller found it");
        debug_assert!(!transfer.state.is_final(), "a final state never changes");
        transfer.state = state;
        self.expiries.remove(&(transfer.spec.expiration_ms, id));
        out.events.push(Event::TransferChanged { id, state });
        at.archive.put_transfer(&transfer);
        transfer
    }

    /// Aborts an open transfer whose payer holds a reservation for it, and releases that.
    fn abort_reserved(
        &mut self,
        id: TransferId,
        reason: AbortReason,
        at: &mut Context<'_>,
        out: &mut Output,
    ) {
        let transfer = self.finish(id, TransferState::Aborted(reason), at, out);
        Self::release(id, &transfer.spec, out);
    }

    fn release(id: TransferId, spec: &TransferSpec, out: &mut Output) {
        out.follow_ups.push((
            Owner::Participant(spec.payer.clone()),
            Command::Release {
                id,
                payer: spec.payer.clone(),
                amount: spec.amount,
            },
        ));
    }

    /// Takes in the payer's answer to a transfer's reservation; returns the transfer's new state.
    fn reserve_result(
        &mut self,
        id: TransferId,
        refusal: Option<ErrorCode>,
        at: &mut Context<'_>,
        out: &mut Output,
    ) -> TransferState {
        let transfer = self.transfers.get(&id).expect("the caller found it");
        assert_eq!(
            transfer.state,
            TransferState::Received,
            "one reservation answer per prepared transfer"
        );
        let state = match refusal {
            Some(code) => TransferState::Aborted(AbortReason::Refused(code)),
            None if transfer.spec.expiration_ms <= at.now_ms => {
                TransferState::Aborted(AbortReason::Expired)
            }
            None => TransferState::Reserved,
        };
        match state {
            TransferState::Aborted(AbortReason::Expired) => {
                self.abort_reserved(id, AbortReason::Expired, at, out)
            }
            TransferState::Aborted(_) => drop(self.finish(id, state, at, out)),
            _ => self.reserve_transfer(id, out),
        }
        state
    }

    /// Checks that `source` may act on the transfer and that it is RESERVED and not yet expired (expiring
    /// it if it is due).
    fn reserved_for_payee(
        &mut self,
        id: TransferId,
        source: &str,
        at: &mut Context<'_>,
        out: &mut Output,
    ) -> Result<(), Refusal> {
        let Some(transfer) = self.lookup(id, at) else {
            return refuse(
                ErrorCode::TransferNotFound,
                format!("no transfer {id:032x}"),
            );
        };
        if transfer.spec.payee != source {
            return refuse(
                ErrorCode::Validation,
                "only the payee may fulfil or reject a transfer",
            );
        }
        match transfer.state {
            TransferState::Reserved if transfer.spec.expiration_ms <= at.now_ms => {
                self.abort_reserved(id, AbortReason::Expired, at, out);
                refuse(ErrorCode::Expired, "the transfer expired")
            }
            TransferState::Reserved => Ok(()),
            TransferState::Received => refuse(
                ErrorCode::Validation,
                "the transfer is not reserved yet; retry shortly",
            ),
            TransferState::Aborted(AbortReason::Expired) => {
                refuse(ErrorCode::Expired, "the transfer expired")
            }
            TransferState::Aborted(_) => refuse(ErrorCode::Validation, "the transfer was aborted"),
            TransferState::Committed => refuse(ErrorCode::Validation, "the transfer was committed"),
        }
    }

    fn fulfil(
        &mut self,
        id: TransferId,
        source: &str,
        fulfilment: [u8; 32],
        at: &mut Context<'_>,
        out: &mut Output,
    ) -> Reply {
        // A repeated fulfil is answered with the outcome of the first.
        if !self.transfers.contains_key(&id)
            && let Some(transfer) = at.archive.transfer(id)
            && transfer.state == TransferState::Committed
            && transfer.spec.payee == source
        {
            return if transfer.fulfilment == Some(fulfilment) {
                Reply::Transfer(id, TransferState::Committed)
            } else {
                Reply::Refused(Refusal {
                    code: ErrorCode::ModifiedRequest,
                    message: "the transfer was committed with another fulfilment".into(),
                })
            };
        }
        if let Err(refusal) = self.reserved_for_payee(id, source, at, out) {
            return Reply::Refused(refusal);
        }
        let transfer = self.transfers.get_mut(&id).expect("checked above");
        if !fulfils(&fulfilment, &transfer.spec.condition) {
            return Reply::Refused(Refusal {
                code: ErrorCode::Validation,
                message: "the fulfilment does not match the condition".into(),
            });
        }
        transfer.fulfilment = Some(fulfilment);
        let spec = self.finish(id, TransferState::Committed, at, out).spec;
        out.follow_ups.push((
            Owner::Participant(spec.payer.clone()),
            Command::CommitPayer {
                id,
                payer: spec.payer,
                amount: spec.amount,
            },
        ));
        out.follow_ups.push((
            Owner::Participant(spec.payee.clone()),
            Command::CreditPayee {
                id,
                payee: spec.payee,
                amount: spec.amount,
            },
        ));
        Reply::Transfer(id, TransferState::Committed)
    }

    fn reject(
        &mut self,
        id: TransferId,
        source: &str,
        at: &mut Context<'_>,
        out: &mut Output,
    ) -> Reply {
        let rejected = TransferState::Aborted(AbortReason::Rejected);
        if !self.transfers.contains_key(&id)
            && let Some(transfer) = at.archive.transfer(id)
            && transfer.state == rejected
            && transfer.spec.payee == source
        {
            return Reply::Transfer(id, rejected);
        }
        if let Err(refusal) = self.reserved_for_payee(id, source, at, out) {
            return Reply::Refused(refusal);
        }
        self.abort_reserved(id, AbortReason::Rejected, at, out);
        Reply::Transfer(id, rejected)
    }

    fn expire_due(&mut self, at: &mut Context<'_>, out: &mut Output) {
        let due: Vec<TransferId> = self
            .expiries
            .range(..(at.now_ms + 1, 0))
            .map(|&(_, id)| id)
            .collect();
        for id in due {
            // A RECEIVED transfer expires when its reservation answer arrives.
            let transfer = self
                .transfers
                .get(&id)
                .expect("expiries are of open transfers");
            if transfer.state == TransferState::Reserved {
                self.abort_reserved(id, AbortReason::Expired, at, out);
            }
        }
    }

    /// Applies a change the transfer's partition decided: `position_change` to the position (with an
    /// entry) and `reserved_change` to the reservations.
    fn move_money(
        &mut self,
        name: &str,
        id: TransferId,
        position_change: Amount,
        reserved_change: Amount,
        at: &mut Context<'_>,
        out: &mut Output,
    ) {
        let participant = self
            .participants
            .get_mut(name)
            .expect("money moves only for a payer that reserved or a payee checked at prepare, and participants are never removed");
        participant.position += position_change;
        participant.reserved += reserved_change;
        assert!(participant.reserved >= 0, "reservations never go negative");
        if position_change != 0 {
            let full = participant.entries.push(Entry {
                transfer: id,
                change: position_change,
                position_after: participant.position,
                timestamp_ms: at.now_ms,
            });
            if let Some((chunk, entries)) = full {
                at.archive.put_entries(name, chunk, &entries);
            }
        }
        out.events.push(Event::ParticipantChanged {
            name: name.into(),
            transfer: id,
            position: participant.position,
            reserved: participant.reserved,
        });
    }
}
