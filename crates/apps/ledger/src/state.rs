//! The ledger on the engine: commands, replies and events as postcard bytes, follow-ups routed by owner,
//! and the partition's snapshot.

use crate::domain::{
    Command, Context, Entry, Event, LedgerArchive, LedgerPartition, Owner, Reply, Transfer,
    TransferId, group_follow_ups,
};
use spate_engine::wire::{ReadLe, WriteLe};
use spate_engine::{Effects, Origin, StateMachine};
use std::io;

/// The key whose partition owns `owner`: transfers by id, participants by name, in separate spaces.
pub fn owner_key(owner: &Owner) -> Vec<u8> {
    // One allocation of the key's size: apply makes a few keys per transfer.
    let key = |space: u8, rest: &[u8]| {
        let mut key = Vec::with_capacity(1 + rest.len());
        key.push(space);
        key.extend_from_slice(rest);
        key
    };
    match owner {
        Owner::Transfer(id) => key(b't', &id.to_le_bytes()),
        Owner::Participant(name) => key(b'p', name.as_bytes()),
    }
}

pub fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("ledger values always encode")
}

/// Encodes `value` at the end of `out`. Apply encodes each event and archived record into one scratch
/// buffer, and its reply straight into the engine's: `encode` would grow a new buffer for each from
/// empty, and those reallocations were an eighth of a batch's apply (BENCHMARKS.md, issue 18).
pub fn encode_into<T: serde::Serialize>(value: &T, out: &mut Vec<u8>) {
    postcard::to_io(value, out).expect("ledger values always encode");
}

/// Room for what apply encodes into its scratch buffer: a transfer with long names, or a chunk of
/// entries, grows it once.
const SCRATCH_BYTES: usize = 512;

pub fn decode<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// Writes `bytes` behind a u64 length, so a reader takes exactly its own share of a longer stream.
pub fn write_prefixed(out: &mut dyn io::Write, bytes: &[u8]) -> io::Result<()> {
    out.write_u64_le(bytes.len() as u64)?;
    out.write_all(bytes)
}

/// Reads what [`write_prefixed`] wrote and decodes it.
pub fn read_prefixed<T: serde::de::DeserializeOwned>(input: &mut dyn io::Read) -> io::Result<T> {
    let len = input.read_u64_le()?;
    let bytes = input.read_len_bytes(len)?;
    decode(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Commands a client may send; the others are steps of a transfer and only come as follow-ups.
fn from_clients(command: &Command) -> bool {
    if let Command::Batch(commands) = command {
        return commands.iter().all(from_clients);
    }
    matches!(
        command,
        Command::CreateParticipant { .. }
            | Command::SetNdc { .. }
            | Command::Prepare(_)
            | Command::PrepareKnownPayee(_)
            | Command::Fulfil { .. }
            | Command::Reject { .. }
            | Command::Tick
    )
}

/// The archive key of a final transfer: the same as its owner's.
pub fn transfer_archive_key(id: TransferId) -> Vec<u8> {
    owner_key(&Owner::Transfer(id))
}

/// The archive key of a full chunk of a participant's entry log: `e`, the name's length, the name, the
/// chunk's index.
pub fn entries_archive_key(participant: &str, chunk: u64) -> Vec<u8> {
    let mut key = vec![b'e', participant.len() as u8];
    key.extend_from_slice(participant.as_bytes());
    key.extend_from_slice(&chunk.to_be_bytes());
    key
}

/// What the ledger archived, as the engine's archive holds it: a transfer or a chunk of entries.
pub fn decode_archived<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> T {
    decode(bytes).expect("the ledger archives only what it encoded")
}

/// The domain's archive is the engine's, on this partition. What it archives is encoded in the
/// command's scratch buffer.
struct EngineArchive<'e, 'a> {
    effects: &'e mut Effects<'a>,
    scratch: &'e mut Vec<u8>,
}

impl EngineArchive<'_, '_> {
    fn put<T: serde::Serialize>(&mut self, key: &[u8], value: &T) {
        self.scratch.clear();
        encode_into(value, self.scratch);
        self.effects.archive(key, self.scratch);
    }
}

impl LedgerArchive for EngineArchive<'_, '_> {
    fn put_transfer(&mut self, transfer: &Transfer) {
        self.put(&transfer_archive_key(transfer.spec.id), transfer);
    }

    fn transfer(&self, id: TransferId) -> Option<Transfer> {
        (self.effects.archived(&transfer_archive_key(id))).map(|bytes| decode_archived(&bytes))
    }

    fn put_entries(&mut self, participant: &str, chunk: u64, entries: &[Entry]) {
        self.put(&entries_archive_key(participant, chunk), &entries);
    }
}

#[derive(Debug, Default)]
pub struct LedgerState {
    pub ledger: LedgerPartition,
    /// A snapshot began and its first step is still to come.
    first_snapshot_step_due: bool,
}

impl LedgerState {
    /// Reads exactly what the snapshot's steps wrote (other apps' state follows in the stream).
    pub fn restore(input: &mut dyn io::Read) -> io::Result<Self> {
        Ok(Self {
            ledger: LedgerPartition::read_snapshot(input)?,
            first_snapshot_step_due: false,
        })
    }
}

impl StateMachine for LedgerState {
    fn apply(&mut self, command: &spate_engine::Command<'_>, effects: &mut Effects<'_>) {
        let reply = match decode::<Command>(command.payload) {
            Err(error) => Reply::Refused(crate::domain::Refusal {
                code: crate::domain::ErrorCode::Validation,
                message: format!("undecodable ledger command: {error}"),
            }),
            Ok(decoded)
                if matches!(command.envelope.origin, Origin::Client { .. })
                    && !from_clients(&decoded) =>
            {
                Reply::Refused(crate::domain::Refusal {
                    code: crate::domain::ErrorCode::Validation,
                    message: "this step of a transfer is internal".into(),
                })
            }
            Ok(decoded) => {
                let (here_partition, partition_count) =
                    (effects.partition(), effects.partition_count());
                let here = |owner: &Owner| {
                    spate_engine::partition_of(&owner_key(owner), partition_count) == here_partition
                };
                let mut scratch = Vec::with_capacity(SCRATCH_BYTES);
                let mut context = Context {
                    now_ms: command.envelope.timestamp_ms,
                    here: &here,
                    archive: &mut EngineArchive {
                        effects: &mut *effects,
                        scratch: &mut scratch,
                    },
                };
                let out = self.ledger.apply(decoded, &mut context);
                for event in &out.events {
                    scratch.clear();
                    encode_into::<Event>(event, &mut scratch);
                    effects.emit(&scratch);
                }
                let grouped = group_follow_ups(out.follow_ups, |owner| {
                    effects.partition_of(&owner_key(owner))
                });
                for (owner, follow_up) in &grouped {
                    effects.follow_up(&owner_key(owner), encode(follow_up));
                }
                out.reply.expect("the domain answers every command")
            }
        };
        encode_into(&reply, effects.reply());
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        self.ledger.write_snapshot(out)
    }

    fn begin_snapshot(&mut self) -> bool {
        self.ledger.begin_snapshot();
        self.first_snapshot_step_due = true;
        true
    }

    fn write_snapshot_step(
        &mut self,
        out: &mut dyn io::Write,
        bytes_budget: usize,
    ) -> io::Result<bool> {
        let first = std::mem::take(&mut self.first_snapshot_step_due);
        self.ledger.snapshot_step(out, bytes_budget, first)
    }
}
