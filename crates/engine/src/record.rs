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

/// CRC-32C's polynomial, bit-reversed (the register shifts right).
const CRC32C_POLY_REFLECTED: u32 = 0x82F6_3B78;

/// The CRC register after one zero bit: the step every bit of a message takes.
fn crc_zero_bit(register: u32) -> u32 {
    if register & 1 == 1 {
        (register >> 1) ^ CRC32C_POLY_REFLECTED
    } else {
        register >> 1
    }
}

/// The register before [`crc_zero_bit`]: the polynomial's top bit is set, so the step's output says
/// whether its input's low bit was.
fn crc_zero_bit_undone(register: u32) -> u32 {
    if register & 0x8000_0000 != 0 {
        ((register ^ CRC32C_POLY_REFLECTED) << 1) | 1
    } else {
        register << 1
    }
}

/// Whether changing exactly one byte after the length field of `frame` (a frame whose length field
/// `frame` holds whole) makes it a valid frame: a byte damaged after it was written, rather than a
/// write cut short. Without trying each byte's 255 other values: a CRC is linear, so for messages of
/// one length `crc(a) ^ crc(b)` is the CRC (from a zero register, without the final xor) of `a ^ b`,
/// and one changed byte `d` at `k` bytes from the end changes the CRC by the register of `d` followed
/// by `k` zero bytes. So the mismatch, undone one zero byte at a time, must meet the register of some
/// single byte: O(length) steps instead of 255 checksums per byte. (A random mismatch meets one with
/// a chance of about 255 x length in 2^32: the caller bounds the length it asks about.)
pub(crate) fn one_byte_from_valid(frame: &[u8]) -> bool {
    let length_bytes: [u8; 4] = frame[..4].try_into().expect("the length field");
    let length = u32::from_le_bytes(length_bytes) as usize;
    assert_eq!(frame.len(), FRAME_HEADER_BYTES + length);
    if length == 0 || length > RECORD_BYTES_MAX {
        return false;
    }
    let stored = u32::from_le_bytes(frame[4..8].try_into().expect("4 bytes"));
    let mismatch = frame_crc(length_bytes, &frame[FRAME_HEADER_BYTES..]) ^ stored;
    if mismatch == 0 {
        // Valid already: any one changed byte would break it (a CRC catches every one-byte error).
        return false;
    }
    // The byte changed is one of the stored CRC's own: the two differ in that byte only.
    if (0..4).any(|i| (mismatch & !(0xFF << (8 * i))) == 0) {
        return true;
    }
    // The register of each single byte (CRC-32C's table), found again from its top byte, which is
    // different for each: the low byte shifts out, the polynomial's multiples shift in from the top.
    let mut register_of_byte = [0u32; 256];
    let mut byte_of_top_byte = [0u8; 256];
    for byte in 0..=u8::MAX {
        let register = (0..8).fold(u32::from(byte), |r, _| crc_zero_bit(r));
        register_of_byte[usize::from(byte)] = register;
        byte_of_top_byte[(register >> 24) as usize] = byte;
    }
    debug_assert!(
        (0..=u8::MAX)
            .all(|b| byte_of_top_byte[(register_of_byte[usize::from(b)] >> 24) as usize] == b)
    );
    // Undone zero byte by zero byte, from the last byte of the body back to its first (the kind).
    let mut register = mismatch;
    for _ in 0..length {
        let byte = byte_of_top_byte[(register >> 24) as usize];
        if register_of_byte[usize::from(byte)] == register {
            return true;
        }
        register = (0..8).fold(register, |r, _| crc_zero_bit_undone(r));
    }
    false
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

    /// What [`one_byte_from_valid`] must answer, by trying every other value of every byte.
    fn one_byte_from_valid_by_trying_each(frame: &[u8]) -> bool {
        let mut frame = frame.to_vec();
        for at in 4..frame.len() {
            let original = frame[at];
            for value in (0..=u8::MAX).filter(|&value| value != original) {
                frame[at] = value;
                if matches!(read_frame(&frame), Frame::Valid { .. }) {
                    return true;
                }
            }
            frame[at] = original;
        }
        false
    }

    /// A valid frame of `body`.
    fn frame_of(body: &[u8]) -> Vec<u8> {
        let mut frame = vec![0; FRAME_HEADER_BYTES];
        frame.extend_from_slice(body);
        let length_bytes = (body.len() as u32).to_le_bytes();
        frame[..4].copy_from_slice(&length_bytes);
        let crc = frame_crc(length_bytes, body);
        frame[4..8].copy_from_slice(&crc.to_le_bytes());
        frame
    }

    #[test]
    fn a_change_to_any_one_byte_after_the_length_is_found() {
        let frame = frame_of(b"kind, then a body of a few bytes");
        assert!(!one_byte_from_valid(&frame), "a valid frame is not damaged");
        for at in 4..frame.len() {
            for delta in [1, 0x80, 0xFF] {
                let mut damaged = frame.clone();
                damaged[at] ^= delta;
                assert!(
                    one_byte_from_valid(&damaged),
                    "byte {at} changed by {delta:#x}"
                );
            }
        }
        let mut twice = frame.clone();
        (twice[9], twice[20]) = (twice[9] ^ 1, twice[20] ^ 1);
        assert!(!one_byte_from_valid(&twice));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        #[test]
        fn one_changed_byte_is_found_and_agrees_with_trying_each_value(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..200),
            changes in proptest::collection::vec((4usize..1000, 1u8..=255), 0..4),
        ) {
            let mut frame = frame_of(&body);
            for &(at, delta) in &changes {
                let at = 4 + at % (frame.len() - 4);
                frame[at] ^= delta;
            }
            let answer = one_byte_from_valid(&frame);
            proptest::prop_assert_eq!(answer, one_byte_from_valid_by_trying_each(&frame));
            let changed = (0..frame.len()).filter(|&i| frame[i] != frame_of(&body)[i]).count();
            if changed == 1 {
                proptest::prop_assert!(answer, "one changed byte must be found");
            }
        }

        #[test]
        fn a_write_cut_short_agrees_with_trying_each_value(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 2..200),
            kept in 0usize..200,
        ) {
            // What a crash leaves in a preallocated segment: the start of the frame, then zeros.
            let mut frame = frame_of(&body);
            let kept = 8 + kept % (frame.len() - 8);
            frame[kept..].fill(0);
            proptest::prop_assert_eq!(
                one_byte_from_valid(&frame),
                one_byte_from_valid_by_trying_each(&frame)
            );
        }
    }
}
