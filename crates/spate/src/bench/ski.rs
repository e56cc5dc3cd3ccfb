//! `spate bench ski`: the seed's client scenario against a fresh server, with the consumer's lag.
//!
//! 1. For each total (200,000 and 500,000 by default): 32 connections x 1,000 POSTs, then the rest with
//!    168 connections, closed loop, as the course's client ran them (each connection one client thread).
//!    Throughput is the total over the wall time of both phases, as the seed's client reported it.
//! 2. Open loop at shares of the 168-connection rate, so latency is measured at a fixed offered load,
//!    over the same 168 connections (each request goes out on whichever is free).
//! 3. Queries (the seed's four questions and the spec's GETs) in open loop while POSTs run in closed
//!    loop over 32 connections (the seed's first phase) and over 168; and queries alone.
//!
//! Throughout, a sampler polls `GET /ski/lag` for the projection's lag (durable rides not yet in the read
//! model) and the requests queued before the partitions; after each run it times how long the lag takes
//! to reach zero.

use super::args::BenchArgs;
use super::common::{CpuMeter, CpuPerRequest, cpu_seconds, get_json, load_table, start_server};
use crate::load::args::LoadArgs;
use crate::load::common::write_outputs;
use crate::load::load_http;
use serde_json::json;
use spate_load::Report;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The seed's first phase: 32 threads, 1,000 POSTs each.
const FIRST_PHASE_CONNECTIONS: u32 = 32;
const FIRST_PHASE_REQUESTS: u64 = 32_000;
/// Shares of the closed-loop rate offered in the open-loop runs.
const OPEN_LOOP_SHARES: [f64; 2] = [0.5, 0.8];
/// Connections of the query runs.
const QUERY_CONNECTIONS: u32 = 16;

/// The largest lag and queue seen by polling `GET /ski/lag` while a run goes on.
struct LagSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64)>,
}

impl LagSampler {
    fn start(base: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let url = format!("{base}/ski/lag");
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut lag_max, mut queued_max) = (0, 0);
            while !stopping.load(Ordering::Relaxed) {
                if let Ok(lag) = get_json(&url) {
                    lag_max = lag_max.max(lag["lagRecords"].as_u64().unwrap_or(0));
                    queued_max = queued_max.max(lag["queuedRequests"].as_u64().unwrap_or(0));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (lag_max, queued_max)
        });
        Self { stop, thread }
    }

    /// Stops sampling; returns the largest lag and queue seen, and the milliseconds the lag then took to
    /// reach zero.
    fn finish(self, base: &str) -> anyhow::Result<(u64, u64, f64)> {
        let stopped = Instant::now();
        let url = format!("{base}/ski/lag");
        while get_json(&url)?["lagRecords"].as_u64() != Some(0) {
            if stopped.elapsed() > Duration::from_secs(60) {
                anyhow::bail!("the ski projection still lags 60 s after the load stopped");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let drain_ms = stopped.elapsed().as_secs_f64() * 1000.0;
        self.stop.store(true, Ordering::Relaxed);
        let (lag_max, queued_max) = self.thread.join().expect("the lag sampler does not panic");
        Ok((lag_max, queued_max, drain_ms))
    }
}

struct SeedRun {
    total: u64,
    first: Report,
    second: Report,
    lag_max: u64,
    queued_max: u64,
    drain_ms: f64,
    server_cpu_us_per_post: f64,
}

impl SeedRun {
    fn wall_s(&self) -> f64 {
        self.first.measured_seconds + self.second.measured_seconds
    }

    fn failures(&self) -> u64 {
        self.first.requests - self.first.ok + self.second.requests - self.second.ok
    }
}

fn rides(base: &str, connections: u32, seed: u64) -> LoadArgs {
    let mut load = LoadArgs::new("ski", "rides", base);
    load.connections = connections;
    load.seed = seed;
    load
}

fn seed_run(
    base: &str,
    server_pid: u32,
    total: u64,
    connections: u32,
    out: &Path,
) -> anyhow::Result<SeedRun> {
    anyhow::ensure!(
        total > FIRST_PHASE_REQUESTS,
        "--ski-totals must exceed {FIRST_PHASE_REQUESTS}"
    );
    let cpu_before = cpu_seconds(server_pid)?;
    let sampler = LagSampler::start(base);
    let mut first = rides(base, FIRST_PHASE_CONNECTIONS, total);
    first.requests = Some(FIRST_PHASE_REQUESTS);
    first.warmup_s = 0.0;
    eprintln!("ski {total}: {FIRST_PHASE_CONNECTIONS} x 1000 ...");
    let first = load_http(&first)?;
    let mut second = rides(base, connections, total + 1);
    second.requests = Some(total - FIRST_PHASE_REQUESTS);
    second.warmup_s = 0.0;
    eprintln!("ski {total}: the rest with {connections} connections ...");
    let second = load_http(&second)?;
    let (lag_max, queued_max, drain_ms) = sampler.finish(base)?;
    let server_cpu_us_per_post = (cpu_seconds(server_pid)? - cpu_before) * 1e6 / total as f64;
    write_outputs(&first, out, &format!("ski-{total}-first"))?;
    write_outputs(&second, out, &format!("ski-{total}-second"))?;
    Ok(SeedRun {
        total,
        first,
        second,
        lag_max,
        queued_max,
        drain_ms,
        server_cpu_us_per_post,
    })
}

/// Runs `load` with the lag sampler; returns the report, the largest lag and queue, and the drain time.
fn sampled_run(
    base: &str,
    load: &LoadArgs,
    stem: &str,
    out: &Path,
) -> anyhow::Result<(Report, u64, u64, f64)> {
    eprintln!("{stem} ...");
    let sampler = LagSampler::start(base);
    let report = load_http(load)?;
    let (lag_max, queued_max, drain_ms) = sampler.finish(base)?;
    write_outputs(&report, out, stem)?;
    Ok((report, lag_max, queued_max, drain_ms))
}

/// A run of POSTs in open loop at `share` of the closed loop's peak.
struct OpenRun {
    share: f64,
    report: Report,
    stem: String,
    lag_max: u64,
    queued_max: u64,
    drain_ms: f64,
    cpu: CpuPerRequest,
}

/// Queries in open loop while `writes` POST rides.
struct MixedRun {
    label: &'static str,
    stem: &'static str,
    writes: Report,
    queries: Report,
    lag_max: u64,
    drain_ms: f64,
}

fn mixed_run(
    base: &str,
    label: &'static str,
    stem: &'static str,
    writes: &LoadArgs,
    queries: &LoadArgs,
    out: &Path,
) -> anyhow::Result<MixedRun> {
    eprintln!("ski queries while POSTs run {label} ...");
    let sampler = LagSampler::start(base);
    let (query_report, write_report) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| load_http(writes));
        let queries = load_http(queries);
        (
            queries,
            writer.join().expect("the POST load does not panic"),
        )
    });
    let (queries, writes) = (query_report?, write_report?);
    let (lag_max, _, drain_ms) = sampler.finish(base)?;
    write_outputs(&writes, out, &format!("{stem}-posts"))?;
    write_outputs(&queries, out, &format!("{stem}-queries"))?;
    Ok(MixedRun {
        label,
        stem,
        writes,
        queries,
        lag_max,
        drain_ms,
    })
}

pub fn run(args: &BenchArgs) -> anyhow::Result<String> {
    let settings = &args.ski;
    let out = &args.out;
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "ski", args.fraud.partitions)?;
    let base = server.http.clone();

    let mut seed_runs = Vec::new();
    for &total in &settings.ski_totals {
        seed_runs.push(seed_run(
            &base,
            server.pid(),
            total,
            settings.ski_connections,
            out,
        )?);
    }
    let peak = seed_runs
        .iter()
        .map(|r| r.second.ok_rate_per_s)
        .fold(0.0, f64::max);

    let mut open = Vec::new();
    for (run, share) in OPEN_LOOP_SHARES.into_iter().enumerate() {
        let mut load = rides(&base, settings.ski_connections, 100 + run as u64);
        load.rate = Some(peak * share);
        load.duration_s = args.duration_s;
        let stem = format!("ski-rides-open-{:.0}", share * 100.0);
        let meter = CpuMeter::start(server.pid())?;
        let (report, lag_max, queued_max, drain_ms) = sampled_run(&base, &load, &stem, out)?;
        let cpu = meter.per_request(&report, load.warmup_s)?;
        open.push(OpenRun {
            share,
            report,
            stem,
            lag_max,
            queued_max,
            drain_ms,
            cpu,
        });
    }

    let mut queries = LoadArgs::new("ski", "queries", &base);
    queries.connections = QUERY_CONNECTIONS;
    queries.duration_s = args.duration_s;
    queries.rate = Some(settings.ski_query_rate);
    let mut mixed = Vec::new();
    for (label, stem, connections, seed) in [
        (
            "over 32 connections",
            "ski-mixed-32",
            FIRST_PHASE_CONNECTIONS,
            200,
        ),
        (
            "over 168 connections",
            "ski-mixed-168",
            settings.ski_connections,
            300,
        ),
    ] {
        let mut writes = rides(&base, connections, seed);
        writes.duration_s = args.duration_s;
        queries.seed = seed;
        mixed.push(mixed_run(&base, label, stem, &writes, &queries, out)?);
    }
    let mut alone = queries.clone();
    alone.rate = None;
    let queries_alone = load_http(&alone)?;
    write_outputs(&queries_alone, out, "ski-queries-closed")?;
    let rides_stored = get_json(&format!("{base}/ski/lag"))?["rides"].clone();
    drop(server);

    let mut text = format!(
        "## ski: lift rides POSTed as the course's client does, and the seed's questions\n\n\
         `POST /skiers/{{resortID}}/seasons/2022/days/1/skiers/{{skierID}}` with `{{\"time\", \"liftID\"}}` (resort 1-10, \
         skier 1-100,000, lift 1-40, time 1-360), 201 once durable. Each total runs as {FIRST_PHASE_CONNECTIONS} \
         connections x 1,000 POSTs, then the rest with {} connections (closed loop, one server throughout; \
         rides in the read model at the end: {rides_stored}).\n\n\
         | total POSTs | wall s | POSTs/s | failures | phase 2 p50 | p99 | max | max lag (rides) | max queued | lag to zero | server CPU per POST |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        settings.ski_connections,
    );
    let ms = |us: u64| format!("{:.2} ms", us as f64 / 1000.0);
    for run in &seed_runs {
        text += &format!(
            "| {} | {:.2} | {:.0} | {} | {} | {} | {} | {} | {} | {:.0} ms | {:.0} µs |\n",
            run.total,
            run.wall_s(),
            run.total as f64 / run.wall_s(),
            run.failures(),
            ms(run.second.latency.p50_us),
            ms(run.second.latency.p99_us),
            ms(run.second.latency.max_us),
            run.lag_max,
            run.queued_max,
            run.drain_ms,
            run.server_cpu_us_per_post,
        );
    }
    text += "\nEvery run, including the open-loop runs and the queries under write load:\n\n";
    let mut rows: Vec<(String, &Report, String)> = Vec::new();
    for run in &seed_runs {
        rows.push((
            format!("{} total: 32 x 1,000", run.total),
            &run.first,
            format!("ski-{}-first", run.total),
        ));
        rows.push((
            format!("{} total: the rest", run.total),
            &run.second,
            format!("ski-{}-second", run.total),
        ));
    }
    for run in &open {
        rows.push((
            format!("POSTs, open loop at {:.0}% of peak", run.share * 100.0),
            &run.report,
            run.stem.clone(),
        ));
    }
    for run in &mixed {
        rows.push((
            format!("POSTs {} (closed loop), with queries", run.label),
            &run.writes,
            format!("{}-posts", run.stem),
        ));
        rows.push((
            format!("queries while POSTs run {}", run.label),
            &run.queries,
            format!("{}-queries", run.stem),
        ));
    }
    rows.push((
        "queries alone (closed loop)".into(),
        &queries_alone,
        "ski-queries-closed".into(),
    ));
    let table_rows: Vec<(&str, &Report, &str)> = rows
        .iter()
        .map(|(l, r, s)| (l.as_str(), *r, s.as_str()))
        .collect();
    text += &load_table(&table_rows);
    text += "\n";
    for run in &open {
        text += &format!(
            "- open loop at {:.0}% of peak: {:.0} POSTs/s, p99 {}, max lag {} rides, max queued {}, \
             lag to zero {:.0} ms; {}\n",
            run.share * 100.0,
            run.report.ok_rate_per_s,
            ms(run.report.latency.p99_us),
            run.lag_max,
            run.queued_max,
            run.drain_ms,
            run.cpu.describe(),
        );
    }
    for run in &mixed {
        text += &format!(
            "- queries while POSTs run {}: p99 {} at {:.0}/s offered, POSTs at {:.0}/s; max lag {} rides, \
             lag to zero {:.0} ms after both stopped\n",
            run.label,
            ms(run.queries.latency.p99_us),
            settings.ski_query_rate,
            run.writes.ok_rate_per_s,
            run.lag_max,
            run.drain_ms,
        );
    }
    let summary = json!({
        "benchmark": "ski",
        "seed_runs": seed_runs.iter().map(|r| json!({
            "total": r.total, "wall_s": r.wall_s(), "posts_per_s": r.total as f64 / r.wall_s(),
            "failures": r.failures(), "p50_us": r.second.latency.p50_us, "p99_us": r.second.latency.p99_us,
            "max_us": r.second.latency.max_us, "lag_max_records": r.lag_max, "queued_max": r.queued_max,
            "lag_to_zero_ms": r.drain_ms, "server_cpu_us_per_post": r.server_cpu_us_per_post,
        })).collect::<Vec<_>>(),
        "open_loop": open.iter().map(|run| json!({
            "share_of_peak": run.share, "posts_per_s": run.report.ok_rate_per_s,
            "p99_us": run.report.latency.p99_us, "lag_max_records": run.lag_max,
            "lag_to_zero_ms": run.drain_ms, "server_cpu_us_per_post": run.cpu.server_us,
            "generator_cpu_us_per_post": run.cpu.generator_us,
        })).collect::<Vec<_>>(),
        "queries_under_load": mixed.iter().map(|m| json!({
            "posts": m.label, "posts_per_s": m.writes.ok_rate_per_s, "query_p99_us": m.queries.latency.p99_us,
            "lag_max_records": m.lag_max, "lag_to_zero_ms": m.drain_ms,
        })).collect::<Vec<_>>(),
    });
    std::fs::write(
        out.join("ski.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    Ok(text)
}
