//! The read model over all partitions: every transfer's state and every participant's position, built
//! by a projection from the ledger's events (`GET /participants` lists it; single transfers and
//! participants are read from their partitions). The projection also wakes the requests waiting for a
//! prepared transfer's reservation.

use crate::domain::{Amount, Command, Event, Name, TransferId, TransferSpec, TransferState};
use crate::state::{decode, encode, read_prefixed, write_prefixed};
use crate::waiters::Waiters;
use serde::{Deserialize, Serialize};
use spate_engine::{Lsn, PartitionId, Projection};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{Arc, RwLock};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParticipantView {
    pub currency: Name,
    pub ndc: Amount,
    pub position: Amount,
    pub reserved: Amount,
}

#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerModel {
    /// The state of each transfer not yet COMMITTED or ABORTED. A final state never changes, so final
    /// transfers are only counted: the model's memory follows the transfers in flight, not all ever
    /// made (the rest of a transfer is on its partition).
    pub open_transfers: HashMap<TransferId, TransferState>,
    pub participants: HashMap<Name, ParticipantView>,
    /// Transfers in each state, indexed by [`state_index`].
    transfer_counts: [u64; STATE_NAMES.len()],
}

/// FSPIOP's state names, in the order of [`state_index`].
pub const STATE_NAMES: [&str; 4] = ["RECEIVED", "RESERVED", "COMMITTED", "ABORTED"];

fn state_index(state: TransferState) -> usize {
    match state {
        TransferState::Received => 0,
        TransferState::Reserved => 1,
        TransferState::Committed => 2,
        TransferState::Aborted(_) => 3,
    }
}

impl LedgerModel {
    /// The prepare command for `spec`: one that skips the payee check when this model has seen the payee
    /// created with the transfer's currency (which then holds forever).
    pub fn prepare_command(&self, spec: TransferSpec) -> Command {
        match self.participants.get(&spec.payee) {
            Some(payee) if payee.currency == spec.currency => Command::PrepareKnownPayee(spec),
            _ => Command::Prepare(spec),
        }
    }

    pub fn transfers_in(&self, state: TransferState) -> u64 {
        self.transfer_counts[state_index(state)]
    }

    /// Transfers by FSPIOP state name, every state included.
    pub fn transfer_counts(&self) -> BTreeMap<&'static str, u64> {
        STATE_NAMES.into_iter().zip(self.transfer_counts).collect()
    }

    fn apply(&mut self, event: Event) {
        match event {
            Event::ParticipantCreated {
                name,
                currency,
                ndc,
            } => {
                self.participants.insert(
                    name,
                    ParticipantView {
                        currency,
                        ndc,
                        position: 0,
                        reserved: 0,
                    },
                );
            }
            Event::NdcChanged { name, ndc } => {
                if let Some(p) = self.participants.get_mut(&name) {
                    p.ndc = ndc;
                }
            }
            Event::ParticipantChanged {
                name,
                position,
                reserved,
                ..
            } => {
                let Some(p) = self.participants.get_mut(&name) else {
                    return;
                };
                p.position = position;
                p.reserved = reserved;
            }
            Event::TransferPrepared { id, .. } => {
                self.transfer_counts[state_index(TransferState::Received)] += 1;
                self.open_transfers.insert(id, TransferState::Received);
            }
            Event::TransferChanged { id, state } => {
                if let Some(known) = self.open_transfers.get_mut(&id) {
                    self.transfer_counts[state_index(*known)] -= 1;
                    self.transfer_counts[state_index(state)] += 1;
                    *known = state;
                    if state.is_final() {
                        self.open_transfers.remove(&id);
                    }
                }
            }
        }
    }
}

pub struct LedgerProjection {
    pub model: Arc<RwLock<LedgerModel>>,
    pub waiters: Arc<Waiters>,
}

impl Projection for LedgerProjection {
    fn apply(
        &mut self,
        _partition: PartitionId,
        _lsn: Lsn,
        _timestamp_ms: u64,
        event: &[u8],
    ) -> io::Result<()> {
        let event: Event = decode(event).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("a ledger event: {e}"))
        })?;
        let settled = match &event {
            Event::TransferChanged { id, state } if *state != TransferState::Received => {
                Some((*id, *state))
            }
            _ => None,
        };
        self.model
            .write()
            .expect("the ledger model lock is never poisoned")
            .apply(event);
        if let Some((id, state)) = settled {
            self.waiters.settle(id, state);
        }
        Ok(())
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        let model = self
            .model
            .read()
            .expect("the ledger model lock is never poisoned");
        write_prefixed(out, &encode(&*model))
    }

    /// A prepare its partitions answered RECEIVED waits for this model to settle it (`waiters.rs`).
    fn requests_wait(&self) -> bool {
        true
    }

    fn restore(&mut self, input: &mut dyn io::Read, _positions: &[Lsn]) -> io::Result<()> {
        let restored = read_prefixed(input)?;
        *self
            .model
            .write()
            .expect("the ledger model lock is never poisoned") = restored;
        Ok(())
    }
}
