//! `spate bench leaderboard`: the case study's load test (100,000 users updating scores) against a fresh
//! server, and the same workload on Redis in the same run.
//!
//! 1. Closed loop at several connection counts: single-update requests (`PUT`, answering the new rank),
//!    to find the peak; then open loop at 50% and 80% of the peak (the latency target names 80%).
//! 2. The same for bulk requests (`--leaderboard-batch` updates each).
//! 3. Redis (when `redis-server` is installed; `scripts/bench-leaderboard.sh` installs it): ZINCRBY +
//!    ZREVRANK at the peak's connection count, and pipelines of ZINCRBY as the bulk peer. With
//!    `appendfsync always` (durable before the reply, like spate) in [`HEAD_TO_HEAD_ROUNDS`] rounds in
//!    turn with spate's single and bulk runs again, and the ratios quoted are of the medians: on a
//!    shared machine whose speed moves from minute to minute, one run of each, minutes apart, compared
//!    the minutes as much as the servers. Then once without persistence.

use super::args::BenchArgs;
use super::common::{cpu_seconds, load_table, start_server};
use crate::load::args::LoadArgs;
use crate::load::common::write_outputs;
use crate::load::load_http;
use anyhow::{Context, bail};
use serde_json::json;
use spate_load::Report;
use std::cell::{Cell, RefCell};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Shares of the closed-loop peak offered in the open-loop runs (the latency target names 80%).
const OPEN_LOOP_SHARES: [f64; 2] = [0.5, 0.8];

/// Rounds of spate and durable Redis in turn (each round's first alternates), single and bulk.
const HEAD_TO_HEAD_ROUNDS: usize = 3;

/// The stems of Redis's in-memory runs: single updates, then pipelines.
const IN_MEMORY_STEMS: [&str; 2] = [
    "redis-zincrby-in-memory",
    "redis-zincrby-pipelined-in-memory",
];

/// One round of spate against durable Redis: each side's single and bulk runs, with their stems.
struct HeadToHeadRound {
    spate_single: (Report, String),
    redis_single: (Report, String),
    spate_bulk: (Report, String),
    redis_bulk: (Report, String),
}

struct Runner<'a> {
    args: &'a BenchArgs,
    out: &'a Path,
    /// The process serving the current runs (spate, then each Redis), whose CPU time is measured.
    server_pid: Cell<u32>,
    /// CPU per request of each run: the currency on two cores shared by server and load generator.
    cpu: RefCell<Vec<CpuUse>>,
}

struct CpuUse {
    stem: String,
    server_us_per_request: f64,
    tool_us_per_request: f64,
}

impl Runner<'_> {
    fn run(&self, mut load: LoadArgs, stem: &str) -> anyhow::Result<Report> {
        load.duration_s = self.args.duration_s;
        load.users = self.args.leaderboard.leaderboard_users;
        eprintln!("{stem}: {} {} ...", load.app, load.scenario);
        let server_pid = self.server_pid.get();
        let (server_before, tool_before) =
            (cpu_seconds(server_pid)?, cpu_seconds(std::process::id())?);
        let report = load_http(&load)?;
        let server_s = cpu_seconds(server_pid)? - server_before;
        let tool_s = cpu_seconds(std::process::id())? - tool_before;
        // The warm-up's requests used CPU too: count them at the measured rate.
        let requests = report.achieved_rate_per_s * (report.measured_seconds + load.warmup_s);
        self.cpu.borrow_mut().push(CpuUse {
            stem: stem.to_string(),
            server_us_per_request: server_s * 1e6 / requests,
            tool_us_per_request: tool_s * 1e6 / requests,
        });
        write_outputs(&report, self.out, stem)?;
        Ok(report)
    }
}

/// A Redis server on a free port in a temporary directory, stopped on drop.
struct Redis {
    child: Child,
    target: String,
    _dir: tempfile::TempDir,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn redis_server_path() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join("redis-server"))
        .find(|path| path.is_file())
}

fn start_redis(binary: &Path, persistence: &[&str]) -> anyhow::Result<Redis> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let dir = tempfile::tempdir()?;
    let child = Command::new(binary)
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
        ])
        .args(persistence)
        .arg("--dir")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("starting redis-server")?;
    let address = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&address).is_err() {
        if Instant::now() > deadline {
            bail!("redis-server did not listen on {address} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Redis {
        child,
        target: format!("redis://{address}"),
        _dir: dir,
    })
}

/// Open-loop runs at each of [`OPEN_LOOP_SHARES`] of `peak_per_s`: `(share, report, chart stem)`.
/// Redis's two loads: ZINCRBY + ZREVRANK from `single_connections`, and pipelines of `batch` ZINCRBY
/// from `bulk_connections`, as spate's single and bulk runs have them.
fn redis_loads(
    redis: &Redis,
    single_connections: u32,
    bulk_connections: u32,
    batch: usize,
) -> (LoadArgs, LoadArgs) {
    let mut single = LoadArgs::new("redis", "zincrby", &redis.target);
    single.connections = single_connections;
    single.batch = 1;
    let mut bulk = single.clone();
    bulk.connections = bulk_connections;
    bulk.batch = batch;
    (single, bulk)
}

fn open_loop_runs(
    runner: &Runner<'_>,
    load: &LoadArgs,
    peak_per_s: f64,
    stem: &str,
) -> anyhow::Result<Vec<(f64, Report, String)>> {
    let mut runs = Vec::new();
    for (run, share) in OPEN_LOOP_SHARES.into_iter().enumerate() {
        let mut load = load.clone();
        load.rate = Some(peak_per_s * share);
        load.seed += 1 + run as u64;
        let stem = format!("{stem}-open-{:.0}", share * 100.0);
        runs.push((share, runner.run(load, &stem)?, stem));
    }
    Ok(runs)
}

pub fn run(args: &BenchArgs) -> anyhow::Result<String> {
    let settings = &args.leaderboard;
    let runner = Runner {
        args,
        out: &args.out,
        server_pid: Cell::new(0),
        cpu: RefCell::new(Vec::new()),
    };
    let batch = settings.leaderboard_batch;
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "leaderboard", args.fraud.partitions)?;
    runner.server_pid.set(server.pid());
    let mut closed = Vec::new();
    for &connections in &settings.leaderboard_connections {
        let mut load = LoadArgs::new("leaderboard", "updates", &server.http);
        load.connections = connections;
        let stem = format!("leaderboard-updates-closed-{connections}");
        closed.push((runner.run(load, &stem)?, stem));
    }
    let (peak, _) = closed
        .iter()
        .max_by(|a, b| a.0.ok_rate_per_s.total_cmp(&b.0.ok_rate_per_s))
        .context("at least one connection count")?;
    let peak_connections = peak.connections;
    let mut single = LoadArgs::new("leaderboard", "updates", &server.http);
    single.connections = peak_connections;
    single.seed = 10;
    let open = open_loop_runs(&runner, &single, peak.ok_rate_per_s, "leaderboard-updates")?;

    let mut bulk = LoadArgs::new("leaderboard", "bulk", &server.http);
    bulk.connections = args.connections;
    bulk.batch = batch;
    bulk.seed = 20;
    let bulk_closed = runner.run(bulk.clone(), "leaderboard-bulk-closed")?;
    let bulk_open = open_loop_runs(
        &runner,
        &bulk,
        bulk_closed.ok_rate_per_s,
        "leaderboard-bulk",
    )?;
    let redis_binary = redis_server_path();
    let mut head_to_head = Vec::new();
    if let Some(binary) = &redis_binary {
        let redis = start_redis(binary, &["--appendonly", "yes", "--appendfsync", "always"])?;
        let (redis_single, redis_bulk) =
            redis_loads(&redis, peak_connections, args.connections, batch);
        for round in 0..HEAD_TO_HEAD_ROUNDS {
            let spate_run = |load: &LoadArgs, stem: String| {
                runner.server_pid.set(server.pid());
                runner.run(load.clone(), &stem).map(|report| (report, stem))
            };
            let redis_run = |load: &LoadArgs, stem: String| {
                runner.server_pid.set(redis.child.id());
                runner.run(load.clone(), &stem).map(|report| (report, stem))
            };
            let spate_stem = format!("leaderboard-updates-round-{round}");
            let redis_stem = format!("redis-zincrby-durable-round-{round}");
            let spate_bulk_stem = format!("leaderboard-bulk-round-{round}");
            let redis_bulk_stem = format!("redis-zincrby-pipelined-durable-round-{round}");
            head_to_head.push(if round % 2 == 0 {
                HeadToHeadRound {
                    spate_single: spate_run(&single, spate_stem)?,
                    redis_single: redis_run(&redis_single, redis_stem)?,
                    spate_bulk: spate_run(&bulk, spate_bulk_stem)?,
                    redis_bulk: redis_run(&redis_bulk, redis_bulk_stem)?,
                }
            } else {
                let redis_single = redis_run(&redis_single, redis_stem)?;
                let spate_single = spate_run(&single, spate_stem)?;
                let redis_bulk = redis_run(&redis_bulk, redis_bulk_stem)?;
                HeadToHeadRound {
                    spate_single,
                    redis_single,
                    spate_bulk: spate_run(&bulk, spate_bulk_stem)?,
                    redis_bulk,
                }
            });
        }
    }
    let board = super::common::get_json(&format!(
        "{}/leaderboards/{}",
        server.http,
        crate::load::leaderboard::LEADERBOARD_BOARD
    ))?;
    drop(server);

    // Redis without persistence, once: what spate aims at next, not the durable comparison.
    let in_memory = match &redis_binary {
        Some(binary) => {
            let redis = start_redis(binary, &["--appendonly", "no"])?;
            runner.server_pid.set(redis.child.id());
            let (single, bulk) = redis_loads(&redis, peak_connections, args.connections, batch);
            Some((
                runner.run(single, IN_MEMORY_STEMS[0])?,
                runner.run(bulk, IN_MEMORY_STEMS[1])?,
            ))
        }
        None => None,
    };

    let mut text = format!(
        "## leaderboard: {} users, increments (the case study's load test)\n\n\
         Single updates: `PUT /leaderboards/load/members/{{user}}` with `{{\"score\": n, \"operator\": \"increment\"}}`, \
         answering the new score and rank, durable before the reply. Bulk: `POST /leaderboards/scores` with {batch} \
         increments per request. Open loop at shares of the closed-loop peak. Members on the board at the end: {}.\n\n",
        settings.leaderboard_users, board["members"],
    );
    let mut rows: Vec<(String, &Report, String)> = Vec::new();
    for (report, stem) in &closed {
        let label = format!("spate single, closed loop, {} conn", report.connections);
        rows.push((label, report, stem.clone()));
    }
    for (share, report, stem) in &open {
        let label = format!("spate single, open loop at {:.0}% of peak", share * 100.0);
        rows.push((label, report, stem.clone()));
    }
    let label = format!("spate bulk of {batch}, closed loop");
    rows.push((label, &bulk_closed, "leaderboard-bulk-closed".into()));
    for (share, report, stem) in &bulk_open {
        let label = format!("spate bulk of {batch}, open loop at {:.0}%", share * 100.0);
        rows.push((label, report, stem.clone()));
    }
    for (round, runs) in head_to_head.iter().enumerate() {
        let first = if round % 2 == 0 { "spate" } else { "Redis" };
        for (label, (report, stem)) in [
            ("spate single", &runs.spate_single),
            ("Redis durable: ZINCRBY + ZREVRANK", &runs.redis_single),
            ("spate bulk", &runs.spate_bulk),
            ("Redis durable: pipelines of ZINCRBY", &runs.redis_bulk),
        ] {
            let label = format!("{label}, round {round} ({first} first)");
            rows.push((label, report, stem.clone()));
        }
    }
    if let Some((single, bulk)) = &in_memory {
        let [single_stem, bulk_stem] = IN_MEMORY_STEMS.map(String::from);
        rows.push((
            "Redis in memory: ZINCRBY + ZREVRANK".into(),
            single,
            single_stem,
        ));
        let pipelined = format!("Redis in memory: pipelines of {batch} ZINCRBY");
        rows.push((pipelined, bulk, bulk_stem));
    }
    let table_rows: Vec<(&str, &Report, &str)> = rows
        .iter()
        .map(|(l, r, s)| (l.as_str(), *r, s.as_str()))
        .collect();
    text += &load_table(&table_rows);
    text += "\nCPU per request (server process, and this load generator, over each run including its warm-up):\n\n\
             | run | server CPU per request | load generator CPU per request |\n|---|---:|---:|\n";
    for cpu in runner.cpu.borrow().iter() {
        text += &format!(
            "| {} | {:.0} µs | {:.0} µs |\n",
            cpu.stem, cpu.server_us_per_request, cpu.tool_us_per_request
        );
    }

    let bulk_updates_per_s = bulk_closed.ok_rate_per_s * batch as f64;
    text += &format!(
        "\n- spate single updates: peak {:.0}/s at {peak_connections} connections\n\
         - spate bulk: {bulk_updates_per_s:.0} updates/s closed loop\n",
        peak.ok_rate_per_s,
    );
    let mut open_json = Vec::new();
    for (kind, runs, per_request) in [("single", &open, 1.0), ("bulk", &bulk_open, batch as f64)] {
        for (share, report, _) in runs {
            let updates_per_s = report.ok_rate_per_s * per_request;
            let p99_ms = report.latency.p99_us as f64 / 1000.0;
            text += &format!(
                "- {kind}, open loop at {:.0}% of peak: {updates_per_s:.0} updates/s, p99 {p99_ms:.2} ms, errors {:.3}%\n",
                share * 100.0,
                report.error_share * 100.0,
            );
            open_json.push(
                json!({"kind": kind, "share_of_peak": share, "updates_per_s": updates_per_s,
                "p99_us": report.latency.p99_us, "error_share": report.error_share}),
            );
        }
    }
    let mut ratios = Vec::new();
    if !head_to_head.is_empty() {
        let median_of = |side: fn(&HeadToHeadRound) -> &(Report, String)| {
            let mut rates: Vec<f64> = (head_to_head.iter())
                .map(|round| side(round).0.ok_rate_per_s)
                .collect();
            super::common::median(&mut rates)
        };
        let spate_single = median_of(|round| &round.spate_single);
        let redis_single = median_of(|round| &round.redis_single);
        let spate_bulk = median_of(|round| &round.spate_bulk) * batch as f64;
        let redis_bulk = median_of(|round| &round.redis_bulk) * batch as f64;
        let (single_ratio, bulk_ratio) = (spate_single / redis_single, spate_bulk / redis_bulk);
        text += &format!(
            "- against Redis durable, medians of {HEAD_TO_HEAD_ROUNDS} rounds in turn: single updates \
             {single_ratio:.2}x ({spate_single:.0} against {redis_single:.0}/s), bulk {bulk_ratio:.2}x \
             ({spate_bulk:.0} against {redis_bulk:.0} updates/s)\n",
        );
        ratios.push(json!({"redis": "durable", "rounds": HEAD_TO_HEAD_ROUNDS,
            "single_ratio": single_ratio, "bulk_ratio": bulk_ratio}));
    }
    if let Some((single, bulk)) = &in_memory {
        let single_ratio = peak.ok_rate_per_s / single.ok_rate_per_s;
        let bulk_ratio = bulk_closed.ok_rate_per_s / bulk.ok_rate_per_s;
        text += &format!(
            "- against Redis in memory (one run each, spate's peak): single updates {single_ratio:.2}x ({:.0}/s), bulk {bulk_ratio:.2}x ({:.0} updates/s)\n",
            single.ok_rate_per_s,
            bulk.ok_rate_per_s * batch as f64,
        );
        ratios.push(
            json!({"redis": "in memory", "single_ratio": single_ratio, "bulk_ratio": bulk_ratio}),
        );
    }
    if redis_binary.is_none() {
        text += "- Redis: `redis-server` is not installed, so no peer ran (`scripts/bench-leaderboard.sh` installs it)\n";
    }
    let summary = json!({
        "benchmark": "leaderboard",
        "users": settings.leaderboard_users,
        "peak_single_updates_per_s": peak.ok_rate_per_s,
        "peak_connections": peak_connections,
        "bulk_updates_per_s": bulk_updates_per_s,
        "open_loop": open_json,
        "redis": ratios,
    });
    std::fs::write(
        args.out.join("leaderboard.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    Ok(text)
}
