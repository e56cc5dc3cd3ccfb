//! Card-data keys: a key-encrypting key (KEK) that lives outside the data directory, and the keys it wraps,
//! kept in the data directory's keyring:
//! - data keys (AES-256-GCM) that seal card numbers, each with an id carried in every sealed record;
//! - the token key (HMAC-SHA-256 of the card number: the lookup token and the fraud history key);
//! - the settlement MAC key.
//!
//! The token and MAC keys are random and wrapped beside the data keys rather than derived from the KEK, so
//! rotating the KEK re-wraps them and tokens stay the same.

use aes_gcm::aead::{Aead, KeyInit, OsRng, Payload};
use aes_gcm::{AeadCore, Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub const KEY_BYTES: usize = 32;
const NONCE_BYTES: usize = 12;
const KEYRING_VERSION: u32 = 1;

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "the key-encrypting key {kek} is inside the data directory {data_dir}; keep it elsewhere (--kek-file)"
    )]
    KekInsideDataDir { kek: PathBuf, data_dir: PathBuf },
    #[error("{0} does not hold a {KEY_BYTES}-byte key")]
    BadKek(PathBuf),
    #[error(
        "the key-encrypting key {kek} may be read or written by other users (mode {mode:03o}); \
         make it its owner's only (chmod 600)"
    )]
    KekOpenToOthers { kek: PathBuf, mode: u32 },
    #[error(
        "the keyring {keyring} is wrapped by key {expected}, but the key-encrypting key given is {given}"
    )]
    WrongKek {
        keyring: PathBuf,
        expected: String,
        given: String,
    },
    #[error("the keyring {0} is damaged: {1}")]
    Damaged(PathBuf, String),
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn hmac(key: &[u8; KEY_BYTES], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

fn random_key() -> [u8; KEY_BYTES] {
    Aes256Gcm::generate_key(&mut OsRng).into()
}

/// Where the KEK lives when no `--kek-file` is given: the user's config directory, never the data directory.
pub fn default_kek_path() -> Option<PathBuf> {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(config.join("spate").join("payments.kek"))
}

/// The key-encrypting key.
pub struct Kek {
    key: [u8; KEY_BYTES],
    id: String,
}

impl Kek {
    pub fn from_bytes(key: [u8; KEY_BYTES]) -> Self {
        let id = format!("kek-{}", hex::encode(&hmac(&key, &[b"spate kek id"])[..4]));
        Self { key, id }
    }

    /// Reads the KEK at `path`, or creates a random one there (mode 0600); `true` when it was created.
    /// Refuses a path inside `data_dir`: a data directory never holds its own key.
    pub fn load_or_create(path: &Path, data_dir: &Path) -> Result<(Self, bool), KeyError> {
        let absolute = |p: &Path| {
            std::path::absolute(p)
                .map(|a| a.canonicalize().unwrap_or(a))
                .map_err(io_error(p))
        };
        std::fs::create_dir_all(data_dir).map_err(io_error(data_dir))?;
        let data_dir_absolute = absolute(data_dir)?;
        let parent = path.parent().unwrap_or(Path::new("."));
        let kek_dir = if parent.as_os_str().is_empty() {
            absolute(Path::new("."))?
        } else {
            absolute(parent)?
        };
        // The key itself too: a link outside may lead into the data directory.
        let kek_file = match path.canonicalize() {
            Ok(file) => Some(file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_error(path)(e)),
        };
        let inside = |p: &Path| p.starts_with(&data_dir_absolute);
        if inside(&kek_dir) || kek_file.as_deref().is_some_and(inside) {
            return Err(KeyError::KekInsideDataDir {
                kek: path.to_path_buf(),
                data_dir: data_dir.to_path_buf(),
            });
        }
        Self::read_or_create(path)
    }

    /// [`Self::load_or_create`] where no data directory is involved (making a cluster's keyring).
    /// Refuses a key others may read or write, as ssh refuses such a private key.
    pub fn read_or_create(path: &Path) -> Result<(Self, bool), KeyError> {
        let existed = path.exists();
        if existed {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .map_err(io_error(path))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(KeyError::KekOpenToOthers {
                    kek: path.to_path_buf(),
                    mode: mode & 0o777,
                });
            }
        }
        let key = spate_cards::cipher::load_or_create_key(path).map_err(|e| {
            if e.kind() == io::ErrorKind::InvalidData {
                KeyError::BadKek(path.to_path_buf())
            } else {
                io_error(path)(e)
            }
        })?;
        Ok((Self::from_bytes(key), !existed))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&self.key))
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WrappedKey {
    id: u32,
    /// base64 of `nonce || ciphertext || tag`.
    wrapped: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyringFile {
    version: u32,
    kek_id: String,
    active_data_key: u32,
    data_keys: Vec<WrappedKey>,
    token_key: WrappedKey,
    mac_key: WrappedKey,
}

fn wrap_aad(purpose: &str, id: u32, kek_id: &str) -> Vec<u8> {
    format!("spate-payments {purpose} key {id} under {kek_id}").into_bytes()
}

fn wrap(kek: &Kek, purpose: &str, id: u32, key: &[u8; KEY_BYTES]) -> WrappedKey {
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    let aad = wrap_aad(purpose, id, kek.id());
    let mut sealed = nonce.to_vec();
    sealed.extend(
        kek.cipher()
            .encrypt(
                &nonce,
                Payload {
                    msg: key,
                    aad: &aad,
                },
            )
            .expect("AES-GCM encryption of a key cannot fail"),
    );
    WrappedKey {
        id,
        wrapped: BASE64.encode(sealed),
    }
}

fn unwrap(
    kek: &Kek,
    purpose: &str,
    wrapped: &WrappedKey,
    path: &Path,
) -> Result<[u8; KEY_BYTES], KeyError> {
    let damaged = |what: &str| {
        KeyError::Damaged(
            path.to_path_buf(),
            format!("{purpose} key {}: {what}", wrapped.id),
        )
    };
    let sealed = BASE64
        .decode(&wrapped.wrapped)
        .map_err(|_| damaged("not base64"))?;
    if sealed.len() < NONCE_BYTES {
        return Err(damaged("too short"));
    }
    let (nonce, ciphertext) = sealed.split_at(NONCE_BYTES);
    let aad = wrap_aad(purpose, wrapped.id, kek.id());
    let key = kek
        .cipher()
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad: &aad,
            },
        )
        .map_err(|_| damaged("does not open under this key-encrypting key"))?;
    key.try_into().map_err(|_| damaged("wrong length"))
}

struct DataKey {
    cipher: Aes256Gcm,
    /// Derives each record's nonce from the record id, so a retried request seals to the same bytes.
    nonce_key: [u8; KEY_BYTES],
}

impl DataKey {
    fn new(key: &[u8; KEY_BYTES]) -> Self {
        Self {
            cipher: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key)),
            nonce_key: hmac(key, &[b"spate payments nonce key"]),
        }
    }
}

/// A card number sealed under a data key: `nonce || ciphertext || tag`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedCard {
    pub key_id: u32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("no data key {0} in the keyring")]
    UnknownKey(u32),
    #[error("the sealed card does not open: wrong record, key or damaged bytes")]
    Rejected,
}

/// The unwrapped keys, in memory only.
pub struct Keyring {
    path: PathBuf,
    kek_id: String,
    active_data_key: u32,
    data_keys: BTreeMap<u32, DataKey>,
    raw_data_keys: BTreeMap<u32, [u8; KEY_BYTES]>,
    token_key: [u8; KEY_BYTES],
    mac_key: (u32, [u8; KEY_BYTES]),
}

impl Keyring {
    /// Where a single server keeps its keyring: in its data directory (the keys are wrapped, so the
    /// directory holds nothing that opens them without the KEK).
    pub fn path_in(data_dir: &Path) -> PathBuf {
        data_dir.join("payments").join("keyring.json")
    }

    /// Opens the keyring at `path` with `kek`; it must exist. Nodes of a cluster share one keyring file:
    /// a keyring made on the spot by one of them would seal cards the others cannot open.
    pub fn load(path: &Path, kek: &Kek) -> Result<Self, KeyError> {
        let bytes = std::fs::read(path).map_err(io_error(path))?;
        Self::from_file(path, &bytes, kek)
    }

    /// Opens the keyring at `path` with `kek`, creating a new one (fresh random keys) if none exists.
    pub fn load_or_create(path: &Path, kek: &Kek) -> Result<Self, KeyError> {
        let path = path.to_path_buf();
        match std::fs::read(&path) {
            Ok(bytes) => Self::from_file(&path, &bytes, kek),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let data_key = random_key();
                let keyring = Self {
                    path: path.clone(),
                    kek_id: kek.id().to_string(),
                    active_data_key: 1,
                    data_keys: BTreeMap::from([(1, DataKey::new(&data_key))]),
                    raw_data_keys: BTreeMap::from([(1, data_key)]),
                    token_key: random_key(),
                    mac_key: (1, random_key()),
                };
                keyring.save(kek)?;
                Ok(keyring)
            }
            Err(e) => Err(io_error(&path)(e)),
        }
    }

    fn from_file(path: &Path, bytes: &[u8], kek: &Kek) -> Result<Self, KeyError> {
        let file: KeyringFile = serde_json::from_slice(bytes)
            .map_err(|e| KeyError::Damaged(path.to_path_buf(), e.to_string()))?;
        if file.version != KEYRING_VERSION {
            return Err(KeyError::Damaged(
                path.to_path_buf(),
                format!("unknown version {}", file.version),
            ));
        }
        if file.kek_id != kek.id() {
            return Err(KeyError::WrongKek {
                keyring: path.to_path_buf(),
                expected: file.kek_id,
                given: kek.id().to_string(),
            });
        }
        let mut raw_data_keys = BTreeMap::new();
        for wrapped in &file.data_keys {
            raw_data_keys.insert(wrapped.id, unwrap(kek, "data", wrapped, path)?);
        }
        if !raw_data_keys.contains_key(&file.active_data_key) {
            return Err(KeyError::Damaged(
                path.to_path_buf(),
                format!("active data key {} is missing", file.active_data_key),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            kek_id: file.kek_id,
            active_data_key: file.active_data_key,
            data_keys: raw_data_keys
                .iter()
                .map(|(id, key)| (*id, DataKey::new(key)))
                .collect(),
            raw_data_keys,
            token_key: unwrap(kek, "token", &file.token_key, path)?,
            mac_key: (file.mac_key.id, unwrap(kek, "mac", &file.mac_key, path)?),
        })
    }

    fn save(&self, kek: &Kek) -> Result<(), KeyError> {
        let file = KeyringFile {
            version: KEYRING_VERSION,
            kek_id: kek.id().to_string(),
            active_data_key: self.active_data_key,
            data_keys: self
                .raw_data_keys
                .iter()
                .map(|(id, key)| wrap(kek, "data", *id, key))
                .collect(),
            token_key: wrap(kek, "token", 0, &self.token_key),
            mac_key: wrap(kek, "mac", self.mac_key.0, &self.mac_key.1),
        };
        let text = serde_json::to_vec_pretty(&file).expect("a keyring always serializes");
        write_durably(&self.path, &text).map_err(io_error(&self.path))
    }

    pub fn kek_id(&self) -> &str {
        &self.kek_id
    }

    pub fn active_data_key(&self) -> u32 {
        self.active_data_key
    }

    /// The lookup token of a card number: HMAC-SHA-256 under the token key.
    pub fn token(&self, card_number: &str) -> [u8; 32] {
        hmac(&self.token_key, &[b"card ", card_number.as_bytes()])
    }

    /// A keyed digest for ids derived from client input (so they reveal nothing of it).
    pub fn digest(&self, context: &[u8], input: &[u8]) -> [u8; 32] {
        hmac(&self.token_key, &[context, b" ", input])
    }

    /// Seals `card_number` for the record `record_id` under the active data key. The AAD binds the record
    /// id and key id, so a sealed card copied to another record does not open. The nonce is derived from
    /// the record id and the card number: unique per record, and the same for a retried request.
    pub fn seal(&self, record_id: &[u8], card_number: &str) -> SealedCard {
        let key_id = self.active_data_key;
        let key = &self.data_keys[&key_id];
        let derived = hmac(&key.nonce_key, &[record_id, card_number.as_bytes()]);
        let nonce = Nonce::from_slice(&derived[..NONCE_BYTES]);
        let aad = card_aad(record_id, key_id);
        let mut bytes = nonce.to_vec();
        bytes.extend(
            key.cipher
                .encrypt(
                    nonce,
                    Payload {
                        msg: card_number.as_bytes(),
                        aad: &aad,
                    },
                )
                .expect("AES-GCM encryption of a card number cannot fail"),
        );
        SealedCard { key_id, bytes }
    }

    pub fn open(&self, record_id: &[u8], sealed: &SealedCard) -> Result<String, OpenError> {
        let key = self
            .data_keys
            .get(&sealed.key_id)
            .ok_or(OpenError::UnknownKey(sealed.key_id))?;
        if sealed.bytes.len() < NONCE_BYTES {
            return Err(OpenError::Rejected);
        }
        let (nonce, ciphertext) = sealed.bytes.split_at(NONCE_BYTES);
        let aad = card_aad(record_id, sealed.key_id);
        let plain = key
            .cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| OpenError::Rejected)?;
        String::from_utf8(plain).map_err(|_| OpenError::Rejected)
    }

    /// The settlement MAC key's id and an HMAC-SHA-256 of `bytes` under it.
    pub fn mac(&self, bytes: &[u8]) -> (u32, [u8; 32]) {
        (self.mac_key.0, hmac(&self.mac_key.1, &[bytes]))
    }
}

fn card_aad(record_id: &[u8], key_id: u32) -> Vec<u8> {
    let mut aad = b"spate-payments card ".to_vec();
    aad.extend_from_slice(record_id);
    aad.extend_from_slice(&key_id.to_le_bytes());
    aad
}

/// What `rotate` did.
pub struct Rotation {
    pub old_kek: String,
    pub new_kek: String,
    pub new_data_key: u32,
}

/// Re-wraps every key of the keyring at `path` under `new`, and adds a fresh data key that seals new
/// cards from now on (old cards keep opening under their own key id). Run it with the servers stopped
/// (in a cluster, then give every node the new keyring and KEK).
pub fn rotate(path: &Path, old: &Kek, new: &Kek) -> Result<Rotation, KeyError> {
    let mut keyring = Keyring::load(path, old)?;
    let new_data_key = keyring.raw_data_keys.keys().max().map_or(1, |id| id + 1);
    keyring.raw_data_keys.insert(new_data_key, random_key());
    keyring.active_data_key = new_data_key;
    keyring.save(new)?;
    Ok(Rotation {
        old_kek: old.id().to_string(),
        new_kek: new.id().to_string(),
        new_data_key,
    })
}

/// Writes `bytes` to `path` so that after a crash the file holds either the old or the new content:
/// a temporary file, fsynced, renamed over `path`, and the directory fsynced. The file is its owner's
/// only (mode 0600): keyrings and settlement files hold what PCI DSS asks to keep from other users.
pub fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let temporary = path.with_extension("tmp");
    {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kek(byte: u8) -> Kek {
        Kek::from_bytes([byte; KEY_BYTES])
    }

    #[test]
    fn a_kek_others_may_read_or_reached_from_the_data_directory_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let path = dir.path().join("payments.kek");
        let (_, created) = Kek::load_or_create(&path, &data_dir).unwrap();
        assert!(created);
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = Kek::load_or_create(&path, &data_dir).err().unwrap();
        assert!(matches!(
            refused,
            KeyError::KekOpenToOthers { mode: 0o644, .. }
        ));
        assert!(refused.to_string().contains("chmod 600"), "{refused}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(!Kek::load_or_create(&path, &data_dir).unwrap().1);

        let inside = data_dir.join("kek");
        std::fs::rename(&path, &inside).unwrap();
        std::os::unix::fs::symlink(&inside, &path).unwrap();
        let refused = Kek::load_or_create(&path, &data_dir).err().unwrap();
        assert!(
            matches!(refused, KeyError::KekInsideDataDir { .. }),
            "{refused}"
        );
    }

    #[test]
    fn sealed_cards_open_only_for_their_record() {
        let dir = tempfile::tempdir().unwrap();
        let keyring = Keyring::load_or_create(&Keyring::path_in(dir.path()), &kek(1)).unwrap();
        let sealed = keyring.seal(b"pay_1", "4242424242424242");
        assert_eq!(keyring.open(b"pay_1", &sealed).unwrap(), "4242424242424242");
        assert_eq!(keyring.open(b"pay_2", &sealed), Err(OpenError::Rejected));
        assert_eq!(keyring.seal(b"pay_1", "4242424242424242"), sealed);
        assert_ne!(
            keyring.seal(b"pay_2", "4242424242424242").bytes,
            sealed.bytes
        );
        let mut flipped = sealed.clone();
        flipped.bytes[NONCE_BYTES] ^= 1;
        assert_eq!(keyring.open(b"pay_1", &flipped), Err(OpenError::Rejected));
        let plain = String::from_utf8_lossy(&std::fs::read(Keyring::path_in(dir.path())).unwrap())
            .to_string();
        assert!(!plain.contains("4242424242424242"));
    }

    #[test]
    fn a_keyring_reopens_with_its_kek_only() {
        let dir = tempfile::tempdir().unwrap();
        let first = Keyring::load_or_create(&Keyring::path_in(dir.path()), &kek(1)).unwrap();
        let sealed = first.seal(b"pay_1", "4000056655665556");
        let again = Keyring::load_or_create(&Keyring::path_in(dir.path()), &kek(1)).unwrap();
        assert_eq!(
            again.token("4000056655665556"),
            first.token("4000056655665556")
        );
        assert_eq!(again.open(b"pay_1", &sealed).unwrap(), "4000056655665556");
        assert!(matches!(
            Keyring::load_or_create(&Keyring::path_in(dir.path()), &kek(2)),
            Err(KeyError::WrongKek { .. })
        ));
    }

    #[test]
    fn rotation_rewraps_keeps_tokens_and_old_cards_and_adds_a_data_key() {
        let dir = tempfile::tempdir().unwrap();
        let before = Keyring::load_or_create(&Keyring::path_in(dir.path()), &kek(1)).unwrap();
        let sealed = before.seal(b"pay_1", "5555555555554444");
        let rotation = rotate(&Keyring::path_in(dir.path()), &kek(1), &kek(2)).unwrap();
        assert_eq!(rotation.new_data_key, 2);
        assert!(Keyring::load_or_create(&Keyring::path_in(dir.path()), &kek(1)).is_err());
        let after = Keyring::load_or_create(&Keyring::path_in(dir.path()), &kek(2)).unwrap();
        assert_eq!(after.active_data_key(), 2);
        assert_eq!(after.open(b"pay_1", &sealed).unwrap(), "5555555555554444");
        assert_eq!(
            after.token("5555555555554444"),
            before.token("5555555555554444")
        );
        assert_eq!(after.seal(b"pay_9", "5555555555554444").key_id, 2);
    }

    #[test]
    fn a_kek_inside_the_data_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("keys").join("kek");
        assert!(matches!(
            Kek::load_or_create(&inside, dir.path()),
            Err(KeyError::KekInsideDataDir { .. })
        ));
        let outside = tempfile::tempdir().unwrap();
        let path = outside.path().join("kek");
        let (created, was_created) = Kek::load_or_create(&path, dir.path()).unwrap();
        assert!(was_created);
        let (loaded, was_created) = Kek::load_or_create(&path, dir.path()).unwrap();
        assert!(!was_created);
        assert_eq!(created.id(), loaded.id());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
