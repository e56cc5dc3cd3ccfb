//! Kill -9 the real server under concurrent load, restart it, and check that every acknowledged command
//! is present exactly once and nothing unacknowledged is half-applied.
//!
//! Seeds: `SPATE_CRASH_SEEDS` (count, default 3) or `SPATE_CRASH_SEED` (one seed, to reproduce a failure).

mod support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{Server, agent, eventually, get, post};

const ACCOUNTS: usize = 8;
const CLIENTS: u64 = 6;

#[derive(Default)]
struct Acked {
    adds: Vec<(String, u64, i64)>,
    transfers: Vec<(String, String, u64, i64)>,
}

fn account(i: usize) -> String {
    format!("acct{i}")
}

/// Sends adds and transfers until the server stops answering; returns what was acknowledged.
fn client(
    base: String,
    seed: u64,
    client_id: u64,
    acked: Arc<Mutex<Acked>>,
    stop: Arc<AtomicBool>,
) {
    let agent = agent();
    let mut rng = StdRng::seed_from_u64(seed ^ client_id);
    for counter in 0u64.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let tag = (client_id << 32) | counter;
        let key = format!("c{client_id}-{counter}");
        if rng.random_bool(0.7) {
            let name = account(rng.random_range(0..ACCOUNTS));
            let amount = rng.random_range(1..1000i64);
            let url = format!("{base}/tally/accounts/{name}/entries");
            match post(
                &agent,
                &url,
                Some(&key),
                &json!({"amount": amount, "tag": tag}),
            ) {
                Ok((201, _)) => acked.lock().unwrap().adds.push((name, tag, amount)),
                Ok((503, _)) => {}
                Ok((status, body)) => panic!("add answered {status}: {body}"),
                Err(_) => return,
            }
        } else {
            let from = rng.random_range(0..ACCOUNTS);
            let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
            let amount = rng.random_range(1..200i64);
            let body =
                json!({"from": account(from), "to": account(to), "amount": amount, "tag": tag});
            match post(
                &agent,
                &format!("{base}/tally/transfers"),
                Some(&key),
                &body,
            ) {
                Ok((201, _)) => {
                    acked
                        .lock()
                        .unwrap()
                        .transfers
                        .push((account(from), account(to), tag, amount))
                }
                Ok((409 | 503, _)) => {}
                Ok((status, body)) => panic!("transfer answered {status}: {body}"),
                Err(_) => return,
            }
        }
    }
}

/// (tag, amount) entries of every account.
fn entries(base: &str) -> HashMap<String, Vec<(u64, i64)>> {
    let agent = agent();
    (0..ACCOUNTS)
        .map(|i| {
            let (status, body) = get(
                &agent,
                &format!("{base}/tally/accounts/{}?limit=10000", account(i)),
            );
            let list = if status == 404 {
                Vec::new()
            } else {
                assert_eq!(status, 200, "{body}");
                assert!(
                    body["entry_count"].as_u64().unwrap() <= 10_000,
                    "test pages are too small"
                );
                body["entries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| (e["tag"].as_u64().unwrap(), e["amount"].as_i64().unwrap()))
                    .collect()
            };
            (account(i), list)
        })
        .collect()
}

fn run_seed(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    // Small segments and frequent snapshots, so that recovery exercises snapshot + replay + segment release.
    // One partition in every other run: then every transfer's credit is a follow-up the partition sends
    // itself and applies at once, in the same group commit as its debit.
    let partitions = if seed.is_multiple_of(2) { "1" } else { "3" };
    let args = [
        "--snapshot-interval-records",
        "300",
        "--segment-bytes",
        "65536",
        "--partitions",
        partitions,
    ];
    let server = Server::start(dir.path(), &args, None);
    let acked = Arc::new(Mutex::new(Acked::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let (base, acked, stop) = (server.base.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || client(base, seed, id, acked, stop))
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    std::thread::sleep(Duration::from_millis(rng.random_range(300..1500)));
    server.kill9();
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("client thread");
    }
    let acked = Arc::try_unwrap(acked).ok().unwrap().into_inner().unwrap();
    assert!(
        acked.adds.len() > 50,
        "seed {seed}: too little load before the kill ({} adds)",
        acked.adds.len()
    );

    let server = Server::start(dir.path(), &args, None);
    let agent = agent();
    // Credits of transfers travel as follow-ups: wait until every debit has its credit.
    let mut by_tag: HashMap<u64, Vec<(String, i64)>> = HashMap::new();
    let settled = eventually(Duration::from_secs(10), || {
        by_tag.clear();
        for (name, list) in entries(&server.base) {
            for (tag, amount) in list {
                by_tag.entry(tag).or_default().push((name.clone(), amount));
            }
        }
        by_tag
            .values()
            .all(|booked| !booked.iter().any(|(_, a)| *a < 0) || booked.len() == 2)
    });
    assert!(
        settled,
        "seed {seed}: some transfer debits never got their credit"
    );

    // Exactly once, nothing half-applied: a tag is one add, or one debit plus its credit.
    for (tag, booked) in &by_tag {
        let debit = booked.iter().find(|(_, a)| *a < 0);
        match (debit, booked.len()) {
            (None, 1) => {}
            (Some((from, amount)), 2) => {
                let credit = booked.iter().find(|(_, a)| *a > 0);
                assert!(
                    matches!(credit, Some((to, a)) if to != from && *a == -amount),
                    "seed {seed}: tag {tag}: {booked:?}"
                );
            }
            _ => panic!("seed {seed}: tag {tag} booked as {booked:?}"),
        }
    }
    let position: HashMap<(String, u64), i64> = by_tag
        .iter()
        .flat_map(|(tag, booked)| booked.iter().map(|(name, a)| ((name.clone(), *tag), *a)))
        .collect();
    for (name, tag, amount) in &acked.adds {
        assert_eq!(
            position.get(&(name.clone(), *tag)),
            Some(amount),
            "seed {seed}: acknowledged add {tag} on {name} lost"
        );
    }
    for (from, to, tag, amount) in &acked.transfers {
        assert_eq!(
            position.get(&(from.clone(), *tag)),
            Some(&-amount),
            "seed {seed}: debit of transfer {tag} lost"
        );
        assert_eq!(
            position.get(&(to.clone(), *tag)),
            Some(amount),
            "seed {seed}: credit of transfer {tag} lost"
        );
    }
    let balance_total: i64 = position.values().sum();

    // The projection, rebuilt from checkpoint + journal, agrees with the partitions.
    let projected = eventually(Duration::from_secs(10), || {
        let (_, totals) = get(&agent, &format!("{}/tally/totals", server.base));
        totals["lag_records"] == 0
            && totals["entries"].as_u64() == Some(position.len() as u64)
            && totals["balance_sum"] == Value::String(balance_total.to_string())
    });
    assert!(
        projected,
        "seed {seed}: projection totals differ from the accounts"
    );

    // A retry of an acknowledged add after the restart is answered from the idempotency table, not applied.
    if let Some((name, tag, amount)) = acked.adds.first() {
        let client_id = tag >> 32;
        let key = format!("c{client_id}-{}", tag & 0xFFFF_FFFF);
        let url = format!("{}/tally/accounts/{name}/entries", server.base);
        let (status, _) = post(
            &agent,
            &url,
            Some(&key),
            &json!({"amount": amount, "tag": tag}),
        )
        .unwrap();
        assert_eq!(status, 201);
        let after = entries(&server.base);
        assert_eq!(
            after[name].iter().filter(|(t, _)| t == tag).count(),
            1,
            "seed {seed}: retry applied twice"
        );
    }
    let status = server.terminate();
    assert!(
        status.success(),
        "seed {seed}: clean shutdown failed: {status}"
    );
}

#[test]
fn every_acknowledged_command_survives_kill_9_exactly_once() {
    let seeds: Vec<u64> = match std::env::var("SPATE_CRASH_SEED") {
        Ok(seed) => vec![seed.parse().expect("SPATE_CRASH_SEED is a number")],
        Err(_) => {
            let count = std::env::var("SPATE_CRASH_SEEDS")
                .map_or(3, |n| n.parse().expect("SPATE_CRASH_SEEDS is a number"));
            let base: u64 = rand::random();
            (0..count).map(|i| base.wrapping_add(i)).collect()
        }
    };
    for seed in seeds {
        eprintln!("crash test seed {seed} (rerun with SPATE_CRASH_SEED={seed})");
        run_seed(seed);
    }
}
