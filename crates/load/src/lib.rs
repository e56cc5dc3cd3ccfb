//! The load generator: drives an HTTP server with a [`Scenario`] in closed loop (N connections, each
//! sending as soon as its previous reply arrived) or open loop (a fixed arrival rate; each latency is
//! measured from the request's *scheduled* send time, so a stalled server shows in the tail instead of
//! silently lowering the offered load: no coordinated omission).
//!
//! Every worker owns one keep-alive connection and its own HDR histograms; they are merged at the end,
//! and per second for the time series. Failures are never dropped: refused connections, timeouts and
//! non-2xx replies are counted by kind.

mod chart;
mod http;
mod report;
mod resp;

pub use ::http::Method;
pub use chart::{Series, write_series_svg, write_svg};
pub use report::{LatencySummary, Report, SecondPoint};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{ExchangeError, HttpConnection};
use resp::{PipelineReply, RedisConnection};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Latencies above this are recorded as this (they are also timeouts unless the timeout is larger).
const LATENCY_US_MAX: u64 = 60_000_000;

/// The shortest the open loop's pacer sleeps. Waking up for each request cost the load generator about a
/// sixth of its CPU at 25,000 requests/s and up to a quarter at 38,000/s (a wake-up costs a thread about
/// 16 µs on the project's VMs), which the server on the same cores then lacks (BENCHMARKS.md). A request released late by up to this
/// counts the delay in its latency, as any other.
const PACER_SLEEP_MIN_US: u64 = 200;

/// Most scheduled requests of an open loop waiting for a free connection. When it is full the pacer
/// waits too; a request keeps its scheduled time however late it is handed out, so its latency still
/// counts from then.
const SCHEDULED_REQUESTS_MAX: usize = 1 << 16;

/// One HTTP request of a scenario.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: Method,
    pub path: String,
    pub body: Bytes,
    pub headers: Vec<(&'static str, String)>,
    /// Statuses besides 2xx that are a correct answer (a 404 for data a query may not find).
    pub also_ok: &'static [u16],
}

/// One request of a scenario: an HTTP exchange, or a pipeline of Redis commands (each a list of
/// arguments) sent in one write, for running Redis as a peer with the same runner.
#[derive(Debug, Clone)]
pub enum Request {
    Http(HttpRequest),
    Redis(Vec<Vec<Vec<u8>>>),
}

impl Request {
    pub fn get(path: impl Into<String>) -> Self {
        Self::http(Method::GET, path, Bytes::new())
    }

    pub fn post_json(path: impl Into<String>, body: Vec<u8>) -> Self {
        Self::json(Method::POST, path, body)
    }

    /// A request with a JSON body and any method.
    pub fn json(method: Method, path: impl Into<String>, body: Vec<u8>) -> Self {
        Self::http(method, path, body.into()).with_header("content-type", "application/json")
    }

    fn http(method: Method, path: impl Into<String>, body: Bytes) -> Self {
        Self::Http(HttpRequest {
            method,
            path: path.into(),
            body,
            headers: Vec::new(),
            also_ok: &[],
        })
    }

    /// Adds a header (HTTP requests only; Redis has none).
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        if let Self::Http(http) = &mut self {
            http.headers.push((name, value.into()));
        }
        self
    }

    /// Counts these statuses as answers rather than errors (HTTP requests only).
    pub fn also_ok(mut self, statuses: &'static [u16]) -> Self {
        if let Self::Http(http) = &mut self {
            http.also_ok = statuses;
        }
        self
    }
}

/// What to send. `request` must depend only on its arguments and the scenario's own seed, so that a
/// run can be reproduced.
pub trait Scenario: Send + Sync + 'static {
    fn name(&self) -> String;
    fn request(&self, worker: u32, seq: u64) -> Request;
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// Each connection sends as soon as its previous reply arrived.
    Closed,
    /// `rate_per_s` requests per second in all, each sent by whichever connection is free first.
    Open { rate_per_s: f64 },
}

#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// `host:port` of the server.
    pub target: String,
    pub connections: u32,
    pub pace: Pace,
    /// Measured time (after the warm-up); the run also ends after `requests` measured requests.
    pub duration: Option<Duration>,
    pub requests: Option<u64>,
    pub warmup: Duration,
    pub timeout: Duration,
    pub progress: bool,
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Ok,
    Status(u16),
    Timeout,
    Connect,
    Io,
    /// A reply that is not HTTP/1.1 as the load generator reads it.
    BadReply,
    /// A Redis command answered with an error reply.
    RedisError,
}

impl Outcome {
    fn label(self) -> String {
        match self {
            Self::Ok => "ok".into(),
            Self::Status(code) => format!("http_{code}"),
            Self::Timeout => "timeout".into(),
            Self::Connect => "connect".into(),
            Self::Io => "io".into(),
            Self::BadReply => "bad_reply".into(),
            Self::RedisError => "redis_error".into(),
        }
    }
}

fn new_histogram(significant_figures: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, significant_figures)
        .expect("valid histogram bounds")
}

/// A worker's results for one second of the measured phase.
struct SecondSlice {
    second: u64,
    ok: u64,
    errors: u64,
    latencies: Histogram<u64>,
}

struct WorkerResult {
    latencies: Histogram<u64>,
    outcomes: BTreeMap<String, u64>,
}

struct Shared {
    config: LoadConfig,
    scenario: Arc<dyn Scenario>,
    measure_from: Instant,
    measure_until: Option<Instant>,
    measured: AtomicU64,
    completed: AtomicU64,
}

impl Shared {
    /// Claims a measured request slot; false once the requested count is reached.
    fn claim(&self, now: Instant) -> bool {
        if self.measure_until.is_some_and(|end| now >= end) {
            return false;
        }
        match self.config.requests {
            Some(limit) if now >= self.measure_from => {
                self.measured.fetch_add(1, Ordering::Relaxed) < limit
            }
            _ => true,
        }
    }
}

/// Runs the load and returns the merged report.
pub async fn run(config: LoadConfig, scenario: Arc<dyn Scenario>) -> Report {
    assert!(config.connections > 0, "at least one connection");
    assert!(
        config.duration.is_some() || config.requests.is_some(),
        "a run needs a duration or a request count"
    );
    let started = Instant::now();
    let measure_from = started + config.warmup;
    let shared = Arc::new(Shared {
        measure_until: config.duration.map(|d| measure_from + d),
        measure_from,
        scenario,
        measured: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        config,
    });
    let (seconds_tx, mut seconds_rx) = mpsc::unbounded_channel::<SecondSlice>();
    let progress = spawn_progress(&shared);
    let schedule = match shared.config.pace {
        Pace::Closed => None,
        Pace::Open { rate_per_s } => Some(start_pacer(&shared, started, rate_per_s)),
    };
    let workers: Vec<_> = (0..shared.config.connections)
        .map(|worker| {
            tokio::spawn(run_worker(
                shared.clone(),
                worker,
                schedule.clone(),
                seconds_tx.clone(),
            ))
        })
        .collect();
    drop(schedule);
    drop(seconds_tx);
    let mut per_second: BTreeMap<u64, SecondSlice> = BTreeMap::new();
    let collect = async {
        while let Some(slice) = seconds_rx.recv().await {
            match per_second.get_mut(&slice.second) {
                Some(merged) => {
                    merged.ok += slice.ok;
                    merged.errors += slice.errors;
                    merged.latencies.add(&slice.latencies).expect("same bounds");
                }
                None => {
                    per_second.insert(slice.second, slice);
                }
            }
        }
    };
    let results = async {
        let mut results = Vec::new();
        for worker in workers {
            results.push(worker.await.expect("a load worker panicked"));
        }
        results
    };
    let ((), results) = tokio::join!(collect, results);
    let measured_s = shared.measure_from.elapsed().as_secs_f64();
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    report::build(
        &shared.config,
        shared.scenario.name(),
        results,
        per_second,
        measured_s,
    )
}

fn spawn_progress(shared: &Arc<Shared>) -> Option<indicatif::ProgressBar> {
    if !shared.config.progress {
        return None;
    }
    let bar = match (shared.config.requests, shared.config.duration) {
        (Some(requests), _) => indicatif::ProgressBar::new(requests),
        (None, Some(duration)) => indicatif::ProgressBar::new(duration.as_secs().max(1)),
        (None, None) => unreachable!("checked in run"),
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .expect("valid template"),
    );
    let (bar_clone, shared) = (bar.clone(), shared.clone());
    tokio::spawn(async move {
        let mut previous = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            let completed = shared.completed.load(Ordering::Relaxed);
            let position = match shared.config.requests {
                Some(_) => shared.measured.load(Ordering::Relaxed),
                None => shared.measure_from.elapsed().as_secs(),
            };
            bar_clone.set_position(position);
            bar_clone.set_message(format!("{} req/s", (completed - previous) * 2));
            previous = completed;
            if bar_clone.is_finished() {
                return;
            }
        }
    });
    Some(bar)
}

/// A worker's connection, of the kind its scenario's requests need.
enum Link {
    Http(HttpConnection),
    Redis(RedisConnection),
}

impl Link {
    fn is_closed(&self) -> bool {
        match self {
            Self::Http(http) => http.is_closed(),
            Self::Redis(_) => false,
        }
    }

    async fn connect(target: &str, request: &Request) -> Result<Self, Outcome> {
        if let Request::Redis(_) = request {
            return RedisConnection::connect(target)
                .await
                .map(Self::Redis)
                .map_err(|_| Outcome::Connect);
        }
        HttpConnection::connect(target)
            .await
            .map(Self::Http)
            .map_err(|_| Outcome::Connect)
    }

    /// Sends `request` and reads the whole reply.
    async fn send(&mut self, target: &str, request: &Request) -> Outcome {
        match (self, request) {
            (Self::Http(http), Request::Http(request)) => {
                match http.exchange(target, request).await {
                    Ok(status)
                        if (200..300).contains(&status) || request.also_ok.contains(&status) =>
                    {
                        Outcome::Ok
                    }
                    Ok(status) => Outcome::Status(status),
                    Err(ExchangeError::Malformed) => Outcome::BadReply,
                    Err(_) => Outcome::Io,
                }
            }
            (Self::Redis(redis), Request::Redis(commands)) => {
                match redis.pipeline(commands).await {
                    Ok(PipelineReply::Ok) => Outcome::Ok,
                    Ok(PipelineReply::Error) => Outcome::RedisError,
                    Err(_) => Outcome::Io,
                }
            }
            _ => panic!("a scenario must not mix HTTP and Redis requests"),
        }
    }
}

/// An open loop's requests due and not yet taken, by their scheduled send times. Idle workers wait in
/// turn (tokio's mutex is fair) and the one holding the lock takes the next request due, so a request
/// goes out on whichever connection is free first, as from a client's pool of connections: one slow
/// reply delays only its own request, not those that would have been dealt to its connection.
type Schedule = tokio::sync::Mutex<mpsc::Receiver<Instant>>;

/// Open loop: one thread releases every request at its scheduled time into the shared schedule.
/// A thread of its own rather than tokio's timer, whose 1 ms resolution would send each request up to a
/// millisecond late; `thread::sleep` overshoots by tens of microseconds, and a request that is due
/// goes out at once. It sleeps at least [`PACER_SLEEP_MIN_US`], so that above 5,000 requests/s it
/// releases those due in a few at a time. When no connection is free, requests queue, and their latency
/// counts from the scheduled time.
fn start_pacer(shared: &Arc<Shared>, started: Instant, rate_per_s: f64) -> Arc<Schedule> {
    let (sender, receiver) = mpsc::channel(SCHEDULED_REQUESTS_MAX);
    let interval = Duration::from_secs_f64(1.0 / rate_per_s);
    let end = shared.measure_until;
    std::thread::spawn(move || {
        for index in 0u64.. {
            let at = started + interval.mul_f64(index as f64);
            if end.is_some_and(|end| at >= end) {
                break;
            }
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait.max(Duration::from_micros(PACER_SLEEP_MIN_US)));
            }
            // Every worker is done (a request count was reached): nothing takes requests any more.
            if sender.blocking_send(at).is_err() {
                break;
            }
        }
    });
    Arc::new(tokio::sync::Mutex::new(receiver))
}

async fn run_worker(
    shared: Arc<Shared>,
    worker: u32,
    schedule: Option<Arc<Schedule>>,
    seconds: mpsc::UnboundedSender<SecondSlice>,
) -> WorkerResult {
    let config = &shared.config;
    let mut result = WorkerResult {
        latencies: new_histogram(3),
        outcomes: BTreeMap::new(),
    };
    let mut slice = SecondSlice {
        second: 0,
        ok: 0,
        errors: 0,
        latencies: new_histogram(2),
    };
    // Counted by kind and labelled once at the end, not a label's allocation per request.
    let mut outcomes: BTreeMap<Outcome, u64> = BTreeMap::new();
    let mut link: Option<Link> = None;
    let mut seq = 0u64;
    loop {
        let scheduled = match &schedule {
            Some(schedule) => match schedule.lock().await.recv().await {
                Some(at) => at,
                None => break,
            },
            None => Instant::now(),
        };
        if !shared.claim(scheduled.max(Instant::now())) {
            break;
        }
        let request = shared.scenario.request(worker, seq);
        seq += 1;
        let outcome = match tokio::time::timeout(config.timeout, async {
            if link.as_ref().is_none_or(Link::is_closed) {
                link = Some(Link::connect(&config.target, &request).await?);
            }
            let connection = link.as_mut().expect("connected above");
            Ok::<_, Outcome>(connection.send(&config.target, &request).await)
        })
        .await
        {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(outcome)) => outcome,
            Err(_) => Outcome::Timeout,
        };
        if outcome != Outcome::Ok {
            // The connection's state is unknown after a failure: start a fresh one.
            link = None;
            if outcome == Outcome::Connect {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let done = Instant::now();
        shared.completed.fetch_add(1, Ordering::Relaxed);
        if scheduled < shared.measure_from {
            continue;
        }
        let latency_us = (done - scheduled)
            .as_micros()
            .clamp(1, u128::from(LATENCY_US_MAX)) as u64;
        result
            .latencies
            .record(latency_us)
            .expect("clamped to bounds");
        *outcomes.entry(outcome).or_default() += 1;
        let second = (done - shared.measure_from).as_secs();
        if second != slice.second && (slice.ok + slice.errors) > 0 {
            let full = std::mem::replace(
                &mut slice,
                SecondSlice {
                    second,
                    ok: 0,
                    errors: 0,
                    latencies: new_histogram(2),
                },
            );
            let _ = seconds.send(full);
        }
        slice.second = second;
        if outcome == Outcome::Ok {
            slice.ok += 1;
        } else {
            slice.errors += 1;
        }
        slice
            .latencies
            .record(latency_us)
            .expect("clamped to bounds");
    }
    if slice.ok + slice.errors > 0 {
        let _ = seconds.send(slice);
    }
    result.outcomes = outcomes
        .into_iter()
        .map(|(outcome, count)| (outcome.label(), count))
        .collect();
    result
}
