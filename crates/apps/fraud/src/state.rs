//! fraud's state on one partition: the card histories and the running counts, changed only by apply.

use crate::cipher::{CardCipher, OpeningReader, SealingWriter};
use crate::command::{BatchReply, Command, GenerateHistory};
use crate::generator::HistoryGenerator;
use crate::history::{HistoryStore, UNSCORED};
use crate::record::Txn;
use crate::rules::RuleSet;
use spate_engine::wire::{Put, Reader, WireError};
use spate_engine::{Effects, StateMachine};
use std::io::{self, Read, Write};
use std::sync::Arc;

/// The routing key of a card: every transaction of a card is applied on the partition that owns it.
pub fn card_key(card: u64) -> [u8; 8] {
    card.to_le_bytes()
}

/// Counts over everything this partition applied (deterministic, so they survive replay exactly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub scored: u64,
    pub imported: u64,
    pub flagged_by_rule: [u64; 64],
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            scored: 0,
            imported: 0,
            flagged_by_rule: [0; 64],
        }
    }
}

impl Stats {
    /// As a snapshot holds them: scored, imported, then the count of each rule, each a u64.
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * (2 + self.flagged_by_rule.len()));
        out.put_u64(self.scored);
        out.put_u64(self.imported);
        for count in self.flagged_by_rule {
            out.put_u64(count);
        }
        out
    }

    pub fn flagged(&self) -> u64 {
        self.flagged_by_rule[1..].iter().sum()
    }

    pub fn add(&mut self, other: &Stats) {
        self.scored += other.scored;
        self.imported += other.imported;
        for (mine, theirs) in self.flagged_by_rule.iter_mut().zip(other.flagged_by_rule) {
            *mine += theirs;
        }
    }
}

/// The query [`FraudState::read`] answers with the partition's [`PartitionStats`].
pub const STATS_QUERY: &[u8] = b"stats";

/// One partition's counts and history sizes; `/fraud/stats` sums them over the partitions, which in a
/// cluster live on several nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionStats {
    pub stats: Stats,
    pub cards: u64,
    pub entries: u64,
    pub heap_bytes: u64,
}

impl PartitionStats {
    pub fn add(&mut self, other: &PartitionStats) {
        self.stats.add(&other.stats);
        self.cards += other.cards;
        self.entries += other.entries;
        self.heap_bytes += other.heap_bytes;
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.stats.encode();
        out.put_u64(self.cards);
        out.put_u64(self.entries);
        out.put_u64(self.heap_bytes);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut reader = Reader::new(bytes);
        let mut stats = Stats {
            scored: reader.u64()?,
            imported: reader.u64()?,
            ..Stats::default()
        };
        for count in &mut stats.flagged_by_rule {
            *count = reader.u64()?;
        }
        let decoded = Self {
            stats,
            cards: reader.u64()?,
            entries: reader.u64()?,
            heap_bytes: reader.u64()?,
        };
        reader.finish()?;
        Ok(decoded)
    }
}

pub struct FraudState {
    store: HistoryStore,
    stats: Stats,
    /// The counts as they were when the snapshot in progress began, until its first step writes them.
    snapshot_stats: Option<Vec<u8>>,
    /// The sealing buffer of the snapshot steps, kept from one to the next.
    snapshot_seal_buffer: Vec<u8>,
    rules: Arc<dyn RuleSet>,
    cipher: Arc<CardCipher>,
    /// Scratch for the history window of the transaction being scored.
    window: Vec<Txn>,
}

impl FraudState {
    pub fn new(
        entries_per_card_max: usize,
        rules: Arc<dyn RuleSet>,
        cipher: Arc<CardCipher>,
    ) -> Self {
        Self {
            store: HistoryStore::new(entries_per_card_max),
            stats: Stats::default(),
            snapshot_stats: None,
            snapshot_seal_buffer: Vec::new(),
            rules,
            cipher,
            window: Vec::new(),
        }
    }

    pub fn store(&self) -> &HistoryStore {
        &self.store
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn restore(
        input: &mut dyn Read,
        rules: Arc<dyn RuleSet>,
        cipher: Arc<CardCipher>,
    ) -> io::Result<Self> {
        let mut opened = OpeningReader::new(input, &cipher);
        let mut word = [0; 8];
        let mut read_u64 = |input: &mut OpeningReader<'_>| -> io::Result<u64> {
            input.read_exact(&mut word)?;
            Ok(u64::from_le_bytes(word))
        };
        let mut stats = Stats {
            scored: read_u64(&mut opened)?,
            imported: read_u64(&mut opened)?,
            ..Stats::default()
        };
        for count in stats.flagged_by_rule.iter_mut() {
            *count = read_u64(&mut opened)?;
        }
        let store = HistoryStore::restore(&mut opened)?;
        drop(opened);
        Ok(Self {
            store,
            stats,
            snapshot_stats: None,
            snapshot_seal_buffer: Vec::new(),
            rules,
            cipher,
            window: Vec::new(),
        })
    }

    fn score(&mut self, txns: &[Txn], want_verdicts: bool) -> BatchReply {
        let mut verdicts = Vec::with_capacity(txns.len());
        self.store
            .score_batch(txns, self.rules.as_ref(), &mut self.window, &mut verdicts);
        let mut flagged = [0u32; 64];
        for verdict in &verdicts {
            flagged[usize::from(*verdict)] += 1;
        }
        if !want_verdicts {
            verdicts.clear();
        }
        self.stats.scored += txns.len() as u64;
        for (rule, count) in flagged.iter().enumerate().skip(1) {
            self.stats.flagged_by_rule[rule] += u64::from(*count);
        }
        BatchReply {
            scored: txns.len() as u32,
            stored: txns.len() as u32,
            flagged_by_rule: flagged
                .iter()
                .enumerate()
                .skip(1)
                .filter(|(_, n)| **n > 0)
                .map(|(rule, n)| (rule as u8, *n))
                .collect(),
            verdicts,
            error: None,
        }
    }

    fn import(&mut self, txns: &[Txn]) -> BatchReply {
        // A history file holds each card's records together (the generator's order): a run of one
        // card's is stored at once.
        for card_txns in txns.chunk_by(|a, b| a.card == b.card) {
            self.store.store_card(card_txns, UNSCORED);
        }
        self.stats.imported += txns.len() as u64;
        BatchReply {
            stored: txns.len() as u32,
            ..BatchReply::default()
        }
    }

    fn generate(&mut self, plan: &GenerateHistory) -> BatchReply {
        let mut generator =
            HistoryGenerator::resume(&plan.from, plan.cards_end, plan.len, plan.now_ms)
                .expect("decoding checked the streams' states");
        if plan.from.card == 0 {
            self.store
                .reserve_cards(plan.cards_total as usize / usize::from(plan.partitions));
        }
        let len = plan.len as usize;
        let mut stored = 0u64;
        let mut drawn = Vec::with_capacity(len * GENERATED_CARDS_LOOKED_UP_TOGETHER);
        loop {
            drawn.clear();
            while drawn.len() < len * GENERATED_CARDS_LOOKED_UP_TOGETHER
                && let Some(card) = generator.next_card()
            {
                // Every partition draws every card (the streams run through all of them in order),
                // and builds and stores only its own.
                if spate_engine::partition_of(&card_key(u64::from(card)), plan.partitions)
                    == plan.partition
                {
                    generator.draw_card(&mut drawn);
                } else {
                    generator.skip_to(card + 1);
                }
            }
            if drawn.is_empty() {
                break;
            }
            let cards = drawn.chunks(len);
            self.store
                .look_up(cards.clone().map(|card_txns| card_txns[0].card));
            for card_txns in cards {
                self.store.store_card(card_txns, UNSCORED);
            }
            stored += drawn.len() as u64;
        }
        self.stats.imported += stored;
        BatchReply {
            stored: stored.min(u64::from(u32::MAX)) as u32,
            ..BatchReply::default()
        }
    }
}

/// Cards of a generated history drawn before any of them is stored, so that the misses on their map
/// slots overlap ([`HistoryStore::look_up`]): storing them one by one, a generation waited on a miss
/// per card.
const GENERATED_CARDS_LOOKED_UP_TOGETHER: usize = 32;

impl StateMachine for FraudState {
    fn apply(&mut self, command: &spate_engine::Command<'_>, effects: &mut Effects<'_>) {
        let decoded = self
            .cipher
            .open(command.payload)
            .map_err(|e| e.to_string())
            .and_then(|plain| Command::decode(&plain).map_err(|e| e.to_string()));
        let reply = match decoded {
            Ok(Command::Score {
                want_verdicts,
                txns,
            }) => self.score(&txns, want_verdicts),
            Ok(Command::Import { txns }) => self.import(&txns),
            Ok(Command::Generate(plan)) => self.generate(&plan),
            Err(error) => BatchReply {
                error: Some(error),
                ..BatchReply::default()
            },
        };
        effects.reply().extend_from_slice(&reply.encode());
    }

    fn write_snapshot(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut sealed = SealingWriter::new(out, &self.cipher);
        sealed.write_all(&self.stats.encode())?;
        self.store.write_snapshot(&mut sealed)?;
        sealed.finish()
    }

    /// The counts are written by the first step as they were now; the card histories follow in steps
    /// (see `HistoryStore::begin_snapshot`).
    fn begin_snapshot(&mut self) -> bool {
        self.snapshot_stats = Some(self.stats.encode());
        self.store.begin_snapshot();
        true
    }

    /// Each step is sealed on its own: the snapshot is a run of sealed chunks however it was cut.
    fn write_snapshot_step(
        &mut self,
        out: &mut dyn Write,
        bytes_budget: usize,
    ) -> io::Result<bool> {
        let buffer = std::mem::take(&mut self.snapshot_seal_buffer);
        let mut sealed = SealingWriter::reusing(out, &self.cipher, buffer);
        if let Some(stats) = self.snapshot_stats.take() {
            sealed.write_all(&stats)?;
        }
        let done = self.store.snapshot_step(&mut sealed, bytes_budget)?;
        let buffer = sealed.finish_keeping_buffer()?;
        if !done {
            self.snapshot_seal_buffer = buffer;
        }
        Ok(done)
    }

    fn read(&self, query: &[u8], _archive: &spate_engine::ArchiveReader<'_>) -> Vec<u8> {
        if query != STATS_QUERY {
            return Vec::new();
        }
        PartitionStats {
            stats: self.stats.clone(),
            cards: self.store.cards() as u64,
            entries: self.store.entries(),
            heap_bytes: self.store.heap_bytes(),
        }
        .encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_stats_cross_the_wire_unchanged_and_refuse_a_short_answer() {
        let mut stats = PartitionStats {
            stats: Stats {
                scored: 7,
                imported: 3,
                ..Stats::default()
            },
            cards: 5,
            entries: 11,
            heap_bytes: 1024,
        };
        stats.stats.flagged_by_rule[0] = 4;
        stats.stats.flagged_by_rule[63] = 2;
        let bytes = stats.encode();
        assert_eq!(PartitionStats::decode(&bytes), Ok(stats.clone()));
        assert!(PartitionStats::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(PartitionStats::decode(&[bytes.as_slice(), &[0]].concat()).is_err());

        let mut sum = stats.clone();
        sum.add(&stats);
        assert_eq!(
            (sum.stats.scored, sum.cards, sum.heap_bytes),
            (14, 10, 2048)
        );
        assert_eq!(sum.stats.flagged_by_rule[63], 4);
    }
}
