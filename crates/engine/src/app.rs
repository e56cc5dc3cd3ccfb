//! The interface between the engine and an app: everything an app crate implements to run on spate.
//!
//! An app is a deterministic state machine per partition ([`StateMachine`]), optionally with a read model
//! fed by its events ([`Projection`]). The engine never interprets payloads, replies or events: they are
//! the app's bytes.

use crate::archive::{Archive, ArchiveReader};
use crate::journal::Lsn;
use crate::record::{Envelope, push_event};
use crate::{AppId, PartitionId};
use std::any::Any;
use std::io;

/// A command as apply sees it: the app's payload plus what the engine stamped on it at ingest.
#[derive(Debug, Clone, Copy)]
pub struct Command<'a> {
    pub envelope: Envelope,
    pub payload: &'a [u8],
}

/// A command for another partition, emitted by apply and delivered exactly once after the emitting
/// command is durable (see ARCHITECTURE.md, "Cross-partition work").
#[derive(Debug, Clone)]
pub(crate) struct FollowUpRequest {
    pub destination: PartitionId,
    pub payload: Vec<u8>,
}

/// What apply produces besides state changes: a reply, events for projections, follow-ups.
pub struct Effects<'a> {
    pub(crate) reply: &'a mut Vec<u8>,
    pub(crate) events: &'a mut Vec<u8>,
    pub(crate) follow_ups: &'a mut Vec<FollowUpRequest>,
    pub(crate) partition: PartitionId,
    pub(crate) partition_count: u16,
    pub(crate) archive: &'a mut Archive,
    pub(crate) app: AppId,
    pub(crate) lsn: Lsn,
}

impl Effects<'_> {
    /// The partition applying this command.
    pub fn partition(&self) -> PartitionId {
        self.partition
    }

    /// The reply buffer, empty when apply starts. Its bytes go back to the caller once the command is durable.
    pub fn reply(&mut self) -> &mut Vec<u8> {
        self.reply
    }

    /// Records an event; projections of this app receive it after the command is durable.
    pub fn emit(&mut self, event: &[u8]) {
        push_event(self.events, event);
    }

    /// The number of partitions: [`crate::partition_of`] a key with it gives [`Self::partition_of`].
    pub fn partition_count(&self) -> u16 {
        self.partition_count
    }

    /// The partition that owns `key`: where [`Self::follow_up`] sends a command with that key. Apps that
    /// send many follow-ups group them by it, one command per destination.
    pub fn partition_of(&self, key: &[u8]) -> PartitionId {
        crate::partition_of(key, self.partition_count)
    }

    /// Sends a command of the same app to the partition that owns `key`. The engine applies it there
    /// exactly once, after this command, even across crashes: on another partition once this command is
    /// durable, on this one right away in the same group commit. It arrives as a command with
    /// [`crate::Origin::FollowUp`]; chains of follow-ups must end.
    pub fn follow_up(&mut self, key: &[u8], payload: Vec<u8>) {
        let destination = self.partition_of(key);
        self.follow_ups.push(FollowUpRequest {
            destination,
            payload,
        });
    }

    /// Moves a final record out of the app's memory into the partition's archive (on disk with the
    /// embedded journal): [`Self::archived`] and queries (`EngineHandle::query_archive`) find it by
    /// `key` from now on, across restarts. A key is archived at most once: what is archived never
    /// changes.
    pub fn archive(&mut self, key: &[u8], value: &[u8]) {
        self.archive.put(self.app, self.lsn, key, value);
    }

    /// What this app archived under `key` on this partition before this command.
    ///
    /// # Panics
    /// If the archive store cannot be read (a damaged disk): apply cannot go on without the answer,
    /// and a guess would make the state differ from the journal's.
    pub fn archived(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.archive
            .get(self.app, key, self.lsn)
            .unwrap_or_else(|error| panic!("partition {}: {error}", self.partition))
    }
}

/// One app's state on one partition. Only the partition's thread ever touches it, but for its drop: when
/// the engine shuts down, the states are dropped on threads of their own after the stop has answered,
/// and a process that exits first never drops them. A state must hold nothing whose drop matters.
pub trait StateMachine: Any + Send {
    /// Applies one command. Must be deterministic: the result depends only on `self` and `command`
    /// (time and randomness are in `command.envelope`), never on the clock, a random source or I/O,
    /// so that replaying the journal rebuilds the same state, replies and events.
    fn apply(&mut self, command: &Command<'_>, effects: &mut Effects<'_>);

    /// Writes the whole state; [`AppSpec::restore`] must read it back.
    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()>;

    /// Starts a snapshot. A state that writes its snapshot in steps returns true: from now on
    /// [`Self::write_snapshot_step`] writes the state as it is at this moment, however apply changes it
    /// between steps (see [`crate::SegmentedMap`]). The default returns false: the engine then writes
    /// the whole state with [`Self::write_snapshot`] at once, and the partition applies nothing meanwhile.
    fn begin_snapshot(&mut self) -> bool {
        false
    }

    /// Called only after [`Self::begin_snapshot`] returned true: writes the next part of the snapshot,
    /// about `bytes_budget` bytes, so that a step does not hold the partition up for long; true once it
    /// is all written. [`AppSpec::restore`] must read the parts back as one. The default writes the whole
    /// state.
    fn write_snapshot_step(
        &mut self,
        out: &mut dyn io::Write,
        _bytes_budget: usize,
    ) -> io::Result<bool> {
        self.write_snapshot(out)?;
        Ok(true)
    }

    /// Answers a read that may come from another node (see `EngineHandle::read`): the query and the
    /// answer are the app's bytes, since a closure cannot travel; `archive` holds what the app archived
    /// on this partition. Apps whose reads each need only one partition have no use for it and keep
    /// this default, which answers nothing. A query may come from another node running another
    /// version: an unknown one gets an empty answer, never a panic.
    fn read(&self, _query: &[u8], _archive: &ArchiveReader<'_>) -> Vec<u8> {
        Vec::new()
    }
}

/// A read model built from an app's events, on its own thread; it may lag the partitions.
pub trait Projection: Send + Sync {
    /// Called for every event of this app in journal order per partition (partitions interleave). An
    /// event it cannot read is an error, never skipped: the read model would then be wrong. At start-up
    /// the engine refuses to start, naming the record; while serving, the read model stops (see
    /// `projection.rs`).
    fn apply(
        &mut self,
        partition: PartitionId,
        lsn: Lsn,
        timestamp_ms: u64,
        event: &[u8],
    ) -> io::Result<()>;
    /// Called after each run of events the projection was handed (the group commits of one pass over
    /// its feed, what a replay read)
    /// and before every checkpoint: a read model that writes its events in batches writes them here.
    fn flush(&mut self) {}
    /// Writes the read model as of the last [`Self::flush`].
    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()>;
    /// True if client requests wait for this read model to apply their events (the ledger's prepares
    /// that are answered once the model settles them): it then passes over its feed as each group
    /// commit comes. Others gather what comes within `EngineConfig::projection_pass_interval` into one
    /// pass and one [`Self::flush`].
    fn requests_wait(&self) -> bool {
        false
    }
    /// Replaces the read model with a snapshot written by `write_snapshot`, which covered each
    /// partition's records below `positions` (indexed by partition).
    fn restore(&mut self, input: &mut dyn io::Read, positions: &[Lsn]) -> io::Result<()>;
}

pub type NewState = dyn Fn(PartitionId) -> Box<dyn StateMachine> + Send + Sync;
pub type RestoreState =
    dyn Fn(PartitionId, &mut dyn io::Read) -> io::Result<Box<dyn StateMachine>> + Send + Sync;

/// How the engine creates and restores an app. One per app crate.
pub struct AppSpec {
    pub id: AppId,
    pub name: &'static str,
    pub new_state: Box<NewState>,
    pub restore: Box<RestoreState>,
    /// True if apply calls `Effects::archive`: the engine then opens the archive's store on disk
    /// (without one, archived records stay in memory and in snapshots).
    pub archives: bool,
    pub projection: Option<Box<dyn Projection>>,
}
