//! Little-endian binary encoding shared by journal records, snapshots and app payloads.
//!
//! Decoding never panics on bad input: every read is bounds-checked and returns [`WireError`], because
//! these bytes come from disk (possibly corrupt) and from apps' own codecs.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("truncated: needed {needed} more bytes at offset {offset}")]
    Truncated { offset: usize, needed: usize },
    #[error("invalid value at offset {offset}: {what}")]
    Invalid { offset: usize, what: &'static str },
}

/// Appends fixed-width little-endian values to a byte buffer.
pub trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_u128(&mut self, v: u128);
    fn put_i128(&mut self, v: i128);
    /// A u32 length, then the bytes.
    fn put_bytes(&mut self, v: &[u8]);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u128(&mut self, v: u128) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_i128(&mut self, v: i128) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_bytes(&mut self, v: &[u8]) {
        let len = u32::try_from(v.len()).expect("wire byte strings are at most u32::MAX long");
        self.put_u32(len);
        self.extend_from_slice(v);
    }
}

/// A cursor over bytes that decodes what [`Put`] encoded.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, offset: 0 }
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.offset
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub fn take(&mut self, len: usize) -> Result<&'a [u8], WireError> {
        if self.remaining() < len {
            return Err(WireError::Truncated {
                offset: self.offset,
                needed: len - self.remaining(),
            });
        }
        let slice = &self.bytes[self.offset..self.offset + len];
        self.offset += len;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let slice = self.take(N)?;
        Ok(slice.try_into().expect("take returned exactly N bytes"))
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn u128(&mut self) -> Result<u128, WireError> {
        Ok(u128::from_le_bytes(self.array()?))
    }
    pub fn i128(&mut self) -> Result<i128, WireError> {
        Ok(i128::from_le_bytes(self.array()?))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    pub fn invalid(&self, what: &'static str) -> WireError {
        WireError::Invalid {
            offset: self.offset,
            what,
        }
    }

    /// Fails unless every byte was consumed: trailing bytes mean the writer and reader disagree.
    pub fn finish(self) -> Result<(), WireError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self.invalid("trailing bytes"))
        }
    }
}

/// Fixed-width little-endian writes to any [`std::io::Write`], for streaming snapshots.
pub trait WriteLe: std::io::Write {
    fn write_u8_le(&mut self, v: u8) -> std::io::Result<()> {
        self.write_all(&[v])
    }
    fn write_u16_le(&mut self, v: u16) -> std::io::Result<()> {
        self.write_all(&v.to_le_bytes())
    }
    fn write_u32_le(&mut self, v: u32) -> std::io::Result<()> {
        self.write_all(&v.to_le_bytes())
    }
    fn write_u64_le(&mut self, v: u64) -> std::io::Result<()> {
        self.write_all(&v.to_le_bytes())
    }
    fn write_i128_le(&mut self, v: i128) -> std::io::Result<()> {
        self.write_all(&v.to_le_bytes())
    }
    fn write_bytes_le(&mut self, v: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(v.len()).map_err(std::io::Error::other)?;
        self.write_u32_le(len)?;
        self.write_all(v)
    }
}
impl<W: std::io::Write + ?Sized> WriteLe for W {}

/// Counts the bytes written through it, for writers that stop after a budget of bytes.
pub(crate) struct CountingWriter<'a> {
    inner: &'a mut dyn std::io::Write,
    pub bytes: usize,
}

impl<'a> CountingWriter<'a> {
    pub fn new(inner: &'a mut dyn std::io::Write) -> Self {
        Self { inner, bytes: 0 }
    }
}

impl std::io::Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.bytes += written;
        Ok(written)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The reading side of [`WriteLe`].
pub trait ReadLe: std::io::Read {
    fn read_le_array<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut buf = [0; N];
        self.read_exact(&mut buf)?;
        Ok(buf)
    }
    fn read_u8_le(&mut self) -> std::io::Result<u8> {
        Ok(self.read_le_array::<1>()?[0])
    }
    fn read_u16_le(&mut self) -> std::io::Result<u16> {
        Ok(u16::from_le_bytes(self.read_le_array()?))
    }
    fn read_u32_le(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.read_le_array()?))
    }
    fn read_u64_le(&mut self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.read_le_array()?))
    }
    fn read_i128_le(&mut self) -> std::io::Result<i128> {
        Ok(i128::from_le_bytes(self.read_le_array()?))
    }
    /// Reads a length-prefixed byte string of at most `len_max` bytes (a larger length is corruption).
    fn read_bytes_le(&mut self, len_max: usize) -> std::io::Result<Vec<u8>> {
        let len = self.read_u32_le()? as usize;
        if len > len_max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("byte string of {len} bytes exceeds the limit of {len_max}"),
            ));
        }
        self.read_len_bytes(len as u64)
    }

    /// Reads `len` bytes, as told by a length read from the same untrusted input: the buffer grows as
    /// bytes arrive, so a damaged length ends in an error at the input's end, not in an allocation of
    /// its size (found by fuzzing a snapshot, `fuzz/fuzz_targets/snapshot_restore.rs`).
    fn read_len_bytes(&mut self, len: u64) -> std::io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(&mut *self, len), &mut buf)?;
        if (buf.len() as u64) < len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{len} bytes announced, {} found", buf.len()),
            ));
        }
        Ok(buf)
    }
}
impl<R: std::io::Read + ?Sized> ReadLe for R {}

#[cfg(test)]
mod tests {
    #[test]
    fn a_huge_announced_length_is_an_error_not_an_allocation() {
        use super::ReadLe;
        let mut input: &[u8] = &[1, 2, 3];
        let error = input.read_len_bytes(0x41ff_0000_0000).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
        let mut input: &[u8] = &[1, 2, 3, 4];
        assert_eq!(input.read_len_bytes(3).unwrap(), [1, 2, 3]);
        assert_eq!(input, [4]);
    }

    use super::*;

    #[test]
    fn round_trips_every_width() {
        let mut buf = Vec::new();
        buf.put_u8(7);
        buf.put_u16(0xBEEF);
        buf.put_u32(123_456);
        buf.put_u64(u64::MAX - 1);
        buf.put_u128(u128::MAX / 3);
        buf.put_i128(i128::MIN);
        buf.put_bytes(b"abc");
        let mut r = Reader::new(&buf);
        assert_eq!(r.u8().unwrap(), 7);
        assert_eq!(r.u16().unwrap(), 0xBEEF);
        assert_eq!(r.u32().unwrap(), 123_456);
        assert_eq!(r.u64().unwrap(), u64::MAX - 1);
        assert_eq!(r.u128().unwrap(), u128::MAX / 3);
        assert_eq!(r.i128().unwrap(), i128::MIN);
        assert_eq!(r.bytes().unwrap(), b"abc");
        r.finish().unwrap();
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let mut buf = Vec::new();
        buf.put_bytes(b"hello");
        let mut r = Reader::new(&buf[..6]);
        assert_eq!(
            r.bytes(),
            Err(WireError::Truncated {
                offset: 4,
                needed: 3
            })
        );
        assert!(Reader::new(&[1, 2]).u32().is_err());
    }

    #[test]
    fn trailing_bytes_are_reported() {
        let mut r = Reader::new(&[1, 2]);
        r.u8().unwrap();
        assert!(r.finish().is_err());
    }
}
