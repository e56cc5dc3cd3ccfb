//! fraud's commands and replies, and their binary encoding inside the (encrypted) journal payload.

use crate::generator::{HISTORY_NOW_MS_MAX, HISTORY_WINDOW_MS, HistoryCursor, Seeds};
use crate::record::{Digits, Txn};
use spate_engine::wire::{Put, Reader, WireError};

/// Transactions per command; a stream batch or HTTP request is split by partition into commands.
pub const TXNS_PER_COMMAND_MAX: usize = 65_536;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Score each transaction in order, store it with its verdict.
    Score { want_verdicts: bool, txns: Vec<Txn> },
    /// Store history as given, unscored.
    Import { txns: Vec<Txn> },
    /// Generate a part of the case study's history in place, keeping the cards this partition owns.
    Generate(GenerateHistory),
}

/// Cards `from.card..cards_end` of a history of `cards_total` cards x `len` records: a part small
/// enough that the partition goes on with other commands between parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerateHistory {
    pub from: HistoryCursor,
    pub cards_end: u32,
    pub cards_total: u32,
    pub len: u32,
    pub now_ms: u64,
    pub partition: u16,
    pub partitions: u16,
}

impl GenerateHistory {
    /// The largest history a command may describe, in cards and in records per card.
    pub const CARDS_MAX: u32 = i32::MAX as u32;
    pub const LEN_MAX: u32 = 1000;

    fn validate(self, reader: &Reader<'_>) -> Result<Self, WireError> {
        let ordered = self.from.card <= self.cards_end
            && self.cards_end <= self.cards_total
            && self.cards_total <= Self::CARDS_MAX;
        let streams_fit = self.from.streams.iter().all(|state| *state < 1 << 48);
        if !ordered
            || !streams_fit
            || self.len > Self::LEN_MAX
            || self.now_ms <= HISTORY_WINDOW_MS
            || self.now_ms > HISTORY_NOW_MS_MAX
            || self.partition >= self.partitions
        {
            return Err(reader.invalid("history to generate out of range"));
        }
        Ok(self)
    }
}

const SCORE: u8 = 1;
const IMPORT: u8 = 2;
/// A whole history from its seeds, as data format version 1 wrote it; still read.
const GENERATE_WHOLE: u8 = 3;
const GENERATE_PART: u8 = 4;

fn put_digits(out: &mut Vec<u8>, digits: Digits) {
    out.put_u64(digits.value);
    out.put_u8(digits.len);
}

fn read_digits(reader: &mut Reader<'_>) -> Result<Digits, WireError> {
    Ok(Digits {
        value: reader.u64()?,
        len: reader.u8()?,
    })
}

fn put_txn(out: &mut Vec<u8>, txn: &Txn) {
    out.put_u64(txn.card);
    put_digits(out, txn.timestamp);
    out.put_u16(txn.country);
    out.put_u8(txn.response);
    put_digits(out, txn.amount);
    out.put_u16(txn.currency);
    out.put_u16(txn.merchant);
    out.put_u32(txn.city);
    put_digits(out, txn.code);
}

fn read_txn(reader: &mut Reader<'_>) -> Result<Txn, WireError> {
    let txn = Txn {
        card: reader.u64()?,
        timestamp: read_digits(reader)?,
        country: reader.u16()?,
        response: reader.u8()?,
        amount: read_digits(reader)?,
        currency: reader.u16()?,
        merchant: reader.u16()?,
        city: reader.u32()?,
        code: read_digits(reader)?,
    };
    txn.validate()
        .map_err(|_| reader.invalid("transaction field out of range"))?;
    Ok(txn)
}

fn put_txns(out: &mut Vec<u8>, txns: &[Txn]) {
    assert!(txns.len() <= TXNS_PER_COMMAND_MAX);
    out.put_u32(txns.len() as u32);
    for txn in txns {
        put_txn(out, txn);
    }
}

fn read_txns(reader: &mut Reader<'_>) -> Result<Vec<Txn>, WireError> {
    let count = reader.u32()? as usize;
    if count > TXNS_PER_COMMAND_MAX {
        return Err(reader.invalid("too many transactions"));
    }
    (0..count).map(|_| read_txn(reader)).collect()
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Self::Score {
                want_verdicts,
                txns,
            } => {
                out.reserve(6 + txns.len() * 48);
                out.put_u8(SCORE);
                out.put_u8(u8::from(*want_verdicts));
                put_txns(&mut out, txns);
            }
            Self::Import { txns } => {
                out.put_u8(IMPORT);
                put_txns(&mut out, txns);
            }
            Self::Generate(g) => {
                out.put_u8(GENERATE_PART);
                out.put_u32(g.from.card);
                for state in g.from.streams {
                    out.put_u64(state);
                }
                out.put_u32(g.cards_end);
                out.put_u32(g.cards_total);
                out.put_u32(g.len);
                out.put_u64(g.now_ms);
                out.put_u16(g.partition);
                out.put_u16(g.partitions);
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut reader = Reader::new(bytes);
        let command = match reader.u8()? {
            SCORE => Self::Score {
                want_verdicts: reader.u8()? != 0,
                txns: read_txns(&mut reader)?,
            },
            IMPORT => Self::Import {
                txns: read_txns(&mut reader)?,
            },
            GENERATE_WHOLE => {
                let mut seed = || reader.u64().map(|v| v as i64);
                let seeds = Seeds {
                    country: seed()?,
                    merchant: seed()?,
                    city: seed()?,
                    amount: seed()?,
                    response: seed()?,
                    card: seed()?,
                    timestamp: seed()?,
                };
                let cards = reader.u32()?;
                let whole = GenerateHistory {
                    from: HistoryCursor::start(&seeds),
                    cards_end: cards,
                    cards_total: cards,
                    len: reader.u32()?,
                    now_ms: reader.u64()?,
                    partition: reader.u16()?,
                    partitions: reader.u16()?,
                };
                Self::Generate(whole.validate(&reader)?)
            }
            GENERATE_PART => {
                let card = reader.u32()?;
                let mut streams = [0; 6];
                for state in &mut streams {
                    *state = reader.u64()?;
                }
                let part = GenerateHistory {
                    from: HistoryCursor { card, streams },
                    cards_end: reader.u32()?,
                    cards_total: reader.u32()?,
                    len: reader.u32()?,
                    now_ms: reader.u64()?,
                    partition: reader.u16()?,
                    partitions: reader.u16()?,
                };
                Self::Generate(part.validate(&reader)?)
            }
            _ => return Err(reader.invalid("unknown fraud command")),
        };
        reader.finish()?;
        Ok(command)
    }
}

/// What a command did: counts, which rules fired how often, and (if asked) each transaction's verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReply {
    pub scored: u32,
    pub stored: u32,
    pub flagged_by_rule: Vec<(u8, u32)>,
    pub verdicts: Vec<u8>,
    pub error: Option<String>,
}

impl BatchReply {
    pub fn flagged(&self) -> u32 {
        self.flagged_by_rule.iter().map(|(_, n)| n).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u32(self.scored);
        out.put_u32(self.stored);
        out.put_u8(self.flagged_by_rule.len() as u8);
        for (rule, count) in &self.flagged_by_rule {
            out.put_u8(*rule);
            out.put_u32(*count);
        }
        out.put_bytes(&self.verdicts);
        out.put_bytes(self.error.as_deref().unwrap_or("").as_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut reader = Reader::new(bytes);
        let scored = reader.u32()?;
        let stored = reader.u32()?;
        let rules = reader.u8()?;
        let flagged_by_rule = (0..rules)
            .map(|_| Ok((reader.u8()?, reader.u32()?)))
            .collect::<Result<_, WireError>>()?;
        let verdicts = reader.bytes()?.to_vec();
        let error = String::from_utf8_lossy(reader.bytes()?).into_owned();
        reader.finish()?;
        Ok(Self {
            scored,
            stored,
            flagged_by_rule,
            verdicts,
            error: (!error.is_empty()).then_some(error),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::TxnGenerator;

    #[test]
    fn commands_and_replies_round_trip() {
        let mut generator = TxnGenerator::new(&Seeds::default(), 1000);
        let txns: Vec<Txn> = (0..10)
            .map(|i| generator.next_txn(1_800_000_000_000 + i))
            .collect();
        let commands = [
            Command::Score {
                want_verdicts: true,
                txns: txns.clone(),
            },
            Command::Import { txns },
            Command::Generate(GenerateHistory {
                from: HistoryCursor {
                    card: 3,
                    streams: [1, 2, 3, 4, 5, (1 << 48) - 1],
                },
                cards_end: 5,
                cards_total: 7,
                len: 20,
                now_ms: 1_800_000_000_000,
                partition: 1,
                partitions: 2,
            }),
        ];
        for command in commands {
            assert_eq!(Command::decode(&command.encode()).unwrap(), command);
        }
        let reply = BatchReply {
            scored: 3,
            stored: 3,
            flagged_by_rule: vec![(9, 1), (36, 2)],
            verdicts: vec![0, 9, 36],
            error: None,
        };
        assert_eq!(BatchReply::decode(&reply.encode()).unwrap(), reply);
        assert!(Command::decode(&[9]).is_err());
    }

    /// A whole history as a journal of data format version 1 holds it: the seeds, then cards, length,
    /// end, partition and partitions.
    fn whole_history_command(cards: u32, len: u32, partition: u16, partitions: u16) -> Vec<u8> {
        let mut bytes = vec![GENERATE_WHOLE];
        for seed in [1_u64, 1, 1, 100, 10, 1, 7] {
            bytes.put_u64(seed);
        }
        bytes.put_u32(cards);
        bytes.put_u32(len);
        bytes.put_u64(1_800_000_000_000);
        bytes.put_u16(partition);
        bytes.put_u16(partitions);
        bytes
    }

    #[test]
    fn a_whole_history_of_the_first_format_reads_as_one_part_from_the_start() {
        let Command::Generate(whole) =
            Command::decode(&whole_history_command(9, 20, 0, 2)).unwrap()
        else {
            panic!("a generation");
        };
        assert_eq!(whole.from, HistoryCursor::start(&Seeds::default()));
        assert_eq!((whole.cards_end, whole.cards_total, whole.len), (9, 9, 20));
        assert_eq!((whole.partition, whole.partitions), (0, 2));
    }

    #[test]
    fn a_history_out_of_range_is_refused() {
        for (cards, len, partition, partitions) in [
            (u32::MAX, 20, 0, 1),
            (10, GenerateHistory::LEN_MAX + 1, 0, 1),
            (10, 20, 2, 2),
            (10, 20, 0, 0),
        ] {
            let bytes = whole_history_command(cards, len, partition, partitions);
            assert!(
                Command::decode(&bytes).is_err(),
                "{cards} {len} {partition}/{partitions}"
            );
        }
        let part = |card, cards_end, cards_total, state| {
            Command::Generate(GenerateHistory {
                from: HistoryCursor {
                    card,
                    streams: [state; 6],
                },
                cards_end,
                cards_total,
                len: 20,
                now_ms: 1_800_000_000_000,
                partition: 0,
                partitions: 1,
            })
            .encode()
        };
        assert!(Command::decode(&part(2, 5, 9, 0)).is_ok());
        assert!(
            Command::decode(&part(6, 5, 9, 0)).is_err(),
            "starts after its end"
        );
        assert!(
            Command::decode(&part(2, 10, 9, 0)).is_err(),
            "ends after the history"
        );
        assert!(
            Command::decode(&part(2, 5, 9, 1 << 48)).is_err(),
            "a state over 48 bits"
        );
    }
}
