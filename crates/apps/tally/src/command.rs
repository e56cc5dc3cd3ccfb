//! tally's commands, replies and events, and their binary encoding in the journal.

use spate_engine::wire::{Put, Reader, WireError};

/// Longest account name, in bytes.
pub const ACCOUNT_BYTES_MAX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Adds `amount` (may be negative) to `account` as the entry `tag`.
    Add {
        account: String,
        amount: i64,
        tag: u64,
    },
    /// Moves `amount` > 0 from `from` to `to` if `from` holds at least that much.
    Transfer {
        from: String,
        to: String,
        amount: i64,
        tag: u64,
    },
    /// The payee half of a transfer; only ever a follow-up.
    Credit {
        account: String,
        amount: i64,
        tag: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Applied { balance: i128 },
    InsufficientFunds { balance: i128 },
    Rejected { reason: String },
}

const ADD: u8 = 0;
const TRANSFER: u8 = 1;
const CREDIT: u8 = 2;

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(64);
        match self {
            Self::Add {
                account,
                amount,
                tag,
            }
            | Self::Credit {
                account,
                amount,
                tag,
            } => {
                buf.put_u8(if matches!(self, Self::Add { .. }) {
                    ADD
                } else {
                    CREDIT
                });
                buf.put_bytes(account.as_bytes());
                buf.put_u64(*amount as u64);
                buf.put_u64(*tag);
            }
            Self::Transfer {
                from,
                to,
                amount,
                tag,
            } => {
                buf.put_u8(TRANSFER);
                buf.put_bytes(from.as_bytes());
                buf.put_bytes(to.as_bytes());
                buf.put_u64(*amount as u64);
                buf.put_u64(*tag);
            }
        }
        buf
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes);
        let kind = r.u8()?;
        let account = |r: &mut Reader<'_>| -> Result<String, WireError> {
            String::from_utf8(r.bytes()?.to_vec()).map_err(|_| r.invalid("account is not UTF-8"))
        };
        let command = match kind {
            ADD | CREDIT => {
                let account = account(&mut r)?;
                let amount = r.u64()? as i64;
                let tag = r.u64()?;
                if kind == ADD {
                    Self::Add {
                        account,
                        amount,
                        tag,
                    }
                } else {
                    Self::Credit {
                        account,
                        amount,
                        tag,
                    }
                }
            }
            TRANSFER => Self::Transfer {
                from: account(&mut r)?,
                to: account(&mut r)?,
                amount: r.u64()? as i64,
                tag: r.u64()?,
            },
            _ => return Err(r.invalid("unknown tally command")),
        };
        r.finish()?;
        Ok(command)
    }
}

impl Outcome {
    pub fn encode(&self, buf: &mut Vec<u8>) {
        match self {
            Self::Applied { balance } => {
                buf.put_u8(0);
                buf.put_i128(*balance);
            }
            Self::InsufficientFunds { balance } => {
                buf.put_u8(1);
                buf.put_i128(*balance);
            }
            Self::Rejected { reason } => {
                buf.put_u8(2);
                buf.put_bytes(reason.as_bytes());
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes);
        let outcome = match r.u8()? {
            0 => Self::Applied { balance: r.i128()? },
            1 => Self::InsufficientFunds { balance: r.i128()? },
            2 => Self::Rejected {
                reason: String::from_utf8_lossy(r.bytes()?).into_owned(),
            },
            _ => return Err(r.invalid("unknown tally outcome")),
        };
        r.finish()?;
        Ok(outcome)
    }
}

/// An entry event: `amount` was booked on an account (the projection needs no more).
pub fn encode_entry_event(amount: i64) -> [u8; 8] {
    amount.to_le_bytes()
}

pub fn decode_entry_event(bytes: &[u8]) -> Option<i64> {
    Some(i64::from_le_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip() {
        for command in [
            Command::Add {
                account: "a".into(),
                amount: -5,
                tag: 9,
            },
            Command::Transfer {
                from: "a".into(),
                to: "b".into(),
                amount: i64::MAX,
                tag: 1,
            },
            Command::Credit {
                account: "ü".into(),
                amount: 3,
                tag: u64::MAX,
            },
        ] {
            assert_eq!(Command::decode(&command.encode()).unwrap(), command);
        }
        assert!(Command::decode(&[7]).is_err());
        assert!(Command::decode(&[]).is_err());
    }
}
