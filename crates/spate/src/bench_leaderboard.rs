//! `spate bench leaderboard`: the case study's load test (100,000 users updating scores) against a fresh
//! server, and the same workload on Redis in the same run.
//!
//! 1. Closed loop at several connection counts: single-update requests (`PUT`, answering the new rank),
//!    to find the peak; then open loop at 80% of the peak, where the latency target applies.
//! 2. The same for bulk requests (`--leaderboard-batch` updates each).
//! 3. Redis (when `redis-server` is installed; `scripts/bench-leaderboard.sh` installs it): ZINCRBY +
//!    ZREVRANK at the peak's connection count, and pipelines of ZINCRBY as the bulk peer, once with
//!    `appendfsync always` (durable before the reply, like spate) and once without persistence.

use crate::bench::{BenchArgs, load_table, start_server};
use crate::load_cli::{LoadArgs, load_http, write_outputs};
use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;
use spate_load::Report;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct LeaderboardBench {
    /// leaderboard: closed-loop connection counts tried for single updates; the best is the peak
    #[arg(long, value_delimiter = ',', default_values_t = [16u32, 32, 64])]
    leaderboard_connections: Vec<u32>,
    /// leaderboard: updates per bulk request
    #[arg(long, default_value_t = 100)]
    leaderboard_batch: usize,
    /// leaderboard: distinct users (the case study's load test had 100,000)
    #[arg(long, default_value_t = 100_000)]
    leaderboard_users: u64,
}

/// Share of the closed-loop peak offered in the open-loop run (the latency target applies there).
const OPEN_LOOP_SHARE: f64 = 0.8;

struct Runner<'a> {
    args: &'a BenchArgs,
    out: &'a Path,
}

impl Runner<'_> {
    fn run(&self, mut load: LoadArgs, stem: &str) -> anyhow::Result<Report> {
        load.duration_s = self.args.duration_s;
        load.users = self.args.leaderboard.leaderboard_users;
        eprintln!("{stem}: {} {} ...", load.app, load.scenario);
        let report = load_http(&load)?;
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

pub fn run(args: &BenchArgs) -> anyhow::Result<String> {
    let settings = &args.leaderboard;
    let runner = Runner {
        args,
        out: &args.out,
    };
    let batch = settings.leaderboard_batch;
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "leaderboard", args.fraud.partitions)?;
    let mut closed = Vec::new();
    for &connections in &settings.leaderboard_connections {
        let mut load = LoadArgs::new("leaderboard", "updates", &server.http);
        load.connections = connections;
        let stem = format!("leaderboard-updates-closed-{connections}");
        closed.push((runner.run(load, &stem)?, stem));
    }
    let peak = closed
        .iter()
        .max_by(|a, b| a.0.ok_rate_per_s.total_cmp(&b.0.ok_rate_per_s))
        .context("at least one connection count")?;
    let peak_connections = peak.0.connections;
    let mut load = LoadArgs::new("leaderboard", "updates", &server.http);
    load.connections = peak_connections;
    load.rate = Some(peak.0.ok_rate_per_s * OPEN_LOOP_SHARE);
    load.seed = 2;
    let open = runner.run(load, "leaderboard-updates-open")?;

    let mut load = LoadArgs::new("leaderboard", "bulk", &server.http);
    load.connections = args.connections;
    load.batch = batch;
    load.seed = 3;
    let bulk_closed = runner.run(load.clone(), "leaderboard-bulk-closed")?;
    load.rate = Some(bulk_closed.ok_rate_per_s * OPEN_LOOP_SHARE);
    load.seed = 4;
    let bulk_open = runner.run(load, "leaderboard-bulk-open")?;
    let board = crate::bench::get_json(&format!(
        "{}/leaderboards/{}",
        server.http,
        crate::load_cli::LEADERBOARD_BOARD
    ))?;
    drop(server);

    let mut redis_runs = Vec::new();
    let redis_binary = redis_server_path();
    if let Some(binary) = &redis_binary {
        for (label, persistence) in [
            (
                "durable",
                &["--appendonly", "yes", "--appendfsync", "always"][..],
            ),
            ("in memory", &["--appendonly", "no"][..]),
        ] {
            let redis = start_redis(binary, persistence)?;
            let mut load = LoadArgs::new("redis", "zincrby", &redis.target);
            load.connections = peak_connections;
            load.batch = 1;
            let stem = format!("redis-zincrby-{}", label.replace(' ', "-"));
            let single = runner.run(load.clone(), &stem)?;
            load.connections = args.connections;
            load.batch = batch;
            let bulk_stem = format!("redis-zincrby-pipelined-{}", label.replace(' ', "-"));
            let bulk = runner.run(load, &bulk_stem)?;
            redis_runs.push((label, single, stem, bulk, bulk_stem));
        }
    }

    let mut text = format!(
        "## leaderboard: {} users, increments (the case study's load test)\n\n\
         Single updates: `PUT /leaderboards/load/members/{{user}}` with `{{\"score\": n, \"operator\": \"increment\"}}`, \
         answering the new score and rank, durable before the reply. Bulk: `POST /leaderboards/scores` with {batch} \
         increments per request. Open loop at {:.0}% of the closed-loop peak. Members on the board at the end: {}.\n\n",
        settings.leaderboard_users,
        OPEN_LOOP_SHARE * 100.0,
        board["members"],
    );
    let mut rows: Vec<(String, &Report, String)> = closed
        .iter()
        .map(|(report, stem)| {
            (
                format!("spate single, closed loop, {} conn", report.connections),
                report,
                stem.clone(),
            )
        })
        .collect();
    rows.push((
        "spate single, open loop at 80% of peak".into(),
        &open,
        "leaderboard-updates-open".into(),
    ));
    rows.push((
        format!("spate bulk of {batch}, closed loop"),
        &bulk_closed,
        "leaderboard-bulk-closed".into(),
    ));
    rows.push((
        format!("spate bulk of {batch}, open loop at 80%"),
        &bulk_open,
        "leaderboard-bulk-open".into(),
    ));
    for (label, single, stem, bulk, bulk_stem) in &redis_runs {
        rows.push((
            format!("Redis {label}: ZINCRBY + ZREVRANK"),
            single,
            stem.clone(),
        ));
        rows.push((
            format!("Redis {label}: pipelines of {batch} ZINCRBY"),
            bulk,
            bulk_stem.clone(),
        ));
    }
    let table_rows: Vec<(&str, &Report, &str)> = rows
        .iter()
        .map(|(l, r, s)| (l.as_str(), *r, s.as_str()))
        .collect();
    text += &load_table(&table_rows);
    let bulk_updates_per_s = bulk_closed.ok_rate_per_s * batch as f64;
    text += &format!(
        "\n- spate single updates: peak {:.0}/s at {} connections; open loop at {:.0}/s: p99 {:.2} ms, errors {:.3}%\n\
         - spate bulk: {:.0} updates/s closed loop; open loop at {:.0} updates/s: p99 {:.2} ms, errors {:.3}%\n",
        peak.0.ok_rate_per_s,
        peak_connections,
        open.ok_rate_per_s,
        open.latency.p99_us as f64 / 1000.0,
        open.error_share * 100.0,
        bulk_updates_per_s,
        bulk_open.ok_rate_per_s * batch as f64,
        bulk_open.latency.p99_us as f64 / 1000.0,
        bulk_open.error_share * 100.0,
    );
    let mut ratios = Vec::new();
    for (label, single, _, bulk, _) in &redis_runs {
        let single_ratio = peak.0.ok_rate_per_s / single.ok_rate_per_s;
        let bulk_ratio = bulk_closed.ok_rate_per_s / bulk.ok_rate_per_s;
        text += &format!(
            "- against Redis {label}: single updates {single_ratio:.2}x ({:.0}/s), bulk {bulk_ratio:.2}x ({:.0} updates/s)\n",
            single.ok_rate_per_s,
            bulk.ok_rate_per_s * batch as f64,
        );
        ratios
            .push(json!({"redis": label, "single_ratio": single_ratio, "bulk_ratio": bulk_ratio}));
    }
    if redis_binary.is_none() {
        text += "- Redis: `redis-server` is not installed, so no peer ran (`scripts/bench-leaderboard.sh` installs it)\n";
    }
    let summary = json!({
        "benchmark": "leaderboard",
        "users": settings.leaderboard_users,
        "peak_single_updates_per_s": peak.0.ok_rate_per_s,
        "peak_connections": peak_connections,
        "open_loop_single": {"rate_per_s": open.ok_rate_per_s, "p99_us": open.latency.p99_us, "error_share": open.error_share},
        "bulk_updates_per_s": bulk_updates_per_s,
        "open_loop_bulk": {"updates_per_s": bulk_open.ok_rate_per_s * batch as f64, "p99_us": bulk_open.latency.p99_us, "error_share": bulk_open.error_share},
        "redis": ratios,
    });
    std::fs::write(
        args.out.join("leaderboard.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    Ok(text)
}
