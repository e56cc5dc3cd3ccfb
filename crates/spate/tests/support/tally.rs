//! The tally workload the crash tests share: clients that send adds and transfers with idempotency keys
//! and record what was acknowledged, and the check that a restarted server holds every acknowledged
//! command exactly once and nothing half-applied.

use super::{agent, eventually, get, post, retry_while_moving};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const ACCOUNTS: usize = 8;
pub const CLIENTS: u64 = 6;

#[derive(Default)]
pub struct Acked {
    pub adds: Vec<(String, u64, i64)>,
    pub transfers: Vec<(String, String, u64, i64)>,
}

impl Acked {
    /// Adds what another load acknowledged.
    pub fn merge(&mut self, other: Acked) {
        self.adds.extend(other.adds);
        self.transfers.extend(other.transfers);
    }
}

pub fn account(i: usize) -> String {
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

/// [`CLIENTS`] clients on their own threads, until [`Load::finish`] or until the server stops answering.
/// Client ids start at `first_client`: loads on one server need distinct ranges, since a client's id is
/// in its tags and idempotency keys.
pub struct Load {
    acked: Arc<Mutex<Acked>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    pub fn start(base: &str, seed: u64, first_client: u64) -> Self {
        let acked = Arc::new(Mutex::new(Acked::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (first_client..first_client + CLIENTS)
            .map(|id| {
                let (base, acked, stop) = (base.to_string(), acked.clone(), stop.clone());
                std::thread::spawn(move || client(base, seed, id, acked, stop))
            })
            .collect();
        Self {
            acked,
            stop,
            threads,
        }
    }

    /// Commands acknowledged so far.
    pub fn acknowledged(&self) -> usize {
        let acked = self
            .acked
            .lock()
            .expect("no client panicked holding the lock");
        acked.adds.len() + acked.transfers.len()
    }

    /// Stops the clients and returns what was acknowledged.
    pub fn finish(self) -> Acked {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("client thread");
        }
        Arc::try_unwrap(self.acked)
            .ok()
            .expect("every client has stopped")
            .into_inner()
            .expect("no client panicked holding the lock")
    }
}

/// (tag, amount) entries of every account.
pub fn entries(base: &str) -> HashMap<String, Vec<(u64, i64)>> {
    let agent = agent();
    (0..ACCOUNTS)
        .map(|i| {
            let url = format!("{base}/tally/accounts/{}?limit=10000", account(i));
            let (status, body) = retry_while_moving(|| get(&agent, &url));
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

/// Checks the server at `base` after a crash: every transfer's debit has its credit, every tag is one
/// add or one debit plus its credit, every acknowledged command is there, the projection agrees, and a
/// retry of an acknowledged add is answered without being applied again. `label` names the run.
pub fn check_exactly_once(base: &str, acked: &Acked, label: &str) {
    let agent = agent();
    // Credits of transfers travel as follow-ups: wait until every debit has its credit.
    let mut by_tag: HashMap<u64, Vec<(String, i64)>> = HashMap::new();
    let settled = eventually(Duration::from_secs(10), || {
        by_tag.clear();
        for (name, list) in entries(base) {
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
        "{label}: some transfer debits never got their credit"
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
                    "{label}: tag {tag}: {booked:?}"
                );
            }
            _ => panic!("{label}: tag {tag} booked as {booked:?}"),
        }
    }
    let position: HashMap<(String, u64), i64> = by_tag
        .iter()
        .flat_map(|(tag, booked)| booked.iter().map(|(name, a)| ((name.clone(), *tag), *a)))
        .collect();
    // The losses are counted and the first 20 named at once: which commands, and how many, say more
    // about a cause than the first alone.
    let mut lost: Vec<String> = acked
        .adds
        .iter()
        .filter(|(name, tag, amount)| position.get(&(name.clone(), *tag)) != Some(amount))
        .map(|(name, tag, amount)| format!("add {tag} of {amount} on {name}"))
        .collect();
    for (from, to, tag, amount) in &acked.transfers {
        if position.get(&(from.clone(), *tag)) != Some(&-amount) {
            lost.push(format!("debit of transfer {tag} on {from}"));
        }
        if position.get(&(to.clone(), *tag)) != Some(amount) {
            lost.push(format!("credit of transfer {tag} on {to}"));
        }
    }
    assert!(
        lost.is_empty(),
        "{label}: {} losses among {} acknowledged adds and {} transfers (two legs each): {:?}",
        lost.len(),
        acked.adds.len(),
        acked.transfers.len(),
        &lost[..lost.len().min(20)]
    );
    let balance_total: i64 = position.values().sum();

    // The projection, rebuilt from checkpoint + journal, agrees with the partitions.
    let projected = eventually(Duration::from_secs(10), || {
        let (_, totals) = retry_while_moving(|| get(&agent, &format!("{base}/tally/totals")));
        totals["lag_records"] == 0
            && totals["entries"].as_u64() == Some(position.len() as u64)
            && totals["balance_sum"] == Value::String(balance_total.to_string())
    });
    assert!(
        projected,
        "{label}: projection totals differ from the accounts"
    );

    // A retry of an acknowledged add after the restart is answered from the idempotency table, not applied.
    if let Some((name, tag, amount)) = acked.adds.first() {
        let client_id = tag >> 32;
        let key = format!("c{client_id}-{}", tag & 0xFFFF_FFFF);
        let url = format!("{}/tally/accounts/{name}/entries", base);
        let body = json!({"amount": amount, "tag": tag});
        let (status, _) =
            retry_while_moving(|| post(&agent, &url, Some(&key), &body).expect("POST answered"));
        assert_eq!(status, 201);
        let after = entries(base);
        assert_eq!(
            after[name].iter().filter(|(t, _)| t == tag).count(),
            1,
            "{label}: retry applied twice"
        );
    }
}
