//! fraud's commands and replies, and their binary encoding inside the (encrypted) journal payload.

use crate::generator::Seeds;
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
    /// Generate the case study's history in place, keeping the cards this partition owns.
    Generate(GenerateHistory),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerateHistory {
    pub seeds: Seeds,
    pub cards: u32,
    pub len: u32,
    pub now_ms: u64,
    pub partition: u16,
    pub partitions: u16,
}

const SCORE: u8 = 1;
const IMPORT: u8 = 2;
const GENERATE: u8 = 3;

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
                out.put_u8(GENERATE);
                let s = &g.seeds;
                for seed in [
                    s.country,
                    s.merchant,
                    s.city,
                    s.amount,
                    s.response,
                    s.card,
                    s.timestamp,
                ] {
                    out.put_u64(seed as u64);
                }
                out.put_u32(g.cards);
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
            GENERATE => {
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
                Self::Generate(GenerateHistory {
                    seeds,
                    cards: reader.u32()?,
                    len: reader.u32()?,
                    now_ms: reader.u64()?,
                    partition: reader.u16()?,
                    partitions: reader.u16()?,
                })
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
                seeds: Seeds::default(),
                cards: 7,
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
}
