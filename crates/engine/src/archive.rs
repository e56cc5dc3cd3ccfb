//! The archive: records an app declared final, moved out of its memory and still answerable by key
//! (see ARCHITECTURE.md, "Archive").
//!
//! A record enters the archive at the LSN of the command that archived it, first in `pending`, in
//! memory. Once that command is durable, the writer thread puts the record in the store, a fjall
//! keyspace per partition on disk, and the partition drops it from `pending`. A record is looked up in
//! `pending`, then in the store, and only counts if it was archived before the command asking: after
//! a crash, the store may hold records that replay of the journal has yet to reach again.
//!
//! Without a store (a journal on Kafka, whose state must outlive this machine's disk) every record
//! stays in `pending`, which snapshots hold whole.

use crate::AppId;
use crate::journal::Lsn;
use crate::wire::{ReadLe, WriteLe};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Bytes shared between the archive's memory and the batch taking them to the store.
type Bytes = Arc<[u8]>;

/// A key no app's can be (app ids are below 64), holding [`ArchiveStore::stored_through`].
const STORED_THROUGH_KEY: &[u8] = b"\xffstored_through";

/// A record archived by a command, on its way to the store.
#[derive(Debug, Clone)]
pub(crate) struct ArchivedRecord {
    pub lsn: Lsn,
    /// The app's id, then the app's key.
    pub key: Arc<[u8]>,
    pub value: Arc<[u8]>,
}

/// The archive's bytes must not be served if the disk damaged them: fjall checks every block it reads,
/// and start-up checks that the store still holds what the restored snapshot left to it.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the archive store failed: {0}")]
    Store(#[from] fjall::Error),
    #[error(
        "the archive store lost records (damaged or replaced): it holds records archived before LSN \
         {stored_through}, and the snapshot relies on it for every record archived before LSN {needed}"
    )]
    Lost { stored_through: Lsn, needed: Lsn },
    #[error(
        "the archive store holds records archived up to LSN {}, but the journal ends at LSN \
         {journal_end}: records are stored only once durable, so the journal lost {} records that \
         were written (a truncated or damaged segment). Restore the journal",
        stored_through - 1,
        stored_through - journal_end
    )]
    AheadOfJournal {
        stored_through: Lsn,
        journal_end: Lsn,
    },
}

/// The node's archive database, in `<data dir>/archive`: one keyspace per partition.
#[derive(Clone)]
pub(crate) struct ArchiveDatabase {
    db: fjall::Database,
    memtable_bytes: u64,
}

impl ArchiveDatabase {
    pub fn open(dir: &Path, cache_bytes: u64, memtable_bytes: u64) -> Result<Self, ArchiveError> {
        // Persisted by hand before a snapshot that relies on it is published: what was stored since
        // and lost in a crash is archived again by replay.
        let db = crate::store::open(|| {
            fjall::Database::builder(dir)
                .cache_size(cache_bytes)
                .manual_journal_persist(true)
                .open()
        })?;
        Ok(Self { db, memtable_bytes })
    }

    pub fn database(&self) -> fjall::Database {
        self.db.clone()
    }

    pub fn partition(&self, partition: crate::PartitionId) -> Result<ArchiveStore, ArchiveError> {
        let keyspace = self.db.keyspace(&format!("p{partition:03}"), || {
            fjall::KeyspaceCreateOptions::default().max_memtable_size(self.memtable_bytes)
        })?;
        Ok(ArchiveStore {
            db: self.db.clone(),
            keyspace,
        })
    }
}

/// One partition's part of the archive on disk. Values are the archiving LSN then the app's bytes.
/// Each write also updates [`STORED_THROUGH_KEY`], which a store that lost its newest writes (a
/// damaged journal that fjall's recovery cut short) is caught by.
#[derive(Clone)]
pub(crate) struct ArchiveStore {
    db: fjall::Database,
    keyspace: fjall::Keyspace,
}

impl ArchiveStore {
    fn get(&self, key: &[u8]) -> Result<Option<(Lsn, fjall::Slice)>, ArchiveError> {
        let Some(stored) = self.keyspace.get(key)? else {
            return Ok(None);
        };
        let lsn = stored
            .get(..8)
            .map(|bytes| Lsn::from_le_bytes(bytes.try_into().expect("8 bytes")))
            .ok_or_else(|| {
                fjall::Error::from(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "an archived value shorter than its LSN",
                ))
            })?;
        Ok(Some((lsn, stored)))
    }

    /// The value stored under `app`'s `key`, whichever command archived it.
    pub fn get_value(&self, app: AppId, key: &[u8]) -> Result<Option<Vec<u8>>, ArchiveError> {
        Ok(with_full_key(app, key, |key| self.get(key))?.map(|(_, stored)| stored[8..].to_vec()))
    }

    /// Stores `records`, in LSN order, in one write; not yet synced (see [`Self::persist`]).
    pub fn put_all(&self, records: &[ArchivedRecord]) -> Result<(), ArchiveError> {
        let Some(last) = records.last() else {
            return Ok(());
        };
        let mut batch = self.db.batch();
        for record in records {
            let mut value = Vec::with_capacity(8 + record.value.len());
            value.extend_from_slice(&record.lsn.to_le_bytes());
            value.extend_from_slice(&record.value);
            batch.insert(&self.keyspace, &*record.key, value);
        }
        let stored_through = last.lsn + 1;
        batch.insert(
            &self.keyspace,
            STORED_THROUGH_KEY,
            stored_through.to_le_bytes(),
        );
        Ok(batch.commit()?)
    }

    /// Fails if the store holds records archived at or past `journal_end` (the journal's next LSN):
    /// the writer stores a record only once the command that archived it is durable, so the journal
    /// lost that command. Starting from the journal as it is would serve the store's copy of what
    /// replay never rebuilds.
    pub fn check_within_journal(&self, journal_end: Lsn) -> Result<(), ArchiveError> {
        let stored_through = self.stored_through()?;
        if stored_through > journal_end {
            return Err(ArchiveError::AheadOfJournal {
                stored_through,
                journal_end,
            });
        }
        Ok(())
    }

    /// Every record archived before this LSN and handed to [`Self::put_all`] is stored.
    fn stored_through(&self) -> Result<Lsn, ArchiveError> {
        Ok(match self.get(STORED_THROUGH_KEY)? {
            Some((lsn, _)) => lsn,
            None => 0,
        })
    }

    /// Makes every record stored so far survive a crash.
    pub fn persist(&self) -> Result<(), ArchiveError> {
        Ok(self.db.persist(fjall::PersistMode::SyncAll)?)
    }
}

/// One partition's archive: the records not yet in the store, and the store.
pub(crate) struct Archive {
    /// By full key (app, then the app's key): the archiving LSN and the value.
    pending: HashMap<Arc<[u8]>, (Lsn, Bytes)>,
    /// The keys in `pending`, in archiving order (one command may archive many records at one LSN).
    order: VecDeque<(Lsn, Arc<[u8]>)>,
    /// Archived by the last applies, for the partition thread to hand to the writer with their batch;
    /// with a store only.
    outbox: Vec<ArchivedRecord>,
    store: Option<ArchiveStore>,
    /// Every record archived before this LSN is in the store, not in memory: what the store must
    /// hold for a snapshot of this archive.
    forgotten_through: Lsn,
    snapshot: Option<SnapshotProgress>,
}

/// A snapshot of the archive being written in steps (see [`Archive::snapshot_step`]).
#[derive(Debug, Clone, Copy)]
struct SnapshotProgress {
    /// The snapshot's LSN: it holds the records archived before it.
    lsn: Lsn,
    /// Where the next step starts in `order`: at LSN `next_lsn`, after `written_at_next_lsn` of the
    /// records archived at it. Positions in `order` move as the front is forgotten; LSNs do not.
    next_lsn: Lsn,
    written_at_next_lsn: usize,
}

/// Marks the end of the archive section's blocks of records.
const END_OF_RECORDS: u32 = u32::MAX;

/// The key a record is kept under: the app, then the app's key. One allocation.
fn full_key(app: AppId, key: &[u8]) -> Arc<[u8]> {
    std::iter::once(app).chain(key.iter().copied()).collect()
}

/// The longest app key [`with_full_key`] looks up without allocating.
const LOOKUP_KEY_BYTES_MAX: usize = 63;

/// Calls `lookup` with the full key of `app`'s `key`, on the stack when it fits: apply looks up a key
/// for every new ledger transfer, most of them absent, and two allocations per lookup showed in its
/// profile (BENCHMARKS.md, issue 18).
fn with_full_key<R>(app: AppId, key: &[u8], lookup: impl FnOnce(&[u8]) -> R) -> R {
    if key.len() > LOOKUP_KEY_BYTES_MAX {
        return lookup(&full_key(app, key));
    }
    let mut full = [0u8; LOOKUP_KEY_BYTES_MAX + 1];
    full[0] = app;
    full[1..=key.len()].copy_from_slice(key);
    lookup(&full[..=key.len()])
}

impl Archive {
    pub fn new(store: Option<ArchiveStore>) -> Self {
        Self {
            pending: HashMap::new(),
            order: VecDeque::new(),
            outbox: Vec::new(),
            store,
            forgotten_through: 0,
            snapshot: None,
        }
    }

    pub fn store(&self) -> Option<&ArchiveStore> {
        self.store.as_ref()
    }

    /// Archives `value` under `key` at `lsn`. A key is archived at most once: an archived record is
    /// final, and lookups during replay rely on it never being replaced.
    pub fn put(&mut self, app: AppId, lsn: Lsn, key: &[u8], value: &[u8]) {
        let key = full_key(app, key);
        let value: Arc<[u8]> = value.into();
        let earlier = self.pending.insert(key.clone(), (lsn, value.clone()));
        debug_assert!(earlier.is_none(), "a key is archived at most once");
        debug_assert!(self.order.back().is_none_or(|(last, _)| *last <= lsn));
        self.order.push_back((lsn, key.clone()));
        if self.store.is_some() {
            self.outbox.push(ArchivedRecord { lsn, key, value });
        }
    }

    /// The value archived under `key` by the command at `as_of` (so far) or one before it.
    pub fn get(&self, app: AppId, key: &[u8], as_of: Lsn) -> Result<Option<Vec<u8>>, ArchiveError> {
        with_full_key(app, key, |key| {
            if let Some((lsn, value)) = self.pending.get(key) {
                debug_assert!(*lsn <= as_of, "pending holds only what was applied");
                return Ok(Some(value.to_vec()));
            }
            let Some(store) = &self.store else {
                return Ok(None);
            };
            Ok(match store.get(key)? {
                Some((lsn, stored)) if lsn < as_of => Some(stored[8..].to_vec()),
                // Stored before a crash by a command that replay has not reached again (or is
                // applying, and has not archived it yet: then it would be in `pending`).
                _ => None,
            })
        })
    }

    /// Moves the records archived since the last call to `batch`, for the writer to store once they
    /// are durable.
    pub fn move_outbox_into(&mut self, batch: &mut Vec<ArchivedRecord>) {
        batch.append(&mut self.outbox);
    }

    /// Drops from memory what the writer has stored: every record archived before `stored_lsn`.
    pub fn forget_stored(&mut self, stored_lsn: Lsn) {
        if self.store.is_none() {
            return;
        }
        while let Some((lsn, _)) = self.order.front()
            && *lsn < stored_lsn
        {
            let (lsn, key) = self.order.pop_front().expect("just seen");
            if self.pending.get(&key).is_some_and(|(at, _)| *at == lsn) {
                self.pending.remove(&key);
            }
            self.forgotten_through = lsn + 1;
        }
    }

    /// After recovery: stores what replay archived again (all of it durable, since it came from the
    /// journal) and what the restored snapshot held pending.
    pub fn store_recovered(&mut self) -> Result<(), ArchiveError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let records: Vec<ArchivedRecord> = self
            .order
            .iter()
            .map(|(lsn, key)| ArchivedRecord {
                lsn: *lsn,
                key: key.clone(),
                value: self.pending[key].1.clone(),
            })
            .collect();
        store.put_all(&records)?;
        if let Some(last) = records.last() {
            self.forgotten_through = last.lsn + 1;
        }
        self.pending.clear();
        self.order.clear();
        self.outbox.clear();
        Ok(())
    }

    /// Records in memory: not yet stored, or all of them without a store.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// After a snapshot is restored: fails if the store lost records the snapshot left to it.
    pub fn check_store(&self) -> Result<(), ArchiveError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let stored_through = store.stored_through()?;
        if stored_through < self.forgotten_through {
            return Err(ArchiveError::Lost {
                stored_through,
                needed: self.forgotten_through,
            });
        }
        Ok(())
    }

    /// Starts a snapshot of the archive for the partition's snapshot at `snapshot_lsn`:
    /// [`Self::snapshot_step`] writes it, after the rest of the partition's, so that most records
    /// archived before that LSN are in the store by then and need not be written.
    pub fn begin_snapshot(&mut self, snapshot_lsn: Lsn) {
        assert!(self.snapshot.is_none(), "one snapshot at a time");
        self.snapshot = Some(SnapshotProgress {
            lsn: snapshot_lsn,
            next_lsn: 0,
            written_at_next_lsn: 0,
        });
    }

    /// Writes about `bytes_budget` bytes of the snapshot in progress: the records archived before its
    /// LSN that are still in memory, oldest first, in blocks; true once the end is written.
    ///
    /// Format: blocks of `count: u32` then `count` records (LSN, key, value), ended by
    /// [`END_OF_RECORDS`], then `forgotten_through`: the LSN before which the store holds every
    /// record. Records stored while the steps went on may be written too; restore skips them.
    pub fn snapshot_step(
        &mut self,
        out: &mut dyn io::Write,
        bytes_budget: usize,
    ) -> io::Result<bool> {
        let mut progress = self.snapshot.expect("a snapshot is in progress");
        let mut start = self
            .order
            .partition_point(|(lsn, _)| *lsn < progress.next_lsn);
        if self
            .order
            .get(start)
            .is_some_and(|(lsn, _)| *lsn == progress.next_lsn)
        {
            start += progress.written_at_next_lsn;
        } else {
            // The records at `next_lsn` were stored and forgotten meanwhile.
            progress.written_at_next_lsn = 0;
        }
        let mut block = Vec::new();
        let mut bytes = 0;
        for (lsn, key) in self.order.range(start..) {
            if *lsn >= progress.lsn || (bytes >= bytes_budget && !block.is_empty()) {
                break;
            }
            let value = &self.pending[key].1;
            bytes += 16 + key.len() + value.len();
            block.push((*lsn, key, value));
            if *lsn == progress.next_lsn {
                progress.written_at_next_lsn += 1;
            } else {
                (progress.next_lsn, progress.written_at_next_lsn) = (*lsn, 1);
            }
        }
        let done =
            (self.order.get(start + block.len())).is_none_or(|(lsn, _)| *lsn >= progress.lsn);
        if !block.is_empty() {
            out.write_u32_le(u32::try_from(block.len()).expect("a block is bounded by its bytes"))?;
            for (lsn, key, value) in block {
                out.write_u64_le(lsn)?;
                out.write_bytes_le(key)?;
                out.write_bytes_le(value)?;
            }
        }
        self.snapshot = Some(progress);
        if !done {
            return Ok(false);
        }
        out.write_u32_le(END_OF_RECORDS)?;
        // The store may already hold records archived after the snapshot's LSN; lookups as of a
        // command ignore those until replay archives them again.
        out.write_u64_le(self.forgotten_through.min(progress.lsn))?;
        self.snapshot = None;
        Ok(true)
    }

    /// Reads what the steps of a snapshot wrote, or, for `format_version` 3, the records then the
    /// LSN the store must reach, each record at once.
    pub fn restore_snapshot(
        &mut self,
        input: &mut dyn io::Read,
        format_version: u32,
    ) -> io::Result<()> {
        let read_record = |input: &mut dyn io::Read| -> io::Result<(Lsn, Bytes, Bytes)> {
            let lsn = input.read_u64_le()?;
            let key: Arc<[u8]> = input.read_bytes_le(crate::record::RECORD_BYTES_MAX)?.into();
            let value: Arc<[u8]> = input.read_bytes_le(crate::record::RECORD_BYTES_MAX)?.into();
            Ok((lsn, key, value))
        };
        let mut records = Vec::new();
        if format_version <= 3 {
            self.forgotten_through = input.read_u64_le()?;
            for _ in 0..input.read_u64_le()? {
                records.push(read_record(input)?);
            }
        } else {
            loop {
                let count = input.read_u32_le()?;
                if count == END_OF_RECORDS {
                    break;
                }
                for _ in 0..count {
                    records.push(read_record(input)?);
                }
            }
            self.forgotten_through = input.read_u64_le()?;
        }
        records.sort_by_key(|(lsn, _, _)| *lsn);
        self.pending.clear();
        self.order.clear();
        for (lsn, key, value) in records {
            if lsn < self.forgotten_through {
                continue;
            }
            self.order.push_back((lsn, key.clone()));
            self.pending.insert(key, (lsn, value));
        }
        Ok(())
    }
}

/// A read of one app's archive as of the moment a query runs on its partition.
pub struct ArchiveReader<'a> {
    /// `None` in [`ArchiveReader::EMPTY`].
    pub(crate) archive: Option<&'a Archive>,
    pub(crate) app: AppId,
    pub(crate) as_of: Lsn,
}

impl ArchiveReader<'_> {
    /// An archive that holds nothing: for unit tests of reads that need none.
    pub const EMPTY: ArchiveReader<'static> = ArchiveReader {
        archive: None,
        app: 0,
        as_of: 0,
    };

    /// The value the app archived under `key`, if any.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ArchiveError> {
        match self.archive {
            Some(archive) => archive.get(self.app, key, self.as_of),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: AppId = 3;

    fn database(dir: &Path) -> ArchiveDatabase {
        ArchiveDatabase::open(dir, 1 << 20, 1 << 20).unwrap()
    }

    /// Hands the outbox to the store as the writer does once the batch is durable, then forgets.
    fn store_all(archive: &mut Archive, durable_lsn: Lsn) {
        let mut batch = Vec::new();
        archive.move_outbox_into(&mut batch);
        archive.store().unwrap().put_all(&batch).unwrap();
        archive.forget_stored(durable_lsn);
    }

    /// A snapshot of the archive at `lsn`, in steps of a few bytes.
    fn write_snapshot(archive: &mut Archive, out: &mut Vec<u8>, lsn: Lsn) {
        archive.begin_snapshot(lsn);
        while !archive.snapshot_step(out, 1).unwrap() {}
    }

    #[test]
    fn a_record_is_found_in_memory_then_in_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut archive = Archive::new(Some(database(dir.path()).partition(0).unwrap()));
        archive.put(APP, 5, b"k", b"v");
        assert_eq!(
            archive.get(APP, b"k", 6).unwrap().as_deref(),
            Some(&b"v"[..])
        );
        assert_eq!(
            archive.get(APP + 1, b"k", 6).unwrap(),
            None,
            "apps have keys of their own"
        );
        store_all(&mut archive, 6);
        assert_eq!(archive.pending_count(), 0);
        assert_eq!(
            archive.get(APP, b"k", 6).unwrap().as_deref(),
            Some(&b"v"[..])
        );
    }

    #[test]
    fn keys_on_either_side_of_the_lookup_buffer_are_found_in_memory_and_in_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = database(dir.path()).partition(0).unwrap();
        let mut archive = Archive::new(Some(store.clone()));
        let lengths = [0, 1, LOOKUP_KEY_BYTES_MAX, LOOKUP_KEY_BYTES_MAX + 1, 300];
        let keys: Vec<Vec<u8>> = lengths.iter().map(|&n| vec![b'x'; n]).collect();
        for (lsn, key) in (1..).zip(&keys) {
            archive.put(APP, lsn, key, key);
        }
        for key in &keys {
            assert_eq!(
                archive.get(APP, key, 10).unwrap().as_deref(),
                Some(&key[..])
            );
        }
        store_all(&mut archive, 10);
        assert_eq!(archive.pending_count(), 0);
        for key in &keys {
            assert_eq!(
                archive.get(APP, key, 10).unwrap().as_deref(),
                Some(&key[..])
            );
            assert_eq!(
                store.get_value(APP, key).unwrap().as_deref(),
                Some(&key[..])
            );
        }
        assert_eq!(archive.get(APP, &[b'x'; 2], 10).unwrap(), None);
    }

    #[test]
    fn a_record_stored_by_a_later_command_is_not_seen_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = database(dir.path()).partition(1).unwrap();
        let mut before_crash = Archive::new(Some(store.clone()));
        before_crash.put(APP, 10, b"k", b"v");
        store_all(&mut before_crash, 11);
        // Recovery from a snapshot taken at LSN 5 replays LSN 5 to 10 against the same store.
        let replaying = Archive::new(Some(store));
        assert_eq!(replaying.get(APP, b"k", 7).unwrap(), None);
        assert_eq!(replaying.get(APP, b"k", 10).unwrap(), None);
        assert_eq!(
            replaying.get(APP, b"k", 11).unwrap().as_deref(),
            Some(&b"v"[..])
        );
    }

    #[test]
    fn only_records_the_writer_stored_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let mut archive = Archive::new(Some(database(dir.path()).partition(0).unwrap()));
        archive.put(APP, 1, b"a", b"1");
        let mut first = Vec::new();
        archive.move_outbox_into(&mut first);
        archive.put(APP, 2, b"b", b"2");
        archive.store().unwrap().put_all(&first).unwrap();
        archive.forget_stored(2);
        assert_eq!(archive.pending_count(), 1, "b is not stored yet");
        assert!(archive.get(APP, b"b", 3).unwrap().is_some());
    }

    #[test]
    fn pending_records_survive_a_snapshot_and_are_stored_after_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let store = database(dir.path()).partition(0).unwrap();
        let mut archive = Archive::new(Some(store.clone()));
        archive.put(APP, 1, b"a", b"1");
        archive.put(APP, 2, b"b", b"2");
        let mut snapshot = Vec::new();
        write_snapshot(&mut archive, &mut snapshot, 10);
        let mut restored = Archive::new(Some(store.clone()));
        restored.restore_snapshot(&mut &snapshot[..], 4).unwrap();
        assert_eq!(restored.pending_count(), 2);
        restored.store_recovered().unwrap();
        assert_eq!(restored.pending_count(), 0);
        let fresh = Archive::new(Some(store));
        assert_eq!(fresh.get(APP, b"a", 3).unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(fresh.get(APP, b"b", 3).unwrap().as_deref(), Some(&b"2"[..]));
    }

    /// A snapshot is written after its LSN (at its end): it leaves out what was archived since, and
    /// relies on the store for no more than was stored at its LSN.
    #[test]
    fn a_snapshot_holds_only_what_was_archived_before_its_lsn() {
        let dir = tempfile::tempdir().unwrap();
        let store = database(dir.path()).partition(0).unwrap();
        let mut archive = Archive::new(Some(store.clone()));
        archive.put(APP, 1, b"a", b"1");
        archive.put(APP, 4, b"b", b"2");
        store_all(&mut archive, 2);
        archive.put(APP, 6, b"c", b"3");
        let mut snapshot = Vec::new();
        write_snapshot(&mut archive, &mut snapshot, 5);
        let mut restored = Archive::new(Some(store.clone()));
        restored.restore_snapshot(&mut &snapshot[..], 4).unwrap();
        restored.check_store().unwrap();
        assert_eq!(
            restored.pending_count(),
            1,
            "b only: a is stored, c came after"
        );
        assert!(restored.get(APP, b"b", 5).unwrap().is_some());
        assert_eq!(
            restored.get(APP, b"c", 7).unwrap(),
            None,
            "replay archives c again"
        );

        // Everything stored by the time the snapshot is written, c included.
        store_all(&mut archive, 7);
        let mut snapshot = Vec::new();
        write_snapshot(&mut archive, &mut snapshot, 5);
        let mut restored = Archive::new(Some(store));
        restored.restore_snapshot(&mut &snapshot[..], 4).unwrap();
        restored.check_store().unwrap();
        assert_eq!(restored.pending_count(), 0);
        assert!(restored.get(APP, b"b", 5).unwrap().is_some());
        assert_eq!(
            restored.get(APP, b"c", 6).unwrap(),
            None,
            "stored by a command after the snapshot: invisible until replay reaches it"
        );
    }

    /// Records at one LSN (one command) split across steps, and the writer storing some while the
    /// steps go on: the restored archive has every record it needs once.
    #[test]
    fn records_stored_while_a_snapshot_is_written_in_steps_are_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store = database(dir.path()).partition(0).unwrap();
        let mut archive = Archive::new(Some(store.clone()));
        for (lsn, count) in [(1, 3), (2, 4), (3, 2)] {
            for n in 0..count {
                archive.put(APP, lsn, format!("{lsn}-{n}").as_bytes(), b"v");
            }
        }
        let mut first = Vec::new();
        archive.move_outbox_into(&mut first);
        archive.begin_snapshot(3);
        let mut snapshot = Vec::new();
        let mut steps = 0;
        loop {
            if steps == 2 {
                // The writer stores what LSN 1 archived, and the partition forgets it.
                archive.store().unwrap().put_all(&first[..3]).unwrap();
                archive.forget_stored(2);
            }
            steps += 1;
            // Two records a step, so the four at LSN 2 take two steps.
            if archive.snapshot_step(&mut snapshot, 40).unwrap() {
                break;
            }
        }
        let mut restored = Archive::new(Some(store));
        restored.restore_snapshot(&mut &snapshot[..], 4).unwrap();
        restored.check_store().unwrap();
        assert_eq!(restored.pending_count(), 4, "LSN 2's, not stored yet");
        for (lsn, count) in [(1, 3), (2, 4)] {
            for n in 0..count {
                let key = format!("{lsn}-{n}");
                assert!(
                    restored.get(APP, key.as_bytes(), 3).unwrap().is_some(),
                    "{key}"
                );
            }
        }
        assert_eq!(
            restored.get(APP, b"3-0", 3).unwrap(),
            None,
            "after the snapshot"
        );
    }

    /// Without a store, a snapshot written in small steps holds every record before its LSN once.
    #[test]
    fn a_snapshot_in_steps_holds_each_record_once() {
        let mut archive = Archive::new(None);
        for lsn in 1..=5 {
            for n in 0..3 {
                archive.put(APP, lsn, format!("{lsn}-{n}").as_bytes(), b"value");
            }
        }
        let mut snapshot = Vec::new();
        write_snapshot(&mut archive, &mut snapshot, 5);
        let mut restored = Archive::new(None);
        restored.restore_snapshot(&mut &snapshot[..], 4).unwrap();
        assert_eq!(restored.pending_count(), 12, "LSN 1 to 4, three each");
        assert_eq!(restored.order.len(), 12);
    }

    #[test]
    fn a_store_missing_what_a_snapshot_relies_on_is_refused() {
        let (dir, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut archive = Archive::new(Some(database(dir.path()).partition(0).unwrap()));
        archive.put(APP, 1, b"a", b"1");
        archive.put(APP, 4, b"b", b"2");
        store_all(&mut archive, 5);
        let mut snapshot = Vec::new();
        write_snapshot(&mut archive, &mut snapshot, 10);
        let mut restored = Archive::new(archive.store().cloned());
        restored.restore_snapshot(&mut &snapshot[..], 4).unwrap();
        restored.check_store().unwrap();
        // The same snapshot over a store that never got those records (or lost them).
        let mut elsewhere = Archive::new(Some(database(other.path()).partition(0).unwrap()));
        elsewhere.restore_snapshot(&mut &snapshot[..], 4).unwrap();
        let error = elsewhere.check_store().unwrap_err().to_string();
        assert!(
            error.contains("before LSN 0") && error.contains("before LSN 5"),
            "{error}"
        );
    }

    #[test]
    fn without_a_store_everything_stays_in_memory_and_in_snapshots() {
        let mut archive = Archive::new(None);
        archive.put(APP, 1, b"a", b"1");
        let mut batch = Vec::new();
        archive.move_outbox_into(&mut batch);
        assert!(batch.is_empty(), "nothing goes to a writer");
        archive.forget_stored(u64::MAX);
        assert_eq!(archive.pending_count(), 1);
        let mut snapshot = Vec::new();
        write_snapshot(&mut archive, &mut snapshot, 10);
        let mut restored = Archive::new(None);
        restored.restore_snapshot(&mut &snapshot[..], 4).unwrap();
        restored.store_recovered().unwrap();
        assert_eq!(
            restored.get(APP, b"a", 2).unwrap().as_deref(),
            Some(&b"1"[..])
        );
    }
}
