//! Pure scoring on one core, no I/O: generated transactions against a generated 20-entry history per card.
//! `cargo bench -p spate-fraud --bench scoring`; `SCORING_CARDS=30000000` sets the history's cards
//! (default 1 M; about 500 bytes each), so that more of them miss the cache.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use spate_fraud::generator::{HistoryGenerator, Seeds, TxnGenerator};
use spate_fraud::history::{ENTRIES_PER_CARD_DEFAULT, HistoryStore, UNSCORED};
use spate_fraud::rules::{CaseStudyRules, RuleSet};
use std::hint::black_box;

const CARDS_DEFAULT: u32 = 1_000_000;
const NOW_MS: u64 = 1_800_000_000_000;
/// The engine's default `--snapshot-step-bytes`.
const SNAPSHOT_STEP_BYTES: usize = 65_536;
/// Criterion's own default, back after the snapshot's fewer samples.
const CRITERION_SAMPLES_DEFAULT: usize = 100;
const BATCH: usize = 10_000;

fn scoring(c: &mut Criterion) {
    let cards: u32 = std::env::var("SCORING_CARDS").map_or(CARDS_DEFAULT, |cards| {
        cards.parse().expect("SCORING_CARDS: a number of cards")
    });
    let seeds = Seeds::default();
    let mut store = HistoryStore::new(ENTRIES_PER_CARD_DEFAULT);
    store.reserve_cards(cards as usize);
    for txn in HistoryGenerator::new(&seeds, cards, 20, NOW_MS) {
        store.store(&txn, UNSCORED);
    }
    let mut generator = TxnGenerator::new(&seeds, cards);
    let mut window = Vec::new();
    let mut verdicts = Vec::with_capacity(BATCH);
    let mut group = c.benchmark_group("fraud");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function(format!("score_and_store_{cards}_cards_x20"), |b| {
        b.iter_batched(
            || {
                (0..BATCH)
                    .map(|i| generator.next_txn(NOW_MS + i as u64))
                    .collect::<Vec<_>>()
            },
            |txns| {
                verdicts.clear();
                store.score_batch(&txns, &CaseStudyRules, &mut window, &mut verdicts);
                black_box(&verdicts);
            },
            BatchSize::LargeInput,
        )
    });
    // A snapshot in the partition's steps, into a sink: what reading the cards costs the store (the
    // app's sealing of each step is not in it).
    group.throughput(Throughput::Elements(u64::from(cards)));
    group.sample_size(10);
    group.bench_function(format!("snapshot_in_steps_{cards}_cards"), |b| {
        b.iter(|| {
            store.begin_snapshot();
            while !store
                .snapshot_step(&mut std::io::sink(), SNAPSHOT_STEP_BYTES)
                .unwrap()
            {}
        })
    });
    group.sample_size(CRITERION_SAMPLES_DEFAULT);
    let history: Vec<_> = HistoryGenerator::new(&seeds, 1, 20, NOW_MS).collect();
    let mut sorted = history.clone();
    sorted.sort_by_key(|h| std::cmp::Reverse(h.timestamp_ms()));
    let current = generator.next_txn(NOW_MS);
    group.throughput(Throughput::Elements(1));
    group.bench_function("rules_only_20_entries", |b| {
        b.iter(|| black_box(CaseStudyRules.score(black_box(&current), black_box(&sorted))))
    });
    group.finish();
}

criterion_group!(benches, scoring);
criterion_main!(benches);
