//! A hash map cut into segments, so that its partition can snapshot it in steps while apply goes on.
//!
//! [`SegmentedMap::begin_snapshot`] marks every segment pending. [`SegmentedMap::snapshot_step`] then
//! writes pending segments, a bounded number of bytes at a time, between the partition's batches. A
//! change to a segment still pending writes that segment first, as it was (copy-on-write per segment),
//! so the snapshot holds the map exactly as it was when it began, however apply changed it meanwhile.
//! The cost of one step or one forced write is bounded by the size of a segment, not of the map.
//!
//! Format, the same whether written whole or in steps: blocks of `count: u32` then `count` entries (each
//! segment is one block, in any order), ended by [`END`]. A reader puts each entry back in the segment
//! its key hashes to.

use crate::wire::{CountingWriter, ReadLe, WriteLe};
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::io::{self, Read, Write};
use std::marker::PhantomData;

/// Marks the end of a map's blocks.
const END: u32 = u32::MAX;

/// How a map's entries are written and read back.
pub trait EntryCodec<K, V> {
    fn write(key: &K, value: &V, out: &mut dyn Write) -> io::Result<()>;
    fn read(input: &mut dyn Read) -> io::Result<(K, V)>;
}

pub struct SegmentedMap<K, V, C> {
    segments: Box<[HashMap<K, V>]>,
    /// Picks a key's segment; fixed, so that a key's segment is the same in every process.
    router: foldhash::fast::FixedState,
    /// Per segment: whether the snapshot in progress has yet to write it.
    pending: Box<[bool]>,
    pending_count: usize,
    /// From [`Self::begin_snapshot`] until a step writes the snapshot's end.
    snapshot_in_progress: bool,
    /// The next segment a step looks at.
    cursor: usize,
    /// Blocks of segments written out of turn, because apply was about to change them; the steps hand
    /// them on from `preserved_at`, a budget at a time.
    preserved: Vec<u8>,
    preserved_at: usize,
    codec: PhantomData<C>,
}

impl<K: Hash + Eq, V, C: EntryCodec<K, V>> SegmentedMap<K, V, C> {
    /// A map of `segment_count` segments (a power of two). More segments bound a step's pause tighter
    /// and cost about 50 bytes each.
    pub fn new(segment_count: usize) -> Self {
        assert!(
            segment_count.is_power_of_two() && segment_count < END as usize,
            "segment count {segment_count} must be a power of two"
        );
        Self {
            segments: (0..segment_count).map(|_| HashMap::new()).collect(),
            router: foldhash::fast::FixedState::with_seed(0x5e97_a7e5_5e97_a7e5),
            pending: vec![false; segment_count].into(),
            pending_count: 0,
            snapshot_in_progress: false,
            cursor: 0,
            preserved: Vec::new(),
            preserved_at: 0,
            codec: PhantomData,
        }
    }

    /// A key's segment. `K: Borrow<Q>` promises equal hashes for a key and its borrowed form.
    fn segment_of<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        // The high bits: the segments' own hash maps use the low bits of a different hash.
        (self.router.hash_one(key) >> 32) as usize & (self.segments.len() - 1)
    }

    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.segments[self.segment_of(key)].get(key)
    }

    pub fn contains_key<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.get(key).is_some()
    }

    /// The value of `key`, to change: a snapshot in progress first writes its segment as it is.
    pub fn get_mut<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        let segment = self.segment_of(key);
        self.preserve(segment);
        self.segments[segment].get_mut(key)
    }

    pub fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let segment = self.segment_of(key);
        self.preserve(segment);
        self.segments[segment].remove(key)
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.segments.iter().flatten()
    }

    /// The value of `key`, inserted with `default` if absent.
    pub fn get_or_insert_with(&mut self, key: K, default: impl FnOnce() -> V) -> &mut V {
        let segment = self.segment_of(&key);
        self.preserve(segment);
        self.segments[segment].entry(key).or_insert_with(default)
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let segment = self.segment_of(&key);
        self.preserve(segment);
        self.segments[segment].insert(key, value)
    }

    /// Writes a pending segment before it changes.
    fn preserve(&mut self, segment: usize) {
        if self.pending[segment] {
            write_block::<K, V, C>(self.segments[segment].iter(), &mut self.preserved)
                .expect("writing to a Vec cannot fail");
            self.pending[segment] = false;
            self.pending_count -= 1;
        }
    }

    /// Starts a snapshot of the map as it is now; [`Self::snapshot_step`] writes it.
    pub fn begin_snapshot(&mut self) {
        assert!(!self.snapshot_in_progress, "one snapshot at a time");
        assert!(self.pending_count == 0 && self.preserved.is_empty());
        self.snapshot_in_progress = true;
        self.pending.fill(true);
        self.pending_count = self.segments.len();
        self.cursor = 0;
    }

    /// Whether a snapshot began and a step has yet to write its end.
    pub fn snapshot_in_progress(&self) -> bool {
        self.snapshot_in_progress
    }

    /// Writes what changes forced out, then pending segments, until about `bytes_budget` bytes are
    /// written; true once the whole snapshot is written. A command that changes many segments (a
    /// settlement run, say) forces out many at once: they go on over as many steps as they need, so
    /// that no step writes much more than its budget.
    pub fn snapshot_step(&mut self, out: &mut dyn Write, bytes_budget: usize) -> io::Result<bool> {
        assert!(self.snapshot_in_progress, "a step belongs to a snapshot");
        let (written, flushed) = flush_preserved(
            &mut self.preserved,
            &mut self.preserved_at,
            out,
            bytes_budget,
        )?;
        if !flushed {
            return Ok(false);
        }
        let mut written = written;
        while self.pending_count > 0 && written < bytes_budget {
            let segment = self.cursor;
            self.cursor += 1;
            if !self.pending[segment] {
                continue;
            }
            let mut counted = CountingWriter::new(&mut *out);
            write_block::<K, V, C>(self.segments[segment].iter(), &mut counted)?;
            written += counted.bytes;
            self.pending[segment] = false;
            self.pending_count -= 1;
        }
        if self.pending_count > 0 {
            return Ok(false);
        }
        out.write_u32_le(END)?;
        self.snapshot_in_progress = false;
        Ok(true)
    }

    /// Reads what [`Self::write_all`] or a sequence of [`Self::snapshot_step`]s wrote.
    pub fn read(input: &mut dyn Read, segment_count: usize) -> io::Result<Self> {
        let mut map = Self::new(segment_count);
        loop {
            let count = input.read_u32_le()?;
            if count == END {
                return Ok(map);
            }
            for _ in 0..count {
                let (key, value) = C::read(input)?;
                if map.insert(key, value).is_some() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a key appears twice in a snapshot of a map",
                    ));
                }
            }
        }
    }
}

impl<K: Hash + Eq + Ord, V, C: EntryCodec<K, V>> SegmentedMap<K, V, C> {
    /// Writes the whole map at once, each segment's entries in key order, so equal maps write equal bytes.
    pub fn write_all(&self, out: &mut dyn Write) -> io::Result<()> {
        for segment in self.segments.iter() {
            let mut entries: Vec<(&K, &V)> = segment.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            write_block::<K, V, C>(entries.into_iter(), out)?;
        }
        out.write_u32_le(END)
    }
}

impl<K, V, C> std::fmt::Debug for SegmentedMap<K, V, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentedMap")
            .field("segments", &self.segments.len())
            .field("pending", &self.pending_count)
            .finish()
    }
}

/// Writes up to `bytes_budget` bytes of `preserved` from `at` on (at least one, so that steps make
/// progress), and empties it once all is written; returns the bytes written and whether all were.
/// A snapshot's other bytes must wait until all of `preserved` is written: it holds whole entries, and
/// a step may stop in the middle of one.
fn flush_preserved(
    preserved: &mut Vec<u8>,
    at: &mut usize,
    out: &mut dyn Write,
    bytes_budget: usize,
) -> io::Result<(usize, bool)> {
    let end = preserved.len().min(*at + bytes_budget.max(1));
    out.write_all(&preserved[*at..end])?;
    let written = end - *at;
    *at = end;
    if end < preserved.len() {
        return Ok((written, false));
    }
    preserved.clear();
    *at = 0;
    Ok((written, true))
}

fn write_block<'a, K: 'a, V: 'a, C: EntryCodec<K, V>>(
    entries: impl ExactSizeIterator<Item = (&'a K, &'a V)>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let count = u32::try_from(entries.len()).expect("a segment holds fewer than 2^32 - 1 entries");
    assert_ne!(count, END);
    out.write_u32_le(count)?;
    for (key, value) in entries {
        C::write(key, value, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    struct Codec;

    impl EntryCodec<u32, u64> for Codec {
        fn write(key: &u32, value: &u64, out: &mut dyn Write) -> io::Result<()> {
            out.write_u32_le(*key)?;
            out.write_u64_le(*value)
        }
        fn read(input: &mut dyn Read) -> io::Result<(u32, u64)> {
            Ok((input.read_u32_le()?, input.read_u64_le()?))
        }
    }

    type Map = SegmentedMap<u32, u64, Codec>;

    fn contents(map: &Map) -> BTreeMap<u32, u64> {
        let mut bytes = Vec::new();
        map.write_all(&mut bytes).unwrap();
        let read = Map::read(&mut bytes.as_slice(), 4).unwrap();
        read.iter().map(|(k, v)| (*k, *v)).collect()
    }

    proptest! {
        /// A snapshot written in steps, with inserts, updates and removals between the steps, reads
        /// back as the map was when it began; and the map itself has every change.
        #[test]
        fn a_stepped_snapshot_is_the_map_at_its_start(
            before in proptest::collection::vec((0..500u32, any::<u64>()), 0..400),
            during in proptest::collection::vec((0..600u32, any::<u64>(), 0..4u8), 0..400),
            budget in 1..300usize,
        ) {
            let mut map = Map::new(16);
            let mut model = BTreeMap::new();
            for (key, value) in &before {
                map.insert(*key, *value);
                model.insert(*key, *value);
            }
            let at_start = model.clone();
            map.begin_snapshot();
            let mut snapshot = Vec::new();
            let mut changes = during.iter();
            loop {
                prop_assert!(map.snapshot_in_progress());
                let done = map.snapshot_step(&mut snapshot, budget).unwrap();
                if done {
                    break;
                }
                for (key, value, kind) in changes.by_ref().take(3) {
                    change(&mut map, &mut model, *key, *value, *kind);
                }
            }
            prop_assert!(!map.snapshot_in_progress());
            let read = Map::read(&mut snapshot.as_slice(), 64).unwrap();
            let read: BTreeMap<u32, u64> = read.iter().map(|(k, v)| (*k, *v)).collect();
            prop_assert_eq!(read, at_start);
            for (key, value, kind) in changes {
                change(&mut map, &mut model, *key, *value, *kind);
            }
            prop_assert_eq!(contents(&map), model);
        }
    }

    /// One change to both the map and its model: an update in place, an update through `get_mut`, a
    /// removal or an insert.
    fn change(map: &mut Map, model: &mut BTreeMap<u32, u64>, key: u32, value: u64, kind: u8) {
        match kind {
            0 => {
                *map.get_or_insert_with(key, || 0) += value % 1000;
                *model.entry(key).or_insert(0) += value % 1000;
            }
            1 => {
                if let Some(found) = map.get_mut(&key) {
                    *found ^= value;
                }
                if let Some(found) = model.get_mut(&key) {
                    *found ^= value;
                }
            }
            2 => assert_eq!(map.remove(&key), model.remove(&key)),
            _ => assert_eq!(map.insert(key, value), model.insert(key, value)),
        }
        assert_eq!(map.contains_key(&key), model.contains_key(&key));
    }

    #[test]
    fn a_step_writes_about_its_budget() {
        let mut map = Map::new(1024);
        for key in 0..100_000 {
            map.insert(key, u64::from(key));
        }
        map.begin_snapshot();
        let mut steps = 0;
        let mut out = Vec::new();
        while !map.snapshot_step(&mut out, 64 * 1024).unwrap() {
            steps += 1;
        }
        // 1.2 MB of entries in steps of 64 KiB and a segment (about 1.2 KB) at most.
        assert!((17..=20).contains(&steps), "{steps} steps");
    }
}
