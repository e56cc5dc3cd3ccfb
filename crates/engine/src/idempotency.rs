//! Remembers the replies of recent client command ids so that a retry returns the original reply instead
//! of applying twice.
//!
//! Eviction is driven by the commands' own timestamps and by bounds on entries and bytes, never by the
//! clock, so replay rebuilds exactly the same table.

use crate::CommandId;
use crate::journal::Lsn;
use crate::wire::{CountingWriter, ReadLe, WriteLe};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::io::Write as _;

/// Largest reply the table keeps; a snapshot holding a larger one is corrupt.
const REPLY_BYTES_MAX: usize = 16 * 1024 * 1024;

/// What an entry holds besides its reply: the id, digest, LSN and timestamp in the map and the queue,
/// and the map's own slack; counted against the table's bound on bytes with each reply.
const ENTRY_OVERHEAD_BYTES: usize = 96;

fn entry_bytes(reply_bytes: usize) -> usize {
    ENTRY_OVERHEAD_BYTES + reply_bytes
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    payload_digest: u64,
    lsn: Lsn,
    reply: Box<[u8]>,
}

/// What the table knows about a command id.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen<'a> {
    New,
    /// Same id, same payload: the original's reply.
    Same {
        reply: &'a [u8],
        lsn: Lsn,
    },
    /// Same id, different payload: a client bug or a reused key.
    Different,
}

#[derive(Debug, Clone)]
pub(crate) struct IdempotencyTable {
    entries: HashMap<CommandId, Entry>,
    /// Insertion order with timestamps, oldest first: the eviction queue.
    order: VecDeque<(CommandId, u64)>,
    window_ms: u64,
    entries_max: usize,
    /// Bound on the entries' bytes (replies and [`ENTRY_OVERHEAD_BYTES`] each); one reply over it is
    /// still kept, alone.
    bytes_max: usize,
    /// The entries' bytes as [`entry_bytes`] counts them.
    bytes: usize,
    /// Position of `order`'s front among every entry this table held since it was created or restored.
    front_position: u64,
    /// The snapshot being written in steps: the positions still to write.
    snapshot: Option<std::ops::Range<u64>>,
    /// What the snapshot wrote out of turn: its count, and entries evicted before their turn came.
    preserved: Vec<u8>,
}

/// Equal content; where a snapshot stands is not content.
impl PartialEq for IdempotencyTable {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
            && self.order == other.order
            && (self.window_ms, self.entries_max, self.bytes_max)
                == (other.window_ms, other.entries_max, other.bytes_max)
    }
}

impl Eq for IdempotencyTable {}

impl IdempotencyTable {
    pub fn new(window_ms: u64, entries_max: usize, bytes_max: usize) -> Self {
        assert!(
            entries_max > 0,
            "an idempotency table must hold at least one entry"
        );
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            window_ms,
            entries_max,
            bytes_max,
            bytes: 0,
            front_position: 0,
            snapshot: None,
            preserved: Vec::new(),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn check(&self, command_id: CommandId, payload_digest: u64) -> Seen<'_> {
        match self.entries.get(&command_id) {
            None => Seen::New,
            Some(entry) if entry.payload_digest == payload_digest => Seen::Same {
                reply: &entry.reply,
                lsn: entry.lsn,
            },
            Some(_) => Seen::Different,
        }
    }

    /// Records a newly applied command, evicting what fell out of the window (measured from `timestamp_ms`)
    /// or over the bounds on entries and bytes, oldest first.
    pub fn insert(
        &mut self,
        command_id: CommandId,
        payload_digest: u64,
        lsn: Lsn,
        timestamp_ms: u64,
        reply: &[u8],
    ) {
        let horizon_ms = timestamp_ms.saturating_sub(self.window_ms);
        let adding = entry_bytes(reply.len());
        while let Some(&(oldest, at_ms)) = self.order.front() {
            let fits = self.order.len() < self.entries_max && self.bytes + adding <= self.bytes_max;
            if at_ms >= horizon_ms && fits {
                break;
            }
            self.preserve_front();
            self.order.pop_front();
            self.front_position += 1;
            let evicted = self.entries.remove(&oldest).expect("queued ids are held");
            self.bytes -= entry_bytes(evicted.reply.len());
        }
        self.bytes += adding;
        let previous = self.entries.insert(
            command_id,
            Entry {
                payload_digest,
                lsn,
                reply: reply.into(),
            },
        );
        assert!(
            previous.is_none(),
            "command id {command_id} applied twice: the check before apply was skipped"
        );
        self.order.push_back((command_id, timestamp_ms));
        debug_assert_eq!(self.order.len(), self.entries.len());
    }

    /// Writes the entry at `position` (it must be held).
    fn write_entry(&self, position: u64, out: &mut dyn io::Write) -> io::Result<()> {
        let index = usize::try_from(position - self.front_position).expect("a held position");
        let (command_id, timestamp_ms) = self.order[index];
        let entry = &self.entries[&command_id];
        out.write_all(&command_id.to_le_bytes())?;
        out.write_u64_le(timestamp_ms)?;
        out.write_u64_le(entry.payload_digest)?;
        out.write_u64_le(entry.lsn)?;
        out.write_bytes_le(&entry.reply)
    }

    /// Starts a snapshot of the table as it is now, which [`Self::snapshot_step`] writes. Entries never
    /// change once inserted, and new ones go after the snapshot's end: only an eviction can take one the
    /// snapshot has yet to write, and `preserve_front` writes it first.
    pub fn begin_snapshot(&mut self) {
        assert!(self.snapshot.is_none(), "one snapshot at a time");
        let end = self.front_position + self.order.len() as u64;
        self.preserved.clear();
        self.preserved
            .write_u64_le(self.order.len() as u64)
            .expect("writing to a Vec cannot fail");
        self.snapshot = Some(self.front_position..end);
    }

    fn preserve_front(&mut self) {
        if let Some(pending) = &mut self.snapshot
            && pending.start == self.front_position
            && !pending.is_empty()
        {
            pending.start += 1;
            let mut preserved = std::mem::take(&mut self.preserved);
            self.write_entry(self.front_position, &mut preserved)
                .expect("writing to a Vec cannot fail");
            self.preserved = preserved;
        }
    }

    /// Writes what was written out of turn, then entries until about `bytes_budget` bytes are written;
    /// true once the snapshot begun last is whole: the table as it was when the snapshot began.
    pub fn snapshot_step(
        &mut self,
        out: &mut dyn io::Write,
        bytes_budget: usize,
    ) -> io::Result<bool> {
        let mut pending = self.snapshot.clone().expect("a snapshot is in progress");
        let mut out = CountingWriter::new(out);
        out.write_all(&self.preserved)?;
        self.preserved.clear();
        while !pending.is_empty() && out.bytes < bytes_budget {
            self.write_entry(pending.start, &mut out)?;
            pending.start += 1;
        }
        let done = pending.is_empty();
        self.snapshot = (!done).then_some(pending);
        Ok(done)
    }

    /// The whole table at once: what a stepped snapshot must equal.
    #[cfg(test)]
    pub fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_u64_le(self.order.len() as u64)?;
        let end = self.front_position + self.order.len() as u64;
        for position in self.front_position..end {
            self.write_entry(position, out)?;
        }
        Ok(())
    }

    pub fn restore(&mut self, input: &mut dyn io::Read) -> io::Result<()> {
        let count = input.read_u64_le()?;
        self.entries.clear();
        self.order.clear();
        self.front_position = 0;
        self.bytes = 0;
        for _ in 0..count {
            let command_id = u128::from_le_bytes(input.read_le_array()?);
            let timestamp_ms = input.read_u64_le()?;
            let payload_digest = input.read_u64_le()?;
            let lsn = input.read_u64_le()?;
            let reply = input.read_bytes_le(REPLY_BYTES_MAX)?.into_boxed_slice();
            self.bytes += entry_bytes(reply.len());
            self.entries.insert(
                command_id,
                Entry {
                    payload_digest,
                    lsn,
                    reply,
                },
            );
            self.order.push_back((command_id, timestamp_ms));
        }
        if self.entries.len() != self.order.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "duplicate command id in snapshot",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_payload_returns_the_reply_and_a_different_one_is_flagged() {
        let mut table = IdempotencyTable::new(1_000, 10, usize::MAX);
        assert_eq!(table.check(1, 11), Seen::New);
        table.insert(1, 11, 5, 100, b"ok");
        assert_eq!(
            table.check(1, 11),
            Seen::Same {
                reply: b"ok",
                lsn: 5
            }
        );
        assert_eq!(table.check(1, 12), Seen::Different);
    }

    #[test]
    fn evicts_by_command_time_and_by_count() {
        let mut table = IdempotencyTable::new(1_000, 3, usize::MAX);
        table.insert(1, 0, 0, 0, b"");
        table.insert(2, 0, 1, 500, b"");
        table.insert(3, 0, 2, 1_200, b""); // 1 is now older than the window
        assert_eq!(table.check(1, 0), Seen::New);
        assert_eq!(table.len(), 2);
        table.insert(4, 0, 3, 1_300, b"");
        table.insert(5, 0, 4, 1_400, b""); // over the count bound: 2 goes
        assert_eq!(table.check(2, 0), Seen::New);
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn evicts_by_bytes_oldest_first_and_counts_them_back_on_restore() {
        let bound = 3 * entry_bytes(1_000);
        let mut table = IdempotencyTable::new(1_000_000, 100, bound);
        for id in 0..3u128 {
            table.insert(id, 0, id as u64, 0, &[7; 1_000]);
        }
        assert_eq!(table.len(), 3);
        table.insert(3, 0, 3, 0, &[7; 1_000]); // over the bound by one reply: the oldest goes
        assert_eq!(table.check(0, 0), Seen::New);
        assert!(matches!(table.check(1, 0), Seen::Same { .. }));
        assert_eq!((table.len(), table.bytes), (3, bound));
        table.insert(4, 0, 4, 0, &[7; 2_500]); // needs the room of three
        assert_eq!(table.len(), 1);
        table.insert(5, 0, 5, 0, &[7; 10_000]); // over the bound alone: kept, alone
        assert_eq!(table.len(), 1);
        assert!(matches!(table.check(5, 0), Seen::Same { .. }));

        let mut bytes = Vec::new();
        table.write_snapshot(&mut bytes).unwrap();
        let mut restored = IdempotencyTable::new(1_000_000, 100, bound);
        restored.restore(&mut bytes.as_slice()).unwrap();
        assert_eq!(restored.bytes, table.bytes);
        assert_eq!(restored, table);
    }

    #[test]
    fn a_stepped_snapshot_is_the_table_at_its_start_despite_evictions() {
        let mut table = IdempotencyTable::new(1_000_000, 6, usize::MAX);
        for id in 0..6u128 {
            table.insert(id, id as u64, id as u64, id as u64, &[id as u8; 20]);
        }
        let mut whole = Vec::new();
        table.write_snapshot(&mut whole).unwrap();
        table.begin_snapshot();
        let mut stepped = Vec::new();
        let mut id = 6;
        // One entry per step, and between steps an insert that evicts the oldest entry, which the
        // snapshot has yet to write from the second step on.
        while !table.snapshot_step(&mut stepped, 1).unwrap() {
            table.insert(id, 0, id as u64, id as u64, b"new");
            id += 1;
        }
        assert_eq!(stepped, whole);
        assert_eq!(
            table.check(0, 0),
            Seen::New,
            "the oldest entries were evicted"
        );
        let mut restored = IdempotencyTable::new(1_000_000, 6, usize::MAX);
        restored.restore(&mut stepped.as_slice()).unwrap();
        assert_eq!(restored.len(), 6);
    }

    #[test]
    fn snapshot_round_trip_keeps_order_and_replies() {
        let mut table = IdempotencyTable::new(1_000, 10, usize::MAX);
        for id in 0..5u128 {
            table.insert(id, id as u64 * 7, id as u64, id as u64 * 10, &[id as u8; 3]);
        }
        let mut bytes = Vec::new();
        table.write_snapshot(&mut bytes).unwrap();
        let mut restored = IdempotencyTable::new(1_000, 10, usize::MAX);
        restored.restore(&mut bytes.as_slice()).unwrap();
        assert_eq!(restored, table);
    }
}
