//! `spate bench ledger`: the Mojaloop PoC's own measure on a fresh server: simulated FSPs doing prepare
//! then fulfil over HTTP, reported as the seed's tables do (financial transfers/s, average, minimum,
//! maximum and p99 response time, share of responses over 1 s).

use super::args::BenchArgs;
use super::common::{cpu_seconds, get_json, start_server};
use crate::load::args::LoadArgs;
use crate::load::common::write_outputs;
use crate::load::load_http;
use anyhow::Context;
use serde_json::json;
use spate_load::Series;

/// Operations per request of the paced batch load of `--ledger-history-write-rate`: small enough that
/// no request holds a core for long.
const PACED_BATCH: usize = 100;

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
    if settings.ledger_soak_s > 0.0 {
        return soak(args);
    }
    if settings.ledger_history > 0 {
        return history(args);
    }
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
        let capacity_run = (settings.ledger_capacity_connections > 0)
            .then_some((16, settings.ledger_capacity_connections));
        let shapes_of_transfers = (settings.ledger_participants.iter())
            .map(|&participants| (participants, settings.ledger_connections))
            .chain(capacity_run);
        for (participants, connections) in shapes_of_transfers {
            let mut load = LoadArgs::new("ledger", "transfers", &server.http);
            load.participants = participants;
            load.connections = connections;
            load.duration_s = args.duration_s;
            load.seed = u64::from(participants);
            eprintln!(
                "ledger: {participants} FSPs, {connections} connections, {partitions} partitions ..."
            );
            let cpu_before = cpu_seconds(server.pid())?;
            let report = load_http(&load)?;
            let cpu_s = cpu_seconds(server.pid())? - cpu_before;
            let stem = format!("ledger-transfers-{participants}-c{connections}-p{partitions}");
            write_outputs(&report, &args.out, &stem)?;
            let transfers_per_s = report.ok_rate_per_s / 2.0;
            let requests = report.achieved_rate_per_s * (report.measured_seconds + load.warmup_s);
            let cpu_us_per_transfer = cpu_s * 1e6 / (requests / 2.0);
            let l = &report.latency;
            let ms = |us: f64| format!("{:.2} ms", us / 1000.0);
            seed_rows += &format!(
                "| {participants} | {connections} | {partitions} | {transfers_per_s:.0} | {:.0} | {} | {} | {} | {} | {:.3}% | {:.3}% | {cpu_us_per_transfer:.0} µs |\n",
                report.achieved_rate_per_s,
                ms(l.mean_us),
                ms(l.min_us as f64),
                ms(l.max_us as f64),
                ms(l.p99_us as f64),
                report.over_1s_share * 100.0,
                report.error_share * 100.0,
            );
            runs.push(json!({
                "participants": participants, "connections": connections, "partitions": partitions,
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
        .max_by(|a, b| a["transfers_per_s"].as_f64().partial_cmp(&b["transfers_per_s"].as_f64()).expect("rates are numbers"))
        .map_or_else(
            || "no run".to_string(),
            |run| {
                format!(
                    "{:.0} financial transfers/s ({} connections, {} partitions, p99 {:.2} ms), {:.1}x the PoC's {POC_TRANSFERS_PER_S:.0}/s",
                    run["transfers_per_s"].as_f64().unwrap_or(0.0),
                    run["connections"],
                    run["partitions"],
                    run["p99_us"].as_f64().unwrap_or(0.0) / 1000.0,
                    run["transfers_per_s"].as_f64().unwrap_or(0.0) / POC_TRANSFERS_PER_S,
                )
            },
        );
    let text = format!(
        "## ledger: prepare then fulfil between simulated FSPs (the Mojaloop PoC's measure)\n\n\
         Each connection prepares a transfer (`POST /transfers`, answered once the payer's reservation is \
         settled) and then fulfils it as the payee (`PUT /transfers/{{id}}`), closed loop, {} connections \
         for each number of FSPs, then 16 FSPs from {} connections (0: not run), where a group commit \
         holds more requests; a financial transfer is both requests. Response times are per request.\n\n\
         | FSPs | connections | partitions | financial transfers/s | requests/s | avg | min | max | p99 | over 1 s | errors | server CPU per transfer |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n\
         {seed_rows}\n\
         - best: {best}\n\n\
         The batch API (`POST /transfers/batch`): each connection sends a batch of prepares, then a batch \
         fulfilling the same transfers. A transfer counts once, as in TigerBeetle's figures. The last two columns \
         come from the read model after each run: the transfers aborted during it, and the positions' sum.\n\n\
         | connections x operations | partitions | transfers/s | batch p50 | batch p99 | errors | server CPU per transfer | aborted during the run | positions sum |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n\
         {batch_rows}",
        settings.ledger_connections, settings.ledger_capacity_connections,
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

/// What the soak samples every [`SAMPLE_INTERVAL`].
struct Sample {
    elapsed_s: f64,
    rss_bytes: u64,
    archive_bytes: u64,
    data_bytes: u64,
}

const SAMPLE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Bytes a directory tree takes on disk (allocated blocks, so preallocated files count as used).
fn disk_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => disk_bytes(&entry.path()),
            Ok(meta) => meta.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Runs `run` while sampling the server `pid`'s memory and its data directory `dir` every
/// [`SAMPLE_INTERVAL`].
fn sampled<T>(pid: u32, dir: &std::path::Path, run: impl FnOnce() -> T) -> (T, Vec<Sample>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                samples.push(Sample {
                    elapsed_s: started.elapsed().as_secs_f64(),
                    rss_bytes: super::common::rss_bytes(pid).unwrap_or(0),
                    archive_bytes: disk_bytes(&dir.join("archive")),
                    data_bytes: disk_bytes(dir),
                });
                let next = started + SAMPLE_INTERVAL * samples.len() as u32;
                while std::time::Instant::now() < next && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
            }
            samples
        });
        let result = run();
        stop.store(true, Ordering::Relaxed);
        (result, sampler.join().expect("the sampler does not panic"))
    })
}

/// Writes `samples` as `<stem>.csv` and a chart, `<stem>.svg`.
fn write_samples(
    samples: &[Sample],
    out: &std::path::Path,
    stem: &str,
    title: &str,
) -> anyhow::Result<()> {
    let series = |value: fn(&Sample) -> u64| -> Vec<(f64, f64)> {
        samples
            .iter()
            .map(|s| (s.elapsed_s, mib(value(s))))
            .collect()
    };
    std::fs::write(
        out.join(format!("{stem}.svg")),
        spate_load::write_series_svg(
            &format!("{title}: server memory and disk"),
            "MiB",
            &[
                Series {
                    color: "steelblue",
                    name: "RSS",
                    points: series(|s| s.rss_bytes),
                },
                Series {
                    color: "darkorange",
                    name: "archive on disk",
                    points: series(|s| s.archive_bytes),
                },
                Series {
                    color: "gray",
                    name: "data directory on disk",
                    points: series(|s| s.data_bytes),
                },
            ],
        ),
    )?;
    let mut csv = String::from("elapsed_s,rss_bytes,archive_bytes,data_bytes\n");
    for s in samples {
        csv += &format!(
            "{:.0},{},{},{}\n",
            s.elapsed_s, s.rss_bytes, s.archive_bytes, s.data_bytes
        );
    }
    std::fs::write(out.join(format!("{stem}.csv")), csv)?;
    Ok(())
}

/// `--ledger-history`: stores many transfers, then reads old ones at random under write load.
fn history(args: &BenchArgs) -> anyhow::Result<String> {
    let settings = &args.ledger;
    let partitions = settings.ledger_partitions.first().copied().unwrap_or(1);
    let (writers, batch) = (4u32, 8_000u64);
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "ledger", Some(partitions))?;
    let batch_load = |seed: u64| {
        let mut load = LoadArgs::new("ledger", "batch", &server.http);
        (load.participants, load.connections) = (16, writers);
        (load.batch, load.seed) = (batch as usize, seed);
        load
    };
    let mut fill = batch_load(1);
    // Two requests per batch of transfers: the prepares, then the fulfils.
    fill.requests = Some(2 * settings.ledger_history.div_ceil(batch));
    eprintln!(
        "ledger history: storing {} transfers, {partitions} partitions ...",
        settings.ledger_history
    );
    let (filled, samples) = sampled(server.pid(), data_dir.path(), || load_http(&fill));
    let filled = filled?;
    write_outputs(&filled, &args.out, "ledger-history-fill")?;
    write_samples(
        &samples,
        &args.out,
        "ledger-history-memory",
        "ledger history",
    )?;
    let stored = ledger_totals(&server.http)?["transfers"]["COMMITTED"]
        .as_u64()
        .unwrap_or(0);
    let last = samples.last().context("no sample")?;
    // Closed-loop writers progress alike: half the mean share is written by every one of them.
    let per_writer = (stored / u64::from(writers) / 2).max(1);
    let old_reads = |http: &str| {
        let mut reads = LoadArgs::new("ledger", "reads", http);
        // The seed of the fill, whose transfers are read.
        (reads.participants, reads.seed) = (16, 1);
        (reads.written_by, reads.users) = (writers, per_writer);
        reads
    };
    // Reads under the batch load: as many as 4 connections get, then at a set rate; then at that rate
    // under a batch load held to a set rate of transfers.
    let read_rate = settings.ledger_history_read_rate;
    let write_rate = settings.ledger_history_write_rate;
    let mut read_runs = vec![(None, None), (Some(read_rate), None)];
    if write_rate > 0.0 {
        read_runs.push((Some(read_rate), Some(write_rate)));
    }
    let mut rows = String::new();
    for (round, (rate, write_rate)) in read_runs.into_iter().enumerate() {
        let mut writes = batch_load(2 + round as u64);
        writes.duration_s = args.duration_s;
        if let Some(transfers_per_s) = write_rate {
            // Each transfer is two operations: its prepare, then its fulfil.
            writes.rate = Some(transfers_per_s * 2.0 / PACED_BATCH as f64);
            writes.batch = PACED_BATCH;
        }
        let writes_batch = writes.batch as f64;
        let mut reads = old_reads(&server.http);
        reads.connections = if rate.is_some() { 32 } else { 4 };
        reads.duration_s = args.duration_s;
        reads.rate = rate;
        let shape = match (rate, write_rate) {
            (None, _) => "closed loop, 4 connections".to_string(),
            (Some(rate), None) => format!("open loop, {rate:.0}/s, 32 connections"),
            (Some(rate), Some(write_rate)) => format!(
                "open loop, {rate:.0}/s, 32 connections; writes held to {write_rate:.0} transfers/s \
                 in batches of {PACED_BATCH}"
            ),
        };
        eprintln!("ledger history: reads of old transfers under the batch load, {shape} ...");
        let (read_report, write_report) = std::thread::scope(|scope| {
            let writing = scope.spawn(|| load_http(&writes));
            let read_report = load_http(&reads);
            (
                read_report,
                writing.join().expect("the writer does not panic"),
            )
        });
        let (read_report, write_report) = (read_report?, write_report?);
        let name = match (rate, write_rate) {
            (None, _) => "ledger-history-reads",
            (Some(_), None) => "ledger-history-reads-open",
            (Some(_), Some(_)) => "ledger-history-reads-open-paced-writes",
        };
        write_outputs(&read_report, &args.out, name)?;
        let l = &read_report.latency;
        rows.push_str(&format!(
            "| {shape} | {:.0} | {:.2} ms | {:.2} ms | {:.1} ms | {:.3}% | {:.0} |\n",
            read_report.ok_rate_per_s,
            l.p50_us as f64 / 1000.0,
            l.p99_us as f64 / 1000.0,
            l.max_us as f64 / 1000.0,
            read_report.error_share * 100.0,
            write_report.ok_rate_per_s * writes_batch / 2.0,
        ));
    }
    let rss = super::common::rss_bytes(server.pid())?;
    // Restart to serving: from kill -9 to a server that listens (recovery is done by then), then
    // random old transfers read from it.
    server.kill9()?;
    eprintln!("ledger history: kill -9, then a restart ...");
    let restarting = std::time::Instant::now();
    let server = start_server(data_dir.path(), "ledger", Some(partitions))?;
    let restart_s = restarting.elapsed().as_secs_f64();
    let rss_restarted = super::common::rss_bytes(server.pid())?;
    let mut after = old_reads(&server.http);
    (after.requests, after.warmup_s) = (Some(10_000), 0.0);
    let after = load_http(&after)?;
    drop(server);
    Ok(format!(
        "## ledger history: {stored} transfers stored, then random old ones read under write load\n\n\
         Filled with the batch API ({writers} connections x {batch} operations, {partitions} partitions) in \
         {:.0} s ({:.0} transfers/s); then, for {:.0} s each, `GET /transfers/{{id}}` of random transfers \
         among the first half of each writer's while the same batch load goes on (in the last run, held \
         to a set rate in smaller batches). Memory and disk during the fill: `ledger-history-memory.svg` and `.csv`.\n\n\
         | stored | RSS after the fill / after the reads | archive on disk | per transfer | data directory |\n\
         |---:|---|---:|---:|---:|\n\
         | {stored} | {:.0} / {:.0} MiB | {:.0} MiB | {:.0} B | {:.0} MiB |\n\n\
         | reads | reads/s | p50 | p99 | max | errors | transfers/s meanwhile |\n\
         |---|---:|---:|---:|---:|---:|---:|\n\
         {rows}\n\
         Restart after kill -9: serving after **{restart_s:.1} s**, RSS {:.0} MiB; then {} random old \
         transfers read at {:.0}/s, p99 {:.2} ms, errors {:.3}%.\n\n",
        filled.measured_seconds,
        filled.ok_rate_per_s * batch as f64 / 2.0,
        args.duration_s,
        mib(last.rss_bytes),
        mib(rss),
        mib(last.archive_bytes),
        last.archive_bytes as f64 / stored.max(1) as f64,
        mib(last.data_bytes),
        mib(rss_restarted),
        after.requests,
        after.ok_rate_per_s,
        after.latency.p99_us as f64 / 1000.0,
        after.error_share * 100.0,
    ))
}

/// `--ledger-soak-s`: one long closed-loop run of single transfers, the server's memory and disk
/// sampled throughout.
fn soak(args: &BenchArgs) -> anyhow::Result<String> {
    let settings = &args.ledger;
    let partitions = settings.ledger_partitions.first().copied().unwrap_or(1);
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "ledger", Some(partitions))?;
    let mut load = LoadArgs::new("ledger", "transfers", &server.http);
    load.participants = 16;
    load.connections = settings.ledger_connections;
    load.duration_s = settings.ledger_soak_s;
    load.seed = 16;
    eprintln!(
        "ledger soak: {} s, {partitions} partitions ...",
        settings.ledger_soak_s
    );
    let (report, samples) = sampled(server.pid(), data_dir.path(), || load_http(&load));
    let report = report?;
    let totals = ledger_totals(&server.http)?;
    drop(server);
    write_outputs(&report, &args.out, "ledger-soak")?;
    write_samples(&samples, &args.out, "ledger-soak-memory", "ledger soak")?;
    let transfers_per_s = report.ok_rate_per_s / 2.0;
    let committed = totals["transfers"]["COMMITTED"].as_u64().unwrap_or(0);
    let rss_at = |fraction: f64| {
        let index = ((samples.len() as f64 - 1.0) * fraction).round() as usize;
        samples.get(index).map_or(0.0, |s| mib(s.rss_bytes))
    };
    let last = samples.last();
    let archive_bytes = last.map_or(0, |s| s.archive_bytes);
    let l = &report.latency;
    Ok(format!(
        "## ledger soak: prepare then fulfil for {:.0} s (the Mojaloop PoC's acceptance test)\n\n\
         16 FSPs, {} connections in closed loop, {partitions} partitions; a financial transfer is both \
         requests. Memory and disk sampled every {} s: `ledger-soak-memory.svg` and `.csv`.\n\n\
         | financial transfers/s | committed | p99 | max | over 1 s | errors | RSS at 10% / 50% / end | \
         archive on disk | per committed transfer |\n\
         |---:|---:|---:|---:|---:|---:|---|---:|---:|\n\
         | {transfers_per_s:.0} | {committed} | {:.2} ms | {:.0} ms | {:.3}% | {:.3}% | \
         {:.0} / {:.0} / {:.0} MiB | {:.0} MiB | {:.0} B |\n\n",
        settings.ledger_soak_s,
        settings.ledger_connections,
        SAMPLE_INTERVAL.as_secs(),
        l.p99_us as f64 / 1000.0,
        l.max_us as f64 / 1000.0,
        report.over_1s_share * 100.0,
        report.error_share * 100.0,
        rss_at(0.1),
        rss_at(0.5),
        rss_at(1.0),
        mib(archive_bytes),
        archive_bytes as f64 / committed.max(1) as f64,
    ))
}
