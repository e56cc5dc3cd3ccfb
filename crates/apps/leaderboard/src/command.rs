//! leaderboard's commands and replies, and their binary encoding in the journal.

use crate::board::{BoardConfig, Operator};
use spate_engine::wire::{Put, Reader, WireError};

/// Longest board name and member id, in bytes.
pub const NAME_BYTES_MAX: usize = 128;
/// Most score updates in one command (one HTTP request's share for one board).
pub const UPDATES_PER_COMMAND_MAX: usize = 10_000;

/// One score update inside [`Command::Update`]. `operator: None` means the board's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateItem<'a> {
    pub member: &'a str,
    pub operator: Option<Operator>,
    pub value: i128,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    Create {
        board: &'a str,
        config: BoardConfig,
    },
    /// Score updates on one board, applied in order; `with_rank` asks for each member's new rank.
    Update {
        board: &'a str,
        with_rank: bool,
        items: Vec<UpdateItem<'a>>,
    },
    DeleteMember {
        board: &'a str,
        member: &'a str,
    },
    DeleteBoard {
        board: &'a str,
    },
    /// Starts a new season; the old one stays readable.
    Reset {
        board: &'a str,
    },
}

const CREATE: u8 = 0;
const UPDATE: u8 = 1;
const DELETE_MEMBER: u8 = 2;
const DELETE_BOARD: u8 = 3;
const RESET: u8 = 4;
const OPERATOR_DEFAULT: u8 = 0xff;

impl<'a> Command<'a> {
    pub fn board(&self) -> &'a str {
        match self {
            Self::Create { board, .. }
            | Self::Update { board, .. }
            | Self::DeleteMember { board, .. }
            | Self::DeleteBoard { board }
            | Self::Reset { board } => board,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(64);
        match self {
            Self::Create { board, config } => {
                buf.put_u8(CREATE);
                buf.put_bytes(board.as_bytes());
                config.encode(&mut buf);
            }
            Self::Update {
                board,
                with_rank,
                items,
            } => {
                buf.reserve(items.len() * 40);
                buf.put_u8(UPDATE);
                buf.put_bytes(board.as_bytes());
                buf.put_u8(u8::from(*with_rank));
                buf.put_u32(
                    u32::try_from(items.len()).expect("bounded by UPDATES_PER_COMMAND_MAX"),
                );
                for item in items {
                    buf.put_bytes(item.member.as_bytes());
                    buf.put_u8(item.operator.map_or(OPERATOR_DEFAULT, Operator::code));
                    buf.put_i128(item.value);
                }
            }
            Self::DeleteMember { board, member } => {
                buf.put_u8(DELETE_MEMBER);
                buf.put_bytes(board.as_bytes());
                buf.put_bytes(member.as_bytes());
            }
            Self::DeleteBoard { board } => {
                buf.put_u8(DELETE_BOARD);
                buf.put_bytes(board.as_bytes());
            }
            Self::Reset { board } => {
                buf.put_u8(RESET);
                buf.put_bytes(board.as_bytes());
            }
        }
        buf
    }

    pub fn decode(bytes: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes);
        let command = match r.u8()? {
            CREATE => Self::Create {
                board: name(&mut r)?,
                config: BoardConfig::decode(&mut r)?,
            },
            UPDATE => {
                let board = name(&mut r)?;
                let with_rank = r.u8()? != 0;
                let count = r.u32()? as usize;
                if count > UPDATES_PER_COMMAND_MAX {
                    return Err(r.invalid("too many updates in one command"));
                }
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    let member = name(&mut r)?;
                    let operator = match r.u8()? {
                        OPERATOR_DEFAULT => None,
                        code => {
                            Some(Operator::from_code(code).ok_or_else(|| r.invalid("operator"))?)
                        }
                    };
                    items.push(UpdateItem {
                        member,
                        operator,
                        value: r.i128()?,
                    });
                }
                Self::Update {
                    board,
                    with_rank,
                    items,
                }
            }
            DELETE_MEMBER => Self::DeleteMember {
                board: name(&mut r)?,
                member: name(&mut r)?,
            },
            DELETE_BOARD => Self::DeleteBoard {
                board: name(&mut r)?,
            },
            RESET => Self::Reset {
                board: name(&mut r)?,
            },
            _ => return Err(r.invalid("command kind")),
        };
        r.finish()?;
        Ok(command)
    }
}

fn name<'a>(r: &mut Reader<'a>) -> Result<&'a str, WireError> {
    let bytes = r.bytes()?;
    if bytes.is_empty() || bytes.len() > NAME_BYTES_MAX {
        return Err(r.invalid("name length"));
    }
    std::str::from_utf8(bytes).map_err(|_| r.invalid("name is not UTF-8"))
}

/// How one update of an [`Outcome::Updated`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemResult {
    /// The member's score now, and its rank when asked for.
    Scored {
        score: i128,
        rank: Option<u64>,
    },
    Overflow,
    BoardFull,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Created {
        config: BoardConfig,
    },
    /// Create found a board of that name: here is its configuration.
    Exists {
        config: BoardConfig,
    },
    Updated {
        season: u32,
        items: Vec<ItemResult>,
    },
    Deleted,
    Reset {
        season: u32,
    },
    NoSuchBoard,
    NoSuchMember,
    /// The payload did not decode; only a bug or a damaged journal produces it.
    Invalid {
        reason: String,
    },
}

const CREATED: u8 = 0;
const EXISTS: u8 = 1;
const UPDATED: u8 = 2;
const DELETED: u8 = 3;
const WAS_RESET: u8 = 4;
const NO_SUCH_BOARD: u8 = 5;
const NO_SUCH_MEMBER: u8 = 6;
const INVALID: u8 = 7;

const ITEM_SCORED: u8 = 0;
const ITEM_SCORED_RANKED: u8 = 1;
const ITEM_OVERFLOW: u8 = 2;
const ITEM_FULL: u8 = 3;

impl ItemResult {
    /// Appends one item's result; apply writes these straight into the reply without collecting them.
    pub fn encode(self, out: &mut Vec<u8>) {
        match self {
            Self::Scored { score, rank: None } => {
                out.put_u8(ITEM_SCORED);
                out.put_i128(score);
            }
            Self::Scored {
                score,
                rank: Some(rank),
            } => {
                out.put_u8(ITEM_SCORED_RANKED);
                out.put_i128(score);
                out.put_u64(rank);
            }
            Self::Overflow => out.put_u8(ITEM_OVERFLOW),
            Self::BoardFull => out.put_u8(ITEM_FULL),
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(match r.u8()? {
            ITEM_SCORED => Self::Scored {
                score: r.i128()?,
                rank: None,
            },
            ITEM_SCORED_RANKED => Self::Scored {
                score: r.i128()?,
                rank: Some(r.u64()?),
            },
            ITEM_OVERFLOW => Self::Overflow,
            ITEM_FULL => Self::BoardFull,
            _ => return Err(r.invalid("item result")),
        })
    }
}

impl Outcome {
    /// The header of an [`Outcome::Updated`] reply; [`ItemResult::encode`] appends the items.
    pub fn begin_updated(out: &mut Vec<u8>, season: u32, count: usize) {
        out.put_u8(UPDATED);
        out.put_u32(season);
        out.put_u32(u32::try_from(count).expect("bounded by UPDATES_PER_COMMAND_MAX"));
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Created { config } => {
                out.put_u8(CREATED);
                config.encode(out);
            }
            Self::Exists { config } => {
                out.put_u8(EXISTS);
                config.encode(out);
            }
            Self::Updated { season, items } => {
                Self::begin_updated(out, *season, items.len());
                for item in items {
                    item.encode(out);
                }
            }
            Self::Deleted => out.put_u8(DELETED),
            Self::Reset { season } => {
                out.put_u8(WAS_RESET);
                out.put_u32(*season);
            }
            Self::NoSuchBoard => out.put_u8(NO_SUCH_BOARD),
            Self::NoSuchMember => out.put_u8(NO_SUCH_MEMBER),
            Self::Invalid { reason } => {
                out.put_u8(INVALID);
                out.put_bytes(reason.as_bytes());
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes);
        let outcome = match r.u8()? {
            CREATED => Self::Created {
                config: BoardConfig::decode(&mut r)?,
            },
            EXISTS => Self::Exists {
                config: BoardConfig::decode(&mut r)?,
            },
            UPDATED => {
                let season = r.u32()?;
                let count = r.u32()? as usize;
                if count > UPDATES_PER_COMMAND_MAX {
                    return Err(r.invalid("too many item results"));
                }
                let items = (0..count)
                    .map(|_| ItemResult::decode(&mut r))
                    .collect::<Result<_, _>>()?;
                Self::Updated { season, items }
            }
            DELETED => Self::Deleted,
            WAS_RESET => Self::Reset { season: r.u32()? },
            NO_SUCH_BOARD => Self::NoSuchBoard,
            NO_SUCH_MEMBER => Self::NoSuchMember,
            INVALID => Self::Invalid {
                reason: String::from_utf8_lossy(r.bytes()?).into_owned(),
            },
            _ => return Err(r.invalid("outcome kind")),
        };
        r.finish()?;
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{Order, TiePolicy};

    #[test]
    fn commands_and_outcomes_round_trip() {
        let config = BoardConfig {
            order: Order::Ascending,
            ties: TiePolicy::Random,
            operator: Operator::Best,
        };
        let commands = [
            Command::Create { board: "b", config },
            Command::Update {
                board: "b",
                with_rank: true,
                items: vec![
                    UpdateItem {
                        member: "m",
                        operator: None,
                        value: i128::MIN,
                    },
                    UpdateItem {
                        member: "n",
                        operator: Some(Operator::Worst),
                        value: 7,
                    },
                ],
            },
            Command::DeleteMember {
                board: "b",
                member: "m",
            },
            Command::DeleteBoard { board: "b" },
            Command::Reset { board: "b" },
        ];
        for command in commands {
            let bytes = command.encode();
            assert_eq!(Command::decode(&bytes), Ok(command.clone()));
            assert!(Command::decode(&bytes[..bytes.len() - 1]).is_err());
        }
        let outcomes = [
            Outcome::Created { config },
            Outcome::Exists { config },
            Outcome::Updated {
                season: 2,
                items: vec![
                    ItemResult::Scored {
                        score: -3,
                        rank: Some(9),
                    },
                    ItemResult::Scored {
                        score: i128::MAX,
                        rank: None,
                    },
                    ItemResult::Overflow,
                    ItemResult::BoardFull,
                ],
            },
            Outcome::Deleted,
            Outcome::Reset { season: 4 },
            Outcome::NoSuchBoard,
            Outcome::NoSuchMember,
            Outcome::Invalid { reason: "x".into() },
        ];
        for outcome in outcomes {
            let mut bytes = Vec::new();
            outcome.encode(&mut bytes);
            assert_eq!(Outcome::decode(&bytes), Ok(outcome));
        }
    }
}
