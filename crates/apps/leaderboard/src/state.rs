//! `LeaderboardState`: the boards a partition owns (a board lives on the partition its name hashes to,
//! so all of its updates are applied by one thread, in order, without locks).

use crate::board::{Board, BoardConfig, UpdateError};
use crate::command::{Command, ItemResult, Outcome};
use crate::snapshot::{self, SnapshotWriter};
use spate_engine::wire::{Put, Reader, WireError};
use spate_engine::{ArchiveReader, Effects, StateMachine};
use std::collections::BTreeMap;
use std::io::{self, Read};

/// The query [`LeaderboardState::read`] answers with a [`BoardSummary`] of every board it holds.
pub const BOARDS_QUERY: &[u8] = b"boards";

/// What a list of boards shows of one. Lists span partitions, which in a cluster live on several
/// nodes, so a summary crosses the network as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoardSummary {
    pub name: String,
    pub config: BoardConfig,
    pub season: u32,
    pub seasons: u32,
    pub members: u64,
}

impl BoardSummary {
    pub fn of(name: &str, board: &Board) -> Self {
        let current = board.current();
        Self {
            name: name.to_string(),
            config: board.config,
            season: current.number,
            seasons: u32::try_from(board.seasons.len()).unwrap_or(u32::MAX),
            members: current.len() as u64,
        }
    }

    pub fn encode_all(summaries: &[BoardSummary]) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u32(u32::try_from(summaries.len()).expect("board count fits in u32"));
        for summary in summaries {
            out.put_bytes(summary.name.as_bytes());
            summary.config.encode(&mut out);
            out.put_u32(summary.season);
            out.put_u32(summary.seasons);
            out.put_u64(summary.members);
        }
        out
    }

    pub fn decode_all(bytes: &[u8]) -> Result<Vec<BoardSummary>, WireError> {
        let mut r = Reader::new(bytes);
        let count = r.u32()? as usize;
        if count > r.remaining() {
            return Err(r.invalid("board count larger than the answer"));
        }
        let mut summaries = Vec::with_capacity(count);
        for _ in 0..count {
            let name = std::str::from_utf8(r.bytes()?).map_err(|_| r.invalid("board name"))?;
            summaries.push(BoardSummary {
                name: name.to_string(),
                config: BoardConfig::decode(&mut r)?,
                season: r.u32()?,
                seasons: r.u32()?,
                members: r.u64()?,
            });
        }
        r.finish()?;
        Ok(summaries)
    }
}

#[derive(Debug, Default)]
pub struct LeaderboardState {
    boards: BTreeMap<String, Board>,
    /// Scratch space for a batch's looked-up member slots, kept to avoid an allocation per command.
    found_slots: Vec<Option<u32>>,
    /// The snapshot being written in steps.
    snapshot: Option<SnapshotWriter>,
}

/// How many updates ahead a batch starts loading the tree leaves an update will touch.
const PREFETCH_AHEAD: usize = 4;

/// A different tie-breaker for every update of one command, from the command's one random draw.
fn item_tie(random: u64, index: usize) -> u64 {
    let mut z = random.wrapping_add((index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl LeaderboardState {
    pub fn board(&self, name: &str) -> Option<&Board> {
        self.boards.get(name)
    }

    pub fn boards(&self) -> impl Iterator<Item = (&String, &Board)> {
        self.boards.iter()
    }

    /// Applies one decoded command, writing its reply into `reply`.
    pub fn execute(
        &mut self,
        command: &Command<'_>,
        timestamp_ms: u64,
        random: u64,
        reply: &mut Vec<u8>,
    ) {
        let outcome = match command {
            Command::Create { board, config } => match self.boards.get(*board) {
                Some(existing) => Outcome::Exists {
                    config: existing.config,
                },
                None => {
                    self.boards
                        .insert((*board).to_string(), Board::new(*config, timestamp_ms));
                    Outcome::Created { config: *config }
                }
            },
            Command::Update {
                board,
                with_rank,
                items,
            } => {
                let Some(board) = self.boards.get_mut(*board) else {
                    return Outcome::NoSuchBoard.encode(reply);
                };
                let config = board.config;
                let season = board.current_mut();
                Outcome::begin_updated(reply, season.number, items.len());
                season.find_slots(items.iter().map(|item| item.member), &mut self.found_slots);
                for (index, item) in items.iter().enumerate() {
                    if let Some(ahead) = items.get(index + PREFETCH_AHEAD) {
                        let operator = ahead.operator.unwrap_or(config.operator);
                        let found = self.found_slots[index + PREFETCH_AHEAD];
                        season.prefetch_update(&config, found, operator, ahead.value);
                    }
                    let operator = item.operator.unwrap_or(config.operator);
                    let result = match season.update_found(
                        &config,
                        item.member,
                        self.found_slots[index],
                        operator,
                        item.value,
                        item_tie(random, index),
                    ) {
                        Ok(score) => ItemResult::Scored {
                            score,
                            rank: with_rank
                                .then(|| season.rank(item.member).expect("just updated")),
                        },
                        Err(UpdateError::Overflow) => ItemResult::Overflow,
                        Err(UpdateError::Full) => ItemResult::BoardFull,
                    };
                    result.encode(reply);
                }
                return;
            }
            Command::DeleteMember { board, member } => match self.boards.get_mut(*board) {
                None => Outcome::NoSuchBoard,
                Some(board) => {
                    if board.current_mut().delete(member) {
                        Outcome::Deleted
                    } else {
                        Outcome::NoSuchMember
                    }
                }
            },
            Command::DeleteBoard { board: name } => match self.boards.remove(*name) {
                Some(board) => {
                    if let Some(snapshot) = &mut self.snapshot {
                        snapshot.keep_deleted(name, board);
                    }
                    Outcome::Deleted
                }
                None => Outcome::NoSuchBoard,
            },
            Command::Reset { board } => match self.boards.get_mut(*board) {
                Some(board) => Outcome::Reset {
                    season: board.reset(timestamp_ms),
                },
                None => Outcome::NoSuchBoard,
            },
        };
        outcome.encode(reply);
    }

    /// Reads what `write_snapshot` wrote, and not a byte more: the engine's snapshot stream continues
    /// with its own checksum and other apps' sections.
    pub fn restore(input: &mut dyn io::Read) -> io::Result<Self> {
        let mut length = [0; 8];
        input.read_exact(&mut length)?;
        let length = u64::from_le_bytes(length);
        let mut bytes = Vec::new();
        Read::take(&mut *input, length).read_to_end(&mut bytes)?;
        if bytes.len() as u64 != length {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "leaderboard snapshot is truncated",
            ));
        }
        let invalid = |e: spate_engine::wire::WireError| {
            io::Error::new(io::ErrorKind::InvalidData, e.to_string())
        };
        let mut r = Reader::new(&bytes);
        let mut boards = BTreeMap::new();
        for _ in 0..r.u32().map_err(invalid)? {
            let name = String::from_utf8(r.bytes().map_err(invalid)?.to_vec()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, "board name is not UTF-8")
            })?;
            boards.insert(name, Board::read(&mut r).map_err(invalid)?);
        }
        r.finish().map_err(invalid)?;
        Ok(Self {
            boards,
            found_slots: Vec::new(),
            snapshot: None,
        })
    }
}

impl StateMachine for LeaderboardState {
    fn apply(&mut self, command: &spate_engine::Command<'_>, effects: &mut Effects<'_>) {
        let envelope = command.envelope;
        match Command::decode(command.payload) {
            Ok(decoded) => self.execute(
                &decoded,
                envelope.timestamp_ms,
                envelope.random,
                effects.reply(),
            ),
            Err(error) => Outcome::Invalid {
                reason: error.to_string(),
            }
            .encode(effects.reply()),
        }
    }

    /// Writes the state through one buffer: the engine writes this app's snapshots in steps instead.
    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        snapshot::write_whole(&self.boards, out)
    }

    fn begin_snapshot(&mut self) -> bool {
        self.snapshot = Some(SnapshotWriter::begin(&mut self.boards));
        true
    }

    fn write_snapshot_step(
        &mut self,
        out: &mut dyn io::Write,
        bytes_budget: usize,
    ) -> io::Result<bool> {
        let writer = self
            .snapshot
            .as_mut()
            .expect("a snapshot step follows begin_snapshot");
        let done = writer.write_step(&mut self.boards, out, bytes_budget)?;
        if done {
            self.snapshot = None;
        }
        Ok(done)
    }

    fn read(&self, query: &[u8], _archive: &ArchiveReader<'_>) -> Vec<u8> {
        if query != BOARDS_QUERY {
            return Vec::new();
        }
        let summaries: Vec<_> = self
            .boards
            .iter()
            .map(|(name, board)| BoardSummary::of(name, board))
            .collect();
        BoardSummary::encode_all(&summaries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{BoardConfig, Operator, Order, TiePolicy};
    use crate::command::UpdateItem;

    #[test]
    fn a_snapshot_restores_exactly_its_own_bytes_from_a_longer_stream() {
        let mut state = LeaderboardState::default();
        let config = BoardConfig {
            order: Order::Descending,
            ties: TiePolicy::Random,
            operator: Operator::Set,
        };
        let mut reply = Vec::new();
        state.execute(&Command::Create { board: "b", config }, 1, 2, &mut reply);
        let items = (0..50)
            .map(|i| UpdateItem {
                member: ["x", "y", "z"][i % 3],
                operator: None,
                value: i as i128 % 7,
            })
            .collect();
        state.execute(
            &Command::Update {
                board: "b",
                with_rank: false,
                items,
            },
            3,
            4,
            &mut reply,
        );
        // Enough members that the snapshot is written in several pieces.
        let names: Vec<String> = (0..5_000).map(|i| format!("member{i}")).collect();
        let items = names
            .iter()
            .map(|m| UpdateItem {
                member: m,
                operator: None,
                value: 1,
            })
            .collect();
        state.execute(
            &Command::Update {
                board: "b",
                with_rank: false,
                items,
            },
            5,
            6,
            &mut reply,
        );
        let mut stream = Vec::new();
        state.write_snapshot(&mut stream).expect("write to a Vec");
        assert!(stream.len() > 100_000);
        // The engine's stream goes on after the app's section (its checksum, other apps).
        stream.extend_from_slice(b"NEXT");
        let mut input = &stream[..];
        let restored = LeaderboardState::restore(&mut input).expect("restore");
        assert_eq!(input, b"NEXT");
        let page = |s: &LeaderboardState| {
            let board = s.board("b").expect("board");
            board.current().page(&board.config, 0, usize::MAX)
        };
        assert_eq!(page(&restored), page(&state));
        assert_eq!(page(&state).len(), 5_003);
        let mut truncated = &stream[..stream.len() - 10];
        assert!(LeaderboardState::restore(&mut truncated).is_err());
    }

    mod in_steps {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Create(u8),
            /// Sets `count` members from `first` on a board: enough to fill several chunks of slots.
            Update {
                board: u8,
                first: u16,
                count: u16,
                value: i8,
            },
            Delete(u8, u16),
            DeleteBoard(u8),
            Reset(u8),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                1 => (0u8..3).prop_map(Op::Create),
                6 => (0u8..3, 0u16..3000, 1u16..1500, any::<i8>()).prop_map(|(board, first, count, value)| Op::Update { board, first, count, value }),
                3 => (0u8..3, 0u16..3000).prop_map(|(board, member)| Op::Delete(board, member)),
                1 => (0u8..3).prop_map(Op::DeleteBoard),
                1 => (0u8..3).prop_map(Op::Reset),
            ]
        }

        fn execute(state: &mut LeaderboardState, op: &Op, time: u64) {
            let name = |board: &u8| format!("board{board}");
            let mut run =
                |command: &Command<'_>| state.execute(command, time, time, &mut Vec::new());
            match op {
                Op::Create(board) => {
                    let ties = if board % 2 == 0 {
                        TiePolicy::First
                    } else {
                        TiePolicy::Random
                    };
                    let config = BoardConfig {
                        order: Order::Descending,
                        ties,
                        operator: Operator::Increment,
                    };
                    run(&Command::Create {
                        board: &name(board),
                        config,
                    });
                }
                Op::Update {
                    board,
                    first,
                    count,
                    value,
                } => {
                    let members: Vec<String> = (*first..first.saturating_add(*count))
                        .map(|m| format!("m{m}"))
                        .collect();
                    let items = members
                        .iter()
                        .map(|member| UpdateItem {
                            member,
                            operator: None,
                            value: i128::from(*value),
                        })
                        .collect();
                    run(&Command::Update {
                        board: &name(board),
                        with_rank: false,
                        items,
                    });
                }
                Op::Delete(board, member) => {
                    run(&Command::DeleteMember {
                        board: &name(board),
                        member: &format!("m{member}"),
                    });
                }
                Op::DeleteBoard(board) => run(&Command::DeleteBoard {
                    board: &name(board),
                }),
                Op::Reset(board) => run(&Command::Reset {
                    board: &name(board),
                }),
            }
        }

        fn whole(state: &LeaderboardState) -> Vec<u8> {
            let mut bytes = Vec::new();
            state.write_snapshot(&mut bytes).expect("write to a Vec");
            bytes
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(24))]
            /// A snapshot written in steps, with updates, deletes, resets and new or deleted boards
            /// between the steps, holds exactly the bytes a whole snapshot held when it began.
            #[test]
            fn a_snapshot_in_steps_is_the_state_when_it_began(
                before in proptest::collection::vec(op(), 1..40),
                during in proptest::collection::vec((op(), 1usize..20_000), 1..60),
            ) {
                let mut state = LeaderboardState::default();
                for board in 0..3 {
                    execute(&mut state, &Op::Create(board), 0);
                }
                for (time, op) in before.iter().enumerate() {
                    execute(&mut state, op, time as u64);
                }
                let expected = whole(&state);
                prop_assert!(state.begin_snapshot());
                let mut stepped = Vec::new();
                let mut done = false;
                for (time, (op, bytes_budget)) in during.iter().enumerate() {
                    if !done {
                        done = state.write_snapshot_step(&mut stepped, *bytes_budget).expect("write to a Vec");
                    }
                    execute(&mut state, op, 1_000 + time as u64);
                }
                while !done {
                    done = state.write_snapshot_step(&mut stepped, 1).expect("write to a Vec");
                }
                prop_assert!(stepped == expected, "{} bytes in steps, {} whole", stepped.len(), expected.len());
                let restored = LeaderboardState::restore(&mut &stepped[..]).expect("restore");
                prop_assert!(whole(&restored) == expected);
            }
        }
    }

    #[test]
    fn the_boards_query_lists_every_board_and_its_answer_decodes_back() {
        let mut state = LeaderboardState::default();
        let config = BoardConfig {
            order: Order::Ascending,
            ties: TiePolicy::Random,
            operator: Operator::Increment,
        };
        let mut reply = Vec::new();
        for board in ["beta", "alpha"] {
            state.execute(&Command::Create { board, config }, 1, 2, &mut reply);
        }
        let items = ["x", "y"]
            .iter()
            .map(|member| UpdateItem {
                member,
                operator: None,
                value: 3,
            })
            .collect();
        let update = Command::Update {
            board: "beta",
            with_rank: false,
            items,
        };
        state.execute(&update, 3, 4, &mut reply);

        let summaries = BoardSummary::decode_all(&state.read(BOARDS_QUERY, &ArchiveReader::EMPTY))
            .expect("decodes");
        let listed: Vec<_> = summaries
            .iter()
            .map(|b| (b.name.as_str(), b.members))
            .collect();
        assert_eq!(listed, [("alpha", 0), ("beta", 2)]);
        assert_eq!(summaries[1].config, config);
        assert_eq!((summaries[1].season, summaries[1].seasons), (1, 1));
        assert!(
            state
                .read(b"no such query", &ArchiveReader::EMPTY)
                .is_empty()
        );
        let answer = state.read(BOARDS_QUERY, &ArchiveReader::EMPTY);
        assert!(BoardSummary::decode_all(&answer[..answer.len() - 1]).is_err());
    }
}
