//! What every benchmark shares: starting and stopping servers (`Spawned`), their longest apply pauses,
//! the process's CPU and memory, the report's date and machine, and the table of load runs.

use anyhow::Context;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The Kafka cluster every server of this run journals to (`--kafka`), set once by `run` in `mod.rs`: the
/// servers are started from every app's benchmark, and none of them needs to know.
pub static KAFKA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// Servers started so far: each gets a topic of its own.
static SERVERS_STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub struct Spawned {
    child: Child,
    pub http: String,
    pub stream: String,
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

    /// Notes the server's longest apply pauses (from its `/metrics`) for the report of the benchmark
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
        let LongestPauses {
            by_gauge,
            counted,
            counted_own,
        } = &mut *longest;
        for (histogram, counted) in [
            (PAUSE_HISTOGRAM, counted),
            (PAUSE_OWN_HISTOGRAM, counted_own),
        ] {
            let scraped = count_pauses(&metrics, histogram);
            counted.all += scraped.all;
            counted.over_budget += scraped.over_budget;
        }
        for (gauge, longest) in PAUSE_GAUGES.into_iter().zip(by_gauge) {
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

impl std::fmt::Display for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} ms ({}, partition {})",
            self.seconds * 1e3,
            self.cause,
            self.partition
        )
    }
}

/// The gauges a report quotes, in the order of [`LongestPauses::by_gauge`]: the longest pause, the
/// longest own share (`thread_time.rs` in the engine), and the longest part of any pause on a core,
/// runnable but not running, and neither (the host's or interrupts').
const PAUSE_GAUGES: [&str; 5] = [
    "spate_apply_pause_max_seconds",
    "spate_apply_pause_own_max_seconds",
    "spate_apply_pause_cpu_max_seconds",
    "spate_apply_pause_queued_max_seconds",
    "spate_apply_pause_stolen_max_seconds",
];
const PAUSE_HISTOGRAM: &str = "spate_apply_pause_seconds";
const PAUSE_OWN_HISTOGRAM: &str = "spate_apply_pause_own_seconds";
/// The histograms' bucket at the pause budget of issue 17, 10 ms (one of their bounds).
const PAUSE_BUDGET_LE: &str = "_bucket{le=\"0.01\",";

/// The longest pauses of the servers stopped since the last [`take_longest_pause`], by gauge of
/// [`PAUSE_GAUGES`], and how many of their pauses passed the budget, by the wall and less the waits.
#[derive(Default)]
struct LongestPauses {
    by_gauge: [Option<Pause>; PAUSE_GAUGES.len()],
    counted: PauseCounts,
    counted_own: PauseCounts,
}

/// Pauses of every partition and cause: all of them, and those longer than the budget.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct PauseCounts {
    all: u64,
    over_budget: u64,
}

impl PauseCounts {
    const NONE: Self = Self {
        all: 0,
        over_budget: 0,
    };
}

static LONGEST_PAUSES: std::sync::Mutex<LongestPauses> = std::sync::Mutex::new(LongestPauses {
    by_gauge: [None, None, None, None, None],
    counted: PauseCounts::NONE,
    counted_own: PauseCounts::NONE,
});

/// The longest pause of the servers stopped since the last call, as a line for a benchmark's report.
pub fn take_longest_pause() -> String {
    let LongestPauses {
        by_gauge: [wall, own, cpu, queued, stolen],
        counted,
        counted_own,
    } = std::mem::take(&mut *LONGEST_PAUSES.lock().expect("never poisoned"));
    let Some(wall) = wall else {
        return "Longest apply pause of this benchmark's servers: none recorded.\n".into();
    };
    let mut line = format!(
        "Longest apply pause of this benchmark's servers: **{wall}**; {} of {} pauses passed 10 ms",
        counted.over_budget, counted.all
    );
    if let Some(own) = own {
        line += &format!(
            ". Less the time their thread was runnable but not running or lost to the host, the \
             longest: **{own}**; {} passed 10 ms",
            counted_own.over_budget
        );
    }
    let parts: Vec<String> = [
        (cpu, "on a core"),
        (queued, "runnable but not running"),
        (stolen, "neither (host steal or interrupts)"),
    ]
    .into_iter()
    .filter_map(|(pause, part)| Some(format!("{part} {}", pause?)))
    .collect();
    if !parts.is_empty() {
        line += &format!(". The longest part of any one pause: {}", parts.join("; "));
    }
    line + ".\n"
}

/// Adds up a pause histogram's counts of a scrape, every partition and cause.
fn count_pauses(metrics: &str, histogram: &str) -> PauseCounts {
    let value = |line: &str| -> u64 {
        let value = line.rsplit_once(' ').map_or("", |(_, value)| value.trim());
        value.parse().unwrap_or(0)
    };
    let mut within_budget = 0;
    let mut counted = PauseCounts::default();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(histogram) else {
            continue;
        };
        if rest.starts_with("_count{") {
            counted.all += value(line);
        } else if rest.starts_with(PAUSE_BUDGET_LE) {
            within_budget += value(line);
        }
    }
    counted.over_budget = counted.all.saturating_sub(within_budget);
    counted
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
        // Warnings only, unless the bench was given a filter (the start-up phases of a restart, for
        // one, are logged at info).
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
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

/// Server CPU and load-generator CPU (this process: the load runs in it) per request of one run.
/// Both share the machine's cores, so a target a run misses may be the generator's CPU as well as the
/// server's.
#[derive(Debug, Clone, Copy)]
pub struct CpuPerRequest {
    pub server_us: f64,
    pub generator_us: f64,
}

impl CpuPerRequest {
    /// As a report's line says it.
    pub fn describe(&self) -> String {
        format!(
            "server CPU {:.0} µs, load generator CPU {:.0} µs per request",
            self.server_us, self.generator_us
        )
    }
}

/// The CPU time of a server and of this process when a run started.
pub struct CpuMeter {
    server_pid: u32,
    server_s: f64,
    generator_s: f64,
}

impl CpuMeter {
    pub fn start(server_pid: u32) -> anyhow::Result<Self> {
        Ok(Self {
            server_pid,
            server_s: cpu_seconds(server_pid)?,
            generator_s: cpu_seconds(std::process::id())?,
        })
    }

    /// Each process's CPU since the start over the requests `report` counts, warm-up included (sent
    /// at the same rate).
    pub fn per_request(
        &self,
        report: &spate_load::Report,
        warmup_s: f64,
    ) -> anyhow::Result<CpuPerRequest> {
        let requests = (report.achieved_rate_per_s * (report.measured_seconds + warmup_s)).max(1.0);
        let server_s = cpu_seconds(self.server_pid)? - self.server_s;
        let generator_s = cpu_seconds(std::process::id())? - self.generator_s;
        Ok(CpuPerRequest {
            server_us: server_s * 1e6 / requests,
            generator_us: generator_s * 1e6 / requests,
        })
    }
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

pub fn get_json(url: &str) -> anyhow::Result<Value> {
    Ok(ureq::get(url).call()?.body_mut().read_json()?)
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
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
            longest_pause(scrape, PAUSE_GAUGES[0]),
            Some(Pause {
                seconds: 0.5,
                cause: "journal".into(),
                partition: "1".into()
            })
        );
        let cpu = PAUSE_GAUGES[2];
        assert_eq!(longest_pause(scrape, cpu), None);
        let scrape = format!("{scrape}{cpu}{{partition=\"0\",cause=\"snapshot\"}} 0.125\n");
        assert_eq!(longest_pause(&scrape, cpu).map(|p| p.seconds), Some(0.125));
        assert_eq!(
            longest_pause("spate_commands_applied_total 3\n", PAUSE_GAUGES[0]),
            None
        );
    }

    #[test]
    fn pauses_over_the_budget_are_counted_over_partitions_and_causes() {
        let scrape = "spate_apply_pause_seconds_count{partition=\"0\",cause=\"snapshot\"} 40\n\
            spate_apply_pause_seconds_bucket{le=\"0.005\",partition=\"0\",cause=\"snapshot\"} 30\n\
            spate_apply_pause_seconds_bucket{le=\"0.01\",partition=\"0\",cause=\"snapshot\"} 37\n\
            spate_apply_pause_seconds_bucket{le=\"0.025\",partition=\"0\",cause=\"snapshot\"} 40\n\
            spate_apply_pause_seconds_count{partition=\"1\",cause=\"journal\"} 5\n\
            spate_apply_pause_seconds_bucket{le=\"0.01\",partition=\"1\",cause=\"journal\"} 4\n\
            spate_apply_pause_max_seconds{partition=\"1\",cause=\"journal\"} 0.02\n";
        assert_eq!(
            count_pauses(scrape, PAUSE_HISTOGRAM),
            PauseCounts {
                all: 45,
                over_budget: 4
            }
        );
        assert_eq!(
            count_pauses(scrape, PAUSE_OWN_HISTOGRAM),
            PauseCounts::default()
        );
        let own = scrape.replace("spate_apply_pause_seconds", "spate_apply_pause_own_seconds");
        assert_eq!(count_pauses(&own, PAUSE_OWN_HISTOGRAM).over_budget, 4);
        assert_eq!(count_pauses(&own, PAUSE_HISTOGRAM), PauseCounts::default());
    }

    #[test]
    fn the_report_line_splits_the_longest_pause_by_where_its_time_went() {
        let pause = |ms: f64| {
            Some(Pause {
                seconds: ms / 1e3,
                cause: "snapshot".into(),
                partition: "1".into(),
            })
        };
        *LONGEST_PAUSES.lock().unwrap() = LongestPauses {
            by_gauge: [
                pause(13.8),
                pause(3.1),
                pause(2.9),
                pause(12.5),
                pause(13.2),
            ],
            counted: PauseCounts {
                all: 2023,
                over_budget: 5,
            },
            counted_own: PauseCounts {
                all: 2023,
                over_budget: 0,
            },
        };
        assert_eq!(
            take_longest_pause(),
            "Longest apply pause of this benchmark's servers: **13.8 ms (snapshot, partition 1)**; \
             5 of 2023 pauses passed 10 ms. Less the time their thread was runnable but not running \
             or lost to the host, the longest: **3.1 ms (snapshot, partition 1)**; 0 passed 10 ms. \
             The longest part of any one pause: on a core 2.9 ms (snapshot, partition 1); runnable \
             but not running 12.5 ms (snapshot, partition 1); neither (host steal or interrupts) \
             13.2 ms (snapshot, partition 1).\n"
        );
        assert_eq!(
            take_longest_pause(),
            "Longest apply pause of this benchmark's servers: none recorded.\n"
        );
    }
}
