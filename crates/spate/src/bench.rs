//! `spate bench [app...]`: each app's benchmark against a fresh server on a temporary data directory,
//! written as one Markdown report (`REPORT.md`) with JSON and SVG charts next to it.
//!
//! - fraud: loads the case study's history in place, then runs the generator -> acknowledged stream ->
//!   scoring -> durable journal pipeline several times (generator included, in its own process).
//! - leaderboard: `bench_leaderboard.rs`.
//! - ski: `bench_ski.rs`.
//! - ledger: `bench_ledger.rs`.
//! - payments: `bench_payments.rs`.
//! - cluster (only when named, with `--kafka`): failover of three nodes, `bench_cluster.rs`.
//! - tally: `spate load tally adds` in closed loop, then in open loop at half the rate the closed loop
//!   achieved, so the report shows latency at a sustainable offered load as well as at saturation.

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// Apps with a benchmark, in report order.
const BENCHMARKS: &[&str] = &["fraud", "leaderboard", "ledger", "payments", "ski", "tally"];
/// Benchmarks that run only when named: `cluster` needs a Kafka cluster (`--kafka`).
const NAMED_ONLY: &[&str] = &["cluster"];

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub leaderboard: crate::bench_leaderboard::LeaderboardBench,
    #[command(flatten)]
    pub ski: crate::bench_ski::SkiBench,
    #[command(flatten)]
    pub ledger: crate::bench_ledger::LedgerBench,
    #[command(flatten)]
    pub payments: crate::bench_payments::PaymentsBench,
    /// Apps to benchmark [default: all: fraud, leaderboard, ledger, payments, ski, tally]; `cluster`
    /// (failover of three nodes, needs --kafka) runs only when named
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(BENCHMARKS.iter().chain(NAMED_ONLY)))]
    apps: Vec<String>,
    #[command(flatten)]
    pub cluster: crate::bench_cluster::ClusterBench,
    #[command(flatten)]
    pub fraud: FraudBench,
    /// Measured seconds of each HTTP load run
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    /// Connections of each HTTP load run
    #[arg(long, default_value_t = 16)]
    pub connections: u32,
    /// Where the report goes
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Kafka bootstrap servers: every server of this run keeps its journal there, each on a new topic
    /// [default: the embedded journal]
    #[arg(long)]
    pub kafka: Option<String>,
}

/// The Kafka cluster every server of this run journals to (`--kafka`), set once by [`run`]: the servers
/// are started from every app's benchmark, and none of them needs to know.
static KAFKA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// Servers started so far: each gets a topic of its own.
static SERVERS_STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[derive(Args)]
pub struct FraudBench {
    /// Cards in the history (the case study's local reference used 1,000,000)
    #[arg(long, default_value_t = 1_000_000)]
    cards: u32,
    /// Transactions per run
    #[arg(long, default_value_t = 10_000_000)]
    count: u64,
    /// Runs; the report quotes their median
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Records per stream batch
    #[arg(long, default_value_t = 2048)]
    batch: usize,
    /// Unacknowledged batches per producer
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// Server partitions [default: one per core]
    #[arg(long)]
    pub partitions: Option<u16>,
}

/// The case study's own code on this machine with its history restored (seeds README): the peer figure.
const CASE_STUDY_TPS: f64 = 48_700.0;

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let apps: Vec<&str> = if args.apps.is_empty() {
        BENCHMARKS.to_vec()
    } else {
        BENCHMARKS
            .iter()
            .chain(NAMED_ONLY)
            .copied()
            .filter(|b| args.apps.iter().any(|a| a == b))
            .collect()
    };
    std::fs::create_dir_all(&args.out)?;
    if let Some(kafka) = &args.kafka {
        KAFKA.set(kafka.clone()).expect("run is called once");
    }
    let command_line = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let journal = match &args.kafka {
        Some(kafka) => format!("Kafka at {kafka} (acks=all, a transaction per group commit)"),
        None => "embedded (fdatasync per group commit)".into(),
    };
    let mut report = format!(
        "# spate benchmark report\n\n- machine: {}\n- date: {}\n- journal: {journal}\n- command: `spate {command_line}`\n\n",
        machine(),
        utc_date(crate::clock::wall_ms())
    );
    for app in apps {
        let section = match app {
            "fraud" => fraud(&args.fraud, &args.out)?,
            "tally" => tally(&args)?,
            "leaderboard" => crate::bench_leaderboard::run(&args)?,
            "ski" => crate::bench_ski::run(&args)?,
            "ledger" => crate::bench_ledger::run(&args)?,
            "payments" => crate::bench_payments::run(&args)?,
            "cluster" => crate::bench_cluster::run(&args)?,
            other => unreachable!("no benchmark for {other}"),
        };
        report += &section;
        report += "\n";
        report += &take_longest_pause();
        report += "\n";
        std::fs::write(args.out.join("REPORT.md"), &report)?;
    }
    println!("{report}");
    eprintln!("report written to {}", args.out.join("REPORT.md").display());
    Ok(())
}

pub struct Spawned {
    child: Child,
    pub http: String,
    stream: String,
    /// The payments key-encrypting key and the fraud card key, beside the temporary data directory
    /// (a journal on Kafka needs keys that outlive it); removed with the server.
    kek_file: PathBuf,
    fraud_key_file: PathBuf,
    /// Killed and waited for: its pid may belong to another process now.
    reaped: bool,
}

impl Spawned {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server with SIGKILL (no shutdown of any kind) and reaps it.
    pub fn kill9(mut self) -> anyhow::Result<()> {
        self.record_longest_pause();
        self.child.kill().context("SIGKILL")?;
        self.child.wait().context("reaping the server")?;
        self.reaped = true;
        Ok(())
    }

    /// Notes the server's longest apply pause (from its `/metrics`) for the report of the benchmark
    /// running now: see [`take_longest_pause`]. A server that does not answer adds nothing; it is said.
    fn record_longest_pause(&self) {
        let metrics = match ureq::get(format!("{}/metrics", self.http))
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
        {
            Ok(metrics) => metrics,
            Err(error) => {
                eprintln!("could not read the server's pauses from its /metrics: {error}");
                return;
            }
        };
        let mut longest = LONGEST_PAUSES.lock().expect("never poisoned");
        let LongestPauses { wall, cpu } = &mut *longest;
        for (gauge, longest) in [(PAUSE_GAUGE, wall), (PAUSE_CPU_GAUGE, cpu)] {
            if let Some(pause) = longest_pause(&metrics, gauge)
                && longest.as_ref().is_none_or(|l| pause.seconds > l.seconds)
            {
                *longest = Some(pause);
            }
        }
    }
}

/// The longest interval in which a partition could not apply, as `/metrics` gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pause {
    pub seconds: f64,
    pub cause: String,
    pub partition: String,
}

/// The longest pause, and the most CPU time one pause took, of the servers stopped since the last
/// [`take_longest_pause`].
#[derive(Default)]
struct LongestPauses {
    wall: Option<Pause>,
    cpu: Option<Pause>,
}

static LONGEST_PAUSES: std::sync::Mutex<LongestPauses> = std::sync::Mutex::new(LongestPauses {
    wall: None,
    cpu: None,
});

const PAUSE_GAUGE: &str = "spate_apply_pause_max_seconds";
const PAUSE_CPU_GAUGE: &str = "spate_apply_pause_cpu_max_seconds";

/// The longest pause of the servers stopped since the last call, as a line for a benchmark's report.
fn take_longest_pause() -> String {
    let LongestPauses { wall, cpu } =
        std::mem::take(&mut *LONGEST_PAUSES.lock().expect("never poisoned"));
    let Some(wall) = wall else {
        return "Longest apply pause of this benchmark's servers: none recorded.\n".into();
    };
    let mut line = format!(
        "Longest apply pause of this benchmark's servers: **{:.1} ms** ({}, partition {})",
        wall.seconds * 1e3,
        wall.cause,
        wall.partition
    );
    if let Some(cpu) = cpu {
        line += &format!(
            "; the most CPU time one pause took: {:.1} ms ({}, partition {}), the rest of a pause \
             is waiting for a core",
            cpu.seconds * 1e3,
            cpu.cause,
            cpu.partition
        );
    }
    line + ".\n"
}

/// Parses the largest `<gauge>{partition="P",cause="C"} S` line of a scrape.
fn longest_pause(metrics: &str, gauge: &str) -> Option<Pause> {
    metrics
        .lines()
        .filter_map(|line| {
            let labels = line.strip_prefix(gauge)?.strip_prefix('{')?;
            let (labels, value) = labels.split_once("} ")?;
            let label = |name: &str| {
                let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
                let end = start + labels[start..].find('"')?;
                Some(labels[start..end].to_string())
            };
            Some(Pause {
                seconds: value.trim().parse().ok()?,
                cause: label("cause")?,
                partition: label("partition")?,
            })
        })
        .max_by(|a, b| a.seconds.total_cmp(&b.seconds))
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // SIGTERM first so the server can stop cleanly; then make sure it is gone.
        if !self.reaped {
            self.record_longest_pause();
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.kek_file);
        let _ = std::fs::remove_file(&self.fraud_key_file);
    }
}

pub fn start_server(
    data_dir: &std::path::Path,
    app: &str,
    partitions: Option<u16>,
) -> anyhow::Result<Spawned> {
    let mut args = vec![
        "--apps".to_string(),
        app.into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--fraud-stream-listen".into(),
        "127.0.0.1:0".into(),
    ];
    if let Some(partitions) = partitions {
        args.extend(["--partitions".into(), partitions.to_string()]);
    }
    if let Some(kafka) = KAFKA.get() {
        let server = SERVERS_STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let topic = format!("bench-{}-{server}", std::process::id());
        args.extend([
            "--kafka".into(),
            kafka.clone(),
            "--kafka-topic".into(),
            topic,
        ]);
    }
    serve(data_dir, &args)
}

/// Starts `spate serve --data-dir <data_dir> <args>` and waits until it listens.
pub fn serve(data_dir: &std::path::Path, args: &[String]) -> anyhow::Result<Spawned> {
    let kek_file = data_dir.with_extension("kek");
    let fraud_key_file = data_dir.with_extension("fraud-key");
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("serve")
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env("SPATE_KEK_FILE", &kek_file)
        .env("SPATE_FRAUD_KEY_FILE", &fraud_key_file)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = command.spawn().context("starting spate serve")?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut stream = None;
    loop {
        let line = lines.next().context("server exited before listening")??;
        if let Some(address) = line.strip_prefix("spate fraud stream on ") {
            stream = Some(address.to_string());
        } else if let Some(http) = line.strip_prefix("spate listening on ") {
            return Ok(Spawned {
                child,
                http: http.to_string(),
                stream: stream.unwrap_or_default(),
                kek_file,
                fraud_key_file,
                reaped: false,
            });
        }
    }
}

/// User and system CPU seconds a process has used so far, from /proc.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = &stat[stat.rfind(')').context("malformed /proc stat")? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS")?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .context("no VmRSS value")?
        .parse()?;
    Ok(kib * 1024)
}

/// A wall-clock time in ms as ISO 8601 in UTC (`2026-11-26T03:58:00.123Z`), as every report dates itself.
pub fn utc_date(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms after the epoch"))
}

/// The machine a report was measured on: cores, CPU model, memory.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores ({model}), {memory_gib:.0} GiB")
}

fn post_json(url: &str, body: &Value) -> anyhow::Result<Value> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(3600)))
        .build()
        .into();
    Ok(agent.post(url).send_json(body)?.body_mut().read_json()?)
}

pub fn get_json(url: &str) -> anyhow::Result<Value> {
    Ok(ureq::get(url).call()?.body_mut().read_json()?)
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn fraud(args: &FraudBench, out: &std::path::Path) -> anyhow::Result<String> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let started_at = crate::clock::wall_ms();
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "fraud", args.partitions)?;
    let server_pid = server.child.id();
    let now_ms = started_at;
    eprintln!("loading history: {} cards x 20 ...", args.cards);
    let load_started = Instant::now();
    let loaded = post_json(
        &format!("{}/fraud/history/generate", server.http),
        &json!({"cards": args.cards, "now_ms": now_ms}),
    )?;
    let load_seconds = load_started.elapsed().as_secs_f64();
    let mut runs = Vec::new();
    for run in 0..args.runs {
        let cpu_before = cpu_seconds(server_pid)?;
        let mut push = Command::new(std::env::current_exe()?);
        push.args(["fraud", "push", "--server", &server.stream])
            .args([
                "--cards",
                &args.cards.to_string(),
                "--count",
                &args.count.to_string(),
            ])
            .args([
                "--batch",
                &args.batch.to_string(),
                "--window",
                &args.window.to_string(),
            ])
            .args(["--start-ms", &(now_ms + run as u64 * 3_600_000).to_string()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let producer = push.spawn().context("starting spate fraud push")?;
        let output = producer.wait_with_output()?;
        if !output.status.success() {
            bail!("the producer failed in run {run}");
        }
        let report: Value = serde_json::from_slice(&output.stdout).context("producer summary")?;
        let server_cpu = cpu_seconds(server_pid)? - cpu_before;
        let seconds = report["seconds"].as_f64().unwrap_or(f64::NAN);
        let scored = report["scored"].as_u64().unwrap_or(0);
        if scored != args.count {
            bail!(
                "run {run}: {scored} of {} transactions acknowledged as scored",
                args.count
            );
        }
        let entry = json!({
            "run": run,
            "transactions": scored,
            "seconds": seconds,
            "transactions_per_s": scored as f64 / seconds,
            "ack_p50_us": report["ack_p50_us"],
            "ack_p99_us": report["ack_p99_us"],
            "server_cpu_s": server_cpu,
            "producer_cpu_s": report["cpu_s"],
        });
        eprintln!("run {run}: {entry}");
        runs.push(entry);
    }
    let stats = get_json(&format!("{}/fraud/stats", server.http))?;
    let rss = rss_bytes(server_pid)?;
    drop(server);

    let mut rates: Vec<f64> = runs
        .iter()
        .filter_map(|r| r["transactions_per_s"].as_f64())
        .collect();
    let median_rate = median(&mut rates);
    let stored = stats["stored_transactions"].as_u64().unwrap_or(1).max(1);
    let command_line = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let report = json!({
        "benchmark": "fraud",
        "date": utc_date(started_at),
        "machine": machine(),
        "command": format!("spate {command_line}"),
        "cards": args.cards,
        "history_load_seconds": load_seconds,
        "history_loaded": loaded["stored"],
        "runs": runs,
        "median_transactions_per_s": median_rate,
        "case_study_transactions_per_s": CASE_STUDY_TPS,
        "ratio_to_case_study": median_rate / CASE_STUDY_TPS,
        "stored_transactions": stored,
        "server_rss_bytes": rss,
        "rss_bytes_per_stored_transaction": rss as f64 / stored as f64,
        "history_bytes_per_stored_transaction": stats["history_bytes_per_transaction"],
        "flagged_by_rule": stats["flagged_by_rule"],
    });
    std::fs::write(
        out.join("fraud.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    Ok(markdown(&report))
}

/// tally: closed loop to find the saturation rate, then open loop at half of it.
fn tally(args: &BenchArgs) -> anyhow::Result<String> {
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "tally", args.fraud.partitions)?;
    let mut load = crate::load::args::LoadArgs::new("tally", "adds", &server.http);
    load.connections = args.connections;
    load.duration_s = args.duration_s;
    let closed = crate::load::load_http(&load)?;
    crate::load::common::write_outputs(&closed, &args.out, "tally-adds-closed")?;
    load.rate = Some((closed.ok_rate_per_s / 2.0).max(1.0));
    load.seed = 2;
    let open = crate::load::load_http(&load)?;
    crate::load::common::write_outputs(&open, &args.out, "tally-adds-open")?;
    drop(server);
    let mut text = String::from(
        "## tally: POST /tally/accounts/{name}/entries (10,000 accounts, idempotency keys)\n\n",
    );
    text += &load_table(&[
        ("closed loop", &closed, "tally-adds-closed"),
        ("open loop", &open, "tally-adds-open"),
    ]);
    Ok(text)
}

/// A Markdown table of load runs: `(label, report, chart file stem)`.
pub fn load_table(rows: &[(&str, &spate_load::Report, &str)]) -> String {
    let mut text = String::from(
        "| run | connections | offered/s | achieved/s | errors | p50 | p90 | p99 | p99.9 | max | chart |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (label, report, stem) in rows {
        let l = &report.latency;
        let ms = |us: u64| format!("{:.2} ms", us as f64 / 1000.0);
        text += &format!(
            "| {label} | {} | {} | {:.0} | {:.3}% | {} | {} | {} | {} | {} | [svg]({stem}.svg) |\n",
            report.connections,
            report
                .offered_rate_per_s
                .map_or_else(|| "-".to_string(), |r| format!("{r:.0}")),
            report.achieved_rate_per_s,
            report.error_share * 100.0,
            ms(l.p50_us),
            ms(l.p90_us),
            ms(l.p99_us),
            ms(l.p999_us),
            ms(l.max_us),
        );
    }
    text
}

fn markdown(report: &Value) -> String {
    let mut text = format!(
        "## fraud: generator -> acknowledged stream -> scoring -> durable journal\n\n\
         - machine: {}\n- command: `{}`\n- history: {} cards x 20 generated in place in {:.1} s\n\n\
         | run | transactions | seconds | transactions/s | batch ack p50 | batch ack p99 | server CPU s | producer CPU s |\n\
         |---|---|---|---|---|---|---|---|\n",
        report["machine"].as_str().unwrap_or(""),
        report["command"].as_str().unwrap_or(""),
        report["cards"],
        report["history_load_seconds"].as_f64().unwrap_or(0.0),
    );
    for run in report["runs"].as_array().into_iter().flatten() {
        text += &format!(
            "| {} | {} | {:.2} | {:.0} | {:.1} ms | {:.1} ms | {:.2} | {:.2} |\n",
            run["run"],
            run["transactions"],
            run["seconds"].as_f64().unwrap_or(0.0),
            run["transactions_per_s"].as_f64().unwrap_or(0.0),
            run["ack_p50_us"].as_f64().unwrap_or(0.0) / 1000.0,
            run["ack_p99_us"].as_f64().unwrap_or(0.0) / 1000.0,
            run["server_cpu_s"].as_f64().unwrap_or(0.0),
            run["producer_cpu_s"].as_f64().unwrap_or(0.0),
        );
    }
    text += &format!(
        "\n- median: **{:.0} transactions/s**, {:.1}x the case study's own code on this machine ({:.0}/s, \
         seeds README)\n- memory: {:.1} bytes per stored transaction by server RSS ({} stored), {:.1} by the \
         history store's own count\n",
        report["median_transactions_per_s"].as_f64().unwrap_or(0.0),
        report["ratio_to_case_study"].as_f64().unwrap_or(0.0),
        report["case_study_transactions_per_s"]
            .as_f64()
            .unwrap_or(0.0),
        report["rss_bytes_per_stored_transaction"]
            .as_f64()
            .unwrap_or(0.0),
        report["stored_transactions"],
        report["history_bytes_per_stored_transaction"]
            .as_f64()
            .unwrap_or(0.0),
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_pause_is_read_from_a_scrape() {
        let scrape = "# HELP spate_apply_pause_max_seconds The longest ...\n\
            spate_apply_pause_max_seconds{partition=\"0\",cause=\"snapshot\"} 0.25\n\
            spate_apply_pause_max_seconds{partition=\"1\",cause=\"journal\"} 0.5\n\
            spate_apply_pause_seconds_sum{partition=\"1\",cause=\"journal\"} 9.0\n";
        assert_eq!(
            longest_pause(scrape, PAUSE_GAUGE),
            Some(Pause {
                seconds: 0.5,
                cause: "journal".into(),
                partition: "1".into()
            })
        );
        assert_eq!(longest_pause(scrape, PAUSE_CPU_GAUGE), None);
        let scrape =
            format!("{scrape}{PAUSE_CPU_GAUGE}{{partition=\"0\",cause=\"snapshot\"}} 0.125\n");
        assert_eq!(
            longest_pause(&scrape, PAUSE_CPU_GAUGE).map(|p| p.seconds),
            Some(0.125)
        );
        assert_eq!(
            longest_pause("spate_commands_applied_total 3\n", PAUSE_GAUGE),
            None
        );
    }
}
