//! Scrubbing the stores on disk: a thread per store reads every record again and again at a bounded
//! rate, so that a block the disk damaged is found and reported soon after start-up (`/health`,
//! `spate_store_damaged`, the log), not first by the read that needs it (see ARCHITECTURE.md,
//! "Archive").
//!
//! fjall checks a block's checksum whenever it reads one, so reading every record checks every data
//! block and the index blocks that lead to them. A pass reads a keyspace in chunks, each from its own
//! iterator, so that no pass holds an old version of the store (and its files) for long.

use crate::store::{BackgroundThreads, StopSignal};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of keys and values one iterator reads before the scrub lets go of it and sleeps.
const CHUNK_BYTES: u64 = 256 << 10;
/// A pass starts at most this often, so that a small store is not read in a loop.
const PASS_INTERVAL_MIN: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StoreLabel {
    pub store: String,
}

/// The scrubs' metrics, one series per store.
#[derive(Clone, Default)]
pub(crate) struct ScrubMetrics {
    pub bytes: Family<StoreLabel, Counter>,
    pub passes: Family<StoreLabel, Counter>,
    pub damaged: Family<StoreLabel, Gauge>,
}

/// A keyspace a scrub could not read back: the first error it met there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreDamage {
    pub store: String,
    pub keyspace: String,
    pub error: String,
}

/// Every store's scrub thread; stops and joins them when dropped.
pub(crate) struct Scrubs {
    bytes_per_s: u64,
    metrics: ScrubMetrics,
    /// Sticky: a block found damaged once is evidence enough, whatever a later read says.
    damage: Arc<Mutex<Vec<StoreDamage>>>,
    threads: BackgroundThreads,
}

impl Scrubs {
    /// Scrubs that read at most `bytes_per_s` from each store; none with 0.
    pub fn new(bytes_per_s: u64, metrics: ScrubMetrics) -> Self {
        Self {
            bytes_per_s,
            metrics,
            damage: Arc::default(),
            threads: BackgroundThreads::default(),
        }
    }

    /// Starts scrubbing `db`, named `store` in reports, until [`Self::stop_all`].
    pub fn start(&self, store: &str, db: fjall::Database) -> std::io::Result<()> {
        if self.bytes_per_s == 0 {
            return Ok(());
        }
        let scrub = Scrub {
            store: store.to_owned(),
            db,
            bytes_per_s: self.bytes_per_s,
            damage: self.damage.clone(),
            metrics: self.metrics.clone(),
        };
        (self.threads).spawn(format!("scrub-{store}"), move |stop| scrub.run(&stop))
    }

    pub fn damage(&self) -> Vec<StoreDamage> {
        self.damage
            .lock()
            .expect("no thread panics holding it")
            .clone()
    }

    pub fn stop_all(&self) {
        self.threads.stop_all();
    }
}

struct Scrub {
    store: String,
    db: fjall::Database,
    bytes_per_s: u64,
    damage: Arc<Mutex<Vec<StoreDamage>>>,
    metrics: ScrubMetrics,
}

impl Scrub {
    fn run(self, stop: &StopSignal) {
        let label = StoreLabel {
            store: self.store.clone(),
        };
        let (bytes, passes) = (
            self.metrics.bytes.get_or_create(&label).clone(),
            self.metrics.passes.get_or_create(&label).clone(),
        );
        let damaged = self.metrics.damaged.get_or_create(&label).clone();
        loop {
            let started = Instant::now();
            for name in self.db.list_keyspace_names() {
                let read = self
                    .db
                    .keyspace(&name, Default::default)
                    .and_then(|keyspace| {
                        scrub_keyspace(&keyspace, |chunk_bytes| {
                            bytes.inc_by(chunk_bytes);
                            !stop.sleep(pace(chunk_bytes, self.bytes_per_s))
                        })
                    });
                match read {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(error) => {
                        damaged.set(1);
                        self.report(&name, &error);
                    }
                }
            }
            passes.inc();
            if stop.sleep(PASS_INTERVAL_MIN.saturating_sub(started.elapsed())) {
                return;
            }
        }
    }

    fn report(&self, keyspace: &str, error: &fjall::Error) {
        let mut damage = self.damage.lock().expect("no thread panics holding it");
        if damage
            .iter()
            .any(|known| known.store == self.store && known.keyspace == keyspace)
        {
            return;
        }
        tracing::error!(store = self.store, keyspace, %error, "a store on disk is damaged: reads of what it held fail, and an operator must restore it");
        damage.push(StoreDamage {
            store: self.store.clone(),
            keyspace: keyspace.to_owned(),
            error: error.to_string(),
        });
    }
}

/// How long to sleep after reading `bytes` to read at most `bytes_per_s`.
fn pace(bytes: u64, bytes_per_s: u64) -> Duration {
    debug_assert!(bytes_per_s > 0);
    Duration::from_secs_f64(bytes as f64 / bytes_per_s as f64)
}

/// Reads every record of `keyspace`, a chunk at a time, calling `after_chunk` with each chunk's bytes
/// of keys and values; false from it stops the scrub. Ok(true) once every record was read.
fn scrub_keyspace(
    keyspace: &fjall::Keyspace,
    mut after_chunk: impl FnMut(u64) -> bool,
) -> Result<bool, fjall::Error> {
    let mut after: Option<fjall::Slice> = None;
    loop {
        let records = match &after {
            None => keyspace.iter(),
            Some(key) => keyspace.range::<&[u8], _>((Bound::Excluded(&key[..]), Bound::Unbounded)),
        };
        let mut chunk_bytes = 0;
        let mut last = None;
        for record in records {
            let (key, value) = record.into_inner()?;
            chunk_bytes += (key.len() + value.len()) as u64;
            last = Some(key);
            if chunk_bytes >= CHUNK_BYTES {
                break;
            }
        }
        let Some(last) = last else {
            return Ok(true);
        };
        if !after_chunk(chunk_bytes) {
            return Ok(false);
        }
        after = Some(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with_a_table(dir: &std::path::Path) -> u64 {
        let db = fjall::Database::builder(dir).open().unwrap();
        let keyspace = db.keyspace("p000", Default::default).unwrap();
        let mut bytes = 0;
        for n in 0u32..20_000 {
            let (key, value) = (n.to_be_bytes(), [n as u8; 100]);
            keyspace.insert(key, value).unwrap();
            bytes += (key.len() + value.len()) as u64;
        }
        keyspace.rotate_memtable_and_wait().unwrap();
        bytes
    }

    /// The pass's result, and the bytes of each chunk it read.
    fn scrub_all(dir: &std::path::Path) -> (Result<bool, fjall::Error>, Vec<u64>) {
        let db = fjall::Database::builder(dir).open().unwrap();
        let keyspace = db.keyspace("p000", Default::default).unwrap();
        let mut chunks = Vec::new();
        let result = scrub_keyspace(&keyspace, |chunk| {
            chunks.push(chunk);
            true
        });
        (result, chunks)
    }

    /// The largest table: the one of the records (fjall's own keyspace of settings has one too).
    fn table_file(dir: &std::path::Path) -> std::path::PathBuf {
        walk(dir)
            .into_iter()
            .filter(|path| {
                path.parent()
                    .is_some_and(|parent| parent.ends_with("tables"))
            })
            .max_by_key(|path| std::fs::metadata(path).unwrap().len())
            .unwrap()
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(walk(&path));
            } else {
                files.push(path);
            }
        }
        files
    }

    #[test]
    fn a_pass_reads_every_record_in_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let written = store_with_a_table(dir.path());
        let (result, chunks) = scrub_all(dir.path());
        assert!(result.unwrap());
        assert_eq!(chunks.iter().sum::<u64>(), written);
        let (last, full) = chunks.split_last().unwrap();
        assert!(full.len() >= 7 && full.iter().all(|bytes| *bytes >= CHUNK_BYTES));
        assert!(*last > 0);
    }

    #[test]
    fn a_flipped_byte_in_a_table_fails_the_pass() {
        let dir = tempfile::tempdir().unwrap();
        store_with_a_table(dir.path());
        let table = table_file(dir.path());
        let mut bytes = std::fs::read(&table).unwrap();
        // The data blocks come first.
        let inside_the_data = bytes.len() / 3;
        bytes[inside_the_data] ^= 0x10;
        std::fs::write(&table, &bytes).unwrap();
        let (result, chunks) = scrub_all(dir.path());
        assert!(result.is_err(), "read {chunks:?} without an error");
    }

    #[test]
    fn stopping_ends_a_pass_between_chunks() {
        let dir = tempfile::tempdir().unwrap();
        store_with_a_table(dir.path());
        let db = fjall::Database::builder(dir.path()).open().unwrap();
        let keyspace = db.keyspace("p000", Default::default).unwrap();
        let mut chunks = 0;
        let finished = scrub_keyspace(&keyspace, |_| {
            chunks += 1;
            false
        });
        assert_eq!((finished.unwrap(), chunks), (false, 1));
    }
}
