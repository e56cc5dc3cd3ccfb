//! The journal's record format.
//!
//! A frame is `length: u32 | crc32c: u32 | kind: u8 | body`, little-endian. `length` counts `kind` and
//! `body`; the CRC covers the length bytes, the kind and the body, so a corrupt length is caught too.
//!
//! The body of both kinds is an envelope followed by the app's command payload and the events that applying
//! it produced:
//! `app: u8 | origin | timestamp_ms: u64 | random: u64 | payload: bytes | (event: bytes)*`, where origin is
//! `command_id: u128` for a client command with an id (kind 1), nothing for one without (kind 3), and
//! `source: u16 | seq: u64` for a follow-up (kind 2).
//!
//! Events are stored so that projections can be rebuilt from the journal alone; partitions replay the
//! command and (in debug builds) check that they produce the same events again.

use crate::wire::{Put, Reader, WireError};
use crate::{AppId, CommandId, PartitionId};

pub const FRAME_HEADER_BYTES: usize = 8;
/// No record may be larger: a length above this is treated as corruption, never as an allocation request.
pub const RECORD_BYTES_MAX: usize = 64 * 1024 * 1024;

const KIND_COMMAND: u8 = 1;
const KIND_FOLLOW_UP: u8 = 2;
const KIND_COMMAND_WITHOUT_ID: u8 = 3;

/// Where a command came from: a client (deduplicated by id) or another partition (deduplicated by sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `command_id` is the client's idempotency key; `None` when the client gave none.
    Client {
        command_id: Option<CommandId>,
    },
    FollowUp {
        source: PartitionId,
        seq: u64,
    },
}

/// The fields of a record that the engine stamps before apply; apply reads its time and randomness here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub app: AppId,
    pub origin: Origin,
    pub timestamp_ms: u64,
    pub random: u64,
}

/// A decoded record borrowing from the journal bytes.
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    pub envelope: Envelope,
    pub payload: &'a [u8],
    events: &'a [u8],
}

impl<'a> RecordRef<'a> {
    /// Decodes a frame's kind and body.
    pub fn decode(kind: u8, body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let app = r.u8()?;
        let origin = match kind {
            KIND_COMMAND => Origin::Client {
                command_id: Some(r.u128()?),
            },
            KIND_COMMAND_WITHOUT_ID => Origin::Client { command_id: None },
            KIND_FOLLOW_UP => Origin::FollowUp {
                source: r.u16()?,
                seq: r.u64()?,
            },
            _ => return Err(r.invalid("unknown record kind")),
        };
        let timestamp_ms = r.u64()?;
        let random = r.u64()?;
        let payload = r.bytes()?;
        let events = r.take(r.remaining())?;
        let mut check = Reader::new(events);
        while !check.is_empty() {
            check.bytes()?;
        }
        Ok(Self {
            envelope: Envelope {
                app,
                origin,
                timestamp_ms,
                random,
            },
            payload,
            events,
        })
    }

    /// The events applying this record produced, in order.
    pub fn events(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let mut r = Reader::new(self.events);
        std::iter::from_fn(move || if r.is_empty() { None } else { r.bytes().ok() })
    }

    pub fn raw_events(&self) -> &'a [u8] {
        self.events
    }
}

/// Starts a record at the end of `buf`; events may then be appended with [`push_event`] before
/// [`finish_record`] seals it. Returns the record's start offset.
pub fn begin_record(buf: &mut Vec<u8>, envelope: &Envelope, payload: &[u8]) -> usize {
    let start = buf.len();
    buf.put_u32(0); // length, patched by finish_record
    buf.put_u32(0); // crc, patched by finish_record
    match envelope.origin {
        Origin::Client {
            command_id: Some(command_id),
        } => {
            buf.put_u8(KIND_COMMAND);
            buf.put_u8(envelope.app);
            buf.put_u128(command_id);
        }
        Origin::Client { command_id: None } => {
            buf.put_u8(KIND_COMMAND_WITHOUT_ID);
            buf.put_u8(envelope.app);
        }
        Origin::FollowUp { source, seq } => {
            buf.put_u8(KIND_FOLLOW_UP);
            buf.put_u8(envelope.app);
            buf.put_u16(source);
            buf.put_u64(seq);
        }
    }
    buf.put_u64(envelope.timestamp_ms);
    buf.put_u64(envelope.random);
    buf.put_bytes(payload);
    start
}

pub fn push_event(buf: &mut Vec<u8>, event: &[u8]) {
    buf.put_bytes(event);
}

/// Patches the length and checksum of the record that starts at `start` and runs to the end of `buf`.
pub fn finish_record(buf: &mut [u8], start: usize) {
    let length = buf.len() - start - FRAME_HEADER_BYTES;
    assert!(
        length <= RECORD_BYTES_MAX,
        "record of {length} bytes exceeds RECORD_BYTES_MAX"
    );
    let length_bytes = (length as u32).to_le_bytes();
    buf[start..start + 4].copy_from_slice(&length_bytes);
    let crc = frame_crc(length_bytes, &buf[start + FRAME_HEADER_BYTES..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn frame_crc(length_bytes: [u8; 4], kind_and_body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&length_bytes), kind_and_body)
}

/// What [`read_frame`] found at the start of a byte slice.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A whole, checksummed frame of `total_bytes` (header included).
    Valid {
        kind: u8,
        body: &'a [u8],
        total_bytes: usize,
    },
    /// Fewer bytes than the header or the stated length need.
    Incomplete,
    /// Checksum mismatch, impossible length or an empty body.
    Corrupt,
}

pub fn read_frame(bytes: &[u8]) -> Frame<'_> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Frame::Incomplete;
    }
    let length_bytes: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
    let length = u32::from_le_bytes(length_bytes) as usize;
    if length == 0 || length > RECORD_BYTES_MAX {
        return Frame::Corrupt;
    }
    let total_bytes = FRAME_HEADER_BYTES + length;
    if bytes.len() < total_bytes {
        return Frame::Incomplete;
    }
    let stored_crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let kind_and_body = &bytes[FRAME_HEADER_BYTES..total_bytes];
    if frame_crc(length_bytes, kind_and_body) != stored_crc {
        return Frame::Corrupt;
    }
    Frame::Valid {
        kind: kind_and_body[0],
        body: &kind_and_body[1..],
        total_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(origin: Origin) -> Vec<u8> {
        let envelope = Envelope {
            app: 3,
            origin,
            timestamp_ms: 1_700_000_000_000,
            random: 42,
        };
        let mut buf = vec![0xAA]; // records need not start at offset 0
        let start = begin_record(&mut buf, &envelope, b"payload");
        push_event(&mut buf, b"e1");
        push_event(&mut buf, b"");
        finish_record(&mut buf, start);
        buf.split_off(1)
    }

    #[test]
    fn round_trips_both_origins() {
        for origin in [
            Origin::Client {
                command_id: Some(u128::MAX - 5),
            },
            Origin::Client { command_id: None },
            Origin::FollowUp { source: 1, seq: 9 },
        ] {
            let buf = sample(origin);
            let Frame::Valid {
                kind,
                body,
                total_bytes,
            } = read_frame(&buf)
            else {
                panic!("not valid")
            };
            assert_eq!(total_bytes, buf.len());
            let record = RecordRef::decode(kind, body).unwrap();
            assert_eq!(record.envelope.origin, origin);
            assert_eq!(record.envelope.app, 3);
            assert_eq!(record.envelope.random, 42);
            assert_eq!(record.payload, b"payload");
            assert_eq!(
                record.events().collect::<Vec<_>>(),
                vec![&b"e1"[..], &b""[..]]
            );
        }
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let buf = sample(Origin::Client {
            command_id: Some(7),
        });
        for bit in 0..buf.len() * 8 {
            let mut flipped = buf.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !matches!(read_frame(&flipped), Frame::Valid { .. }),
                "flip of bit {bit} went unnoticed"
            );
        }
    }

    #[test]
    fn short_input_is_incomplete() {
        let buf = sample(Origin::Client {
            command_id: Some(7),
        });
        for len in 0..buf.len() {
            assert_eq!(
                read_frame(&buf[..len]),
                Frame::Incomplete,
                "prefix of {len} bytes"
            );
        }
    }
}
