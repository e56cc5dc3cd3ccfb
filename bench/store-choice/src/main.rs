//! The workload of spate's history on disk (issue 17), on each candidate store, one after another:
//! records that became final, written in batches with a durable point every few batches (a snapshot's
//! cadence), then random point reads of old records while writes go on, reads of ids never written
//! (a duplicate check of a new id), and the time to reopen.

use clap::Parser;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser, Clone)]
struct Args {
    /// Records written in the load phase
    #[arg(long, default_value_t = 5_000_000)]
    keys: u64,
    /// Bytes per record (about a serialized final transfer)
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
    /// Records per write batch
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Batches between two durable points (fsync)
    #[arg(long, default_value_t = 100)]
    sync_every: usize,
    /// Seconds of reads of old records while a writer goes on
    #[arg(long, default_value_t = 20)]
    mixed_s: u64,
    /// Cache of each store
    #[arg(long, default_value_t = 256)]
    cache_mb: usize,
    /// Where the stores go (wiped)
    #[arg(long, default_value = "/tmp/store-choice")]
    dir: PathBuf,
    /// Stores to measure, in order
    #[arg(long, value_delimiter = ',', default_value = "fjall,redb")]
    stores: Vec<String>,
}

/// What the workload needs of a store. Durability is the same for all: a batch is one atomic write; a
/// durable point (`sync: true`) fsyncs everything written so far.
trait Store: Send + Sync {
    fn put_batch(&self, records: &[([u8; 16], Vec<u8>)], sync: bool);
    fn contains(&self, key: &[u8; 16]) -> bool;
}

struct Fjall {
    db: fjall::Database,
    history: fjall::Keyspace,
}

impl Fjall {
    fn open(dir: &Path, cache_bytes: u64) -> Self {
        let db = fjall::Database::builder(dir)
            .cache_size(cache_bytes)
            .open()
            .expect("open fjall");
        let history = db
            .keyspace("history", fjall::KeyspaceCreateOptions::default)
            .expect("open fjall keyspace");
        Self { db, history }
    }
}

impl Store for Fjall {
    fn put_batch(&self, records: &[([u8; 16], Vec<u8>)], sync: bool) {
        let mut batch = self.db.batch();
        for (key, value) in records {
            batch.insert(&self.history, key.as_slice(), value.as_slice());
        }
        batch.commit().expect("fjall batch");
        if sync {
            self.db
                .persist(fjall::PersistMode::SyncAll)
                .expect("fjall persist");
        }
    }
    fn contains(&self, key: &[u8; 16]) -> bool {
        self.history.get(key).expect("fjall get").is_some()
    }
}

const REDB_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("history");

struct Redb(redb::Database);

impl Redb {
    fn open(dir: &Path, cache_bytes: usize) -> Self {
        std::fs::create_dir_all(dir).expect("redb dir");
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(dir.join("history.redb"))
            .expect("open redb");
        Self(db)
    }
}

impl Store for Redb {
    fn put_batch(&self, records: &[([u8; 16], Vec<u8>)], sync: bool) {
        let mut tx = self.0.begin_write().expect("redb write");
        // Durability::None commits without fsync; the next Immediate commit makes them all durable.
        tx.set_durability(if sync {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        });
        {
            let mut table = tx.open_table(REDB_TABLE).expect("redb table");
            for (key, value) in records {
                table
                    .insert(key.as_slice(), value.as_slice())
                    .expect("redb insert");
            }
        }
        tx.commit().expect("redb commit");
    }
    fn contains(&self, key: &[u8; 16]) -> bool {
        let tx = self.0.begin_read().expect("redb read");
        let table = tx.open_table(REDB_TABLE).expect("redb table");
        table.get(key.as_slice()).expect("redb get").is_some()
    }
}

#[cfg(feature = "rocksdb")]
struct Rocks(rocksdb::DB);

#[cfg(feature = "rocksdb")]
impl Rocks {
    fn open(dir: &Path, cache_bytes: usize) -> Self {
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_block_cache(&rocksdb::Cache::new_lru_cache(cache_bytes));
        table.set_bloom_filter(10.0, false);
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.set_block_based_table_factory(&table);
        Self(rocksdb::DB::open(&options, dir).expect("open rocksdb"))
    }
}

#[cfg(feature = "rocksdb")]
impl Store for Rocks {
    fn put_batch(&self, records: &[([u8; 16], Vec<u8>)], sync: bool) {
        let mut batch = rocksdb::WriteBatch::default();
        for (key, value) in records {
            batch.put(key, value);
        }
        let mut options = rocksdb::WriteOptions::default();
        options.set_sync(sync);
        self.0.write_opt(batch, &options).expect("rocksdb write");
    }
    fn contains(&self, key: &[u8; 16]) -> bool {
        self.0.get_pinned(key).expect("rocksdb get").is_some()
    }
}

fn open(name: &str, dir: &Path, cache_bytes: usize) -> Arc<dyn Store> {
    match name {
        "fjall" => Arc::new(Fjall::open(dir, cache_bytes as u64)),
        "redb" => Arc::new(Redb::open(dir, cache_bytes)),
        #[cfg(feature = "rocksdb")]
        "rocksdb" => Arc::new(Rocks::open(dir, cache_bytes)),
        other => panic!("unknown store {other} (rocksdb needs --features rocksdb)"),
    }
}

/// Key number `n` of the run: random-looking (like the UUIDs of transfers), yet recomputable.
fn key(n: u64) -> [u8; 16] {
    let mut rng = SmallRng::seed_from_u64(n);
    let mut key = [0; 16];
    rng.fill_bytes(&mut key);
    key
}

/// Half random, half zeros: about as compressible as a serialized struct.
fn value(n: u64, bytes: usize) -> Vec<u8> {
    let mut value = vec![0; bytes];
    SmallRng::seed_from_u64(!n).fill_bytes(&mut value[..bytes / 2]);
    value
}

/// Writes keys `first..first + count` in batches; returns how many it wrote (it stops early if `stop`).
fn write(store: &dyn Store, args: &Args, first: u64, count: u64, stop: &AtomicBool) -> u64 {
    let mut written = 0;
    let mut batches = 0;
    while written < count && !stop.load(Ordering::Relaxed) {
        let n = (args.batch as u64).min(count - written);
        let records: Vec<_> = (first + written..first + written + n)
            .map(|k| (key(k), value(k, args.value_bytes)))
            .collect();
        batches += 1;
        store.put_batch(&records, batches % args.sync_every == 0);
        written += n;
    }
    store.put_batch(&[], true);
    written
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat[stat.rfind(')').expect("stat") + 2..]
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => disk_bytes(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    })
}

fn main() {
    let args = Args::parse();
    println!(
        "command: store-choice {}\n",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    println!(
        "| store | load records/s | load CPU s | disk bytes per record | peak RSS MiB | reads/s under writes | read p50 µs | p99 µs | p99.9 µs | max µs | writes/s meanwhile | absent-id reads/s | absent p99 µs | reopen ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let never = AtomicBool::new(false);
    for name in &args.stores {
        let dir = args.dir.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        let cache_bytes = args.cache_mb << 20;
        let store = open(name, &dir, cache_bytes);

        let (started, cpu) = (Instant::now(), cpu_seconds());
        write(&*store, &args, 0, args.keys, &never);
        let load_s = started.elapsed().as_secs_f64();
        let load_cpu = cpu_seconds() - cpu;
        let disk = disk_bytes(&dir) as f64 / args.keys as f64;

        // Reads of old records while one writer goes on appending new ones.
        let stop = Arc::new(AtomicBool::new(false));
        let appended = Arc::new(AtomicU64::new(0));
        let writer = {
            let (store, stop, appended) = (store.clone(), stop.clone(), appended.clone());
            let args = args.clone();
            std::thread::spawn(move || {
                let n = write(&*store, &args, args.keys, u64::MAX / 2, &stop);
                appended.store(n, Ordering::Relaxed);
            })
        };
        let mut latency = Histogram::<u64>::new(3).expect("histogram");
        let mut rng = SmallRng::seed_from_u64(7);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(args.mixed_s) {
            let k = key(rng.random_range(0..args.keys));
            let at = Instant::now();
            assert!(store.contains(&k), "{name}: a written record is missing");
            latency
                .record(at.elapsed().as_micros() as u64)
                .expect("record");
        }
        let mixed_s = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("writer");
        let writes_per_s = appended.load(Ordering::Relaxed) as f64 / mixed_s;

        let mut absent = Histogram::<u64>::new(3).expect("histogram");
        let started = Instant::now();
        for n in 0..1_000_000u64 {
            let at = Instant::now();
            assert!(!store.contains(&key(u64::MAX - n)));
            absent
                .record(at.elapsed().as_micros() as u64)
                .expect("record");
        }
        let absent_s = started.elapsed().as_secs_f64();

        drop(store);
        let started = Instant::now();
        let store = open(name, &dir, cache_bytes);
        assert!(store.contains(&key(0)));
        let reopen_ms = started.elapsed().as_secs_f64() * 1e3;
        drop(store);

        println!(
            "| {name} | {:.0} | {:.1} | {:.0} | {} | {:.0} | {} | {} | {} | {} | {:.0} | {:.0} | {} | {:.0} |",
            args.keys as f64 / load_s,
            load_cpu,
            disk,
            status_kib("VmHWM:") / 1024,
            latency.len() as f64 / mixed_s,
            latency.value_at_quantile(0.5),
            latency.value_at_quantile(0.99),
            latency.value_at_quantile(0.999),
            latency.max(),
            writes_per_s,
            1e6 / absent_s,
            absent.value_at_quantile(0.99),
            reopen_ms
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
