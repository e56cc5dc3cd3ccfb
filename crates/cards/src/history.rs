//! Per-card transaction history, packed: 24 bytes per stored transaction plus 10 per card, exact.
//!
//! A card's history is one allocation: a header (base timestamp u64, entry count u16), then its entries
//! newest first (among equal timestamps, the one stored later first), then room for up to
//! [`GROWTH_ENTRIES`] - 1 more. An entry keeps every field's exact text (values plus digit counts) and the
//! verdict; its timestamp is an offset from the base. Entries more than 90 days older than the card's
//! newest are dropped, so offsets stay far below their 34-bit limit. Memory grows with the entries stored
//! (in steps of [`GROWTH_ENTRIES`], so a stream of transactions does not reallocate on every one), not
//! with the per-card cap.
//!
//! Snapshots are written in steps while scoring goes on (see [`HistoryStore::begin_snapshot`]): the cards
//! are cut into segments that a step writes whole, and a card about to change in a segment not yet
//! written is written first, as it was (copy-on-write per card, not per segment: scoring touches cards
//! at random, and copying whole segments copied nearly all of them). A bit of the card's header marks it
//! as already written, or as new since the snapshot began, so that its segment's step skips it.

use crate::HISTORY_WINDOW_MS;
use crate::record::{Digits, Txn};
use crate::rules::RuleSet;
use std::collections::HashMap;
use std::io::{self, Read, Write};

pub const ENTRY_BYTES: usize = 24;
const HEADER_BYTES: usize = 10;
const OFFSET_BITS: u32 = 34;
/// A card's allocation grows by this many entries at a time.
pub const GROWTH_ENTRIES: usize = 4;
/// The verdict stored with history that was imported rather than scored.
pub const UNSCORED: u8 = 63;
/// Default per-card cap on stored entries.
pub const ENTRIES_PER_CARD_DEFAULT: usize = 32;
/// A cap large enough for any test of the rules, small enough to bound the work per transaction.
pub const ENTRIES_PER_CARD_MAX: usize = 4096;

const _: () = assert!(HISTORY_WINDOW_MS < 1 << OFFSET_BITS);
const _: () = assert!(ENTRIES_PER_CARD_MAX < SNAPSHOT_MARK as usize);
/// The count field's top bit: the card is not to be written by its segment's step of the snapshot in
/// progress (it was written before it changed, or it is new since the snapshot began).
const SNAPSHOT_MARK: u16 = 1 << 15;
/// Segments of a store: a step writes at least one, so this bounds a step's work at large scale (30 M
/// cards on two partitions: about 230 cards, 115 KB, per segment). 2^14 segments of 450 KB made steps
/// of 10-15 ms by the wall at that scale, up to 58 ms of CPU; each segment costs an empty store about
/// 40 bytes (2.6 MB for 2^16).
const SEGMENT_BITS: u32 = 16;
/// What visiting a card costs a snapshot's step, counted against its byte budget whether or not the
/// card is written (about a cache line).
const CARD_VISIT_BYTES: usize = 64;

fn field(word: u128, shift: u32, bits: u32) -> u64 {
    ((word >> shift) & ((1u128 << bits) - 1)) as u64
}

/// One packed entry. Low 128 bits (what scoring reads most): offset 34 | amount 31 | country 10 |
/// merchant 14 | code 34 | code digits-1 4; high 64 bits: timestamp digits 5 | amount digits 4 |
/// currency 10 | response 7 | city 17 | verdict 6.
fn pack(txn: &Txn, verdict: u8, base_ms: u64) -> [u8; ENTRY_BYTES] {
    let offset = txn.timestamp_ms() - base_ms;
    debug_assert!(offset < 1 << OFFSET_BITS, "offset {offset} exceeds 34 bits");
    debug_assert!(txn.validate().is_ok());
    debug_assert!(verdict <= UNSCORED);
    let low = u128::from(offset)
        | u128::from(txn.amount.value) << 34
        | u128::from(txn.country) << 65
        | u128::from(txn.merchant) << 75
        | u128::from(txn.code.value) << 89
        | u128::from(txn.code.len - 1) << 123;
    let high = u64::from(txn.timestamp.len)
        | u64::from(txn.amount.len) << 5
        | u64::from(txn.currency) << 9
        | u64::from(txn.response) << 19
        | u64::from(txn.city) << 26
        | u64::from(verdict) << 43;
    let mut bytes = [0; ENTRY_BYTES];
    bytes[..16].copy_from_slice(&low.to_le_bytes());
    bytes[16..].copy_from_slice(&high.to_le_bytes());
    bytes
}

fn low_word(entry: &[u8]) -> u128 {
    u128::from_le_bytes(entry[..16].try_into().expect("16 bytes"))
}

fn timestamp_of(entry: &[u8], base_ms: u64) -> u64 {
    base_ms + field(low_word(entry), 0, OFFSET_BITS)
}

fn unpack(entry: &[u8], base_ms: u64, card: u64) -> (Txn, u8) {
    let low = low_word(entry);
    let high = u64::from_le_bytes(entry[16..].try_into().expect("8 bytes"));
    let txn = Txn {
        card,
        timestamp: Digits {
            value: base_ms + field(low, 0, OFFSET_BITS),
            len: (high & 0x1f) as u8,
        },
        country: field(low, 65, 10) as u16,
        response: ((high >> 19) & 0x7f) as u8,
        amount: Digits {
            value: field(low, 34, 31),
            len: ((high >> 5) & 0xf) as u8,
        },
        currency: ((high >> 9) & 0x3ff) as u16,
        merchant: field(low, 75, 14) as u16,
        city: ((high >> 26) & 0x1_ffff) as u32,
        code: Digits {
            value: field(low, 89, 34),
            len: field(low, 123, 4) as u8 + 1,
        },
    };
    (txn, ((high >> 43) & 0x3f) as u8)
}

/// One card's packed history.
struct CardHistory<'a>(&'a [u8]);

impl CardHistory<'_> {
    fn base_ms(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().expect("8 bytes"))
    }

    fn len(&self) -> usize {
        usize::from(count_field(self.0) & !SNAPSHOT_MARK)
    }

    fn entry(&self, index: usize) -> &[u8] {
        debug_assert!(index < self.len());
        let start = HEADER_BYTES + index * ENTRY_BYTES;
        &self.0[start..start + ENTRY_BYTES]
    }

    fn timestamp(&self, index: usize) -> u64 {
        timestamp_of(self.entry(index), self.base_ms())
    }

    fn decode_all(&self, card: u64) -> Vec<(Txn, u8)> {
        (0..self.len())
            .map(|i| unpack(self.entry(i), self.base_ms(), card))
            .collect()
    }

    /// The header and the stored entries, without spare room.
    fn used_bytes(&self) -> usize {
        HEADER_BYTES + self.len() * ENTRY_BYTES
    }
}

fn count_field(packed: &[u8]) -> u16 {
    u16::from_le_bytes([packed[8], packed[9]])
}

fn set_count_field(packed: &mut [u8], field: u16) {
    packed[8..10].copy_from_slice(&field.to_le_bytes());
}

/// Sets the entry count, keeping the snapshot mark.
fn set_len(packed: &mut [u8], len: usize) {
    let mark = count_field(packed) & SNAPSHOT_MARK;
    set_count_field(packed, len as u16 | mark);
}

fn is_marked(packed: &[u8]) -> bool {
    count_field(packed) & SNAPSHOT_MARK != 0
}

fn set_mark(packed: &mut [u8], marked: bool) {
    let len = count_field(packed) & !SNAPSHOT_MARK;
    set_count_field(packed, if marked { len | SNAPSHOT_MARK } else { len });
}

/// One card as a snapshot holds it: `card u64 | length u32 | header and entries` (never the mark).
fn write_card(out: &mut dyn Write, card: u64, packed: &[u8]) -> io::Result<()> {
    let used = &packed[..CardHistory(packed).used_bytes()];
    out.write_all(&card.to_le_bytes())?;
    out.write_all(&(used.len() as u32).to_le_bytes())?;
    out.write_all(&used[..8])?;
    out.write_all(&(CardHistory(packed).len() as u16).to_le_bytes())?;
    out.write_all(&used[HEADER_BYTES..])
}

fn capacity_of(packed: &[u8]) -> usize {
    (packed.len() - HEADER_BYTES) / ENTRY_BYTES
}

/// Room for `len` entries, rounded up to the growth step and capped.
fn allocation_bytes(len: usize, cap: usize) -> usize {
    HEADER_BYTES + len.next_multiple_of(GROWTH_ENTRIES).min(cap).max(len) * ENTRY_BYTES
}

/// What a card costs the store besides its entries: its slot in the card index, and the allocator's.
const CARD_OVERHEAD_BYTES: u64 = 64;

/// About the memory `cards` cards with `len` entries each take, stored with at most `cap` each.
pub fn memory_estimate_bytes(cards: u64, len: usize, cap: usize) -> u64 {
    let per_card = if len == 0 {
        CARD_OVERHEAD_BYTES
    } else {
        allocation_bytes(len.min(cap), cap) as u64 + CARD_OVERHEAD_BYTES
    };
    cards.saturating_mul(per_card)
}

/// How many transactions' cards [`HistoryStore::score_batch`] looks up together (measured: see
/// BENCHMARKS.md).
const LOOKUP_GROUP_TXNS: usize = 64;

#[cfg(target_arch = "x86_64")]
fn prefetch_read(address: *const u8) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: a prefetch is a hint; it never faults and never dereferences in a way Rust can observe.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(address.cast()) };
}

#[cfg(not(target_arch = "x86_64"))]
fn prefetch_read(_address: *const u8) {}

type CardMap = HashMap<u64, Box<[u8]>, foldhash::fast::RandomState>;

/// Every card's history on one partition.
pub struct HistoryStore {
    segments: Box<[CardMap]>,
    entries_per_card_max: usize,
    cards: usize,
    entries: u64,
    snapshot: Option<SnapshotInProgress>,
    /// Kept from call to call of [`HistoryStore::store_card`], which sorts a card's entries here as
    /// [`order_key`]s, not the entries themselves: it is called once per card of a generated history,
    /// and sorting its records took 11% of a replay of one.
    store_order: Vec<u64>,
}

/// A snapshot being written in steps: see [`HistoryStore::begin_snapshot`].
struct SnapshotInProgress {
    /// The store's header (cap, cards at the start), written by the first step.
    header: Option<[u8; 16]>,
    /// Per segment: its step has not written it yet.
    pending: Box<[bool]>,
    /// The next segment a step looks at.
    cursor: usize,
    /// Cards written before they changed, since the last step: the next step hands them on.
    preserved: Vec<u8>,
}

impl HistoryStore {
    pub fn new(entries_per_card_max: usize) -> Self {
        Self::with_segment_bits(entries_per_card_max, SEGMENT_BITS)
    }

    /// A store of `2^segment_bits` segments: fewer than [`SEGMENT_BITS`] let tests of a few cards step
    /// through snapshots quickly.
    fn with_segment_bits(entries_per_card_max: usize, segment_bits: u32) -> Self {
        assert!((1..=ENTRIES_PER_CARD_MAX).contains(&entries_per_card_max));
        assert!((1..=SEGMENT_BITS).contains(&segment_bits));
        Self {
            // One hasher state for every segment: a state of its own each drew 16,384 seeds, most of
            // the time an empty store took to make (it is made for every partition, and for every
            // input of the fuzz target `snapshot_file`).
            segments: {
                let hasher = foldhash::fast::RandomState::default();
                (0..1 << segment_bits)
                    .map(|_| CardMap::with_hasher(hasher.clone()))
                    .collect()
            },
            entries_per_card_max,
            cards: 0,
            entries: 0,
            snapshot: None,
            store_order: Vec::new(),
        }
    }

    pub fn cards(&self) -> usize {
        self.cards
    }

    pub fn entries(&self) -> u64 {
        self.entries
    }

    pub fn entries_per_card_max(&self) -> usize {
        self.entries_per_card_max
    }

    /// Bytes held for histories: the packed allocations plus the maps' slots (allocator overhead aside).
    pub fn heap_bytes(&self) -> u64 {
        let slot_bytes = (size_of::<u64>() + size_of::<Box<[u8]>>() + 1) as u64;
        let cards = self.segments.iter().flat_map(|segment| segment.values());
        let packed: u64 = cards.map(|h| h.len() as u64).sum();
        let slots: u64 = self.segments.iter().map(|s| s.capacity() as u64).sum();
        packed + slots * slot_bytes
    }

    /// Makes room for about `additional` more cards. Below a few per segment it reserves nothing: the
    /// smallest table of each segment would hold more than the cards need.
    pub fn reserve_cards(&mut self, additional: usize) {
        let per_segment = additional / self.segments.len();
        if per_segment >= GROWTH_ENTRIES {
            for segment in self.segments.iter_mut() {
                segment.reserve(per_segment);
            }
        }
    }

    /// A card's segment: the top bits of a multiplicative hash, so that card numbers in sequence
    /// spread.
    fn segment_of(&self, card: u64) -> usize {
        let segment_bits = self.segments.len().trailing_zeros();
        (card.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - segment_bits)) as usize
    }

    fn get(&self, card: u64) -> Option<&[u8]> {
        self.segments[self.segment_of(card)]
            .get(&card)
            .map(|b| &b[..])
    }

    /// Scores `txn` against its card's history with `rules`, then stores it with its verdict.
    /// `window` is scratch space, reused across calls to avoid an allocation per transaction.
    pub fn score_and_store(&mut self, txn: &Txn, rules: &dyn RuleSet, window: &mut Vec<Txn>) -> u8 {
        let t = txn.timestamp_ms();
        window.clear();
        if let Some(packed) = self.get(txn.card) {
            let history = CardHistory(packed);
            let base_ms = history.base_ms();
            for index in 0..history.len() {
                let entry = history.entry(index);
                if timestamp_of(entry, base_ms) + HISTORY_WINDOW_MS <= t {
                    break;
                }
                window.push(unpack(entry, base_ms, txn.card).0);
            }
        }
        let verdict = rules.score(txn, window);
        self.store(txn, verdict);
        verdict
    }

    /// Scores and stores each of `txns` in order (see [`Self::score_and_store`]), appending the verdicts
    /// to `verdicts`. Cards are random, so each card costs at least two cache misses: its map slot (and
    /// the table's control bytes), then its history. Before scoring a group of [`LOOKUP_GROUP_TXNS`]
    /// transactions the store looks up the next group's cards one after another, so that their slots'
    /// misses overlap, and starts fetching their histories, which then have the whole group's scoring
    /// to arrive.
    pub fn score_batch(
        &mut self,
        txns: &[Txn],
        rules: &dyn RuleSet,
        window: &mut Vec<Txn>,
        verdicts: &mut Vec<u8>,
    ) {
        let mut groups = txns.chunks(LOOKUP_GROUP_TXNS).peekable();
        if let Some(first) = groups.peek() {
            self.look_up(first.iter().map(|txn| txn.card));
        }
        while let Some(group) = groups.next() {
            if let Some(next) = groups.peek() {
                self.look_up(next.iter().map(|txn| txn.card));
            }
            for txn in group {
                verdicts.push(self.score_and_store(txn, rules, window));
            }
        }
    }

    /// Looks up `cards` one after another, so that the misses on their map slots overlap (nothing a
    /// lookup finds depends on the one before), and starts fetching the histories found: the next
    /// calls on these cards find them in the cache.
    pub fn look_up(&self, cards: impl Iterator<Item = u64>) {
        for card in cards {
            if let Some(packed) = self.get(card) {
                for offset in (0..packed.len()).step_by(64) {
                    prefetch_read(packed.as_ptr().wrapping_add(offset));
                }
            }
        }
    }

    /// The card's stored history, newest first, with verdicts.
    pub fn history(&self, card: u64) -> Vec<(Txn, u8)> {
        self.get(card)
            .map(|packed| CardHistory(packed).decode_all(card))
            .unwrap_or_default()
    }

    /// Stores `txn` with `verdict`, keeping the newest entries up to the cap and dropping those more than
    /// 90 days older than the newest.
    pub fn store(&mut self, txn: &Txn, verdict: u8) {
        let segment = self.segment_of(txn.card);
        let snapshot_pending = self.snapshot.as_ref().is_some_and(|s| s.pending[segment]);
        if snapshot_pending {
            self.preserve(segment, txn.card);
        }
        self.change(segment, txn, verdict);
        if snapshot_pending && let Some(packed) = self.segments[segment].get_mut(&txn.card) {
            // Written before the change, or new: either way its segment's step must skip it.
            set_mark(packed, true);
        }
    }

    /// Stores `txns`, all of one card, with `verdict`: the same store as [`Self::store`] of each in
    /// order, built at once when the card is new and keeps every one (a generated history arrives a
    /// card at a time). One by one, each entry older than the card's oldest rebuilt the card, and each
    /// growth reallocated it: about 3 rebuilds and 4 reallocations for 20 entries in random order.
    pub fn store_card(&mut self, txns: &[Txn], verdict: u8) {
        let Some(first) = txns.first() else {
            return;
        };
        let card = first.card;
        debug_assert!(txns.iter().all(|txn| txn.card == card));
        let newest_ms = txns.iter().map(Txn::timestamp_ms).max().unwrap_or(0);
        // One by one, an entry is dropped (by the cap or the window) only in these cases; otherwise the
        // card ends as every entry, newest first, later stored first among equal timestamps, on a base
        // of the oldest (each older one rebuilt it on itself).
        let keeps_all = txns.len() <= self.entries_per_card_max
            && txns
                .iter()
                .all(|txn| txn.timestamp_ms() + HISTORY_WINDOW_MS > newest_ms);
        let segment = self.segment_of(card);
        if !keeps_all || self.segments[segment].contains_key(&card) {
            for txn in txns {
                self.store(txn, verdict);
            }
            return;
        }
        let base_ms = txns.iter().map(Txn::timestamp_ms).min().unwrap_or(0);
        let mut order = std::mem::take(&mut self.store_order);
        order.clear();
        order.extend((txns.iter().zip(0..)).map(|(txn, place)| order_key(txn, place, base_ms)));
        order.sort_unstable();
        // Newest first, and among equal timestamps the later stored first.
        let entries = (order.iter().rev()).map(|&key| (&txns[order_place(key)], verdict));
        let mut packed = encode_from(entries, txns.len(), base_ms, self.entries_per_card_max);
        self.store_order = order;
        // New since a snapshot began, if one is in progress: its segment's step must skip it.
        let snapshot_pending = self.snapshot.as_ref().is_some_and(|s| s.pending[segment]);
        set_mark(&mut packed, snapshot_pending);
        self.segments[segment].insert(card, packed);
        self.cards += 1;
        self.entries += txns.len() as u64;
    }

    /// Writes `card` as it is into the snapshot in progress, unless it was written or is new.
    fn preserve(&mut self, segment: usize, card: u64) {
        let snapshot = self.snapshot.as_mut().expect("a snapshot is in progress");
        if let Some(packed) = self.segments[segment].get(&card)
            && !is_marked(packed)
        {
            write_card(&mut snapshot.preserved, card, packed).expect("a Vec takes every write");
        }
    }

    fn change(&mut self, segment: usize, txn: &Txn, verdict: u8) {
        let t = txn.timestamp_ms();
        let cap = self.entries_per_card_max;
        let cards = &mut self.segments[segment];
        let Some(packed) = cards.get_mut(&txn.card) else {
            cards.insert(txn.card, encode(&[(*txn, verdict)], cap));
            self.cards += 1;
            self.entries += 1;
            return;
        };
        let history = CardHistory(packed);
        let base_ms = history.base_ms();
        let len = history.len();
        let newest_ms = history.timestamp(0).max(t);
        let fits_base = t >= base_ms && t - base_ms < 1 << OFFSET_BITS;
        if !fits_base {
            // Rare (an entry older than the base, or a jump of months): rebuild with a new base.
            let mut all = history.decode_all(txn.card);
            let position = all
                .iter()
                .position(|(h, _)| h.timestamp_ms() <= t)
                .unwrap_or(all.len());
            all.insert(position, (*txn, verdict));
            all.truncate(cap);
            all.retain(|(h, _)| h.timestamp_ms() + HISTORY_WINDOW_MS > newest_ms);
            self.entries = self.entries - len as u64 + all.len() as u64;
            if all.is_empty() {
                cards.remove(&txn.card);
                self.cards -= 1;
            } else {
                *packed = encode(&all, cap);
            }
            return;
        }
        let position = (0..len).find(|&i| history.timestamp(i) <= t).unwrap_or(len);
        if position == cap {
            return; // Older than every entry of a full history: it would be the one dropped.
        }
        let new_len = (len + 1).min(cap);
        if new_len > capacity_of(packed) {
            let mut grown = std::mem::take(packed).into_vec();
            let bytes = allocation_bytes(new_len, cap);
            grown.reserve_exact(bytes - grown.len());
            grown.resize(bytes, 0);
            *packed = grown.into_boxed_slice();
        }
        // Shift the entries from `position` back by one (the last falls off a full history) and insert.
        let at = HEADER_BYTES + position * ENTRY_BYTES;
        let end = HEADER_BYTES + (new_len - 1) * ENTRY_BYTES;
        packed.copy_within(at..end, at + ENTRY_BYTES);
        packed[at..at + ENTRY_BYTES].copy_from_slice(&pack(txn, verdict, base_ms));
        let mut kept = new_len;
        while kept > 1
            && timestamp_of(&packed[HEADER_BYTES + (kept - 1) * ENTRY_BYTES..], base_ms)
                + HISTORY_WINDOW_MS
                <= newest_ms
        {
            kept -= 1;
        }
        set_len(packed, kept);
        self.entries = self.entries - len as u64 + kept as u64;
        if capacity_of(packed) >= kept + 2 * GROWTH_ENTRIES {
            let mut shrunk = std::mem::take(packed).into_vec();
            shrunk.truncate(allocation_bytes(kept, cap));
            *packed = shrunk.into_boxed_slice();
        }
        debug_assert!(kept >= 1 && kept <= cap && kept <= capacity_of(packed));
    }

    /// Writes the whole store at once; [`Self::restore`] reads it, and what the steps of a snapshot
    /// write, alike.
    pub fn write_snapshot(&self, out: &mut dyn Write) -> io::Result<()> {
        assert!(
            self.snapshot.is_none(),
            "a snapshot is being written in steps"
        );
        out.write_all(&self.header())?;
        for (card, packed) in self.segments.iter().flatten() {
            write_card(out, *card, packed)?;
        }
        Ok(())
    }

    fn header(&self) -> [u8; 16] {
        let mut header = [0; 16];
        header[..8].copy_from_slice(&(self.entries_per_card_max as u64).to_le_bytes());
        header[8..].copy_from_slice(&(self.cards as u64).to_le_bytes());
        header
    }

    /// Starts a snapshot of the store as it is now, which [`Self::snapshot_step`] then writes while
    /// transactions go on being stored: the cards are written in any order, each as it was here.
    pub fn begin_snapshot(&mut self) {
        assert!(self.snapshot.is_none(), "one snapshot at a time");
        self.snapshot = Some(SnapshotInProgress {
            header: Some(self.header()),
            pending: vec![true; self.segments.len()].into(),
            cursor: 0,
            preserved: Vec::new(),
        });
    }

    /// Writes the cards preserved since the last step, then whole segments until about `bytes_budget`
    /// bytes are written; true once the snapshot is all written.
    pub fn snapshot_step(&mut self, out: &mut dyn Write, bytes_budget: usize) -> io::Result<bool> {
        let snapshot = self.snapshot.as_mut().expect("a snapshot is in progress");
        if let Some(header) = snapshot.header.take() {
            out.write_all(&header)?;
        }
        // All at once: scoring forces out cards far faster than steps of the budget would hand them on
        // (measured: the backlog grew by hundreds of MB, and fraud scored 8-10% fewer transactions),
        // and what one batch forces out is bounded by its transactions.
        out.write_all(&snapshot.preserved)?;
        let mut written = snapshot.preserved.len();
        snapshot.preserved.clear();
        while written < bytes_budget && snapshot.cursor < self.segments.len() {
            let segment = snapshot.cursor;
            snapshot.cursor += 1;
            debug_assert!(snapshot.pending[segment]);
            snapshot.pending[segment] = false;
            for (card, packed) in self.segments[segment].iter_mut() {
                // A card skipped costs a cache miss too: count it, so that a step through segments
                // whose cards were all written ahead of it still stops.
                written += CARD_VISIT_BYTES;
                if is_marked(packed) {
                    set_mark(packed, false);
                } else {
                    write_card(out, *card, packed)?;
                    written += 12 + CardHistory(packed).used_bytes();
                }
            }
        }
        let done = snapshot.cursor == self.segments.len();
        if done {
            self.snapshot = None;
        }
        Ok(done)
    }

    /// Asserts what holds between snapshots: no card carries the mark, and the counts are right.
    pub fn check(&self) {
        assert!(self.snapshot.is_none());
        let mut counted = (0, 0);
        for (index, segment) in self.segments.iter().enumerate() {
            for (card, packed) in segment {
                assert!(!is_marked(packed), "card {card} still marked");
                assert_eq!(
                    self.segment_of(*card),
                    index,
                    "card {card} in another segment"
                );
                counted.0 += 1;
                counted.1 += CardHistory(packed).len() as u64;
            }
        }
        assert_eq!(counted, (self.cards, self.entries));
    }

    pub fn restore(input: &mut dyn Read) -> io::Result<Self> {
        const RESTORE_CARDS_BEFORE_RESERVING: u64 = 1024;
        let mut word = [0; 8];
        input.read_exact(&mut word)?;
        let cap = u64::from_le_bytes(word) as usize;
        if !(1..=ENTRIES_PER_CARD_MAX).contains(&cap) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad history cap",
            ));
        }
        input.read_exact(&mut word)?;
        let count = u64::from_le_bytes(word);
        let mut store = Self::new(cap);
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        for read in 0..count {
            // Reserved for the whole count (so that the tables never rehash) once its first cards
            // were read whole, and bounded by what a partition can hold: a count damaged in a short
            // or garbled section reserves nothing, and no count can reserve the machine.
            if read == RESTORE_CARDS_BEFORE_RESERVING {
                store.reserve_cards((count.min(1 << 26) - read) as usize);
            }
            input.read_exact(&mut word)?;
            let card = u64::from_le_bytes(word);
            let mut len = [0; 4];
            input.read_exact(&mut len)?;
            let len = u32::from_le_bytes(len) as usize;
            if len < HEADER_BYTES + ENTRY_BYTES
                || !(len - HEADER_BYTES).is_multiple_of(ENTRY_BYTES)
                || len > HEADER_BYTES + cap * ENTRY_BYTES
            {
                return Err(invalid("bad card history length"));
            }
            let mut packed = vec![0; len];
            input.read_exact(&mut packed)?;
            if is_marked(&packed)
                || CardHistory(&packed).len() != (len - HEADER_BYTES) / ENTRY_BYTES
            {
                return Err(invalid("card history count disagrees with its length"));
            }
            let entries = CardHistory(&packed).len();
            let segment = store.segment_of(card);
            let segment = &mut store.segments[segment];
            if segment.insert(card, packed.into_boxed_slice()).is_some() {
                return Err(invalid("a card's history appears twice"));
            }
            store.cards += 1;
            store.entries += entries as u64;
        }
        Ok(store)
    }
}

/// Packs entries (newest first) with the oldest timestamp as the base.
fn encode(entries: &[(Txn, u8)], cap: usize) -> Box<[u8]> {
    let base_ms = entries
        .iter()
        .map(|(t, _)| t.timestamp_ms())
        .min()
        .expect("at least one entry");
    let entries_by_reference = entries.iter().map(|(txn, verdict)| (txn, *verdict));
    encode_from(entries_by_reference, entries.len(), base_ms, cap)
}

/// Bits of an [`order_key`] that hold the entry's place among the card's records.
const ORDER_PLACE_BITS: u32 = ENTRIES_PER_CARD_MAX.trailing_zeros();
const _: () = assert!(ENTRIES_PER_CARD_MAX.is_power_of_two());
const _: () = assert!(OFFSET_BITS + ORDER_PLACE_BITS <= u64::BITS);

/// One integer per entry of a card stored whole, which orders as the entries do by timestamp, then by
/// place: an integer sorts with a branchless network where a pair sorts by insertion, whose
/// mispredicted branches were most of a generated card's sort.
fn order_key(txn: &Txn, place: usize, base_ms: u64) -> u64 {
    let offset_ms = txn.timestamp_ms() - base_ms;
    debug_assert!(offset_ms < 1 << OFFSET_BITS && place < ENTRIES_PER_CARD_MAX);
    offset_ms << ORDER_PLACE_BITS | place as u64
}

/// The place an [`order_key`] holds.
fn order_place(key: u64) -> usize {
    (key & ((1 << ORDER_PLACE_BITS) - 1)) as usize
}

/// [`encode`] of `len` entries, newest first, on `base_ms`, the oldest one's timestamp.
fn encode_from<'a>(
    entries: impl Iterator<Item = (&'a Txn, u8)>,
    len: usize,
    base_ms: u64,
    cap: usize,
) -> Box<[u8]> {
    let allocation = allocation_bytes(len, cap);
    let mut bytes = Vec::with_capacity(allocation);
    bytes.extend_from_slice(&base_ms.to_le_bytes());
    bytes.extend_from_slice(&(len as u16).to_le_bytes());
    for (txn, verdict) in entries {
        bytes.extend_from_slice(&pack(txn, verdict, base_ms));
    }
    assert_eq!(bytes.len(), HEADER_BYTES + len * ENTRY_BYTES);
    bytes.resize(allocation, 0);
    bytes.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::parse_body;
    use crate::rules::CaseStudyRules;

    const T: u64 = 1_800_000_000_000;

    fn txn(card: u64, ts: u64, amount: u64) -> Txn {
        Txn {
            card,
            timestamp: Digits::of(ts),
            amount: Digits::of(amount),
            code: Digits::padded(7, 5),
            ..Txn::default()
        }
    }

    #[test]
    fn packing_keeps_every_field_exactly() {
        let odd = parse_body(
            b"99999999999999,0001800000000000,999,99,0147483647,999,9999,99999,0000000001",
        )
        .unwrap();
        let entry = pack(&odd, 49, T - 5);
        assert_eq!(unpack(&entry, T - 5, odd.card), (odd, 49));
        let plain =
            parse_body(b"00000000548985,1795294622406,185,00,3915,185,0485,08985,548985").unwrap();
        assert_eq!(
            unpack(
                &pack(&plain, 0, plain.timestamp_ms()),
                plain.timestamp_ms(),
                plain.card
            ),
            (plain, 0)
        );
    }

    #[test]
    fn keeps_newest_first_with_later_stored_first_among_equal_timestamps() {
        let mut store = HistoryStore::new(8);
        store.store(&txn(1, T, 1), 0);
        store.store(&txn(1, T + 10, 2), 0);
        store.store(&txn(1, T - 10, 3), 0);
        store.store(&txn(1, T, 4), 0);
        let amounts: Vec<u64> = store
            .history(1)
            .iter()
            .map(|(t, _)| t.amount.value)
            .collect();
        assert_eq!(amounts, [2, 4, 1, 3]);
        assert_eq!(store.entries(), 4);
    }

    #[test]
    fn the_cap_keeps_the_newest_and_memory_follows_what_is_stored() {
        let mut store = HistoryStore::new(3);
        for i in 0..5 {
            store.store(&txn(1, T + i, i), 0);
        }
        let amounts: Vec<u64> = store
            .history(1)
            .iter()
            .map(|(t, _)| t.amount.value)
            .collect();
        assert_eq!(amounts, [4, 3, 2]);
        store.store(&txn(1, T - 100, 99), 0);
        assert_eq!(
            store.history(1).len(),
            3,
            "an entry older than a full history is not kept"
        );
        store.store(&txn(2, T, 1), 0);
        assert_eq!(store.entries(), 4);
        assert_eq!(store.cards(), 2);
        // Card 1 holds its cap of 3; card 2 one entry, with room up to the growth step or the cap.
        assert_eq!(store.get(1).unwrap().len(), HEADER_BYTES + 3 * ENTRY_BYTES);
        assert_eq!(store.get(2).unwrap().len(), HEADER_BYTES + 3 * ENTRY_BYTES);
        let mut store = HistoryStore::new(32);
        for i in 0..9 {
            store.store(&txn(1, T + i, i), 0);
        }
        assert_eq!(
            store.get(1).unwrap().len(),
            HEADER_BYTES + 12 * ENTRY_BYTES,
            "grows in steps"
        );
    }

    #[test]
    fn entries_older_than_90_days_before_the_newest_are_dropped_and_rebasing_is_exact() {
        let mut store = HistoryStore::new(32);
        store.store(&txn(1, T, 1), 0);
        store.store(&txn(1, T + HISTORY_WINDOW_MS - 1, 2), 0);
        assert_eq!(store.history(1).len(), 2);
        store.store(&txn(1, T + HISTORY_WINDOW_MS, 3), 0);
        let amounts: Vec<u64> = store
            .history(1)
            .iter()
            .map(|(t, _)| t.amount.value)
            .collect();
        assert_eq!(amounts, [3, 2]);
        // Far in the future: everything before is dropped and the base moves.
        store.store(&txn(1, T + 1000 * HISTORY_WINDOW_MS, 4), 0);
        store.store(&txn(1, T + 1000 * HISTORY_WINDOW_MS - 5, 5), 0);
        let kept: Vec<(u64, u64)> = store
            .history(1)
            .iter()
            .map(|(t, _)| (t.timestamp_ms(), t.amount.value))
            .collect();
        assert_eq!(
            kept,
            [
                (T + 1000 * HISTORY_WINDOW_MS, 4),
                (T + 1000 * HISTORY_WINDOW_MS - 5, 5)
            ]
        );
        assert_eq!(store.entries(), 2);
    }

    #[test]
    fn scoring_sees_only_the_90_day_window_and_stores_the_verdict() {
        let mut store = HistoryStore::new(32);
        store.store(&txn(1, T, 100), UNSCORED);
        let mut window = Vec::new();
        // Rule 36: above the average of the last 60 days.
        let verdict = store.score_and_store(&txn(1, T + 1000, 101), &CaseStudyRules, &mut window);
        assert_eq!(verdict, 36);
        assert_eq!(window.len(), 1);
        let stored = store.history(1);
        assert_eq!((stored[0].1, stored[1].1), (36, UNSCORED));
        let later = T + HISTORY_WINDOW_MS + 1000;
        store.score_and_store(&txn(1, later, 101), &CaseStudyRules, &mut window);
        assert!(window.is_empty(), "both earlier entries are 90 days old");
    }

    mod steps {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            /// Card, minutes after T (or a year before it, which rebuilds the card), amount, verdict.
            Store(u64, u64, bool, u64, u8),
            Begin,
            Step(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (0..48u64, 0..5_000u64, proptest::bool::weighted(0.05), 0..1_000u64, 0..50u8)
                    .prop_map(|(card, minutes, rebuild, amount, verdict)| {
                        Op::Store(card * 7_919, minutes, rebuild, amount, verdict)
                    }),
                1 => Just(Op::Begin),
                3 => (1..400usize).prop_map(Op::Step),
            ]
        }

        fn same_cards(a: &HistoryStore, b: &HistoryStore) {
            assert_eq!((a.cards(), a.entries()), (b.cards(), b.entries()));
            for card in (0..48u64).map(|c| c * 7_919) {
                assert_eq!(a.history(card), b.history(card), "card {card}");
            }
        }

        proptest! {
            /// A snapshot written in steps, with transactions stored between the steps, reads back as
            /// the store was when it began; the marks are all gone once it is written.
            #[test]
            fn a_snapshot_in_steps_is_the_store_as_it_began(ops in proptest::collection::vec(op(), 1..300)) {
                let mut store = HistoryStore::with_segment_bits(6, 8);
                let mut in_progress: Option<(HistoryStore, Vec<u8>)> = None;
                let step = |store: &mut HistoryStore, bytes: &mut Vec<u8>, budget| {
                    store.snapshot_step(bytes, budget).unwrap()
                };
                for op in ops {
                    match op {
                        Op::Store(card, minutes, rebuild, amount, verdict) => {
                            let ts = if rebuild { T - 365 * 86_400_000 } else { T + minutes * 60_000 };
                            store.store(&txn(card, ts, amount), verdict);
                        }
                        Op::Begin if in_progress.is_none() => {
                            let mut whole = Vec::new();
                            store.write_snapshot(&mut whole).unwrap();
                            let expected = HistoryStore::restore(&mut whole.as_slice()).unwrap();
                            store.begin_snapshot();
                            in_progress = Some((expected, Vec::new()));
                        }
                        Op::Begin => {}
                        Op::Step(budget) => {
                            if let Some((expected, mut bytes)) = in_progress.take() {
                                if step(&mut store, &mut bytes, budget) {
                                    let restored = HistoryStore::restore(&mut bytes.as_slice()).unwrap();
                                    same_cards(&restored, &expected);
                                    store.check();
                                } else {
                                    in_progress = Some((expected, bytes));
                                }
                            }
                        }
                    }
                }
                if let Some((expected, mut bytes)) = in_progress {
                    while !step(&mut store, &mut bytes, 1 << 20) {}
                    same_cards(&HistoryStore::restore(&mut bytes.as_slice()).unwrap(), &expected);
                }
                store.check();
            }

            /// A batch scored at once, its cards looked up a group ahead, gives the verdicts and the
            /// store that scoring its transactions one at a time gives, cards repeated within and
            /// across groups included.
            #[test]
            fn a_batch_scored_at_once_is_the_batch_scored_one_by_one(
                history in proptest::collection::vec((0..48u64, 0..5_000u64, 0..1_000u64), 0..100),
                batch in proptest::collection::vec((0..48u64, 0..5_000u64, 0..3_000u64), 0..(3 * LOOKUP_GROUP_TXNS)),
            ) {
                let mut at_once = HistoryStore::with_segment_bits(20, 4);
                for (card, minutes, amount) in history {
                    at_once.store(&txn(card * 7_919, T + minutes * 60_000, amount), UNSCORED);
                }
                let mut one_by_one = HistoryStore::restore(&mut {
                    let mut whole = Vec::new();
                    at_once.write_snapshot(&mut whole).unwrap();
                    whole
                }.as_slice()).unwrap();
                let txns: Vec<Txn> = batch
                    .iter()
                    .map(|&(card, minutes, amount)| txn(card * 7_919, T + minutes * 60_000, amount))
                    .collect();
                let mut window = Vec::new();
                let mut verdicts = Vec::new();
                at_once.score_batch(&txns, &CaseStudyRules, &mut window, &mut verdicts);
                let expected: Vec<u8> = txns
                    .iter()
                    .map(|txn| one_by_one.score_and_store(txn, &CaseStudyRules, &mut window))
                    .collect();
                prop_assert_eq!(verdicts, expected);
                same_cards(&at_once, &one_by_one);
            }

            /// A card stored at once is byte for byte the card stored one entry at a time (capacity and
            /// snapshot mark included), new or not, whatever the cap and the window drop, with
            /// snapshots begun and stepped between cards.
            #[test]
            fn a_card_stored_at_once_is_the_card_stored_one_by_one(
                cards in proptest::collection::vec(
                    (
                        0..48u64,
                        proptest::collection::vec((0..2_000u64, proptest::bool::weighted(0.05), 0..1_000u64), 0..12),
                        0..50u8,
                        proptest::option::weighted(0.2, 1..400usize),
                    ),
                    1..60,
                ),
                cap in 1..10usize,
            ) {
                let mut at_once = HistoryStore::with_segment_bits(cap, 4);
                let mut one_by_one = HistoryStore::with_segment_bits(cap, 4);
                let mut snapshots: Option<(Vec<u8>, Vec<u8>)> = None;
                for (card, entries, verdict, step) in cards {
                    let card = card * 7_919;
                    let txns: Vec<Txn> = entries
                        .iter()
                        .map(|&(minutes, far, amount)| {
                            // Far: 100 days later, so that the window drops what came before.
                            let far_ms = if far { 100 * 86_400_000 } else { 0 };
                            txn(card, T + minutes * 60_000 + far_ms, amount)
                        })
                        .collect();
                    at_once.store_card(&txns, verdict);
                    for txn in &txns {
                        one_by_one.store(txn, verdict);
                    }
                    prop_assert_eq!(at_once.get(card), one_by_one.get(card), "card {}", card);
                    prop_assert_eq!(
                        (at_once.cards(), at_once.entries(), at_once.heap_bytes()),
                        (one_by_one.cards(), one_by_one.entries(), one_by_one.heap_bytes())
                    );
                    match (step, snapshots.as_mut()) {
                        (Some(_), None) => {
                            at_once.begin_snapshot();
                            one_by_one.begin_snapshot();
                            snapshots = Some((Vec::new(), Vec::new()));
                        }
                        (Some(budget), Some((a, b))) => {
                            let done = at_once.snapshot_step(a, budget).unwrap();
                            prop_assert_eq!(done, one_by_one.snapshot_step(b, budget).unwrap());
                            if done {
                                same_cards(
                                    &HistoryStore::restore(&mut a.as_slice()).unwrap(),
                                    &HistoryStore::restore(&mut b.as_slice()).unwrap(),
                                );
                                snapshots = None;
                            }
                        }
                        (None, _) => {}
                    }
                }
                if let Some((mut a, mut b)) = snapshots {
                    while !at_once.snapshot_step(&mut a, 1 << 20).unwrap() {}
                    while !one_by_one.snapshot_step(&mut b, 1 << 20).unwrap() {}
                    same_cards(
                        &HistoryStore::restore(&mut a.as_slice()).unwrap(),
                        &HistoryStore::restore(&mut b.as_slice()).unwrap(),
                    );
                }
                at_once.check();
            }
        }
    }

    #[test]
    fn snapshot_round_trip() {
        let mut store = HistoryStore::new(4);
        for card in 0..50 {
            for i in 0..(card % 7) {
                store.store(&txn(card, T + i * 1000, card * 10 + i), (i % 50) as u8);
            }
        }
        let mut bytes = Vec::new();
        store.write_snapshot(&mut bytes).unwrap();
        let restored = HistoryStore::restore(&mut bytes.as_slice()).unwrap();
        assert_eq!(restored.entries(), store.entries());
        for card in 0..50 {
            assert_eq!(restored.history(card), store.history(card));
        }
        assert!(HistoryStore::restore(&mut &bytes[..bytes.len() - 1]).is_err());
    }
}
