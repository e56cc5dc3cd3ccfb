//! The read model: the seed's questions answered from lift-ride events, with the rides on disk.
//!
//! Built by [`RideProjection`] on the engine's projection thread, which may lag the partitions; the
//! lag is reported by `GET /ski/lag` and the `spate_projection_lag_records` metric. Every ride is kept
//! (the seed's Redis model lost rides that shared skier, day and time; here each acknowledged POST is a
//! ride), so every figure is derived from the rides themselves.
//!
//! The rides live in a fjall database of their own ([`RideStore`], `<data dir>/ski/model`), so memory
//! does not grow with the seasons of rides kept:
//! - `rides`: skier, season, day, then the ride's LSN (all big-endian, so a skier's day, season or
//!   seasons are a prefix scan in journal order) -> resort, time and lift; after them (keys from 0xff)
//!   the ride count and per partition the next LSN whose ride the store does not hold;
//! - `visits`: resort, season, day and a chunk of 1,024 skier ids -> a bitmap of the skiers who rode
//!   there that day; a ride whose bit was clear counts one more unique skier;
//! - `meta`: the unique skiers per resort and day, and per partition the next LSN whose visit the
//!   bitmaps do not hold. The counts are in memory too, with the seasons with rides per resort they
//!   imply: one entry per resort and day skied, not per ride.
//!
//! Rides gather in memory and go to disk in one atomic write per [`Projection::flush`] (after each run
//! of events, or every [`PENDING_MAX`] rides); changed bitmaps and the counts go at each checkpoint
//! (see `Visits`). After a crash the store may be ahead of the engine's checkpoint: a replayed ride it
//! already holds is not written again, and a visit its bitmaps hold is not counted again. It is never
//! behind: a checkpoint writes and persists it first, and start-up refuses a store that holds less than
//! the checkpoint covers.

use crate::command::{Ride, vertical_of};
use spate_engine::wire::{ReadLe, WriteLe};
use spate_engine::{Lsn, PartitionId, Projection};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

/// The block cache's default size (`--ski-store-cache-mb`): recent blocks of rides and visits.
pub const STORE_CACHE_BYTES_DEFAULT: u64 = 16 << 20;
/// Memtables of rides, visits and meta (fjall's default is 64 MiB each). Each memtable written to disk
/// holds up reads for an fsync (fjall persists its new version under the lock readers take), so what a
/// flush writes besides rides is in `rides`, and `visits` and `meta` change only at checkpoints. A
/// 64 MiB `rides` memtable made those waits rarer but the latencies worse (BENCHMARKS.md).
const MEMTABLE_BYTES: [u64; 3] = [16 << 20, 8 << 20, 1 << 20];
/// fjall's journal, at most (its least): past it fjall writes the memtables that hold it back, which
/// `meta`'s, written only at checkpoints, would otherwise do for ever; a start-up replays it all.
const JOURNAL_BYTES_MAX: u64 = 64 << 20;
/// In `rides`, written with them by every flush: each partition's next LSN, and the ride count. A
/// skier id is at most `i32::MAX`, so no ride's key begins with 0xff.
const APPLIED_KEY: &[u8] = b"\xffapplied";
const RIDES_KEY: &[u8] = b"\xffrides";
/// Followed by resort, season and day: that day's unique skiers.
const DAY_PREFIX: &[u8] = b"day/";
/// Rides applied and not yet written, at most: a replay at start-up writes every so many.
const PENDING_MAX: usize = 16_384;
/// Skiers per chunk of a day's visits (see `Visits`): a bitmap of 128 bytes.
const SKIERS_PER_CHUNK: u32 = 1024;
const CHUNK_WORDS: usize = (SKIERS_PER_CHUNK / 64) as usize;
/// Unchanged chunks kept in memory, at most (about 11 MiB): the case study's 100,000 skiers at 10
/// resorts are 980 chunks a day.
const CLEAN_CHUNKS_MAX: usize = 1 << 16;
const VISITS_APPLIED_KEY: &[u8] = b"visits applied";
/// What a checkpoint holds now that the store holds the rides. A checkpoint from before the store
/// began with the number of (skier, season, day) entries that followed, which is never this.
const STORE_CHECKPOINT: u64 = u64::MAX;

type RideKey = [u8; 16];
type RideValue = [u8; 6];
/// Resort, season, day, then the skier divided by `SKIERS_PER_CHUNK`.
type ChunkKey = [u8; 10];
/// (resort, season, day)
type ResortDay = (u16, u16, u16);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the ski read model's store failed: {0}")]
    Fjall(#[from] fjall::Error),
    #[error("the ski read model's store holds a damaged {0}")]
    Damaged(&'static str),
}

/// A ride as the read model keeps it under its skier, season and day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DayRide {
    pub resort: u16,
    pub time: u16,
    pub lift: u16,
}

/// One day a skier skied, over every resort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaySummary {
    pub day: u16,
    pub rides: u32,
    pub vertical: u64,
}

/// What the store holds besides the rides, kept in memory for the queries that count.
#[derive(Debug, Default)]
struct Counts {
    /// Ordered, so that a resort's days in a season are one range.
    unique_skiers: BTreeMap<ResortDay, u32>,
    /// resort -> seasons with at least one ride.
    ride_seasons: BTreeMap<u16, BTreeSet<u16>>,
    rides: u64,
}

impl Counts {
    fn add_skier(&mut self, (resort, season, day): ResortDay) {
        self.ride_seasons.entry(resort).or_default().insert(season);
        *self.unique_skiers.entry((resort, season, day)).or_default() += 1;
    }
}

fn ride_key(skier: u32, season: u16, day: u16, lsn: Lsn) -> RideKey {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&day_prefix(skier, season, day));
    key[8..].copy_from_slice(&lsn.to_be_bytes());
    key
}

fn day_prefix(skier: u32, season: u16, day: u16) -> [u8; 8] {
    let mut prefix = [0; 8];
    prefix[..4].copy_from_slice(&skier.to_be_bytes());
    prefix[4..6].copy_from_slice(&season.to_be_bytes());
    prefix[6..].copy_from_slice(&day.to_be_bytes());
    prefix
}

fn ride_value(ride: &Ride) -> RideValue {
    let mut value = [0; 6];
    value[..2].copy_from_slice(&ride.resort.to_be_bytes());
    value[2..4].copy_from_slice(&ride.time.to_be_bytes());
    value[4..].copy_from_slice(&ride.lift.to_be_bytes());
    value
}

fn chunk_key(ride: &Ride) -> ChunkKey {
    let mut key = [0; 10];
    key[..6].copy_from_slice(&resort_day_bytes((ride.resort, ride.season, ride.day)));
    key[6..].copy_from_slice(&(ride.skier / SKIERS_PER_CHUNK).to_be_bytes());
    key
}

fn resort_day_bytes((resort, season, day): ResortDay) -> [u8; 6] {
    let mut bytes = [0; 6];
    bytes[..2].copy_from_slice(&resort.to_be_bytes());
    bytes[2..4].copy_from_slice(&season.to_be_bytes());
    bytes[4..].copy_from_slice(&day.to_be_bytes());
    bytes
}

fn be_u16(bytes: &[u8]) -> u16 {
    u16::from_be_bytes([bytes[0], bytes[1]])
}

/// The ride stored under `key` (a [`RideKey`]): its day and what it was.
fn decode_ride(key: &[u8], value: &[u8]) -> Result<(u16, DayRide), StoreError> {
    if key.len() != size_of::<RideKey>() || value.len() != size_of::<RideValue>() {
        return Err(StoreError::Damaged("ride"));
    }
    let ride = DayRide {
        resort: be_u16(&value[..2]),
        time: be_u16(&value[2..4]),
        lift: be_u16(&value[4..]),
    };
    Ok((be_u16(&key[6..8]), ride))
}

/// Positions as `encode_positions` wrote them; none if nothing was written.
fn decode_positions(bytes: Option<&[u8]>) -> Result<Vec<Lsn>, StoreError> {
    let bytes = bytes.unwrap_or_default();
    if !bytes.len().is_multiple_of(8) {
        return Err(StoreError::Damaged("list of positions"));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|lsn| Lsn::from_le_bytes(lsn.try_into().expect("8 bytes")))
        .collect())
}

/// The rides on disk and the counts in memory; read by the query handlers while the projection
/// writes.
pub struct RideStore {
    db: fjall::Database,
    rides: fjall::Keyspace,
    visits: fjall::Keyspace,
    meta: fjall::Keyspace,
    /// As of the last flush.
    counts: RwLock<Counts>,
}

impl RideStore {
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Arc<Self>, StoreError> {
        // Persisted by hand before each checkpoint: the journal replays whatever a crash lost since.
        // One worker: its flushes and compactions never take every core from the partitions.
        let db = spate_engine::store::open(|| {
            fjall::Database::builder(dir)
                .cache_size(cache_bytes)
                .worker_threads(1)
                .manual_journal_persist(true)
                .max_journaling_size(JOURNAL_BYTES_MAX)
                .open()
        })?;
        let keyspace = |name: &str, memtable_bytes: u64| {
            db.keyspace(name, || {
                fjall::KeyspaceCreateOptions::default().max_memtable_size(memtable_bytes)
            })
        };
        let [rides_memtable, visits_memtable, meta_memtable] = MEMTABLE_BYTES;
        let (rides, visits, meta) = (
            keyspace("rides", rides_memtable)?,
            keyspace("visits", visits_memtable)?,
            keyspace("meta", meta_memtable)?,
        );
        let mut counts = Counts::default();
        if let Some(bytes) = rides.get(RIDES_KEY)? {
            let bytes = bytes.as_ref().try_into();
            counts.rides =
                u64::from_le_bytes(bytes.map_err(|_| StoreError::Damaged("ride count"))?);
        }
        for entry in meta.prefix(DAY_PREFIX) {
            let (key, value) = entry.into_inner()?;
            let (Ok(day), Ok(skiers)) = (
                <[u8; 6]>::try_from(&key[DAY_PREFIX.len()..]),
                <[u8; 4]>::try_from(value.as_ref()),
            ) else {
                return Err(StoreError::Damaged("count of unique skiers"));
            };
            let (resort, season, day) = (be_u16(&day[..2]), be_u16(&day[2..4]), be_u16(&day[4..]));
            counts
                .ride_seasons
                .entry(resort)
                .or_default()
                .insert(season);
            (counts.unique_skiers).insert((resort, season, day), u32::from_le_bytes(skiers));
        }
        Ok(Arc::new(Self {
            db,
            rides,
            visits,
            meta,
            counts: RwLock::new(counts),
        }))
    }

    /// The database, for the engine's scrub to read back.
    pub fn database(&self) -> fjall::Database {
        self.db.clone()
    }

    /// Per partition, the next LSN whose ride the store does not hold.
    fn rides_applied(&self) -> Result<Vec<Lsn>, StoreError> {
        decode_positions(self.rides.get(APPLIED_KEY)?.as_deref())
    }

    /// Per partition, the next LSN whose visit the store's bitmaps do not hold.
    fn visits_applied(&self) -> Result<Vec<Lsn>, StoreError> {
        decode_positions(self.meta.get(VISITS_APPLIED_KEY)?.as_deref())
    }

    fn counts(&self) -> std::sync::RwLockReadGuard<'_, Counts> {
        self.counts
            .read()
            .expect("the counts' lock is never poisoned")
    }

    pub fn ride_count(&self) -> u64 {
        self.counts().rides
    }

    pub fn unique_skiers(&self, resort: u16, season: u16, day: u16) -> u32 {
        (self.counts().unique_skiers)
            .get(&(resort, season, day))
            .copied()
            .unwrap_or(0)
    }

    /// The days of `season` with rides at `resort`, in order, each with its distinct skiers.
    pub fn skiers_per_day(&self, resort: u16, season: u16) -> Vec<(u16, u32)> {
        (self.counts().unique_skiers)
            .range((resort, season, 0)..=(resort, season, u16::MAX))
            .map(|(&(_, _, day), &skiers)| (day, skiers))
            .collect()
    }

    pub fn seasons_with_rides(&self, resort: u16) -> Vec<u16> {
        (self.counts().ride_seasons)
            .get(&resort)
            .map(|seasons| seasons.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Calls `each` with the day and ride of every ride under `prefix` (of a [`RideKey`]), in key order.
    fn scan(&self, prefix: &[u8], mut each: impl FnMut(u16, DayRide)) -> Result<(), StoreError> {
        for entry in self.rides.prefix(prefix) {
            let (key, value) = entry.into_inner()?;
            let (day, ride) = decode_ride(&key, &value)?;
            each(day, ride);
        }
        Ok(())
    }

    /// The rides of `skier` on one day, over every resort, in journal order; empty if none.
    pub fn lifts(&self, skier: u32, season: u16, day: u16) -> Result<Vec<DayRide>, StoreError> {
        let mut rides = Vec::new();
        self.scan(&day_prefix(skier, season, day), |_, ride| rides.push(ride))?;
        Ok(rides)
    }

    /// Vertical of `skier` at `resort` on one day; `None` without a ride there that day.
    pub fn day_vertical(
        &self,
        resort: u16,
        season: u16,
        day: u16,
        skier: u32,
    ) -> Result<Option<u64>, StoreError> {
        let rides = self.lifts(skier, season, day)?;
        let mut at_resort = rides.iter().filter(|r| r.resort == resort).peekable();
        Ok(at_resort
            .peek()
            .is_some()
            .then(|| at_resort.map(|r| vertical_of(r.lift)).sum()))
    }

    /// The days `skier` skied in `season`, in day order.
    pub fn days_skied(&self, skier: u32, season: u16) -> Result<Vec<DaySummary>, StoreError> {
        let mut days: Vec<DaySummary> = Vec::new();
        let prefix = &day_prefix(skier, season, 0)[..6];
        self.scan(prefix, |day, ride| {
            if days.last().is_none_or(|last| last.day != day) {
                days.push(DaySummary {
                    day,
                    rides: 0,
                    vertical: 0,
                });
            }
            let summary = days.last_mut().expect("pushed above");
            summary.rides += 1;
            summary.vertical += vertical_of(ride.lift);
        })?;
        Ok(days)
    }

    /// Total vertical of `skier` at `resort` per season with rides there, limited to `seasons` when
    /// given; in season order.
    pub fn season_verticals(
        &self,
        skier: u32,
        resort: u16,
        seasons: Option<&[u16]>,
    ) -> Result<Vec<(u16, u64)>, StoreError> {
        let mut totals: BTreeMap<u16, u64> = BTreeMap::new();
        for entry in self.rides.prefix(skier.to_be_bytes()) {
            let (key, value) = entry.into_inner()?;
            let (_, ride) = decode_ride(&key, &value)?;
            let season = be_u16(&key[4..6]);
            if ride.resort == resort && seasons.is_none_or(|wanted| wanted.contains(&season)) {
                *totals.entry(season).or_default() += vertical_of(ride.lift);
            }
        }
        Ok(totals.into_iter().collect())
    }
}

/// Which skiers rode at each resort on each day: bitmaps of [`SKIERS_PER_CHUNK`] skiers, so that a
/// ride's visit is new when its bit was clear. A changed chunk stays in memory until the next checkpoint
/// writes it, with the counts and the positions it covers, in one write: a store insert per new visit
/// cost about as much as storing the ride (measured), and a bitmap is idempotent, so a replay after a
/// crash sets again what the last checkpoint did not write.
struct Visits {
    chunks: HashMap<ChunkKey, Chunk>,
    /// Chunks in `chunks` that the store holds as they are; dropped all at once past `clean_max`.
    clean: usize,
    clean_max: usize,
    /// Per partition, the next LSN whose visit the chunks do not hold.
    next: Vec<Lsn>,
    /// Resorts and days with a new visit since the last write.
    changed_days: HashSet<ResortDay>,
}

struct Chunk {
    bits: Box<[u64; CHUNK_WORDS]>,
    dirty: bool,
}

impl Visits {
    /// Records `ride`'s visit; true if it is the skier's first ride at that resort that day.
    fn visit(&mut self, store: &RideStore, ride: &Ride) -> Result<bool, StoreError> {
        let chunk = match self.chunks.entry(chunk_key(ride)) {
            Entry::Occupied(cached) => cached.into_mut(),
            Entry::Vacant(missing) => {
                let mut bits = Box::new([0; CHUNK_WORDS]);
                if let Some(stored) = store.visits.get(missing.key())? {
                    if stored.len() != CHUNK_WORDS * 8 {
                        return Err(StoreError::Damaged("bitmap of visits"));
                    }
                    for (word, bytes) in bits.iter_mut().zip(stored.chunks_exact(8)) {
                        *word = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
                    }
                }
                self.clean += 1;
                missing.insert(Chunk { bits, dirty: false })
            }
        };
        let offset = ride.skier % SKIERS_PER_CHUNK;
        let (word, mask) = ((offset / 64) as usize, 1u64 << (offset % 64));
        let new = chunk.bits[word] & mask == 0;
        if new {
            chunk.bits[word] |= mask;
            self.changed_days
                .insert((ride.resort, ride.season, ride.day));
            if !chunk.dirty {
                chunk.dirty = true;
                self.clean -= 1;
            }
        }
        if self.clean > self.clean_max {
            self.chunks.retain(|_, chunk| chunk.dirty);
            self.clean = 0;
        }
        Ok(new)
    }

    /// Writes the changed chunks, the counts of their days (which must count exactly their visits) and
    /// the positions they cover, in one write.
    fn write(&mut self, store: &RideStore) -> Result<(), StoreError> {
        let mut batch = store.db.batch();
        for (key, chunk) in &mut self.chunks {
            if chunk.dirty {
                let bytes: Vec<u8> = chunk.bits.iter().flat_map(|w| w.to_le_bytes()).collect();
                batch.insert(&store.visits, *key, bytes);
                chunk.dirty = false;
                self.clean += 1;
            }
        }
        let counts = store.counts();
        for day in self.changed_days.drain() {
            let count_key = [DAY_PREFIX, &resort_day_bytes(day)].concat();
            batch.insert(
                &store.meta,
                count_key,
                counts.unique_skiers[&day].to_le_bytes(),
            );
        }
        drop(counts);
        batch.insert(
            &store.meta,
            VISITS_APPLIED_KEY,
            encode_positions(&self.next),
        );
        batch.commit()?;
        if self.clean > self.clean_max {
            self.chunks.clear();
            self.clean = 0;
        }
        Ok(())
    }
}

fn encode_positions(positions: &[Lsn]) -> Vec<u8> {
    positions.iter().flat_map(|lsn| lsn.to_le_bytes()).collect()
}

/// Grows `positions` to hold `partition`'s.
fn position_of(positions: &mut Vec<Lsn>, partition: PartitionId) -> &mut Lsn {
    let p = usize::from(partition);
    if positions.len() <= p {
        positions.resize(p + 1, 0);
    }
    &mut positions[p]
}

/// The projection: the one writer of the store.
pub struct RideProjection {
    store: Arc<RideStore>,
    /// Per partition, the next LSN the store does not hold once the pending rides are written.
    next: Vec<Lsn>,
    /// `next` moved since the last flush.
    next_moved: bool,
    pending_rides: Vec<(RideKey, RideValue)>,
    /// The days of the visits found new since the last flush, one entry per visit.
    pending_new_visits: Vec<ResortDay>,
    /// Behind a lock only because a checkpoint (`write_snapshot`) writes it through `&self`.
    visits: Mutex<Visits>,
}

impl RideProjection {
    pub fn new(store: Arc<RideStore>) -> Result<Self, StoreError> {
        let visits = Visits {
            chunks: HashMap::new(),
            clean: 0,
            clean_max: CLEAN_CHUNKS_MAX,
            next: store.visits_applied()?,
            changed_days: HashSet::new(),
        };
        Ok(Self {
            next: store.rides_applied()?,
            store,
            next_moved: false,
            pending_rides: Vec::new(),
            pending_new_visits: Vec::new(),
            visits: Mutex::new(visits),
        })
    }

    fn visits(&mut self) -> &mut Visits {
        self.visits
            .get_mut()
            .expect("the visits' lock is never poisoned")
    }

    /// Takes in the ride at `lsn` of `partition`: its visit unless the stored chunks hold it, the ride
    /// unless the store holds it.
    fn take(&mut self, partition: PartitionId, lsn: Lsn, ride: &Ride) -> Result<(), StoreError> {
        let visits = (self.visits.get_mut()).expect("the visits' lock is never poisoned");
        let visits_next = position_of(&mut visits.next, partition);
        if lsn >= *visits_next {
            *visits_next = lsn + 1;
            if visits.visit(&self.store, ride)? {
                self.pending_new_visits
                    .push((ride.resort, ride.season, ride.day));
            }
        }
        let next = position_of(&mut self.next, partition);
        if lsn >= *next {
            *next = lsn + 1;
            self.next_moved = true;
            self.pending_rides.push((
                ride_key(ride.skier, ride.season, ride.day, lsn),
                ride_value(ride),
            ));
        }
        Ok(())
    }

    /// Writes the pending rides, the ride count and the positions reached in one write, then counts
    /// the new visits.
    fn write_pending(&mut self) -> Result<(), StoreError> {
        let store = &self.store;
        let mut stored_rides = 0;
        if self.next_moved {
            let mut batch = store.db.batch();
            for (key, value) in &self.pending_rides {
                batch.insert(&store.rides, *key, *value);
            }
            stored_rides = self.pending_rides.len() as u64;
            let rides = store.ride_count() + stored_rides;
            batch.insert(&store.rides, RIDES_KEY, rides.to_le_bytes());
            batch.insert(&store.rides, APPLIED_KEY, encode_positions(&self.next));
            batch.commit()?;
            self.pending_rides.clear();
            self.next_moved = false;
        }
        assert!(self.pending_rides.is_empty(), "a ride moves a position");
        // Counted once the rides are written, so a count never runs ahead of the rides a reader finds.
        let mut counts = store.counts.write().expect("never poisoned");
        counts.rides += stored_rides;
        for day in self.pending_new_visits.drain(..) {
            counts.add_skier(day);
        }
        Ok(())
    }

    /// Writes the rides of a checkpoint from before the store, which covered each partition's records
    /// below `positions`, unless an earlier start-up did. A day's rides are keyed by their order in it:
    /// a partition's later LSNs are all at or above its position, which is above that order.
    fn import(&mut self, input: &mut dyn io::Read, positions: &[Lsn]) -> io::Result<()> {
        let done = (positions.iter().enumerate())
            .all(|(p, position)| self.next.get(p).is_some_and(|next| next >= position));
        let store = self.store.clone();
        for _ in 0..input.read_u64_le()? {
            let (skier, season, day) = (
                input.read_u32_le()?,
                input.read_u16_le()?,
                input.read_u16_le()?,
            );
            for order in 0..input.read_u32_le()? {
                let ride = Ride {
                    resort: input.read_u16_le()?,
                    season,
                    day,
                    skier,
                    time: input.read_u16_le()?,
                    lift: input.read_u16_le()?,
                };
                if done {
                    continue;
                }
                self.pending_rides.push((
                    ride_key(skier, season, day, Lsn::from(order)),
                    ride_value(&ride),
                ));
                if self
                    .visits()
                    .visit(&store, &ride)
                    .map_err(io::Error::other)?
                {
                    self.pending_new_visits.push((ride.resort, season, day));
                }
            }
        }
        if !done {
            self.next = positions.to_vec();
            self.next_moved = true;
            self.visits().next = positions.to_vec();
            self.write_pending().map_err(io::Error::other)?;
            self.visits().write(&store).map_err(io::Error::other)?;
        }
        Ok(())
    }
}

impl Projection for RideProjection {
    fn apply(
        &mut self,
        partition: PartitionId,
        lsn: Lsn,
        _timestamp_ms: u64,
        event: &[u8],
    ) -> io::Result<()> {
        let ride = Ride::decode_event(event).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("a ski ride event: {e}"))
        })?;
        // The read model cannot go on without its store, nor skip what it failed to read or write.
        self.take(partition, lsn, &ride)
            .unwrap_or_else(|error| panic!("{error}"));
        if self.pending_rides.len() >= PENDING_MAX {
            self.flush();
        }
        Ok(())
    }

    fn flush(&mut self) {
        self.write_pending()
            .unwrap_or_else(|error| panic!("{error}"));
    }

    /// The store holds the rides: write the visits and persist it, so that it is never behind the
    /// checkpoint, which holds the positions it covers.
    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        assert!(
            !self.next_moved && self.pending_new_visits.is_empty(),
            "a checkpoint follows a flush"
        );
        let mut visits = self
            .visits
            .lock()
            .expect("the visits' lock is never poisoned");
        visits.write(&self.store).map_err(io::Error::other)?;
        (self.store.db)
            .persist(fjall::PersistMode::SyncAll)
            .map_err(io::Error::other)?;
        out.write_u64_le(STORE_CHECKPOINT)?;
        out.write_u32_le(visits.next.len() as u32)?;
        for position in &visits.next {
            out.write_u64_le(*position)?;
        }
        Ok(())
    }

    fn restore(&mut self, input: &mut dyn io::Read, positions: &[Lsn]) -> io::Result<()> {
        let mut marker = [0; 8];
        input.read_exact(&mut marker)?;
        if u64::from_le_bytes(marker) != STORE_CHECKPOINT {
            return self.import(&mut io::Read::chain(marker.as_slice(), input), positions);
        }
        let visits_next = self.visits().next.clone();
        for partition in 0..input.read_u32_le()? as usize {
            let covered = input.read_u64_le()?;
            let held = [&self.next, &visits_next]
                .map(|next| next.get(partition).copied().unwrap_or(0))
                .into_iter()
                .min()
                .expect("two");
            if held < covered {
                return Err(io::Error::other(format!(
                    "the ski read model's store holds partition {partition}'s rides below LSN {held}, \
                     behind its checkpoint's {covered}: it is not the store this checkpoint was written with"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What follows a ride in a test: nothing, a flush, or a checkpoint.
    #[derive(Debug, Clone, Copy)]
    enum Then {
        Next,
        Flush,
        Checkpoint,
    }

    fn rides() -> impl Strategy<Value = Vec<(Ride, Then)>> {
        // Small ranges, so skiers, days and resorts repeat; skiers span two chunks of visits.
        let ride = (
            1u16..4,
            2020u16..2023,
            1u16..5,
            prop_oneof![1u32..6, Just(SKIERS_PER_CHUNK + 1)],
            1u16..361,
            1u16..41,
            prop_oneof![
                4 => Just(Then::Next),
                2 => Just(Then::Flush),
                1 => Just(Then::Checkpoint),
            ],
        )
            .prop_map(|(resort, season, day, skier, time, lift, then)| {
                let ride = Ride {
                    resort,
                    season,
                    day,
                    skier,
                    time,
                    lift,
                };
                (ride, then)
            });
        proptest::collection::vec(ride, 0..300)
    }

    /// Every skier `rides` makes.
    const SKIERS: [u32; 6] = [1, 2, 3, 4, 5, SKIERS_PER_CHUNK + 1];

    /// A skier's partition, as the engine routes rides by skier.
    fn partition_of(ride: &Ride) -> PartitionId {
        (ride.skier % 2) as PartitionId
    }

    fn event(ride: &Ride) -> Vec<u8> {
        let mut bytes = Vec::new();
        ride.encode_into(&mut bytes);
        bytes
    }

    /// Applies `rides` as partitions 0 and 1 would journal them, each at the LSN after its
    /// partition's last, flushing and checkpointing where each ride says.
    fn apply_all(projection: &mut RideProjection, rides: &[(Ride, Then)]) {
        let mut next = [0; 2];
        for (ride, then) in rides {
            let partition = partition_of(ride);
            let lsn = &mut next[usize::from(partition)];
            projection.apply(partition, *lsn, 0, &event(ride)).unwrap();
            *lsn += 1;
            match then {
                Then::Next => {}
                Then::Flush => projection.flush(),
                Then::Checkpoint => {
                    checkpoint(projection);
                }
            }
        }
        projection.flush();
    }

    fn open(dir: &Path) -> RideProjection {
        RideProjection::new(RideStore::open(dir, STORE_CACHE_BYTES_DEFAULT).unwrap()).unwrap()
    }

    /// See the same test in payments' model: an unreadable event is an error, not a panic.
    #[test]
    fn an_event_it_cannot_read_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let error = open(dir.path()).apply(0, 7, 0, &[1, 2, 3]).unwrap_err();
        assert!(error.to_string().contains("a ski ride event"), "{error}");
    }

    /// With room for only `chunks_max` unchanged chunks of visits: they are dropped and read again.
    fn open_with_clean_chunks(dir: &Path, chunks_max: usize) -> RideProjection {
        let mut projection = open(dir);
        projection.visits().clean_max = chunks_max;
        projection
    }

    fn check_answers(store: &RideStore, rides: &[Ride]) -> Result<(), TestCaseError> {
        prop_assert_eq!(store.ride_count(), rides.len() as u64);
        for resort in 1..4 {
            for season in 2020..2023 {
                for day in 1..5 {
                    let skiers: BTreeSet<u32> = rides
                        .iter()
                        .filter(|r| (r.resort, r.season, r.day) == (resort, season, day))
                        .map(|r| r.skier)
                        .collect();
                    prop_assert_eq!(
                        store.unique_skiers(resort, season, day),
                        skiers.len() as u32
                    );
                    for skier in SKIERS {
                        let there: Vec<&Ride> = (rides.iter())
                            .filter(|r| {
                                (r.resort, r.season, r.day, r.skier) == (resort, season, day, skier)
                            })
                            .collect();
                        let expected = (!there.is_empty())
                            .then(|| there.iter().map(|r| vertical_of(r.lift)).sum());
                        prop_assert_eq!(
                            store.day_vertical(resort, season, day, skier).unwrap(),
                            expected
                        );
                    }
                }
                let seen = rides
                    .iter()
                    .any(|r| (r.resort, r.season) == (resort, season));
                prop_assert_eq!(store.seasons_with_rides(resort).contains(&season), seen);
            }
        }
        for skier in SKIERS {
            for season in 2020..2023 {
                let mine: Vec<&Ride> = (rides.iter())
                    .filter(|r| (r.skier, r.season) == (skier, season))
                    .collect();
                let days: BTreeSet<u16> = mine.iter().map(|r| r.day).collect();
                let summaries = store.days_skied(skier, season).unwrap();
                prop_assert_eq!(
                    summaries.iter().map(|s| s.day).collect::<Vec<_>>(),
                    days.iter().copied().collect::<Vec<_>>()
                );
                for day in 1..5 {
                    let that_day: Vec<DayRide> = (mine.iter())
                        .filter(|r| r.day == day)
                        .map(|r| DayRide {
                            resort: r.resort,
                            time: r.time,
                            lift: r.lift,
                        })
                        .collect();
                    if let Some(summary) = summaries.iter().find(|s| s.day == day) {
                        prop_assert_eq!(summary.rides as usize, that_day.len());
                        let vertical = that_day.iter().map(|r| vertical_of(r.lift)).sum::<u64>();
                        prop_assert_eq!(summary.vertical, vertical);
                    }
                    prop_assert_eq!(store.lifts(skier, season, day).unwrap(), that_day);
                }
            }
            for resort in 1..4 {
                let mut expected: BTreeMap<u16, u64> = BTreeMap::new();
                for r in rides
                    .iter()
                    .filter(|r| (r.skier, r.resort) == (skier, resort))
                {
                    *expected.entry(r.season).or_default() += vertical_of(r.lift);
                }
                prop_assert_eq!(
                    store.season_verticals(skier, resort, None).unwrap(),
                    expected.clone().into_iter().collect::<Vec<_>>()
                );
                let only_2021: Vec<(u16, u64)> =
                    expected.into_iter().filter(|(s, _)| *s == 2021).collect();
                prop_assert_eq!(
                    store
                        .season_verticals(skier, resort, Some(&[2021]))
                        .unwrap(),
                    only_2021
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn every_answer_is_what_the_rides_imply_before_and_after_a_restart(
            rides in rides(),
            clean_chunks in 0usize..4,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut projection = open_with_clean_chunks(dir.path(), clean_chunks);
            apply_all(&mut projection, &rides);
            let plain: Vec<Ride> = rides.iter().map(|(ride, _)| *ride).collect();
            check_answers(&projection.store, &plain)?;
            drop(projection);

            // A restart replays the journal from an older checkpoint (here: from the start); the
            // store already holds every ride and the visits of the last checkpoint, so each counts
            // once.
            let mut restarted = open_with_clean_chunks(dir.path(), clean_chunks);
            apply_all(&mut restarted, &rides);
            check_answers(&restarted.store, &plain)?;
        }
    }

    fn checkpoint(projection: &mut RideProjection) -> Vec<u8> {
        projection.flush();
        let mut bytes = Vec::new();
        projection.write_snapshot(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn a_store_behind_its_checkpoint_is_refused() {
        let ride = Ride {
            resort: 1,
            season: 2022,
            day: 1,
            skier: 8,
            time: 10,
            lift: 4,
        };
        let (written, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut projection = open(written.path());
        projection.apply(0, 0, 0, &event(&ride)).unwrap();
        let bytes = checkpoint(&mut projection);
        // The engine's position may be past other apps' records, which the store never sees.
        projection.restore(&mut bytes.as_slice(), &[5]).unwrap();
        let error = open(lost.path())
            .restore(&mut bytes.as_slice(), &[5])
            .unwrap_err();
        assert!(
            error.to_string().contains("behind its checkpoint"),
            "{error}"
        );
    }

    /// (skier, season, day) and that day's rides.
    type SkierDay = ((u32, u16, u16), Vec<DayRide>);

    /// The format the checkpoint had while the rides were in memory.
    fn checkpoint_from_before_the_store(days: &[SkierDay]) -> Vec<u8> {
        let mut out = Vec::new();
        out.write_u64_le(days.len() as u64).unwrap();
        for ((skier, season, day), rides) in days {
            out.write_u32_le(*skier).unwrap();
            out.write_u16_le(*season).unwrap();
            out.write_u16_le(*day).unwrap();
            out.write_u32_le(rides.len() as u32).unwrap();
            for ride in rides {
                out.write_u16_le(ride.resort).unwrap();
                out.write_u16_le(ride.time).unwrap();
                out.write_u16_le(ride.lift).unwrap();
            }
        }
        out
    }

    #[test]
    fn a_checkpoint_from_before_the_store_is_imported_once_and_replay_goes_on_after_it() {
        let ride = |resort, skier, time| DayRide {
            resort,
            time,
            lift: skier as u16,
        };
        let old = checkpoint_from_before_the_store(&[
            ((4, 2022, 1), vec![ride(1, 4, 30), ride(2, 4, 20)]),
            ((5, 2022, 1), vec![ride(1, 5, 10)]),
        ]);
        // Skiers 4 and 5 were on partition 0, whose records below LSN 3 the checkpoint covered.
        let positions = [3, 0];
        let later = Ride {
            resort: 1,
            season: 2022,
            day: 1,
            skier: 4,
            time: 5,
            lift: 7,
        };
        let dir = tempfile::tempdir().unwrap();
        for _start in 0..2 {
            // The second start finds the checkpoint not yet replaced and the store holding it.
            let mut projection = open(dir.path());
            projection.restore(&mut old.as_slice(), &positions).unwrap();
            projection.apply(0, 3, 0, &event(&later)).unwrap();
            projection.flush();
            let store = &projection.store;
            assert_eq!(store.ride_count(), 4);
            assert_eq!(store.unique_skiers(1, 2022, 1), 2);
            assert_eq!(store.unique_skiers(2, 2022, 1), 1);
            let lifts = store.lifts(4, 2022, 1).unwrap();
            assert_eq!(
                lifts.iter().map(|r| r.time).collect::<Vec<_>>(),
                [30, 20, 5]
            );
        }
        let mut projection = open(dir.path());
        let now = checkpoint(&mut projection);
        projection.restore(&mut now.as_slice(), &[4, 0]).unwrap();
        assert_eq!(projection.store.seasons_with_rides(2), [2022]);
    }
}
