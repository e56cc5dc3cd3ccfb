//! A board: its settings and its seasons. A season is one ranking: members by name, their scores, and
//! the [`RankTree`] that orders them. Only the newest season takes updates; a reset starts a new one and
//! keeps the old ones readable.

use crate::snapshot_vec::SnapshotVec;
use crate::tree::{Entry, RankTree};
use spate_engine::wire::{Put, Reader, WireError};
use std::collections::HashMap;

/// Most members one season holds; an update that would add one more is refused.
pub const MEMBERS_PER_BOARD_MAX: usize = 100_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Highest score first.
    Descending,
    Ascending,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TiePolicy {
    /// Whoever reached the score first ranks higher.
    First,
    /// A random tie-breaker drawn at ingest on every update (the case study's).
    Random,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Set,
    Increment,
    /// Keeps the better of the old and the new score.
    Best,
    /// Keeps the worse of the old and the new score.
    Worst,
}

macro_rules! named_enum {
    ($type:ty { $($variant:ident = $code:literal, $name:literal;)* }) => {
        impl $type {
            pub const NAMES: &'static [&'static str] = &[$($name),*];
            pub fn name(self) -> &'static str {
                match self { $(Self::$variant => $name),* }
            }
            pub fn parse(name: &str) -> Option<Self> {
                match name { $($name => Some(Self::$variant),)* _ => None }
            }
            pub fn code(self) -> u8 {
                match self { $(Self::$variant => $code),* }
            }
            pub fn from_code(code: u8) -> Option<Self> {
                match code { $($code => Some(Self::$variant),)* _ => None }
            }
        }
    };
}

named_enum!(Order { Descending = 0, "descending"; Ascending = 1, "ascending"; });
named_enum!(TiePolicy { First = 0, "first"; Random = 1, "random"; });
named_enum!(Operator { Set = 0, "set"; Increment = 1, "increment"; Best = 2, "best"; Worst = 3, "worst"; });

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoardConfig {
    pub order: Order,
    pub ties: TiePolicy,
    pub operator: Operator,
}

impl BoardConfig {
    pub fn encode(&self, out: &mut impl Put) {
        out.put_u8(self.order.code());
        out.put_u8(self.ties.code());
        out.put_u8(self.operator.code());
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let order = Order::from_code(r.u8()?).ok_or_else(|| r.invalid("order"))?;
        let ties = TiePolicy::from_code(r.u8()?).ok_or_else(|| r.invalid("tie policy"))?;
        let operator = Operator::from_code(r.u8()?).ok_or_else(|| r.invalid("operator"))?;
        Ok(Self {
            order,
            ties,
            operator,
        })
    }

    /// The tree key of a score: better scores get smaller keys, so rank 1 is the first entry.
    fn key(&self, score: i128) -> u128 {
        let ascending = (score as u128) ^ (1 << 127);
        match self.order {
            Order::Ascending => ascending,
            Order::Descending => !ascending,
        }
    }

    fn score(&self, key: u128) -> i128 {
        let ascending = match self.order {
            Order::Ascending => key,
            Order::Descending => !key,
        };
        (ascending ^ (1 << 127)) as i128
    }

    /// A member's new score from its old one.
    fn combine(&self, operator: Operator, old: i128, value: i128) -> Result<i128, UpdateError> {
        Ok(match operator {
            Operator::Set => value,
            Operator::Increment => old.checked_add(value).ok_or(UpdateError::Overflow)?,
            Operator::Best => self.better(old, value),
            Operator::Worst => self.worse(old, value),
        })
    }

    fn better(&self, a: i128, b: i128) -> i128 {
        match self.order {
            Order::Descending => a.max(b),
            Order::Ascending => a.min(b),
        }
    }

    fn worse(&self, a: i128, b: i128) -> i128 {
        match self.order {
            Order::Descending => a.min(b),
            Order::Ascending => a.max(b),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateError {
    /// The increment would leave the 128-bit range; nothing changed.
    Overflow,
    /// The season holds [`MEMBERS_PER_BOARD_MAX`] members already.
    Full,
}

/// A member's standing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// 1 is best.
    pub rank: u64,
    pub member: String,
    pub score: i128,
}

#[derive(Debug, Clone)]
struct Slot {
    /// Empty when the slot is free (its member was deleted).
    name: Box<str>,
    entry: Entry,
}

type MemberIndex = HashMap<Box<str>, u32, foldhash::fast::RandomState>;

/// One ranking. Every live member has exactly one entry in `tree`, equal to its slot's `entry`.
///
/// The slots and the free list are what a snapshot writes (the index and the tree are rebuilt from
/// them), so they are [`SnapshotVec`]s: a snapshot writes them in steps while updates go on.
#[derive(Debug)]
pub struct Season {
    pub number: u32,
    pub started_ms: u64,
    index: MemberIndex,
    slots: SnapshotVec<Slot>,
    free_slots: SnapshotVec<u32>,
    /// The bytes of every slot's name, so that a snapshot knows its length when it begins.
    name_bytes: u64,
    tree: RankTree,
    /// The next tie-breaker under [`TiePolicy::First`]: it only grows, so earlier means better.
    next_tie: u64,
}

/// What a snapshot writes of a season besides its slots and free list, as it was when it began.
#[derive(Debug, Clone, Copy)]
pub struct SeasonHeader {
    number: u32,
    started_ms: u64,
    next_tie: u64,
    slot_count: u32,
    free_count: u32,
    name_bytes: u64,
}

/// A slot's bytes in a snapshot besides its name's: the name's length, the entry's key and tie.
const SLOT_BYTES: u64 = 4 + 16 + 8;

impl Season {
    pub fn new(number: u32, started_ms: u64) -> Self {
        Self {
            number,
            started_ms,
            index: MemberIndex::default(),
            slots: SnapshotVec::default(),
            free_slots: SnapshotVec::default(),
            name_bytes: 0,
            tree: RankTree::default(),
            next_tie: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.tree.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    /// Applies one score update and returns the member's new score. `random_tie` is this update's
    /// tie-breaker under [`TiePolicy::Random`] (drawn at ingest, so replay is identical).
    pub fn update(
        &mut self,
        config: &BoardConfig,
        member: &str,
        operator: Operator,
        value: i128,
        random_tie: u64,
    ) -> Result<i128, UpdateError> {
        let found = self.index.get(member).copied();
        self.update_found(config, member, found, operator, value, random_tie)
    }

    /// Looks up the slots of a batch's members before any update is applied. The lookups do not depend
    /// on each other, so the CPU overlaps their cache misses, which inside each update it could not.
    pub fn find_slots<'a>(
        &self,
        members: impl Iterator<Item = &'a str>,
        slots: &mut Vec<Option<u32>>,
    ) {
        slots.clear();
        slots.extend(members.map(|member| {
            let slot = self.index.get(member).copied();
            if let Some(slot) = slot {
                crate::tree::prefetch(std::slice::from_ref(&self.slots[slot as usize]));
            }
            slot
        }));
    }

    /// Starts loading the tree leaves an update will touch (where the member is, and where its new score
    /// goes), a few updates before it is applied; `found` is from [`Season::find_slots`].
    pub fn prefetch_update(
        &self,
        config: &BoardConfig,
        found: Option<u32>,
        operator: Operator,
        value: i128,
    ) {
        let Some(slot) = found else { return };
        let old = self.slots[slot as usize].entry;
        self.tree.prefetch_leaf(&old);
        if let Ok(score) = config.combine(operator, config.score(old.key), value) {
            // The newest tie-breaker sorts after every equal score, as `u64::MAX` does.
            let new = Entry {
                key: config.key(score),
                tie: u64::MAX,
                member: slot,
            };
            self.tree.prefetch_leaf(&new);
        }
    }

    /// [`Season::update`] with the member's slot found beforehand by [`Season::find_slots`] in the same
    /// batch. Slots are only freed by deletes, never inside a batch of updates, so a found slot is still
    /// the member's; `None` is looked up again, since an earlier update of the batch may have added it.
    pub fn update_found(
        &mut self,
        config: &BoardConfig,
        member: &str,
        found: Option<u32>,
        operator: Operator,
        value: i128,
        random_tie: u64,
    ) -> Result<i128, UpdateError> {
        debug_assert!(found.is_none_or(|slot| *self.slots[slot as usize].name == *member));
        let Some(slot) = found.or_else(|| self.index.get(member).copied()) else {
            if self.tree.len() >= MEMBERS_PER_BOARD_MAX {
                return Err(UpdateError::Full);
            }
            // A new member's old score is "none": every operator yields `value`.
            let tie = self.tie(config, random_tie);
            self.add_member(member, config.key(value), tie);
            return Ok(value);
        };
        let old = self.slots[slot as usize].entry;
        let old_score = config.score(old.key);
        let score = config.combine(operator, old_score, value)?;
        if score == old_score && config.ties == TiePolicy::First {
            // Still the same score, reached back then: the old tie-breaker stands.
            return Ok(score);
        }
        let new = Entry {
            key: config.key(score),
            tie: self.tie(config, random_tie),
            member: slot,
        };
        self.tree.replace(&old, new);
        self.slots[slot as usize].entry = new;
        Ok(score)
    }

    fn tie(&mut self, config: &BoardConfig, random_tie: u64) -> u64 {
        match config.ties {
            TiePolicy::Random => random_tie,
            TiePolicy::First => {
                self.next_tie += 1;
                self.next_tie
            }
        }
    }

    fn add_member(&mut self, name: &str, key: u128, tie: u64) {
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot {
                    name: "".into(),
                    entry: Entry {
                        key: 0,
                        tie: 0,
                        member: 0,
                    },
                });
                u32::try_from(self.slots.len() - 1).expect("member slots fit in u32")
            }
        };
        let entry = Entry {
            key,
            tie,
            member: slot,
        };
        self.slots[slot as usize] = Slot {
            name: name.into(),
            entry,
        };
        self.name_bytes += name.len() as u64;
        self.index.insert(name.into(), slot);
        self.tree.insert(entry);
    }

    /// Removes a member; returns whether it was there.
    pub fn delete(&mut self, member: &str) -> bool {
        let Some(slot) = self.index.remove(member) else {
            return false;
        };
        let removed = self.tree.remove(&self.slots[slot as usize].entry);
        debug_assert!(removed, "every indexed member has an entry");
        let freed = std::mem::take(&mut self.slots[slot as usize].name);
        self.name_bytes -= freed.len() as u64;
        self.free_slots.push(slot);
        true
    }

    fn standing(&self, config: &BoardConfig, position: usize, entry: Entry) -> Standing {
        Standing {
            rank: position as u64 + 1,
            member: self.slots[entry.member as usize].name.to_string(),
            score: config.score(entry.key),
        }
    }

    pub fn member(&self, config: &BoardConfig, member: &str) -> Option<Standing> {
        let slot = *self.index.get(member)?;
        let entry = self.slots[slot as usize].entry;
        Some(self.standing(config, self.tree.count_before(&entry), entry))
    }

    /// Rank only (1 is best), without copying the name: the hot reply of an update.
    pub fn rank(&self, member: &str) -> Option<u64> {
        let slot = *self.index.get(member)?;
        Some(self.tree.count_before(&self.slots[slot as usize].entry) as u64 + 1)
    }

    /// Up to `limit` standings from 0-based `offset`.
    pub fn page(&self, config: &BoardConfig, offset: usize, limit: usize) -> Vec<Standing> {
        self.tree
            .range(offset, limit)
            .into_iter()
            .enumerate()
            .map(|(i, entry)| self.standing(config, offset + i, entry))
            .collect()
    }

    /// Up to `limit` standings after the entry a cursor names. The cursor is a position in the order,
    /// not an offset, so a page never repeats or skips a member because others moved above it.
    pub fn page_after(&self, config: &BoardConfig, cursor: &Cursor, limit: usize) -> Vec<Standing> {
        let after = Entry {
            key: cursor.key,
            tie: cursor.tie,
            member: cursor.member,
        };
        self.page(config, self.tree.count_through(&after), limit)
    }

    /// The cursor that continues after `standing` (a member of this season).
    pub fn cursor_after(&self, member: &str) -> Option<Cursor> {
        let slot = *self.index.get(member)?;
        let entry = self.slots[slot as usize].entry;
        Some(Cursor {
            key: entry.key,
            tie: entry.tie,
            member: entry.member,
        })
    }

    /// Slots a snapshot step writes at a time (tens of kilobytes).
    const SLOTS_PER_PIECE: usize = 1024;

    pub fn header(&self) -> SeasonHeader {
        let count = |len: usize| u32::try_from(len).expect("member slots fit in u32");
        SeasonHeader {
            number: self.number,
            started_ms: self.started_ms,
            next_tie: self.next_tie,
            slot_count: count(self.slots.len()),
            free_count: count(self.free_slots.len()),
            name_bytes: self.name_bytes,
        }
    }

    /// Writes the whole season as it is now: the header, the slots, the free list.
    pub fn write(&self, out: &mut impl Put) {
        let header = self.header();
        header.write(out);
        self.slots.iter().for_each(|slot| slot.write(out));
        header.write_free_count(out);
        self.free_slots.iter().for_each(|&slot| out.put_u32(slot));
    }

    /// Starts a snapshot written in steps: its header now, then its slots and free list as they are
    /// now, however updates change them before the steps write them.
    pub fn begin_snapshot(&mut self) -> SeasonHeader {
        self.slots.begin_snapshot();
        self.free_slots.begin_snapshot();
        self.header()
    }

    /// Writes the next slots of the snapshot in progress; true once all are written.
    pub fn write_snapshot_slots(&mut self, out: &mut impl Put) -> bool {
        self.slots
            .write_frozen(Self::SLOTS_PER_PIECE, |slot| slot.write(out))
    }

    /// Writes the next part of the free list of the snapshot in progress; true once all is written.
    pub fn write_snapshot_free_slots(&mut self, out: &mut impl Put) -> bool {
        self.free_slots
            .write_frozen(Self::SLOTS_PER_PIECE, |&slot| out.put_u32(slot))
    }

    /// Reads what [`Season::write`] wrote, or a snapshot's steps.
    pub fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let mut season = Self::new(r.u32()?, r.u64()?);
        season.next_tie = r.u64()?;
        let slot_count = r.u32()?;
        let mut entries = Vec::new();
        for member in 0..slot_count {
            let name = std::str::from_utf8(r.bytes()?).map_err(|_| r.invalid("member name"))?;
            let entry = Entry {
                key: r.u128()?,
                tie: r.u64()?,
                member,
            };
            if !name.is_empty() {
                season.index.insert(name.into(), member);
                entries.push(entry);
            }
            season.name_bytes += name.len() as u64;
            season.slots.push(Slot {
                name: name.into(),
                entry,
            });
        }
        for _ in 0..r.u32()? {
            let slot = r.u32()?;
            if slot >= slot_count || !season.slots[slot as usize].name.is_empty() {
                return Err(r.invalid("free member slot"));
            }
            season.free_slots.push(slot);
        }
        entries.sort_unstable();
        season.tree = RankTree::from_sorted(&entries);
        Ok(season)
    }
}

impl SeasonHeader {
    /// The bytes of the season's whole snapshot: this header, the slots, the free list.
    pub fn encoded_len(&self) -> u64 {
        let header = 4 + 8 + 8 + 4;
        let slots = u64::from(self.slot_count) * SLOT_BYTES + self.name_bytes;
        let free_slots = 4 + u64::from(self.free_count) * 4;
        header + slots + free_slots
    }

    /// What comes before the slots.
    pub fn write(&self, out: &mut impl Put) {
        out.put_u32(self.number);
        out.put_u64(self.started_ms);
        out.put_u64(self.next_tie);
        out.put_u32(self.slot_count);
    }

    /// What comes between the slots and the free list.
    pub fn write_free_count(&self, out: &mut impl Put) {
        out.put_u32(self.free_count);
    }
}

impl Slot {
    fn write(&self, out: &mut impl Put) {
        out.put_bytes(self.name.as_bytes());
        out.put_u128(self.entry.key);
        out.put_u64(self.entry.tie);
    }
}

/// Where a page of a ranking ended; opaque to clients (hex of its fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    key: u128,
    tie: u64,
    member: u32,
}

impl Cursor {
    pub fn to_text(self) -> String {
        format!("{:032x}{:016x}{:08x}", self.key, self.tie, self.member)
    }

    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != 56 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(Self {
            key: u128::from_str_radix(&text[..32], 16).ok()?,
            tie: u64::from_str_radix(&text[32..48], 16).ok()?,
            member: u32::from_str_radix(&text[48..], 16).ok()?,
        })
    }
}

/// A board: settings plus its seasons, oldest first; the last one is current.
#[derive(Debug)]
pub struct Board {
    pub config: BoardConfig,
    pub seasons: Vec<Season>,
}

impl Board {
    pub fn new(config: BoardConfig, created_ms: u64) -> Self {
        Self {
            config,
            seasons: vec![Season::new(1, created_ms)],
        }
    }

    pub fn current(&self) -> &Season {
        self.seasons.last().expect("a board always has a season")
    }

    pub fn current_mut(&mut self) -> &mut Season {
        self.seasons
            .last_mut()
            .expect("a board always has a season")
    }

    /// The season numbered `number` (1-based), or the current one.
    pub fn season(&self, number: Option<u32>) -> Option<&Season> {
        match number {
            None => Some(self.current()),
            Some(n) => self.seasons.get(usize::try_from(n).ok()?.checked_sub(1)?),
        }
    }

    /// Starts a new season; returns its number.
    pub fn reset(&mut self, now_ms: u64) -> u32 {
        let number = self.current().number + 1;
        self.seasons.push(Season::new(number, now_ms));
        number
    }

    /// What comes before the seasons.
    pub fn write_header(&self, out: &mut impl Put) {
        self.config.encode(out);
        out.put_u32(u32::try_from(self.seasons.len()).expect("season count fits in u32"));
    }

    /// The bytes [`Board::write_header`] puts.
    pub fn header_len(&self) -> u64 {
        let mut header = Vec::new();
        self.write_header(&mut header);
        header.len() as u64
    }

    pub fn write(&self, out: &mut impl Put) {
        self.write_header(out);
        self.seasons.iter().for_each(|season| season.write(out));
    }

    pub fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let config = BoardConfig::decode(r)?;
        let count = r.u32()?;
        if count == 0 {
            return Err(r.invalid("a board has at least one season"));
        }
        let seasons = (0..count)
            .map(|_| Season::read(r))
            .collect::<Result<_, _>>()?;
        Ok(Self { config, seasons })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(order: Order, ties: TiePolicy) -> BoardConfig {
        BoardConfig {
            order,
            ties,
            operator: Operator::Set,
        }
    }

    #[test]
    fn keys_order_scores_both_ways_across_the_whole_range() {
        let scores = [i128::MIN, -5, -1, 0, 1, 7, i128::MAX];
        for order in [Order::Descending, Order::Ascending] {
            let c = config(order, TiePolicy::First);
            for pair in scores.windows(2) {
                let (low, high) = (c.key(pair[0]), c.key(pair[1]));
                assert_eq!(low < high, order == Order::Ascending, "{order:?} {pair:?}");
                assert_eq!(c.score(c.key(pair[0])), pair[0]);
            }
        }
    }

    #[test]
    fn operators_ties_and_overflow() {
        let c = config(Order::Descending, TiePolicy::First);
        let mut s = Season::new(1, 0);
        assert_eq!(s.update(&c, "a", Operator::Increment, 5, 0), Ok(5));
        assert_eq!(s.update(&c, "b", Operator::Set, 5, 0), Ok(5));
        // Tie: "a" reached 5 first.
        assert_eq!(s.rank("a"), Some(1));
        assert_eq!(s.rank("b"), Some(2));
        // Setting the same score again keeps the old tie-breaker.
        assert_eq!(s.update(&c, "a", Operator::Set, 5, 0), Ok(5));
        assert_eq!(s.rank("a"), Some(1));
        assert_eq!(s.update(&c, "b", Operator::Best, 3, 0), Ok(5));
        assert_eq!(s.update(&c, "b", Operator::Best, 9, 0), Ok(9));
        assert_eq!(s.update(&c, "b", Operator::Worst, 2, 0), Ok(2));
        assert_eq!(s.rank("a"), Some(1));
        assert_eq!(
            s.update(&c, "a", Operator::Set, i128::MAX, 0),
            Ok(i128::MAX)
        );
        assert_eq!(
            s.update(&c, "a", Operator::Increment, 1, 0),
            Err(UpdateError::Overflow)
        );
        assert_eq!(s.member(&c, "a").map(|m| m.score), Some(i128::MAX));
        assert!(s.delete("a"));
        assert!(!s.delete("a"));
        assert_eq!(s.rank("b"), Some(1));
        assert_eq!(s.len(), 1);
    }

    /// A season's bytes, whole and, with the season changed between the steps, in steps.
    fn season_bytes(season: &mut Season) -> Vec<u8> {
        let mut whole = Vec::new();
        season.write(&mut whole);
        let header = season.begin_snapshot();
        assert_eq!(whole.len() as u64, header.encoded_len());
        let mut stepped = Vec::new();
        header.write(&mut stepped);
        let c = config(Order::Ascending, TiePolicy::Random);
        for (i, member) in ["late", "x", "y", "z", "w"].into_iter().enumerate() {
            season.delete(member);
            season
                .update(&c, member, Operator::Set, i as i128, 7)
                .expect("set");
            if season.write_snapshot_slots(&mut stepped) {
                break;
            }
        }
        header.write_free_count(&mut stepped);
        while !season.write_snapshot_free_slots(&mut stepped) {}
        assert_eq!(stepped, whole);
        whole
    }

    #[test]
    fn random_ties_follow_the_drawn_breaker_and_a_snapshot_round_trips() {
        let c = config(Order::Ascending, TiePolicy::Random);
        let mut s = Season::new(3, 42);
        s.update(&c, "x", Operator::Set, 10, 900).expect("set");
        s.update(&c, "y", Operator::Set, 10, 100).expect("set");
        s.update(&c, "z", Operator::Set, -1, 5).expect("set");
        s.delete("z");
        s.update(&c, "w", Operator::Set, 11, 5).expect("set");
        assert_eq!(s.rank("y"), Some(1));
        assert_eq!(s.rank("x"), Some(2));
        let mut changed = Season::read(&mut Reader::new(&{
            let mut bytes = Vec::new();
            s.write(&mut bytes);
            bytes
        }))
        .expect("restore");
        let bytes = season_bytes(&mut changed);
        let restored = Season::read(&mut Reader::new(&bytes)).expect("restore");
        assert_eq!(restored.page(&c, 0, 10), s.page(&c, 0, 10));
        let free = |season: &Season| season.free_slots.iter().copied().collect::<Vec<_>>();
        assert_eq!(free(&restored), free(&s));
        let mut again = Vec::new();
        restored.write(&mut again);
        assert_eq!(again, bytes);
        let cursor = s.cursor_after("y").expect("member");
        assert_eq!(Cursor::parse(&cursor.to_text()), Some(cursor));
        assert_eq!(s.page_after(&c, &cursor, 10), s.page(&c, 1, 10));
    }

    mod reference {
        use super::*;
        use proptest::prelude::*;

        /// The simplest model: every member's (score, tie-breaker) in a map, ranked by sorting it all.
        #[derive(Default)]
        struct Model {
            members: HashMap<String, (i128, u64)>,
            next_tie: u64,
        }

        impl Model {
            fn update(
                &mut self,
                c: &BoardConfig,
                member: &str,
                op: Operator,
                value: i128,
                random: u64,
            ) -> Option<i128> {
                let old = self.members.get(member).map(|m| m.0);
                let score = match (old, op) {
                    (None, _) | (Some(_), Operator::Set) => value,
                    (Some(o), Operator::Increment) => o.checked_add(value)?,
                    (Some(o), Operator::Best) => {
                        if c.order == Order::Descending {
                            o.max(value)
                        } else {
                            o.min(value)
                        }
                    }
                    (Some(o), Operator::Worst) => {
                        if c.order == Order::Descending {
                            o.min(value)
                        } else {
                            o.max(value)
                        }
                    }
                };
                if old == Some(score) && c.ties == TiePolicy::First {
                    return Some(score);
                }
                self.next_tie += 1;
                let tie = if c.ties == TiePolicy::First {
                    self.next_tie
                } else {
                    random
                };
                self.members.insert(member.to_string(), (score, tie));
                Some(score)
            }

            fn ranking(&self, c: &BoardConfig) -> Vec<(String, i128)> {
                let mut all: Vec<_> = self.members.iter().collect();
                all.sort_by(|a, b| {
                    let by_score = if c.order == Order::Descending {
                        b.1.0.cmp(&a.1.0)
                    } else {
                        a.1.0.cmp(&b.1.0)
                    };
                    by_score.then(a.1.1.cmp(&b.1.1))
                });
                all.into_iter().map(|(m, (s, _))| (m.clone(), *s)).collect()
            }
        }

        #[derive(Debug, Clone)]
        enum Step {
            Update(u8, u8, i8, u64),
            Delete(u8),
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(96))]
            #[test]
            fn rank_and_range_match_a_sorted_model(
                descending in any::<bool>(),
                random_ties in any::<bool>(),
                huge in any::<bool>(),
                steps in proptest::collection::vec(prop_oneof![
                    6 => (0u8..60, 0u8..4, any::<i8>(), any::<u64>()).prop_map(|(m, o, v, r)| Step::Update(m, o, v, r)),
                    1 => (0u8..60).prop_map(Step::Delete),
                ], 1..700),
            ) {
                let c = BoardConfig {
                    order: if descending { Order::Descending } else { Order::Ascending },
                    ties: if random_ties { TiePolicy::Random } else { TiePolicy::First },
                    operator: Operator::Set,
                };
                let mut season = Season::new(1, 0);
                let mut model = Model::default();
                for step in steps {
                    match step {
                        Step::Update(m, o, v, r) => {
                            let member = format!("m{m}");
                            let op = Operator::from_code(o).expect("0..4 are operators");
                            // Small values make ties common; "huge" ones reach the edges of the range.
                            let value = if huge { i128::from(v).signum() * (i128::MAX - 3) + i128::from(v % 3) } else { i128::from(v % 4) };
                            let expected = model.update(&c, &member, op, value, r);
                            let got = season.update(&c, &member, op, value, r).ok();
                            prop_assert_eq!(got, expected);
                        }
                        Step::Delete(m) => {
                            let member = format!("m{m}");
                            prop_assert_eq!(season.delete(&member), model.members.remove(&member).is_some());
                        }
                    }
                }
                let ranking = model.ranking(&c);
                prop_assert_eq!(season.len(), ranking.len());
                let page: Vec<_> = season.page(&c, 0, usize::MAX).into_iter().map(|s| (s.member, s.score)).collect();
                prop_assert_eq!(&page, &ranking);
                for (position, (member, score)) in ranking.iter().enumerate() {
                    let standing = season.member(&c, member).expect("ranked member");
                    prop_assert_eq!(standing.rank, position as u64 + 1);
                    prop_assert_eq!(standing.score, *score);
                    let from = position.saturating_sub(2);
                    let window: Vec<_> = season.page(&c, from, 4).into_iter().map(|s| (s.member, s.score)).collect();
                    prop_assert_eq!(&window[..], &ranking[from..(from + 4).min(ranking.len())]);
                }
            }
        }
    }
}
