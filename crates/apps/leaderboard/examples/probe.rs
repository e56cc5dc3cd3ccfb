use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use spate_leaderboard::{BoardConfig, Entry, Operator, Order, RankTree, Season, TiePolicy};
use std::time::Instant;

fn main() {
    let n = 1_000_000u32;
    let mut rng = SmallRng::seed_from_u64(1);
    let mut entries: Vec<Entry> = (0..n)
        .map(|m| Entry {
            key: rng.random_range(0..1_000_000u128),
            tie: u64::from(m),
            member: m,
        })
        .collect();
    let mut sorted = entries.clone();
    sorted.sort();
    let mut tree = RankTree::from_sorted(&sorted);
    let ops = 2_000_000;
    let picks: Vec<(u32, u128)> = (0..ops)
        .map(|_| (rng.random_range(0..n), rng.random_range(1..=100u128)))
        .collect();
    let t = Instant::now();
    for (i, &(m, d)) in picks.iter().enumerate() {
        let old = entries[m as usize];
        let new = Entry {
            key: old.key - d.min(old.key),
            tie: (n as u64) + i as u64,
            member: m,
        };
        tree.replace(&old, new);
        entries[m as usize] = new;
    }
    println!(
        "tree replace (increment): {:.0} ns/op",
        t.elapsed().as_nanos() as f64 / ops as f64
    );
    let t = Instant::now();
    let mut s = 0usize;
    for &(m, _) in &picks {
        s += tree.count_before(&entries[m as usize]);
    }
    println!(
        "tree rank: {:.0} ns/op ({s})",
        t.elapsed().as_nanos() as f64 / ops as f64
    );

    let config = BoardConfig {
        order: Order::Descending,
        ties: TiePolicy::First,
        operator: Operator::Increment,
    };
    let mut season = Season::new(1, 0);
    let names: Vec<String> = (0..n).map(|i| format!("user{i}")).collect();
    for name in &names {
        season
            .update(
                &config,
                name,
                Operator::Set,
                rng.random_range(0..1_000_000),
                0,
            )
            .unwrap();
    }
    let t = Instant::now();
    let mut found = 0u64;
    for &(m, _) in &picks {
        found += season.rank(&names[m as usize]).is_some() as u64;
    }
    println!(
        "season rank incl lookup: {:.0} ns/op ({found})",
        t.elapsed().as_nanos() as f64 / ops as f64
    );
    let t = Instant::now();
    for &(m, d) in &picks {
        season
            .update(
                &config,
                &names[m as usize],
                Operator::Increment,
                d as i128,
                0,
            )
            .unwrap();
    }
    println!(
        "season increment: {:.0} ns/op",
        t.elapsed().as_nanos() as f64 / ops as f64
    );
}
