//! Card data at rest is encrypted: journal payloads and snapshots of this app pass through AES-256-GCM-SIV,
//! so card numbers never reach the disk in clear. Memory holds them in clear (scoring needs them).
//!
//! Encryption is deterministic: the nonce is derived from the plaintext, so a resent batch seals to the
//! same bytes and the engine's idempotency check recognises it. GCM-SIV is built for this: a repeated
//! nonce reveals only that two plaintexts are equal, never their content or the key stream.

use aes_gcm_siv::aead::{Aead, KeyInit, OsRng};
use aes_gcm_siv::{Aes256GcmSiv, Key, Nonce};
use std::io::{self, Read, Write};
use std::path::Path;

const NONCE_BYTES: usize = 12;
/// Plaintext per sealed snapshot chunk.
const CHUNK_BYTES: usize = 1 << 20;
/// Largest sealed chunk accepted when reading (a chunk plus nonce and tag).
const SEALED_CHUNK_BYTES_MAX: usize = CHUNK_BYTES + NONCE_BYTES + 16;
pub const KEY_BYTES: usize = 32;

pub struct CardCipher(Aes256GcmSiv);

#[derive(Debug, thiserror::Error)]
#[error("cannot decrypt: wrong key or damaged data")]
pub struct OpenError;

impl CardCipher {
    pub fn new(key: &[u8; KEY_BYTES]) -> Self {
        Self(Aes256GcmSiv::new(Key::<Aes256GcmSiv>::from_slice(key)))
    }

    /// `nonce || ciphertext || tag`; the same plaintext always seals to the same bytes.
    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        let digest = xxhash_rust::xxh3::xxh3_128(plaintext).to_le_bytes();
        let nonce = Nonce::from_slice(&digest[..NONCE_BYTES]);
        let mut sealed = nonce.to_vec();
        sealed.extend(
            self.0
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
        self.0
            .decrypt(Nonce::from_slice(nonce), ciphertext)
            .map_err(|_| OpenError)
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
        Self {
            inner,
            cipher,
            buffer: Vec::with_capacity(CHUNK_BYTES),
        }
    }

    fn seal_buffer(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let sealed = self.cipher.seal(&self.buffer);
        self.inner.write_all(&(sealed.len() as u32).to_le_bytes())?;
        self.inner.write_all(&sealed)?;
        self.buffer.clear();
        Ok(())
    }

    /// Seals what is buffered; call once at the end.
    pub fn finish(mut self) -> io::Result<()> {
        self.seal_buffer()
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

/// Reads what [`SealingWriter`] wrote.
pub struct OpeningReader<'a> {
    inner: &'a mut dyn Read,
    cipher: &'a CardCipher,
    chunk: Vec<u8>,
    at: usize,
}

impl<'a> OpeningReader<'a> {
    pub fn new(inner: &'a mut dyn Read, cipher: &'a CardCipher) -> Self {
        Self {
            inner,
            cipher,
            chunk: Vec::new(),
            at: 0,
        }
    }
}

impl Read for OpeningReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.at == self.chunk.len() {
            let mut len = [0; 4];
            // A clean end of stream falls between chunks; anywhere else it is truncation.
            if self.inner.read(&mut len[..1])? == 0 {
                return Ok(0);
            }
            self.inner.read_exact(&mut len[1..])?;
            let len = u32::from_le_bytes(len) as usize;
            if len > SEALED_CHUNK_BYTES_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "sealed chunk too large",
                ));
            }
            let mut sealed = vec![0; len];
            self.inner.read_exact(&mut sealed)?;
            self.chunk = self
                .cipher
                .open(&sealed)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            self.at = 0;
        }
        let taken = (self.chunk.len() - self.at).min(out.len());
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
