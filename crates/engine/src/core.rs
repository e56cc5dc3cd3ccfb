//! The deterministic state of one partition: the apps' state machines plus the engine's own bookkeeping
//! (idempotency table, follow-up outbox and inbox sequence numbers, the partition clock).
//!
//! [`Core::apply`] is the only way state changes, used alike for live commands and for journal replay:
//! that is what makes replay rebuild the same state, replies and events.

use crate::app::{Command, Effects, FollowUpRequest, StateMachine};
use crate::archive::{Archive, ArchivedRecord};
use crate::idempotency::{IdempotencyTable, Seen};
use crate::journal::Lsn;
use crate::record::{Envelope, Origin};
use crate::wire::{ReadLe, WriteLe};
use crate::{AppId, PartitionId};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

/// A follow-up waiting for its destination to make it durable.
#[derive(Debug, Clone)]
pub(crate) struct FollowUp {
    pub source: PartitionId,
    pub seq: u64,
    pub app: AppId,
    pub payload: Arc<[u8]>,
}

/// A follow-up produced by an apply, to be sent once the command that produced it is durable.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub destination: PartitionId,
    pub follow_up: FollowUp,
}

/// Follow-ups this partition sent and has not seen acknowledged, per destination, in sequence order.
#[derive(Debug, Default)]
struct Lane {
    next_seq: u64,
    unacknowledged: VecDeque<FollowUp>,
}

pub(crate) struct Core {
    pub partition: PartitionId,
    pub partition_count: u16,
    /// LSN the next applied record gets.
    pub next_lsn: Lsn,
    /// Timestamps only grow within a partition; the next stamp is at least this.
    pub last_timestamp_ms: u64,
    /// The envelope's random of the record before `next_lsn`, which a snapshot keeps: recovery checks
    /// it against the journal's record there, so that a snapshot of another history (a fenced node's
    /// records that never reached a shared log) is never continued with this journal. `None` before the
    /// first record, and from a snapshot of format 4 or older.
    pub last_record_random: Option<u64>,
    pub apps: Vec<(AppId, Box<dyn StateMachine>)>,
    pub archive: Archive,
    idempotency: IdempotencyTable,
    lanes: Vec<Lane>,
    /// Highest follow-up sequence applied from each source partition.
    applied_from: Vec<u64>,
    reply: Vec<u8>,
    follow_ups: Vec<FollowUpRequest>,
}

/// The verdict on a client command before apply.
pub(crate) enum Admission<'a> {
    Apply,
    Duplicate { reply: &'a [u8], lsn: Lsn },
    Conflict,
}

impl Core {
    pub fn new(
        partition: PartitionId,
        partition_count: u16,
        apps: Vec<(AppId, Box<dyn StateMachine>)>,
        idempotency: IdempotencyTable,
        archive: Archive,
    ) -> Self {
        let peers = usize::from(partition_count);
        Self {
            partition,
            partition_count,
            next_lsn: 0,
            last_timestamp_ms: 0,
            last_record_random: None,
            apps,
            archive,
            idempotency,
            lanes: (0..peers)
                .map(|_| Lane {
                    next_seq: 1,
                    unacknowledged: VecDeque::new(),
                })
                .collect(),
            applied_from: vec![0; peers],
            reply: Vec::new(),
            follow_ups: Vec::new(),
        }
    }

    pub fn has_app(&self, app: AppId) -> bool {
        self.apps.iter().any(|(id, _)| *id == app)
    }

    pub fn app_state(&self, app: AppId) -> Option<&dyn StateMachine> {
        self.apps
            .iter()
            .find(|(id, _)| *id == app)
            .map(|(_, state)| state.as_ref())
    }

    pub fn admit(&self, command_id: Option<u128>, payload: &[u8]) -> Admission<'_> {
        let Some(command_id) = command_id else {
            return Admission::Apply;
        };
        match self.idempotency.check(command_id, payload_digest(payload)) {
            Seen::New => Admission::Apply,
            Seen::Same { reply, lsn } => Admission::Duplicate { reply, lsn },
            Seen::Different => Admission::Conflict,
        }
    }

    /// True if a follow-up from `source` with `seq` was already applied (a resend after recovery).
    pub fn already_applied(&self, source: PartitionId, seq: u64) -> bool {
        seq <= self.applied_from[usize::from(source)]
    }

    /// The number of unacknowledged follow-ups on the fullest lane.
    pub fn unacknowledged_max(&self) -> usize {
        self.lanes
            .iter()
            .map(|l| l.unacknowledged.len())
            .max()
            .unwrap_or(0)
    }

    pub fn acknowledge(&mut self, destination: PartitionId, seq: u64) {
        let lane = &mut self.lanes[usize::from(destination)];
        while lane.unacknowledged.front().is_some_and(|f| f.seq <= seq) {
            lane.unacknowledged.pop_front();
        }
    }

    /// The sequence number the next follow-up from `source` must have to be applied.
    pub fn next_follow_up_from(&self, source: PartitionId) -> u64 {
        self.applied_from[usize::from(source)] + 1
    }

    /// Every follow-up not yet acknowledged, for resending after recovery.
    pub fn unacknowledged(&self) -> impl Iterator<Item = Outgoing> + '_ {
        (0..self.lanes.len())
            .flat_map(|destination| self.unacknowledged_to(destination as PartitionId))
    }

    /// The follow-ups to `destination` not yet acknowledged, oldest first.
    pub fn unacknowledged_to(
        &self,
        destination: PartitionId,
    ) -> impl Iterator<Item = Outgoing> + '_ {
        self.lanes[usize::from(destination)]
            .unacknowledged
            .iter()
            .map(move |f| Outgoing {
                destination,
                follow_up: f.clone(),
            })
    }

    /// Per destination, the sequence number of the oldest unacknowledged follow-up (`None`: all acknowledged).
    pub fn oldest_unacknowledged(&self) -> Vec<Option<u64>> {
        self.lanes
            .iter()
            .map(|lane| lane.unacknowledged.front().map(|f| f.seq))
            .collect()
    }

    /// Applies one record at `self.next_lsn`. Events are appended to `events`, follow-ups to `sent`,
    /// archived records to `archived` (with an archive store); returns the reply. The caller has
    /// admitted the command (no duplicate id, known app).
    pub fn apply(
        &mut self,
        envelope: &Envelope,
        payload: &[u8],
        events: &mut Vec<u8>,
        sent: &mut Vec<Outgoing>,
        archived: &mut Vec<ArchivedRecord>,
    ) -> &[u8] {
        assert!(
            envelope.timestamp_ms >= self.last_timestamp_ms,
            "partition time went backwards: {} < {}",
            envelope.timestamp_ms,
            self.last_timestamp_ms
        );
        self.last_timestamp_ms = envelope.timestamp_ms;
        self.last_record_random = Some(envelope.random);
        if let Origin::FollowUp { source, seq } = envelope.origin {
            let applied = &mut self.applied_from[usize::from(source)];
            assert_eq!(
                seq,
                *applied + 1,
                "follow-ups from partition {source} must arrive in order without gaps"
            );
            *applied = seq;
        }
        let state = &mut self
            .apps
            .iter_mut()
            .find(|(id, _)| *id == envelope.app)
            .expect("the caller checked that the app exists")
            .1;
        self.reply.clear();
        let mut effects = Effects {
            reply: &mut self.reply,
            events,
            follow_ups: &mut self.follow_ups,
            partition: self.partition,
            partition_count: self.partition_count,
            archive: &mut self.archive,
            app: envelope.app,
            lsn: self.next_lsn,
        };
        state.apply(
            &Command {
                envelope: *envelope,
                payload,
            },
            &mut effects,
        );
        for request in self.follow_ups.drain(..) {
            let lane = &mut self.lanes[usize::from(request.destination)];
            let follow_up = FollowUp {
                source: self.partition,
                seq: lane.next_seq,
                app: envelope.app,
                payload: request.payload.into(),
            };
            lane.next_seq += 1;
            lane.unacknowledged.push_back(follow_up.clone());
            sent.push(Outgoing {
                destination: request.destination,
                follow_up,
            });
        }
        if let Origin::Client {
            command_id: Some(command_id),
        } = envelope.origin
        {
            self.idempotency.insert(
                command_id,
                payload_digest(payload),
                self.next_lsn,
                envelope.timestamp_ms,
                &self.reply,
            );
        }
        self.archive.move_outbox_into(archived);
        self.next_lsn += 1;
        &self.reply
    }

    /// Writes the engine's bookkeeping but the idempotency table (see [`Self::idempotency`]): one
    /// snapshot section. It ends with the archive's records not yet in its store (all of them without
    /// a store).
    pub fn write_bookkeeping(&self, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_u64_le(self.next_lsn)?;
        out.write_u64_le(self.last_timestamp_ms)?;
        out.write_u8_le(u8::from(self.last_record_random.is_some()))?;
        out.write_u64_le(self.last_record_random.unwrap_or(0))?;
        for (lane, applied) in self.lanes.iter().zip(&self.applied_from) {
            out.write_u64_le(*applied)?;
            out.write_u64_le(lane.next_seq)?;
            out.write_u64_le(lane.unacknowledged.len() as u64)?;
            for follow_up in &lane.unacknowledged {
                out.write_u64_le(follow_up.seq)?;
                out.write_u8_le(follow_up.app)?;
                out.write_bytes_le(&follow_up.payload)?;
            }
        }
        Ok(())
    }

    /// Reads what [`Self::write_bookkeeping`] wrote; a snapshot of format 1 also holds the idempotency
    /// table, between the clock and the lanes; format 3 ends with the archive (which has a section of
    /// its own at the end from format 4 on), formats before 3 have none; formats before 5 do not name
    /// their last record.
    pub fn restore_bookkeeping(
        &mut self,
        input: &mut dyn io::Read,
        format_version: u32,
    ) -> io::Result<()> {
        self.next_lsn = input.read_u64_le()?;
        self.last_timestamp_ms = input.read_u64_le()?;
        self.last_record_random = None;
        if format_version >= 5 {
            let known = input.read_u8_le()? != 0;
            let random = input.read_u64_le()?;
            self.last_record_random = known.then_some(random);
        }
        if format_version == 1 {
            self.idempotency.restore(input)?;
        }
        for (lane, applied) in self.lanes.iter_mut().zip(self.applied_from.iter_mut()) {
            *applied = input.read_u64_le()?;
            lane.next_seq = input.read_u64_le()?;
            let count = input.read_u64_le()?;
            lane.unacknowledged.clear();
            for _ in 0..count {
                let seq = input.read_u64_le()?;
                let app = input.read_u8_le()?;
                let payload = input.read_bytes_le(crate::record::RECORD_BYTES_MAX)?.into();
                lane.unacknowledged.push_back(FollowUp {
                    source: self.partition,
                    seq,
                    app,
                    payload,
                });
            }
        }
        if format_version == 3 {
            self.archive.restore_snapshot(input, format_version)?;
        }
        Ok(())
    }
}

impl Core {
    /// The idempotency table, which a snapshot writes in steps, in a section of its own after the apps'.
    pub fn idempotency(&mut self) -> &mut IdempotencyTable {
        &mut self.idempotency
    }
}

pub(crate) fn payload_digest(payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::Seen;

    /// Snapshot format 1 kept the idempotency table inside the bookkeeping section, between the clock
    /// and the lanes: a data directory written by an older binary must still start.
    #[test]
    fn bookkeeping_of_format_1_is_still_read() {
        let mut table = IdempotencyTable::new(60_000, 10, usize::MAX);
        table.insert(7, 70, 3, 1_000, b"reply");
        let mut bytes = Vec::new();
        bytes.write_u64_le(42).unwrap(); // next LSN
        bytes.write_u64_le(1_000).unwrap(); // last timestamp
        table.write_snapshot(&mut bytes).unwrap();
        for value in [0, 1, 0] {
            // One lane: applied from it, next sequence, no unacknowledged follow-up.
            bytes.write_u64_le(value).unwrap();
        }
        let mut core = Core::new(
            0,
            1,
            Vec::new(),
            IdempotencyTable::new(60_000, 10, usize::MAX),
            crate::archive::Archive::new(None),
        );
        core.restore_bookkeeping(&mut bytes.as_slice(), 1).unwrap();
        assert_eq!(core.next_lsn, 42);
        assert_eq!(
            core.idempotency.check(7, 70),
            Seen::Same {
                reply: b"reply",
                lsn: 3
            }
        );
    }

    fn empty_core() -> Core {
        Core::new(
            0,
            1,
            Vec::new(),
            IdempotencyTable::new(60_000, 10, usize::MAX),
            crate::archive::Archive::new(None),
        )
    }

    /// From format 5 the bookkeeping names the record a snapshot ends at; before, nothing does, and a
    /// restored core then has no record for recovery to check.
    #[test]
    fn bookkeeping_names_the_last_record_from_format_5_on() {
        let mut core = empty_core();
        core.next_lsn = 9;
        core.last_record_random = Some(0xfeed);
        let mut bytes = Vec::new();
        core.write_bookkeeping(&mut bytes).unwrap();
        let mut restored = empty_core();
        restored
            .restore_bookkeeping(&mut bytes.as_slice(), 5)
            .unwrap();
        assert_eq!(
            (restored.next_lsn, restored.last_record_random),
            (9, Some(0xfeed))
        );

        let mut format_4 = Vec::new();
        for value in [9, 1_000, 0, 1, 0] {
            // Next LSN, last timestamp, then one lane: applied from it, next sequence, none pending.
            format_4.write_u64_le(value).unwrap();
        }
        restored
            .restore_bookkeeping(&mut format_4.as_slice(), 4)
            .unwrap();
        assert_eq!((restored.next_lsn, restored.last_record_random), (9, None));
    }
}
