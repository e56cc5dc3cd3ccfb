//! `spate bench payments`: authorizations over HTTP (fraud scoring, tax, card encryption and the durable
//! journal on every one), in closed loop to find the peak and in open loop at a share of it for latency;
//! the authorize/capture/refund mix; and settlement of a large spool of pending captures into files, on a
//! server of its own so the spool holds exactly the captures the benchmark made.

use super::args::BenchArgs;
use super::common::{CpuMeter, load_table, start_server};
use crate::load::args::LoadArgs;
use crate::load::common::write_outputs;
use crate::load::load_http;
use serde_json::{Value, json};
use std::time::Instant;

/// The seed's figure after its work: 500 transactions/s.
const SEED_PER_S: f64 = 500.0;
/// Connections of the mix run.
const MIX_CONNECTIONS: u32 = 32;

fn settle(base: &str) -> anyhow::Result<Value> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(3600)))
        .build()
        .into();
    Ok(agent
        .post(format!("{base}/admin/settlements"))
        .send_empty()?
        .body_mut()
        .read_json()?)
}

pub fn run(args: &BenchArgs) -> anyhow::Result<String> {
    let settings = &args.payments;
    if settings.payments_runs == 0 {
        anyhow::bail!("--payments-runs must be at least 1");
    }
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "payments", args.fraud.partitions)?;
    let mut rows = Vec::new();
    let mut rates = Vec::new();
    let mut cpu_us = Vec::new();
    for run in 0..settings.payments_runs {
        let mut load = LoadArgs::new("payments", "authorize", &server.http);
        load.connections = settings.payments_connections;
        load.duration_s = args.duration_s;
        load.cards = 1_000_000;
        load.seed = run as u64 + 1;
        eprintln!("payments: authorizations, run {run} ...");
        let meter = CpuMeter::start(server.pid())?;
        let report = load_http(&load)?;
        cpu_us.push(meter.per_request(&report, load.warmup_s)?.server_us);
        rates.push(report.ok_rate_per_s);
        let stem = format!("payments-authorize-{run}");
        write_outputs(&report, &args.out, &stem)?;
        rows.push((format!("closed loop, run {run}"), report, stem));
    }
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let mut open_cpu = Vec::new();
    for (index, share) in settings.payments_open_shares.iter().enumerate() {
        let mut open = LoadArgs::new("payments", "authorize", &server.http);
        open.connections = settings.payments_connections;
        open.duration_s = args.duration_s;
        open.cards = 1_000_000;
        open.seed = 100 + index as u64;
        open.rate = Some((median * share).max(1.0));
        eprintln!(
            "payments: open loop at {:.0}/s ...",
            open.rate.unwrap_or(0.0)
        );
        let meter = CpuMeter::start(server.pid())?;
        let report = load_http(&open)?;
        open_cpu.push((share, meter.per_request(&report, open.warmup_s)?));
        let stem = format!("payments-authorize-open-{:.0}", share * 100.0);
        write_outputs(&report, &args.out, &stem)?;
        rows.push((
            format!("open loop at {:.0}% of the median", share * 100.0),
            report,
            stem,
        ));
    }

    let mut mix = LoadArgs::new("payments", "mix", &server.http);
    mix.connections = MIX_CONNECTIONS;
    mix.duration_s = args.duration_s;
    mix.cards = 1_000_000;
    mix.participants = 2_000;
    mix.seed = 200;
    eprintln!("payments: mix ...");
    let mix_report = load_http(&mix)?;
    write_outputs(&mix_report, &args.out, "payments-mix")?;
    rows.push((
        "mix: 70% authorize, 20% capture, 10% refund".into(),
        mix_report,
        "payments-mix".into(),
    ));
    drop(server);

    // Settlement on a server of its own.
    let settle_dir = tempfile::tempdir()?;
    let server = start_server(settle_dir.path(), "payments", args.fraud.partitions)?;
    let mut spool = LoadArgs::new("payments", "authorize-capture", &server.http);
    spool.connections = settings.payments_connections;
    spool.requests = Some(settings.payments_settle_captures);
    spool.warmup_s = 0.0;
    spool.cards = 100_000_000;
    spool.seed = 300;
    eprintln!(
        "payments: spooling {} captures ...",
        settings.payments_settle_captures
    );
    let spooled = load_http(&spool)?;
    eprintln!("payments: settling ...");
    let started = Instant::now();
    let settled = settle(&server.http)?;
    let settle_s = started.elapsed().as_secs_f64();
    drop(server);
    let batch = &settled["batches"][0];
    let files = batch["files"].as_array().cloned().unwrap_or_default();
    let records: u64 = files.iter().filter_map(|f| f["records"].as_u64()).sum();
    let captures = batch["captures"].as_u64().unwrap_or(0);
    if records != captures {
        anyhow::bail!("settlement wrote {records} records for {captures} captures");
    }
    // Every answered authorization was either captured at once or declined (402).
    let declined = spooled.ok.saturating_sub(captures);

    let refs: Vec<(&str, &spate_load::Report, &str)> = rows
        .iter()
        .map(|(label, report, stem)| (label.as_str(), report, stem.as_str()))
        .collect();
    let mut cpu_sorted = cpu_us.clone();
    cpu_sorted.sort_by(f64::total_cmp);
    let mut text = format!(
        "## payments: authorizations with fraud scoring, tax, card encryption and a durable journal\n\n\
         Each authorization is one `POST /v1/payments` with an Idempotency-Key, cards drawn from 1,000,000, \
         the built-in merchants and tax lines in turn; a decline (402) is an answer. Closed loop on {} \
         connections, {} runs, then open loop on as many; the mix closed loop on {MIX_CONNECTIONS}.\n\n{}\n\
         - median: **{median:.0} authorizations/s**, {:.0}x the seed's {SEED_PER_S:.0}/s; server CPU {:.0} µs \
         per authorization (median of the runs)\n",
        settings.payments_connections,
        settings.payments_runs,
        load_table(&refs),
        median / SEED_PER_S,
        cpu_sorted[cpu_sorted.len() / 2],
    );
    for (share, cpu) in &open_cpu {
        text += &format!(
            "- open loop at {:.0}% of the median: {}\n",
            *share * 100.0,
            cpu.describe()
        );
    }
    text += &format!(
        "\n### Settlement\n\n{} authorizations with `capture_method: automatic` ({declined} declined by the \
         fraud rules), then one `POST /admin/settlements`: **{captures} captures into {} files in {settle_s:.2} s** \
         ({:.0} captures/s; the count of detail records equals the captures)\n",
        settings.payments_settle_captures,
        files.len(),
        captures as f64 / settle_s
    );
    std::fs::write(
        args.out.join("payments.json"),
        serde_json::to_string_pretty(&json!({
            "benchmark": "payments",
            "authorizations_per_s": rates,
            "median_authorizations_per_s": median,
            "server_cpu_us_per_authorization": cpu_us,
            "open_loop_cpu_us_per_authorization": open_cpu.iter().map(|(share, cpu)| json!({
                "share_of_median": share, "server": cpu.server_us, "load_generator": cpu.generator_us,
            })).collect::<Vec<_>>(),
            "settlement": {"captures": captures, "files": files.len(), "seconds": settle_s, "declined": declined},
        }))?,
    )?;
    Ok(text)
}
