//! The leaderboard's snapshot, written in steps while updates go on.
//!
//! [`SnapshotWriter::begin`] takes what the snapshot holds of each board when it begins (its name, its
//! header, its seasons' headers), and each season's slots and free list freeze themselves
//! ([`crate::snapshot_vec`]): the steps write them as they were, however updates change them
//! meanwhile. A board deleted before the steps are through with it is kept by the writer until they
//! are. A step writes pieces (a header, or up to 1,024 slots) until its byte budget is spent, so it
//! holds the partition up for about that budget whatever the state's size; beginning costs a little
//! per board and season.
//!
//! Format, the same as [`write_whole`]'s: the section's length (`u64`), the board count (`u32`), then
//! per board its name, its header and its seasons (see [`crate::board`]). The length comes first so that
//! restore reads this section and not a byte more of the engine's stream; the headers give it without
//! a pass over the members.

use crate::board::{Board, SeasonHeader};
use spate_engine::wire::Put;
use std::collections::BTreeMap;
use std::io;

/// Writes every board as it is now, at once.
pub fn write_whole(boards: &BTreeMap<String, Board>, out: &mut dyn io::Write) -> io::Result<()> {
    let length: u64 = 4 + boards
        .iter()
        .map(|(name, board)| {
            board_len(
                name,
                board.header_len(),
                board.seasons.iter().map(|s| s.header()),
            )
        })
        .sum::<u64>();
    let mut bytes = Vec::new();
    bytes.put_u64(length);
    bytes.put_u32(board_count(boards.len()));
    for (name, board) in boards {
        bytes.put_bytes(name.as_bytes());
        board.write(&mut bytes);
    }
    assert_eq!(
        bytes.len() as u64,
        8 + length,
        "the headers give the length"
    );
    out.write_all(&bytes)
}

fn board_len(name: &str, header_len: u64, seasons: impl Iterator<Item = SeasonHeader>) -> u64 {
    let seasons: u64 = seasons.map(|header| header.encoded_len()).sum();
    4 + name.len() as u64 + header_len + seasons
}

fn board_count(count: usize) -> u32 {
    u32::try_from(count).expect("board count fits in u32")
}

/// A board as the snapshot holds it.
#[derive(Debug)]
struct BoardInSnapshot {
    name: String,
    header: Vec<u8>,
    seasons: Vec<SeasonHeader>,
}

/// The piece the writer puts next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// The section's length and the board count.
    Start,
    BoardHeader {
        board: usize,
    },
    SeasonHeader {
        board: usize,
        season: usize,
    },
    Slots {
        board: usize,
        season: usize,
    },
    FreeSlots {
        board: usize,
        season: usize,
    },
    Done,
}

#[derive(Debug)]
pub struct SnapshotWriter {
    /// In the order of their names, as in the live map.
    boards: Vec<BoardInSnapshot>,
    /// Boards deleted while the snapshot had yet to write them.
    deleted: BTreeMap<String, Board>,
    next: Piece,
    /// The section's bytes after its length.
    length: u64,
    /// Bytes put so far after the length.
    put: u64,
    buffer: Vec<u8>,
}

impl SnapshotWriter {
    pub fn begin(boards: &mut BTreeMap<String, Board>) -> Self {
        let boards: Vec<BoardInSnapshot> = boards
            .iter_mut()
            .map(|(name, board)| {
                let mut header = Vec::new();
                board.write_header(&mut header);
                BoardInSnapshot {
                    name: name.clone(),
                    header,
                    seasons: board
                        .seasons
                        .iter_mut()
                        .map(|s| s.begin_snapshot())
                        .collect(),
                }
            })
            .collect();
        let length = 4 + boards
            .iter()
            .map(|b| board_len(&b.name, b.header.len() as u64, b.seasons.iter().copied()))
            .sum::<u64>();
        Self {
            boards,
            deleted: BTreeMap::new(),
            next: Piece::Start,
            length,
            put: 0,
            buffer: Vec::new(),
        }
    }

    /// Takes a board apply deleted: the snapshot still needs it if it has yet to write all of it.
    pub fn keep_deleted(&mut self, name: &str, board: Board) {
        let current = match self.next {
            Piece::Start => 0,
            Piece::BoardHeader { board }
            | Piece::SeasonHeader { board, .. }
            | Piece::Slots { board, .. }
            | Piece::FreeSlots { board, .. } => board,
            Piece::Done => self.boards.len(),
        };
        let in_snapshot = self.boards[current..]
            .binary_search_by(|b| b.name.as_str().cmp(name))
            .is_ok();
        // A board deleted twice (deleted, made again, deleted) was kept the first time.
        if in_snapshot && !self.deleted.contains_key(name) {
            self.deleted.insert(name.to_string(), board);
        }
    }

    /// Writes pieces until about `bytes_budget` bytes are out (at least one piece); true once the whole
    /// snapshot is written.
    pub fn write_step(
        &mut self,
        boards: &mut BTreeMap<String, Board>,
        out: &mut dyn io::Write,
        bytes_budget: usize,
    ) -> io::Result<bool> {
        self.buffer.clear();
        while self.next != Piece::Done && self.buffer.len() < bytes_budget {
            self.put_next(boards);
        }
        out.write_all(&self.buffer)?;
        if self.next == Piece::Done {
            assert_eq!(
                self.put, self.length,
                "the headers gave the snapshot's length"
            );
            assert!(self.deleted.is_empty(), "every kept board was written");
            return Ok(true);
        }
        Ok(false)
    }

    fn put_next(&mut self, boards: &mut BTreeMap<String, Board>) {
        // The length that starts the section is not part of itself.
        let length_bytes = if self.next == Piece::Start { 8 } else { 0 };
        let before = self.buffer.len() + length_bytes;
        let out = &mut self.buffer;
        self.next = match self.next {
            Piece::Start => {
                out.put_u64(self.length);
                out.put_u32(board_count(self.boards.len()));
                Self::first_of(0, self.boards.len())
            }
            Piece::BoardHeader { board } => {
                let in_snapshot = &self.boards[board];
                out.put_bytes(in_snapshot.name.as_bytes());
                out.extend_from_slice(&in_snapshot.header);
                Piece::SeasonHeader { board, season: 0 }
            }
            Piece::SeasonHeader { board, season } => {
                self.boards[board].seasons[season].write(out);
                Piece::Slots { board, season }
            }
            Piece::Slots { board, season } => {
                let live = Self::board(&mut self.deleted, boards, &self.boards[board].name);
                if live.seasons[season].write_snapshot_slots(out) {
                    self.boards[board].seasons[season].write_free_count(out);
                    Piece::FreeSlots { board, season }
                } else {
                    Piece::Slots { board, season }
                }
            }
            Piece::FreeSlots { board, season } => {
                let name = &self.boards[board].name;
                let live = Self::board(&mut self.deleted, boards, name);
                if !live.seasons[season].write_snapshot_free_slots(out) {
                    Piece::FreeSlots { board, season }
                } else if season + 1 < self.boards[board].seasons.len() {
                    Piece::SeasonHeader {
                        board,
                        season: season + 1,
                    }
                } else {
                    self.deleted.remove(name);
                    Self::first_of(board + 1, self.boards.len())
                }
            }
            Piece::Done => unreachable!("nothing is put after the end"),
        };
        self.put += (self.buffer.len() - before) as u64;
    }

    fn first_of(board: usize, count: usize) -> Piece {
        if board < count {
            Piece::BoardHeader { board }
        } else {
            Piece::Done
        }
    }

    /// A board the snapshot holds: kept by the writer if apply deleted it, else live.
    fn board<'a>(
        deleted: &'a mut BTreeMap<String, Board>,
        boards: &'a mut BTreeMap<String, Board>,
        name: &str,
    ) -> &'a mut Board {
        match deleted.get_mut(name) {
            Some(board) => board,
            None => boards
                .get_mut(name)
                .expect("a board in the snapshot is live or kept"),
        }
    }
}
