//! `spate bench cluster --kafka B`: failover of a three-node cluster.
//!
//! Three nodes share a new topic of six partitions (`tally` only). Each round kills one node with
//! SIGKILL, then sends an add to every partition the killed node applied through a surviving node,
//! retrying each until it is acknowledged: a partition's failover time is from the kill to its first
//! acknowledged command. The node is then restarted on its data directory and the next round waits until
//! every partition has an owner again. At the end every account must hold exactly the acknowledged adds
//! (none lost, none applied twice).

use super::args::BenchArgs;
use super::common::{Spawned, get_json, machine, median, serve};
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NODES: usize = 3;
const PARTITIONS: u16 = 6;
/// The longest a partition may go without an owner before the benchmark gives up.
const FAILOVER_MAX: Duration = Duration::from_secs(60);

pub fn run(args: &BenchArgs) -> anyhow::Result<String> {
    let Some(kafka) = args.kafka.clone() else {
        bail!("the cluster benchmark needs a Kafka cluster: --kafka HOST:PORT,...");
    };
    if args.cluster.kills == 0 {
        bail!("--kills must be at least 1");
    }
    let topic = format!("bench-cluster-{}", std::process::id());
    let dirs: Vec<_> = (0..NODES)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let listens: Vec<String> = (0..NODES)
        .map(|_| free_port().map(|port| format!("127.0.0.1:{port}")))
        .collect::<Result<_, _>>()?;
    // The nodes sign their requests to each other with a secret they share.
    let secret_dir = tempfile::tempdir()?;
    let secret_file = secret_dir.path().join("cluster.secret");
    std::fs::write(
        &secret_file,
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            rand::random::<[u8; 32]>(),
        ),
    )?;
    let secret_file = secret_file
        .to_str()
        .context("a UTF-8 temporary path")?
        .to_string();
    let start = |node: usize| -> anyhow::Result<Spawned> {
        let args: Vec<String> = [
            "--apps",
            "tally",
            "--fraud-stream-listen",
            "off",
            "--kafka",
            &kafka,
            "--kafka-topic",
            &topic,
            "--partitions",
            &PARTITIONS.to_string(),
            "--node-id",
            &(node + 1).to_string(),
            "--cluster-secret-file",
            &secret_file,
            "--listen",
            &listens[node],
        ]
        .map(String::from)
        .to_vec();
        serve(dirs[node].path(), &args)
    };
    let mut nodes: Vec<Option<Spawned>> = Vec::new();
    for node in 0..NODES {
        nodes.push(Some(start(node)?));
    }
    // One account per partition, so that an add is a probe of exactly that partition.
    let accounts = accounts_by_partition();
    let mut acknowledged: BTreeMap<String, u64> = BTreeMap::new();
    let mut tag = 0u64;
    let mut add = |via: &str, partition: u16| -> bool {
        tag += 1;
        let account = &accounts[usize::from(partition)];
        let url = format!("http://{via}/tally/accounts/{account}/entries");
        let body = json!({"amount": 1, "tag": tag});
        let key = format!("probe-{tag}");
        let answered = ureq::post(&url)
            .header("Idempotency-Key", &key)
            .config()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(15)))
            .build()
            .send_json(&body);
        let acked = matches!(answered, Ok(response) if response.status() == 201);
        if acked {
            *acknowledged.entry(account.clone()).or_default() += 1;
        }
        acked
    };
    let owners = wait_for_owners(&listens[0], NODES)?;
    for partition in 0..PARTITIONS {
        retry_until_acknowledged(|| add(&listens[0], partition))?;
    }
    eprintln!("cluster of {NODES} up: {owners:?}");

    let mut per_partition_s = Vec::new();
    let mut per_kill_s = Vec::new();
    for round in 0..args.cluster.kills {
        let victim = round % NODES;
        let survivor = (victim + 1) % NODES;
        let owners = wait_for_owners(&listens[survivor], NODES)?;
        let orphaned: Vec<u16> = owners
            .get(&(victim as u64 + 1))
            .cloned()
            .unwrap_or_default();
        let killed_at = Instant::now();
        nodes[victim]
            .take()
            .expect("every node runs between rounds")
            .kill9()?;
        let mut worst = Duration::ZERO;
        for &partition in &orphaned {
            retry_until_acknowledged(|| add(&listens[survivor], partition))?;
            let took = killed_at.elapsed();
            per_partition_s.push(took.as_secs_f64());
            worst = worst.max(took);
        }
        per_kill_s.push(worst.as_secs_f64());
        eprintln!(
            "kill {}: node {} with partitions {orphaned:?}: all served again after {:.2} s",
            round + 1,
            victim + 1,
            worst.as_secs_f64()
        );
        nodes[victim] = Some(start(victim)?);
    }
    wait_for_owners(&listens[0], NODES)?;

    // Nothing acknowledged lost, nothing applied twice.
    let mut lost_or_doubled = 0i64;
    for (account, expected) in &acknowledged {
        let url = format!("http://{}/tally/accounts/{account}?limit=10000", listens[0]);
        let found = get_json(&url)?["entry_count"].as_u64().unwrap_or(0);
        lost_or_doubled += (found as i64 - *expected as i64).abs();
    }
    let acknowledged_total: u64 = acknowledged.values().sum();
    if lost_or_doubled != 0 {
        bail!(
            "{lost_or_doubled} acknowledged adds lost or applied twice out of {acknowledged_total}"
        );
    }
    let worst = |values: &[f64]| values.iter().copied().fold(0.0, f64::max);
    let mut section = format!(
        "## cluster: failover\n\n- machine: {}\n- nodes: {NODES} on this machine, {PARTITIONS} partitions, Kafka at {kafka}\n- kills: {} (kill -9 of one node per round, restarted afterwards)\n",
        machine(),
        args.cluster.kills
    );
    section += &format!(
        "- kill -9 to the first acknowledged command on a partition of the killed node: median {:.2} s, worst {:.2} s over {} partitions\n",
        median(&mut per_partition_s.clone()),
        worst(&per_partition_s),
        per_partition_s.len()
    );
    section += &format!(
        "- kill -9 to every partition of the killed node served: median {:.2} s, worst {:.2} s\n",
        median(&mut per_kill_s.clone()),
        worst(&per_kill_s)
    );
    section += &format!("- acknowledged adds: {acknowledged_total}; lost or applied twice: 0\n");
    Ok(section)
}

/// Waits until `via` describes a cluster of `nodes` nodes with every partition owned; returns the
/// partitions of each node id.
fn wait_for_owners(via: &str, nodes: usize) -> anyhow::Result<BTreeMap<u64, Vec<u16>>> {
    let deadline = Instant::now() + FAILOVER_MAX;
    loop {
        if let Ok(status) = get_json(&format!("http://{via}/cluster")) {
            let owners = owners(&status);
            if owners.len() == nodes && status["partitions_unowned"] == 0 {
                return Ok(owners);
            }
        }
        if Instant::now() >= deadline {
            bail!("the cluster did not settle on {nodes} nodes within {FAILOVER_MAX:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn owners(status: &Value) -> BTreeMap<u64, Vec<u16>> {
    status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|node| {
            let partitions = node["partitions"]
                .as_array()?
                .iter()
                .filter_map(|p| u16::try_from(p.as_u64()?).ok())
                .collect();
            Some((node["node_id"].as_u64()?, partitions))
        })
        .collect()
}

fn retry_until_acknowledged(mut attempt: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + FAILOVER_MAX;
    while !attempt() {
        if Instant::now() >= deadline {
            bail!("a partition was not served again within {FAILOVER_MAX:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// An account name for each partition.
fn accounts_by_partition() -> Vec<String> {
    let mut accounts = vec![String::new(); usize::from(PARTITIONS)];
    for i in 0.. {
        let name = format!("probe{i}");
        let slot =
            &mut accounts[usize::from(spate_engine::partition_of(name.as_bytes(), PARTITIONS))];
        if slot.is_empty() {
            *slot = name;
        }
        if accounts.iter().all(|a| !a.is_empty()) {
            return accounts;
        }
    }
    unreachable!("the loop returns once every partition has an account")
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}
