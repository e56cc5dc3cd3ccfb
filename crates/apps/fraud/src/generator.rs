//! The case study's transaction generator (`specs/fraud.md` §2), reproducible from its seeds.
//!
//! Five `java.util.Random` streams draw the fields; history is card-major (card 0's records k = 0..len,
//! then card 1's, ...), so a history of N cards is one fixed sequence of draws. History timestamps are
//! not specified by the case study; spate draws them from a sixth stream (see [`Seeds::timestamp`]).

use crate::java_random::JavaRandom;
use crate::record::{Digits, Txn};

pub use spate_cards::{DAY_MS, HISTORY_WINDOW_MS};
/// The case study's scale: 30 million cards with 20 history records each.
pub const CASE_STUDY_CARDS: u32 = 30_000_000;
pub const CASE_STUDY_HISTORY_LEN: u32 = 20;
/// The latest timestamp the record format holds: 19 digits.
pub const TIMESTAMP_MS_MAX: u64 = 9_999_999_999_999_999_999;
/// The latest end of a history: its timestamps are before it, so they fit the record format.
pub const HISTORY_NOW_MS_MAX: u64 = TIMESTAMP_MS_MAX + 1;

/// Seeds of every random stream the generator uses; the defaults are the case study's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seeds {
    pub country: i64,
    pub merchant: i64,
    pub city: i64,
    pub amount: i64,
    pub response: i64,
    /// New transactions: the card stream, re-created every `cards` transactions.
    pub card: i64,
    /// History: each timestamp is `now - 1 - (nextLong() mod (90 d - 1))`, so uniform over the 90 days
    /// before `now`.
    pub timestamp: i64,
}

impl Default for Seeds {
    fn default() -> Self {
        Self {
            country: 1,
            merchant: 1,
            city: 1,
            amount: 100,
            response: 10,
            card: 1,
            timestamp: 7,
        }
    }
}

/// The five field streams, drawn in the case study's order: country, response (only when drawn), amount,
/// merchant, city.
#[derive(Debug, Clone)]
struct FieldStreams {
    country: JavaRandom,
    merchant: JavaRandom,
    city: JavaRandom,
    amount: JavaRandom,
    response: JavaRandom,
}

impl FieldStreams {
    fn new(seeds: &Seeds) -> Self {
        Self {
            country: JavaRandom::new(seeds.country),
            merchant: JavaRandom::new(seeds.merchant),
            city: JavaRandom::new(seeds.city),
            amount: JavaRandom::new(seeds.amount),
            response: JavaRandom::new(seeds.response),
        }
    }

    /// The streams in the order of [`HistoryCursor::streams`], with the timestamps' stream last.
    fn states(&self, timestamps: &JavaRandom) -> [u64; 6] {
        [
            self.country.state(),
            self.merchant.state(),
            self.city.state(),
            self.amount.state(),
            self.response.state(),
            timestamps.state(),
        ]
    }

    /// Draws what [`FieldStreams::draw`] draws for `code`, without building the record.
    fn skip(&mut self, code: u32) {
        self.country.skip_bounded(200);
        if code.is_multiple_of(95) {
            self.response.skip_bounded(20);
        }
        self.amount.skip_bounded(50_000);
        self.merchant.skip_bounded(500);
        self.city.skip_bounded(10_000);
    }

    fn draw(&mut self, card: u32, code: u32, timestamp_ms: u64) -> Txn {
        let country = self.country.next_int_bounded(200) as u16;
        let response = if code.is_multiple_of(95) {
            self.response.next_int_bounded(20) as u8
        } else {
            0
        };
        let amount = self.amount.next_int_bounded(50_000) as u64;
        let merchant = self.merchant.next_int_bounded(500) as u16;
        let city = self.city.next_int_bounded(10_000) as u32;
        Txn {
            card: u64::from(card),
            timestamp: Digits::of(timestamp_ms),
            country,
            response,
            amount: Digits::of(amount),
            currency: country,
            merchant,
            city,
            code: Digits::padded(u64::from(code), 5),
        }
    }
}

/// Where a history's generation stands at the start of a card: the state of every stream. A history is
/// one sequence of draws (a bounded draw may draw again, so the count per card varies), so a part of it
/// can only start where the cards before it left the streams; [`HistoryGenerator::skip_to`] finds that
/// without building their records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryCursor {
    /// The next card to generate.
    pub card: u32,
    /// Country, merchant, city, amount, response and timestamp streams, 48 bits each.
    pub streams: [u64; 6],
}

impl HistoryCursor {
    /// The start of the history that `seeds` draw.
    pub fn start(seeds: &Seeds) -> Self {
        Self {
            card: 0,
            streams: FieldStreams::new(seeds).states(&JavaRandom::new(seeds.timestamp)),
        }
    }
}

/// The history: `cards` x `len` records, timestamps in the 90 days before `now_ms`; or the part of it
/// from a [`HistoryCursor`] to a card.
#[derive(Debug, Clone)]
pub struct HistoryGenerator {
    streams: FieldStreams,
    timestamps: JavaRandom,
    cards_end: u32,
    len: u32,
    now_ms: u64,
    card: u32,
    index: u32,
}

impl HistoryGenerator {
    pub fn new(seeds: &Seeds, cards: u32, len: u32, now_ms: u64) -> Self {
        Self::resume(&HistoryCursor::start(seeds), cards, len, now_ms)
            .expect("a start cursor's states are 48 bits")
    }

    /// The records of cards `cursor.card..cards_end`, as [`HistoryGenerator::new`] would draw them;
    /// `None` when a stream's state is over 48 bits.
    pub fn resume(cursor: &HistoryCursor, cards_end: u32, len: u32, now_ms: u64) -> Option<Self> {
        assert!(
            now_ms > HISTORY_WINDOW_MS,
            "now must be after 90 days past the epoch"
        );
        let [country, merchant, city, amount, response, timestamps] =
            cursor.streams.map(JavaRandom::from_state);
        Some(Self {
            streams: FieldStreams {
                country: country?,
                merchant: merchant?,
                city: city?,
                amount: amount?,
                response: response?,
            },
            timestamps: timestamps?,
            cards_end,
            len,
            now_ms,
            card: cursor.card,
            index: 0,
        })
    }

    /// Where the generation stands; only between cards.
    pub fn cursor(&self) -> HistoryCursor {
        assert_eq!(self.index, 0, "a cursor starts at a card");
        HistoryCursor {
            card: self.card,
            streams: self.streams.states(&self.timestamps),
        }
    }

    /// The card the next record belongs to; `None` once every card is drawn.
    pub fn next_card(&self) -> Option<u32> {
        (self.card < self.cards_end && self.len > 0).then_some(self.card)
    }

    /// Appends the records of the next card to `into`, all of them (a card is stored whole at once).
    pub fn draw_card(&mut self, into: &mut Vec<Txn>) {
        assert_eq!(self.index, 0, "a card is drawn from its start");
        if self.next_card().is_some() {
            let len = self.len as usize;
            into.extend(self.by_ref().take(len));
        }
    }

    /// Moves on to card `card` (at most the end) without building the records before it.
    pub fn skip_to(&mut self, card: u32) {
        assert_eq!(self.index, 0, "skipping starts at a card");
        let card = card.min(self.cards_end);
        if self.len == 0 {
            self.card = self.card.max(card);
            return;
        }
        while self.card < card {
            for code in 0..self.len {
                self.timestamps.next_long();
                self.streams.skip(code);
            }
            self.card += 1;
        }
    }
}

impl Iterator for HistoryGenerator {
    type Item = Txn;

    fn next(&mut self) -> Option<Txn> {
        if self.card >= self.cards_end || self.len == 0 {
            return None;
        }
        let offset_ms = (self.timestamps.next_long() as u64) % (HISTORY_WINDOW_MS - 1);
        let txn = self
            .streams
            .draw(self.card, self.index, self.now_ms - 1 - offset_ms);
        self.index += 1;
        if self.index == self.len {
            self.index = 0;
            self.card += 1;
        }
        Some(txn)
    }
}

/// New transactions: a card drawn from `0..cards`, the card id as the code, fields from fresh streams.
#[derive(Debug, Clone)]
pub struct TxnGenerator {
    seeds: Seeds,
    streams: FieldStreams,
    card_stream: JavaRandom,
    cards: u32,
    produced_in_cycle: u32,
}

impl TxnGenerator {
    pub fn new(seeds: &Seeds, cards: u32) -> Self {
        assert!(
            cards > 0 && cards <= i32::MAX as u32,
            "cards must be in 1..=2^31-1"
        );
        Self {
            seeds: *seeds,
            streams: FieldStreams::new(seeds),
            card_stream: JavaRandom::new(seeds.card),
            cards,
            produced_in_cycle: 0,
        }
    }

    /// The next transaction, stamped `timestamp_ms` (the caller's clock: wall or virtual).
    pub fn next_txn(&mut self, timestamp_ms: u64) -> Txn {
        if self.produced_in_cycle == self.cards {
            self.card_stream = JavaRandom::new(self.seeds.card);
            self.produced_in_cycle = 0;
        }
        self.produced_in_cycle += 1;
        let card = self.card_stream.next_int_bounded(self.cards as i32) as u32;
        self.streams.draw(card, card, timestamp_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_new_transaction_of_a_million_cards_is_the_spec_example() {
        let mut generator = TxnGenerator::new(&Seeds::default(), 1_000_000);
        let mut body = Vec::new();
        generator.next_txn(1_795_294_622_406).write_body(&mut body);
        assert_eq!(
            body,
            b"00000000548985,1795294622406,185,00,3915,185,0485,08985,548985"
        );
    }

    #[test]
    fn card_sequence_repeats_every_cycle_and_fields_follow_the_streams() {
        let mut generator = TxnGenerator::new(&Seeds::default(), 50);
        let first: Vec<u64> = (0..50).map(|_| generator.next_txn(1).card).collect();
        let second: Vec<u64> = (0..50).map(|_| generator.next_txn(1).card).collect();
        assert_eq!(first, second);
        let mut generator = TxnGenerator::new(&Seeds::default(), 1000);
        for _ in 0..1000 {
            let txn = generator.next_txn(1);
            assert_eq!(txn.currency, txn.country);
            assert_eq!(txn.code.value, txn.card);
            // The three streams share a seed, so they agree record by record (no rejection at these bounds).
            assert_eq!(u32::from(txn.merchant), txn.city % 500);
            assert_eq!(u32::from(txn.country), txn.city % 200);
            if txn.response != 0 {
                assert!(
                    txn.card.is_multiple_of(95),
                    "only codes divisible by 95 draw a response"
                );
            }
        }
    }

    #[test]
    fn history_is_card_major_within_the_window_and_reproducible() {
        let now_ms = 1_800_000_000_000;
        let history: Vec<Txn> = HistoryGenerator::new(&Seeds::default(), 3, 20, now_ms).collect();
        assert_eq!(history.len(), 60);
        for (index, txn) in history.iter().enumerate() {
            assert_eq!(txn.card, index as u64 / 20);
            assert_eq!(txn.code.value, index as u64 % 20);
            assert_eq!(txn.code.len, 5);
            assert!(txn.timestamp_ms() < now_ms && txn.timestamp_ms() > now_ms - HISTORY_WINDOW_MS);
        }
        assert_eq!(history[0].response, 13, "k = 0 draws the response stream");
        assert_eq!(history[1].response, 0);
        let again: Vec<Txn> = HistoryGenerator::new(&Seeds::default(), 3, 20, now_ms).collect();
        assert_eq!(history, again);
    }

    #[test]
    fn a_history_resumed_from_a_cursor_goes_on_as_the_whole_one() {
        let now_ms = 1_800_000_000_000;
        let seeds = Seeds {
            amount: 3,
            ..Seeds::default()
        };
        // 96 records a card: codes 0 and 95 draw the response stream.
        let whole: Vec<Txn> = HistoryGenerator::new(&seeds, 40, 96, now_ms).collect();
        let mut walker = HistoryGenerator::new(&seeds, 40, 96, now_ms);
        let mut parts = Vec::new();
        for end in [1, 7, 7, 30, 40] {
            let cursor = walker.cursor();
            parts.extend(HistoryGenerator::resume(&cursor, end, 96, now_ms).unwrap());
            walker.skip_to(end);
            assert_eq!(walker.cursor().card, end);
        }
        walker.skip_to(45);
        assert_eq!(
            walker.cursor().card,
            40,
            "skipping stops at the history's end"
        );
        let mut empty_cards = HistoryGenerator::new(&seeds, i32::MAX as u32, 0, now_ms);
        empty_cards.skip_to(2_000_000_000);
        assert_eq!(
            empty_cards.cursor().card,
            2_000_000_000,
            "no draws, no loop"
        );
        assert_eq!(parts.len(), whole.len());
        assert!(parts == whole, "the parts are the whole history, in order");
        let mut over = HistoryCursor::start(&seeds);
        over.streams[4] = 1 << 48;
        assert!(HistoryGenerator::resume(&over, 1, 20, now_ms).is_none());
    }

    #[test]
    fn cards_drawn_whole_between_skipped_ones_are_those_of_the_whole_history() {
        let now_ms = 1_800_000_000_000;
        let seeds = Seeds::default();
        let whole: Vec<Txn> = HistoryGenerator::new(&seeds, 30, 96, now_ms).collect();
        let mut generator = HistoryGenerator::new(&seeds, 30, 96, now_ms);
        let mut drawn = Vec::new();
        let mut card_txns = Vec::new();
        while let Some(card) = generator.next_card() {
            if card % 3 == 1 {
                generator.skip_to(card + 1);
            } else {
                card_txns.clear();
                generator.draw_card(&mut card_txns);
                assert!(
                    card_txns.len() == 96 && card_txns.iter().all(|t| t.card == u64::from(card))
                );
                drawn.extend_from_slice(&card_txns);
            }
        }
        let kept: Vec<Txn> = whole.into_iter().filter(|t| t.card % 3 != 1).collect();
        assert!(
            drawn == kept,
            "the drawn cards, in order, as the whole history has them"
        );
        card_txns.clear();
        generator.draw_card(&mut card_txns);
        assert!(card_txns.is_empty(), "nothing is drawn past the end");
    }
}
