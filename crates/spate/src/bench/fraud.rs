//! `spate bench fraud`: loads the case study's history in place, then runs the generator -> acknowledged
//! stream -> scoring -> durable journal pipeline several times (generator included, in its own process).

use super::args::FraudBench;
use super::common::{cpu_seconds, get_json, machine, median, rss_bytes, start_server, utc_date};
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The case study's own code on this machine with its history restored (seeds README): the peer figure.
const CASE_STUDY_TPS: f64 = 48_700.0;

fn post_json(url: &str, body: &Value) -> anyhow::Result<Value> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(3600)))
        .build()
        .into();
    Ok(agent.post(url).send_json(body)?.body_mut().read_json()?)
}

pub fn run(args: &FraudBench, out: &std::path::Path) -> anyhow::Result<String> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let started_at = crate::clock::wall_ms();
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "fraud", args.partitions)?;
    let server_pid = server.pid();
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
