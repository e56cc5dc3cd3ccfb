//! Card data at rest is encrypted, so card numbers never reach the disk in clear. Memory holds them in
//! clear (scoring needs them).
//!
//! - Journal payloads pass through AES-256-GCM-SIV ([`CardCipher::seal`]). Their encryption is
//!   deterministic: the nonce is derived from the plaintext, so a resent batch seals to the same bytes
//!   and the engine's idempotency check recognises it. GCM-SIV is built for this: a repeated nonce
//!   reveals only that two plaintexts are equal, never their content or the key stream.
//! - Snapshots are streams of chunks ([`SealingWriter`]) sealed with AES-256-GCM (ring) under a key
//!   derived from the card key, with a random nonce each: nothing needs two snapshots' bytes to be
//!   equal, and ring opens about 7.5 GiB/s per core here against 1.3 GiB/s for the GCM-SIV crate, which
//!   was half of a restart's CPU (BENCHMARKS.md, "fraud: restart"). Chunks sealed with GCM-SIV by
//!   earlier versions are still read: the top bit of a chunk's length tells the two apart.

use aes_gcm_siv::aead::{Aead, KeyInit, OsRng};
use aes_gcm_siv::{Aes256GcmSiv, Key, Nonce};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use std::io::{self, Read, Write};
use std::path::Path;

const NONCE_BYTES: usize = 12;
const TAG_BYTES: usize = 16;
/// Plaintext per sealed snapshot chunk.
const CHUNK_BYTES: usize = 1 << 20;
/// Largest sealed chunk accepted when reading (a chunk plus nonce and tag).
const SEALED_CHUNK_BYTES_MAX: usize = CHUNK_BYTES + NONCE_BYTES + TAG_BYTES;
/// Set in a chunk's length when AES-256-GCM sealed it; clear in chunks sealed with GCM-SIV, which are
/// never that long.
const GCM_CHUNK: u32 = 1 << 31;
pub const KEY_BYTES: usize = 32;

pub struct CardCipher {
    /// Journal payloads: deterministic.
    payloads: Aes256GcmSiv,
    /// Snapshot chunks: random nonces.
    chunks: LessSafeKey,
    random: SystemRandom,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot decrypt: wrong key or damaged data")]
pub struct OpenError;

impl CardCipher {
    pub fn new(key: &[u8; KEY_BYTES]) -> Self {
        // A key of its own for the other mode, so that no AES block under the card key is ever used by
        // both.
        let pseudorandom_key =
            ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"spate fraud").extract(key);
        let derived = pseudorandom_key
            .expand(&[b"snapshot chunks"], &AES_256_GCM)
            .expect("AES-256-GCM's key length is a valid HKDF output length");
        Self {
            payloads: Aes256GcmSiv::new(Key::<Aes256GcmSiv>::from_slice(key)),
            chunks: LessSafeKey::new(UnboundKey::from(derived)),
            random: SystemRandom::new(),
        }
    }

    /// `nonce || ciphertext || tag`; the same plaintext always seals to the same bytes.
    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        let digest = xxhash_rust::xxh3::xxh3_128(plaintext).to_le_bytes();
        let nonce = Nonce::from_slice(&digest[..NONCE_BYTES]);
        let mut sealed = nonce.to_vec();
        sealed.extend(
            self.payloads
                .encrypt(nonce, plaintext)
                .expect("AES-GCM-SIV encryption cannot fail for in-memory buffers"),
        );
        sealed
    }

    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        if sealed.len() < NONCE_BYTES {
            return Err(OpenError);
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_BYTES);
        self.payloads
            .decrypt(Nonce::from_slice(nonce), ciphertext)
            .map_err(|_| OpenError)
    }

    /// Encrypts `plaintext` in place as a snapshot chunk; returns its nonce and tag.
    fn seal_chunk(&self, plaintext: &mut [u8]) -> ([u8; NONCE_LEN], [u8; TAG_BYTES]) {
        let mut nonce = [0; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .expect("the system's random source works");
        let tag = self
            .chunks
            .seal_in_place_separate_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce),
                Aad::empty(),
                plaintext,
            )
            .expect("a chunk is far below AES-GCM's length limit");
        let tag = tag.as_ref().try_into().expect("AES-GCM's tag is 16 bytes");
        (nonce, tag)
    }

    /// Decrypts a snapshot chunk (`nonce || ciphertext || tag`) in place; returns where its plaintext is.
    fn open_chunk(&self, sealed: &mut [u8]) -> Result<std::ops::Range<usize>, OpenError> {
        if sealed.len() < NONCE_BYTES + TAG_BYTES {
            return Err(OpenError);
        }
        let (nonce, ciphertext) = sealed.split_at_mut(NONCE_BYTES);
        let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce).map_err(|_| OpenError)?;
        let plaintext = self
            .chunks
            .open_in_place(nonce, Aad::empty(), ciphertext)
            .map_err(|_| OpenError)?;
        Ok(NONCE_BYTES..NONCE_BYTES + plaintext.len())
    }
}

/// Reads the key file, or creates it (mode 0600, 32 random bytes) if it does not exist.
pub fn load_or_create_key(path: &Path) -> io::Result<[u8; KEY_BYTES]> {
    match std::fs::read(path) {
        Ok(bytes) => bytes.try_into().map_err(|bytes: Vec<u8>| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds {} bytes; a key is {KEY_BYTES}",
                    path.display(),
                    bytes.len()
                ),
            )
        }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            let key: [u8; KEY_BYTES] = Aes256GcmSiv::generate_key(&mut OsRng).into();
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            file.write_all(&key)?;
            file.sync_all()?;
            Ok(key)
        }
        Err(error) => Err(error),
    }
}

/// Encrypts a stream in sealed chunks: `len u32 | sealed chunk`.
pub struct SealingWriter<'a> {
    inner: &'a mut dyn Write,
    cipher: &'a CardCipher,
    buffer: Vec<u8>,
}

impl<'a> SealingWriter<'a> {
    pub fn new(inner: &'a mut dyn Write, cipher: &'a CardCipher) -> Self {
        Self::reusing(inner, cipher, Vec::new())
    }

    /// A writer that buffers its chunk in `buffer`, which [`Self::finish_keeping_buffer`] gives back:
    /// a writer made again and again (a snapshot step each) then touches memory already paged in
    /// rather than a fresh megabyte each time (measured at fraud's 30 M cards: about 300 page faults,
    /// 4-19 ms of system time, in each step).
    pub fn reusing(inner: &'a mut dyn Write, cipher: &'a CardCipher, mut buffer: Vec<u8>) -> Self {
        buffer.clear();
        buffer.reserve_exact(CHUNK_BYTES);
        Self {
            inner,
            cipher,
            buffer,
        }
    }

    fn seal_buffer(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let (nonce, tag) = self.cipher.seal_chunk(&mut self.buffer);
        let sealed_len = (NONCE_BYTES + self.buffer.len() + TAG_BYTES) as u32;
        self.inner
            .write_all(&(sealed_len | GCM_CHUNK).to_le_bytes())?;
        self.inner.write_all(&nonce)?;
        self.inner.write_all(&self.buffer)?;
        self.inner.write_all(&tag)?;
        self.buffer.clear();
        Ok(())
    }

    /// Seals what is buffered; call once at the end.
    pub fn finish(self) -> io::Result<()> {
        self.finish_keeping_buffer().map(drop)
    }

    /// Seals what is buffered and gives the buffer back, for [`Self::reusing`].
    pub fn finish_keeping_buffer(mut self) -> io::Result<Vec<u8>> {
        self.seal_buffer()?;
        Ok(self.buffer)
    }
}

impl Write for SealingWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let room = CHUNK_BYTES - self.buffer.len();
        let taken = room.min(bytes.len());
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() == CHUNK_BYTES {
            self.seal_buffer()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads what [`SealingWriter`] wrote, or chunks sealed with GCM-SIV by earlier versions.
pub struct OpeningReader<'a> {
    inner: &'a mut dyn Read,
    cipher: &'a CardCipher,
    /// The chunk being read (kept from chunk to chunk, so that opening one allocates nothing), and
    /// where its plaintext not read yet is.
    chunk: Vec<u8>,
    at: usize,
    end: usize,
}

impl<'a> OpeningReader<'a> {
    pub fn new(inner: &'a mut dyn Read, cipher: &'a CardCipher) -> Self {
        Self {
            inner,
            cipher,
            chunk: Vec::new(),
            at: 0,
            end: 0,
        }
    }

    /// Reads and opens the next chunk; false at a clean end of the stream.
    fn next_chunk(&mut self) -> io::Result<bool> {
        let mut len = [0; 4];
        // A clean end of stream falls between chunks; anywhere else it is truncation.
        if self.inner.read(&mut len[..1])? == 0 {
            return Ok(false);
        }
        self.inner.read_exact(&mut len[1..])?;
        let len = u32::from_le_bytes(len);
        let gcm = len & GCM_CHUNK != 0;
        let sealed_len = (len & !GCM_CHUNK) as usize;
        if sealed_len > SEALED_CHUNK_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "sealed chunk too large",
            ));
        }
        self.chunk.resize(sealed_len, 0);
        self.inner.read_exact(&mut self.chunk)?;
        let damaged = |e: OpenError| io::Error::new(io::ErrorKind::InvalidData, e);
        let plaintext = if gcm {
            self.cipher.open_chunk(&mut self.chunk).map_err(damaged)?
        } else {
            self.chunk = self.cipher.open(&self.chunk).map_err(damaged)?;
            0..self.chunk.len()
        };
        (self.at, self.end) = (plaintext.start, plaintext.end);
        Ok(true)
    }
}

impl Read for OpeningReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        // Nothing in the format forbids an empty chunk: read on to the next.
        while self.at == self.end {
            if !self.next_chunk()? {
                return Ok(0);
            }
        }
        let taken = (self.end - self.at).min(out.len());
        out[..taken].copy_from_slice(&self.chunk[self.at..self.at + taken]);
        self.at += taken;
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_streams_round_trip_and_hide_the_plaintext() {
        let cipher = CardCipher::new(&[7; KEY_BYTES]);
        let plaintext: Vec<u8> = b"00000000548985,"
            .iter()
            .copied()
            .cycle()
            .take(3 * CHUNK_BYTES + 5)
            .collect();
        let mut sealed = Vec::new();
        let mut writer = SealingWriter::new(&mut sealed, &cipher);
        writer.write_all(&plaintext).unwrap();
        writer.finish().unwrap();
        assert!(!sealed.windows(14).any(|w| w == b"00000000548985"));
        assert_eq!(
            cipher.seal(b"batch"),
            cipher.seal(b"batch"),
            "deterministic, for idempotent resends"
        );
        assert_ne!(cipher.seal(b"batch"), cipher.seal(b"batch2"));
        let mut source = sealed.as_slice();
        let mut opened = Vec::new();
        OpeningReader::new(&mut source, &cipher)
            .read_to_end(&mut opened)
            .unwrap();
        assert_eq!(opened, plaintext);
        let other = CardCipher::new(&[8; KEY_BYTES]);
        let mut source = sealed.as_slice();
        let mut buffer = [0; 16];
        assert!(
            OpeningReader::new(&mut source, &other)
                .read(&mut buffer)
                .is_err()
        );
        for at in [0, 3, 4, 20, sealed.len() / 2, sealed.len() - 1] {
            let mut damaged = sealed.clone();
            damaged[at] ^= 0x10;
            let mut source = damaged.as_slice();
            let mut opened = Vec::new();
            assert!(
                OpeningReader::new(&mut source, &cipher)
                    .read_to_end(&mut opened)
                    .is_err(),
                "a byte flipped at {at} goes unnoticed"
            );
        }
    }

    /// Snapshots written before chunks were sealed with AES-256-GCM hold GCM-SIV chunks (a length
    /// without the top bit, then what [`CardCipher::seal`] gives): they still read, mixed with new ones.
    #[test]
    fn chunks_sealed_with_gcm_siv_by_earlier_versions_still_open() {
        let cipher = CardCipher::new(&[9; KEY_BYTES]);
        let mut stream = Vec::new();
        for plaintext in [&b"an old chunk, "[..], b"", b"another"] {
            let sealed = cipher.seal(plaintext);
            stream.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
            stream.extend_from_slice(&sealed);
        }
        let mut writer = SealingWriter::new(&mut stream, &cipher);
        writer.write_all(b" and a new one").unwrap();
        writer.finish().unwrap();
        let mut source = stream.as_slice();
        let mut opened = Vec::new();
        OpeningReader::new(&mut source, &cipher)
            .read_to_end(&mut opened)
            .unwrap();
        assert_eq!(opened, b"an old chunk, another and a new one");
    }

    #[test]
    fn a_key_file_is_created_once_with_owner_only_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/fraud.key");
        let key = load_or_create_key(&path).unwrap();
        assert_eq!(load_or_create_key(&path).unwrap(), key);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&path, b"short").unwrap();
        assert!(load_or_create_key(&path).is_err());
    }
}
