//! Remembers the replies of recent client command ids so that a retry returns the original reply instead
//! of applying twice.
//!
//! Eviction is driven by the commands' own timestamps and by a count bound, never by the clock, so replay
//! rebuilds exactly the same table.

use crate::CommandId;
use crate::journal::Lsn;
use crate::wire::{ReadLe, WriteLe};
use std::collections::{HashMap, VecDeque};
use std::io;

/// Largest reply the table keeps; a snapshot holding a larger one is corrupt.
const REPLY_BYTES_MAX: usize = 16 * 1024 * 1024;

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdempotencyTable {
    entries: HashMap<CommandId, Entry>,
    /// Insertion order with timestamps, oldest first: the eviction queue.
    order: VecDeque<(CommandId, u64)>,
    window_ms: u64,
    entries_max: usize,
}

impl IdempotencyTable {
    pub fn new(window_ms: u64, entries_max: usize) -> Self {
        assert!(
            entries_max > 0,
            "an idempotency table must hold at least one entry"
        );
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            window_ms,
            entries_max,
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
    /// or over the count bound.
    pub fn insert(
        &mut self,
        command_id: CommandId,
        payload_digest: u64,
        lsn: Lsn,
        timestamp_ms: u64,
        reply: &[u8],
    ) {
        let horizon_ms = timestamp_ms.saturating_sub(self.window_ms);
        while let Some(&(oldest, at_ms)) = self.order.front() {
            if at_ms >= horizon_ms && self.order.len() < self.entries_max {
                break;
            }
            self.order.pop_front();
            self.entries.remove(&oldest);
        }
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

    pub fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_u64_le(self.order.len() as u64)?;
        for (command_id, timestamp_ms) in &self.order {
            let entry = &self.entries[command_id];
            out.write_all(&command_id.to_le_bytes())?;
            out.write_u64_le(*timestamp_ms)?;
            out.write_u64_le(entry.payload_digest)?;
            out.write_u64_le(entry.lsn)?;
            out.write_bytes_le(&entry.reply)?;
        }
        Ok(())
    }

    pub fn restore(&mut self, input: &mut dyn io::Read) -> io::Result<()> {
        let count = input.read_u64_le()?;
        self.entries.clear();
        self.order.clear();
        for _ in 0..count {
            let command_id = u128::from_le_bytes(input.read_le_array()?);
            let timestamp_ms = input.read_u64_le()?;
            let payload_digest = input.read_u64_le()?;
            let lsn = input.read_u64_le()?;
            let reply = input.read_bytes_le(REPLY_BYTES_MAX)?.into_boxed_slice();
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
        let mut table = IdempotencyTable::new(1_000, 10);
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
        let mut table = IdempotencyTable::new(1_000, 3);
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
    fn snapshot_round_trip_keeps_order_and_replies() {
        let mut table = IdempotencyTable::new(1_000, 10);
        for id in 0..5u128 {
            table.insert(id, id as u64 * 7, id as u64, id as u64 * 10, &[id as u8; 3]);
        }
        let mut bytes = Vec::new();
        table.write_snapshot(&mut bytes).unwrap();
        let mut restored = IdempotencyTable::new(1_000, 10);
        restored.restore(&mut bytes.as_slice()).unwrap();
        assert_eq!(restored, table);
    }
}
