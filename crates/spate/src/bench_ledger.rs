//! `spate bench ledger`: the Mojaloop PoC's own measure on a fresh server: simulated FSPs doing prepare
//! then fulfil over HTTP, reported as the seed's tables do (financial transfers/s, average, minimum,
//! maximum and p99 response time, share of responses over 1 s).

use crate::bench::{BenchArgs, cpu_seconds, get_json, start_server};
use crate::load_cli::{LoadArgs, load_http, write_outputs};
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct LedgerBench {
    /// ledger: numbers of simulated FSPs, one run each (the PoC's tables used 8, 16 and 32)
    #[arg(long, value_delimiter = ',', default_values_t = [8u32, 16, 32])]
    ledger_participants: Vec<u32>,
    /// ledger: closed-loop connections of each run
    #[arg(long, default_value_t = 64)]
    ledger_connections: u32,
    /// ledger: batch runs as CONNECTIONSxOPERATIONS (TigerBeetle-style batches of 8,000 from a few
    /// clients, and many clients with small batches)
    #[arg(long, value_delimiter = ',', default_values_t = ["4x8000".to_string(), "64x100".to_string(), "64x10".to_string()])]
    ledger_batches: Vec<String>,
    /// ledger: server partition counts, a fresh server and every run above for each (with one, every
    /// step of a transfer is local and shares its group commit)
    #[arg(long, value_delimiter = ',', default_values_t = [1u16, 2])]
    ledger_partitions: Vec<u16>,
}

/// `GET /participants`: the transfers in each state and the positions' sum, from the read model once it
/// has caught up.
fn ledger_totals(base: &str) -> anyhow::Result<serde_json::Value> {
    let url = format!("{base}/participants");
    for _ in 0..1000 {
        let totals = get_json(&url)?;
        if totals["lagRecords"] == 0 {
            return Ok(totals);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    anyhow::bail!("the ledger read model did not catch up within 10 s")
}

/// The PoC's best figure: financial transfers (prepare + fulfil) per second on its cluster.
const POC_TRANSFERS_PER_S: f64 = 6_020.0;

/// Parses `--ledger-batches` shapes: `CONNECTIONSxOPERATIONS`.
fn batch_shape(shape: &str) -> anyhow::Result<(u32, usize)> {
    shape
        .split_once('x')
        .and_then(|(c, b)| Some((c.parse::<u32>().ok()?, b.parse::<usize>().ok()?)))
        .ok_or_else(|| {
            anyhow::anyhow!("--ledger-batches takes CONNECTIONSxOPERATIONS, got {shape:?}")
        })
}

pub fn run(args: &BenchArgs) -> anyhow::Result<String> {
    let settings = &args.ledger;
    let shapes = settings
        .ledger_batches
        .iter()
        .map(|shape| batch_shape(shape))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut seed_rows = String::new();
    let mut batch_rows = String::new();
    let mut runs = Vec::new();
    let mut batch_runs = Vec::new();
    for &partitions in &settings.ledger_partitions {
        let data_dir = tempfile::tempdir()?;
        let server = start_server(data_dir.path(), "ledger", Some(partitions))?;
        for &participants in &settings.ledger_participants {
            let mut load = LoadArgs::new("ledger", "transfers", &server.http);
            load.participants = participants;
            load.connections = settings.ledger_connections;
            load.duration_s = args.duration_s;
            load.seed = u64::from(participants);
            eprintln!("ledger: {participants} FSPs, {partitions} partitions ...");
            let cpu_before = cpu_seconds(server.pid())?;
            let report = load_http(&load)?;
            let cpu_s = cpu_seconds(server.pid())? - cpu_before;
            let stem = format!("ledger-transfers-{participants}-p{partitions}");
            write_outputs(&report, &args.out, &stem)?;
            let transfers_per_s = report.ok_rate_per_s / 2.0;
            let requests = report.achieved_rate_per_s * (report.measured_seconds + load.warmup_s);
            let cpu_us_per_transfer = cpu_s * 1e6 / (requests / 2.0);
            let l = &report.latency;
            let ms = |us: f64| format!("{:.2} ms", us / 1000.0);
            seed_rows += &format!(
                "| {participants} | {partitions} | {transfers_per_s:.0} | {:.0} | {} | {} | {} | {} | {:.3}% | {:.3}% | {cpu_us_per_transfer:.0} µs |\n",
                report.achieved_rate_per_s,
                ms(l.mean_us),
                ms(l.min_us as f64),
                ms(l.max_us as f64),
                ms(l.p99_us as f64),
                report.over_1s_share * 100.0,
                report.error_share * 100.0,
            );
            runs.push(json!({
                "participants": participants, "partitions": partitions,
                "transfers_per_s": transfers_per_s,
                "mean_us": l.mean_us, "min_us": l.min_us, "max_us": l.max_us, "p99_us": l.p99_us,
                "over_1s_share": report.over_1s_share, "error_share": report.error_share,
                "server_cpu_us_per_transfer": cpu_us_per_transfer,
            }));
        }
        for &(connections, batch) in &shapes {
            let before = ledger_totals(&server.http)?;
            let mut load = LoadArgs::new("ledger", "batch", &server.http);
            load.participants = 16;
            load.connections = connections;
            load.batch = batch;
            load.duration_s = args.duration_s;
            load.seed = 1_000 + batch as u64;
            eprintln!(
                "ledger: batches of {batch} on {connections} connections, {partitions} partitions ..."
            );
            let cpu_before = cpu_seconds(server.pid())?;
            let report = load_http(&load)?;
            let cpu_s = cpu_seconds(server.pid())? - cpu_before;
            write_outputs(
                &report,
                &args.out,
                &format!("ledger-batch-{connections}x{batch}-p{partitions}"),
            )?;
            let after = ledger_totals(&server.http)?;
            let aborted = after["transfers"]["ABORTED"].as_u64().unwrap_or(0)
                - before["transfers"]["ABORTED"].as_u64().unwrap_or(0);
            let transfers_per_s = report.ok_rate_per_s * batch as f64 / 2.0;
            let requests = report.achieved_rate_per_s * (report.measured_seconds + load.warmup_s);
            let cpu_us_per_transfer = cpu_s * 1e6 / (requests * batch as f64 / 2.0);
            batch_rows += &format!(
                "| {connections} x {batch} | {partitions} | {transfers_per_s:.0} | {:.2} ms | {:.2} ms | {:.3}% | {cpu_us_per_transfer:.1} µs | {aborted} | {} |\n",
                report.latency.p50_us as f64 / 1000.0,
                report.latency.p99_us as f64 / 1000.0,
                report.error_share * 100.0,
                after["positionSums"]["USD"].as_str().unwrap_or("?"),
            );
            batch_runs.push(json!({
                "connections": connections, "batch": batch, "partitions": partitions,
                "transfers_per_s": transfers_per_s, "p99_us": report.latency.p99_us,
                "error_share": report.error_share, "aborted": aborted,
                "server_cpu_us_per_transfer": cpu_us_per_transfer,
            }));
        }
    }
    let best = runs
        .iter()
        .filter_map(|r| r["transfers_per_s"].as_f64())
        .fold(0.0, f64::max);
    let text = format!(
        "## ledger: prepare then fulfil between simulated FSPs (the Mojaloop PoC's measure)\n\n\
         Each connection prepares a transfer (`POST /transfers`, answered once the payer's reservation is \
         settled) and then fulfils it as the payee (`PUT /transfers/{{id}}`), closed loop, {} connections; \
         a financial transfer is both requests. Response times are per request.\n\n\
         | FSPs | partitions | financial transfers/s | requests/s | avg | min | max | p99 | over 1 s | errors | server CPU per transfer |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n\
         {seed_rows}\n\
         - best: {best:.0} financial transfers/s, {:.1}x the PoC's {POC_TRANSFERS_PER_S:.0}/s\n\n\
         The batch API (`POST /transfers/batch`): each connection sends a batch of prepares, then a batch \
         fulfilling the same transfers. A transfer counts once, as in TigerBeetle's figures. The last two columns \
         come from the read model after each run: the transfers aborted during it, and the positions' sum.\n\n\
         | connections x operations | partitions | transfers/s | batch p50 | batch p99 | errors | server CPU per transfer | aborted during the run | positions sum |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n\
         {batch_rows}",
        settings.ledger_connections,
        best / POC_TRANSFERS_PER_S
    );
    std::fs::write(
        args.out.join("ledger.json"),
        serde_json::to_string_pretty(&json!({
            "benchmark": "ledger", "runs": runs, "batch_runs": batch_runs,
            "poc_transfers_per_s": POC_TRANSFERS_PER_S,
        }))?,
    )?;
    Ok(text)
}
