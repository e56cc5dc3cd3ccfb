//! In-process apply on one core, no I/O: the leaderboard's state machine fed encoded update commands, as
//! the partition thread feeds it, on a board of 1M members; rank queries on a board of 10M; and the
//! machine's random-access memory latency, for proportion.
//! `cargo bench -p spate-leaderboard --bench ranking`

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use spate_leaderboard::{
    BoardConfig, Command, LeaderboardState, Operator, Order, Season, TiePolicy, UpdateItem,
};
use std::hint::black_box;

const MEMBERS: u32 = 1_000_000;
const UPDATES_PER_COMMAND: usize = 1_000;
const BOARD: &str = "bench";

fn member(n: u32) -> String {
    format!("user{n}")
}

/// A board of `MEMBERS` with scores spread over 0..1e6, ties broken by arrival.
fn filled_state(ties: TiePolicy) -> LeaderboardState {
    let mut state = LeaderboardState::default();
    let config = BoardConfig {
        order: Order::Descending,
        ties,
        operator: Operator::Increment,
    };
    let mut reply = Vec::new();
    state.execute(
        &Command::Create {
            board: BOARD,
            config,
        },
        0,
        0,
        &mut reply,
    );
    let mut rng = SmallRng::seed_from_u64(7);
    let names: Vec<String> = (0..MEMBERS).map(member).collect();
    for chunk in names.chunks(UPDATES_PER_COMMAND) {
        let items = chunk
            .iter()
            .map(|m| UpdateItem {
                member: m,
                operator: Some(Operator::Set),
                value: rng.random_range(0..1_000_000),
            })
            .collect();
        reply.clear();
        state.execute(
            &Command::Update {
                board: BOARD,
                with_rank: false,
                items,
            },
            0,
            rng.random(),
            &mut reply,
        );
    }
    state
}

/// One encoded command of `UPDATES_PER_COMMAND` updates of random members; `value` draws each update's
/// score argument. Every iteration gets a fresh command: repeating a few would turn `set` into no-ops.
fn command(rng: &mut SmallRng, operator: Operator, value: DrawValue) -> Vec<u8> {
    let names: Vec<String> = (0..UPDATES_PER_COMMAND)
        .map(|_| member(rng.random_range(0..MEMBERS)))
        .collect();
    let items = names
        .iter()
        .map(|m| UpdateItem {
            member: m,
            operator: Some(operator),
            value: value(rng),
        })
        .collect();
    Command::Update {
        board: BOARD,
        with_rank: false,
        items,
    }
    .encode()
}

/// Draws one update's score argument.
type DrawValue = fn(&mut SmallRng) -> i128;

fn apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("leaderboard_apply_1M_members");
    group.throughput(Throughput::Elements(UPDATES_PER_COMMAND as u64));
    let cases: [(&str, TiePolicy, Operator, DrawValue); 3] = [
        (
            "increment_1_to_100",
            TiePolicy::First,
            Operator::Increment,
            |rng| rng.random_range(1..=100),
        ),
        (
            "increment_random_ties",
            TiePolicy::Random,
            Operator::Increment,
            |rng| rng.random_range(1..=100),
        ),
        ("set_anywhere", TiePolicy::First, Operator::Set, |rng| {
            rng.random_range(0..1_000_000)
        }),
    ];
    for (name, ties, operator, value) in cases {
        let mut state = filled_state(ties);
        let mut rng = SmallRng::seed_from_u64(11);
        let mut timestamp_ms = 1;
        let mut reply = Vec::with_capacity(UPDATES_PER_COMMAND * 20);
        group.bench_function(name, |b| {
            b.iter_batched(
                || command(&mut rng, operator, value),
                |payload| {
                    let command = Command::decode(&payload).expect("valid command");
                    reply.clear();
                    timestamp_ms += 1;
                    state.execute(&command, timestamp_ms, timestamp_ms, &mut reply);
                    black_box(&reply);
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

fn rank(c: &mut Criterion) {
    const BIG: u32 = 10_000_000;
    let config = BoardConfig {
        order: Order::Descending,
        ties: TiePolicy::First,
        operator: Operator::Set,
    };
    let mut season = Season::new(1, 0);
    let mut rng = SmallRng::seed_from_u64(3);
    for n in 0..BIG {
        season
            .update(
                &config,
                &member(n),
                Operator::Set,
                rng.random_range(0..1_000_000_000),
                0,
            )
            .expect("fits");
    }
    let mut group = c.benchmark_group("leaderboard_query_10M_members");
    group.throughput(Throughput::Elements(1));
    group.bench_function("rank_of_member", |b| {
        b.iter_batched(
            || member(rng.random_range(0..BIG)),
            |m| black_box(season.rank(&m)),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("top_100_from_random_offset", |b| {
        b.iter_batched(
            || rng.random_range(0..BIG as usize),
            |offset| black_box(season.page(&config, offset, 100)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// The machine's cost of one dependent random load over 64 MiB (a pointer chase), the unit an update on a
/// random member of a large board pays several times: it puts the apply figures in proportion.
fn memory(c: &mut Criterion) {
    const SLOTS: usize = 64 * 1024 * 1024 / 8;
    const STEPS: usize = 1_000;
    // Sattolo's shuffle: one cycle through every slot, so the chase never settles into a cached loop.
    let mut next: Vec<usize> = (0..SLOTS).collect();
    let mut rng = SmallRng::seed_from_u64(5);
    for i in (1..SLOTS).rev() {
        next.swap(i, rng.random_range(0..i));
    }
    let mut at = 0;
    let mut group = c.benchmark_group("machine");
    group.throughput(Throughput::Elements(STEPS as u64));
    group.bench_function("dependent_load_64MiB", |b| {
        b.iter(|| {
            for _ in 0..STEPS {
                at = next[at];
            }
            black_box(at)
        })
    });
    group.finish();
}

criterion_group!(benches, apply, rank, memory);
criterion_main!(benches);
