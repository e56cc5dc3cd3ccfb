//! The ledger partition's snapshot: its participants and open transfers, written in steps while apply
//! goes on, each map a segment at a time (see `spate_engine::SegmentedMap`). The expiry index is not
//! written: it is rebuilt from the open transfers.
//!
//! Format: [`STEPPED_FORMAT`], the participants' map, the open transfers' map. Snapshots from before
//! (one postcard value behind its u64 length, written whole) are still read.

use crate::domain::{LedgerPartition, Name, Participant, Transfer, TransferId};
use crate::state::{decode, encode};
use serde::{Deserialize, Serialize};
use spate_engine::wire::{ReadLe, WriteLe};
use spate_engine::{EntryCodec, SegmentedMap};
use std::collections::{BTreeSet, HashMap};
use std::io;

/// Marks a snapshot written in steps. Older snapshots begin with their length, which is never this.
const STEPPED_FORMAT: u64 = u64::MAX;

/// Segments of the participants' map. A participant's encoding is up to one full chunk of its entry
/// log (about 200 KB), which bounds a step's or a forced write's pause.
pub(crate) const PARTICIPANT_SEGMENTS: usize = 64;
/// Segments of the open transfers' map: at the default cap of 10 M open transfers, about 2,400
/// transfers (250 KB) per segment.
pub(crate) const TRANSFER_SEGMENTS: usize = 4096;

/// Bounds on one encoded entry, so that a damaged length cannot ask for gigabytes.
const PARTICIPANT_BYTES_MAX: usize = 16 << 20;
const TRANSFER_BYTES_MAX: usize = 4 << 10;

pub(crate) type Participants = SegmentedMap<Name, Participant, ParticipantCodec>;
pub(crate) type OpenTransfers = SegmentedMap<TransferId, Box<Transfer>, TransferCodec>;

pub(crate) struct ParticipantCodec;

impl EntryCodec<Name, Participant> for ParticipantCodec {
    fn write(name: &Name, participant: &Participant, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_bytes_le(&encode(&(name, participant)))
    }

    fn read(input: &mut dyn io::Read) -> io::Result<(Name, Participant)> {
        decode(&input.read_bytes_le(PARTICIPANT_BYTES_MAX)?).map_err(invalid)
    }
}

/// A transfer is written without its key, which is its id.
pub(crate) struct TransferCodec;

impl EntryCodec<TransferId, Box<Transfer>> for TransferCodec {
    fn write(id: &TransferId, transfer: &Box<Transfer>, out: &mut dyn io::Write) -> io::Result<()> {
        debug_assert_eq!(*id, transfer.spec.id);
        out.write_bytes_le(&encode(transfer))
    }

    fn read(input: &mut dyn io::Read) -> io::Result<(TransferId, Box<Transfer>)> {
        let transfer: Box<Transfer> =
            decode(&input.read_bytes_le(TRANSFER_BYTES_MAX)?).map_err(invalid)?;
        Ok((transfer.spec.id, transfer))
    }
}

fn invalid(error: postcard::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

/// The snapshot format before steps: the whole partition as one postcard value.
#[derive(Serialize, Deserialize)]
struct WholeSnapshot {
    participants: HashMap<Name, Participant>,
    transfers: HashMap<TransferId, Box<Transfer>>,
    expiries: BTreeSet<(u64, TransferId)>,
}

impl LedgerPartition {
    /// Writes the whole partition at once.
    pub fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_u64_le(STEPPED_FORMAT)?;
        self.participants.write_all(out)?;
        self.transfers.write_all(out)
    }

    /// Starts a snapshot of the partition as it is now; [`Self::snapshot_step`] writes it.
    pub fn begin_snapshot(&mut self) {
        self.participants.begin_snapshot();
        self.transfers.begin_snapshot();
    }

    /// Writes about `bytes_budget` bytes of the snapshot in progress; true once it is all written.
    /// The first step (`first`) writes the format; the participants' map comes before the transfers'.
    pub fn snapshot_step(
        &mut self,
        out: &mut dyn io::Write,
        bytes_budget: usize,
        first: bool,
    ) -> io::Result<bool> {
        if first {
            out.write_u64_le(STEPPED_FORMAT)?;
        }
        if self.participants.snapshot_in_progress() {
            self.participants.snapshot_step(out, bytes_budget)?;
            return Ok(false);
        }
        self.transfers.snapshot_step(out, bytes_budget)
    }

    /// Reads what [`Self::write_snapshot`] or a sequence of [`Self::snapshot_step`]s wrote, or a
    /// snapshot in the format before steps.
    pub fn read_snapshot(input: &mut dyn io::Read) -> io::Result<Self> {
        let format_or_len = input.read_u64_le()?;
        let (participants, transfers) = if format_or_len == STEPPED_FORMAT {
            (
                Participants::read(input, PARTICIPANT_SEGMENTS)?,
                OpenTransfers::read(input, TRANSFER_SEGMENTS)?,
            )
        } else {
            let bytes = input.read_len_bytes(format_or_len)?;
            let whole: WholeSnapshot = decode(&bytes).map_err(invalid)?;
            let mut participants = Participants::new(PARTICIPANT_SEGMENTS);
            whole
                .participants
                .into_iter()
                .for_each(|(name, participant)| {
                    participants.insert(name, participant);
                });
            let mut transfers = OpenTransfers::new(TRANSFER_SEGMENTS);
            whole.transfers.into_iter().for_each(|(id, transfer)| {
                transfers.insert(id, transfer);
            });
            (participants, transfers)
        };
        let expiries = (transfers.iter())
            .map(|(&id, transfer)| (transfer.spec.expiration_ms, id))
            .collect();
        Ok(Self {
            participants,
            transfers,
            expiries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EntryLog, TransferSpec, TransferState};

    /// Found by `fuzz/fuzz_targets/snapshot_restore.rs`: a damaged length in a snapshot of the format
    /// before steps made its reader allocate 72 TB and abort the process, instead of refusing.
    #[test]
    fn a_damaged_length_is_refused_without_allocating_it() {
        let damaged: &[u8] = &[0, 0, 0, 0, 0xff, 0x41, 0, 0, 0, 0x6d];
        assert!(LedgerPartition::read_snapshot(&mut &damaged[..]).is_err());
    }

    /// Snapshots written whole before steps existed read back, with the expiry index rebuilt.
    #[test]
    fn a_snapshot_in_the_format_before_steps_is_read() {
        let participant = Participant {
            currency: "USD".into(),
            ndc: 1_000,
            position: 0,
            reserved: 40,
            entries: EntryLog::default(),
        };
        let transfer = Transfer {
            spec: TransferSpec {
                id: 7,
                payer: "dfsp0".into(),
                payee: "dfsp1".into(),
                currency: "USD".into(),
                amount: 40,
                condition: [3; 32],
                expiration_ms: 90_000,
                content_hash: 11,
            },
            state: TransferState::Reserved,
            fulfilment: None,
        };
        let whole = WholeSnapshot {
            participants: HashMap::from([("dfsp0".into(), participant.clone())]),
            transfers: HashMap::from([(7, Box::new(transfer.clone()))]),
            expiries: BTreeSet::from([(90_000, 7)]),
        };
        let encoded = encode(&whole);
        let mut bytes = (encoded.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&encoded);
        bytes.extend_from_slice(b"the next section");

        let mut input = bytes.as_slice();
        let read = LedgerPartition::read_snapshot(&mut input).unwrap();
        assert_eq!(input, b"the next section", "it reads exactly its own bytes");
        assert_eq!(read.participant("dfsp0"), Some(&participant));
        assert_eq!(read.open_transfer(7), Some(&transfer));
        assert_eq!(read.expiries, BTreeSet::from([(90_000, 7)]));
    }
}
