//! Journal throughput with group commit and fdatasync, against the raw sequential write + fdatasync rate
//! of the same disk, measured in the same run.
//!
//! `cargo bench -p spate-engine --bench journal`. Records are 100 bytes framed (70-byte payload), group
//! commits of 1, 100 and 10,000 records. Before criterion runs, the commit latency distribution of
//! 10,000-record group commits is printed (p50/p99/max).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spate_engine::journal::{FileJournal, JournalConfig, Log};
use spate_engine::record::{Envelope, Origin, begin_record, finish_record};
use std::fs::OpenOptions;
use std::io::Write;
use std::time::{Duration, Instant};

const RECORD_BYTES: usize = 100;
const PAYLOAD_BYTES: usize = 70; // + 30 bytes of frame header and envelope

fn group_commit(records: usize) -> Vec<u8> {
    let mut frames = Vec::with_capacity(records * RECORD_BYTES);
    let payload = [0x5A; PAYLOAD_BYTES];
    for i in 0..records {
        let envelope = Envelope {
            app: 1,
            origin: Origin::Client { command_id: None },
            timestamp_ms: i as u64,
            random: 7,
        };
        let start = begin_record(&mut frames, &envelope, &payload);
        finish_record(&mut frames, start);
    }
    assert_eq!(
        frames.len(),
        records * RECORD_BYTES,
        "records must be exactly 100 bytes"
    );
    frames
}

fn bench_dir() -> tempfile::TempDir {
    // Benchmark the project's disk, not a tmpfs: target/ lives on it.
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-tmp");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn print_commit_latency() {
    let dir = bench_dir();
    let (mut journal, _) = FileJournal::open(dir.path(), JournalConfig::default()).unwrap();
    let frames = group_commit(10_000);
    let mut latencies: Vec<Duration> = (0..300)
        .map(|_| {
            let started = Instant::now();
            journal.append(&frames, 10_000).unwrap();
            started.elapsed()
        })
        .collect();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let total: Duration = latencies.iter().sum();
    eprintln!(
        "journal commit latency, 10,000 x 100-byte records per fdatasync'd group commit (300 commits): \
         p50 {:?}, p99 {:?}, max {:?}; {:.0} records/s",
        at(0.5),
        at(0.99),
        latencies.last().unwrap(),
        300.0 * 10_000.0 / total.as_secs_f64()
    );
}

fn journal(c: &mut Criterion) {
    print_commit_latency();
    let mut group = c.benchmark_group("journal_100B_records");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    for records in [1usize, 100, 10_000] {
        let frames = group_commit(records);
        group.throughput(Throughput::Elements(records as u64));

        let dir = bench_dir();
        let path = dir.path().join("raw");
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        group.bench_function(format!("raw_write_fdatasync/{records}"), |b| {
            b.iter(|| {
                file.write_all(&frames).unwrap();
                file.sync_data().unwrap();
            })
        });

        let dir = bench_dir();
        let (mut journal, _) = FileJournal::open(dir.path(), JournalConfig::default()).unwrap();
        group.bench_function(format!("file_journal_append_fsync/{records}"), |b| {
            b.iter(|| journal.append(&frames, records as u64).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, journal);
criterion_main!(benches);
