//! The merged result of a run, for people (a summary table) and machines (JSON).

use crate::{LoadConfig, Pace, SecondSlice, WorkerResult, new_histogram};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub min_us: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SecondPoint {
    pub second: u64,
    pub ok: u64,
    pub errors: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    /// `closed` or `open`.
    pub mode: String,
    pub connections: u32,
    /// The arrival rate asked for (open loop only).
    pub offered_rate_per_s: Option<f64>,
    /// Measured requests completed per second, successful or not.
    pub achieved_rate_per_s: f64,
    pub ok_rate_per_s: f64,
    pub measured_seconds: f64,
    pub requests: u64,
    pub ok: u64,
    /// Failures by kind: `http_<status>`, `timeout`, `connect`, `io`.
    pub errors: BTreeMap<String, u64>,
    pub error_share: f64,
    /// Latency of every measured request, failures included (from the scheduled send time in open loop).
    pub latency: LatencySummary,
    /// Share of requests slower than 1 s (the ledger case study's "% over 1 s").
    pub over_1s_share: f64,
    pub per_second: Vec<SecondPoint>,
}

pub(crate) fn build(
    config: &LoadConfig,
    scenario: String,
    results: Vec<WorkerResult>,
    per_second: BTreeMap<u64, SecondSlice>,
    measured_seconds: f64,
) -> Report {
    let mut latencies = new_histogram(3);
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for result in &results {
        latencies.add(&result.latencies).expect("same bounds");
        for (kind, count) in &result.outcomes {
            *outcomes.entry(kind.clone()).or_default() += count;
        }
    }
    let requests = latencies.len();
    let ok = outcomes.remove("ok").unwrap_or(0);
    debug_assert_eq!(ok + outcomes.values().sum::<u64>(), requests);
    let over_1s = latencies.count_between(1_000_001, u64::MAX);
    let share = |n: u64| {
        if requests == 0 {
            0.0
        } else {
            n as f64 / requests as f64
        }
    };
    Report {
        scenario,
        mode: match config.pace {
            Pace::Closed => "closed".into(),
            Pace::Open { .. } => "open".into(),
        },
        connections: config.connections,
        offered_rate_per_s: match config.pace {
            Pace::Closed => None,
            Pace::Open { rate_per_s } => Some(rate_per_s),
        },
        achieved_rate_per_s: requests as f64 / measured_seconds,
        ok_rate_per_s: ok as f64 / measured_seconds,
        measured_seconds,
        requests,
        ok,
        error_share: share(requests - ok),
        errors: outcomes,
        latency: LatencySummary {
            min_us: latencies.min(),
            mean_us: latencies.mean(),
            p50_us: latencies.value_at_quantile(0.5),
            p90_us: latencies.value_at_quantile(0.9),
            p99_us: latencies.value_at_quantile(0.99),
            p999_us: latencies.value_at_quantile(0.999),
            max_us: latencies.max(),
        },
        over_1s_share: share(over_1s),
        // The last, partial second (replies to requests in flight when measuring stopped) would read as a
        // collapse of throughput; it is left out of the series but not of the totals.
        per_second: per_second
            .into_values()
            .filter(|slice| slice.second < measured_seconds as u64 || measured_seconds < 1.0)
            .map(|slice| SecondPoint {
                second: slice.second,
                ok: slice.ok,
                errors: slice.errors,
                p50_us: slice.latencies.value_at_quantile(0.5),
                p99_us: slice.latencies.value_at_quantile(0.99),
            })
            .collect(),
    }
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

impl Report {
    /// A plain-text summary for the terminal.
    pub fn table(&self) -> String {
        let mut text = String::new();
        let offered = self.offered_rate_per_s.map_or_else(
            || "closed loop".to_string(),
            |r| format!("offered {r:.0}/s"),
        );
        let _ = writeln!(
            text,
            "{}: {} connections, {offered}, {:.1} s measured",
            self.scenario, self.connections, self.measured_seconds
        );
        let _ = writeln!(
            text,
            "  requests {:>10}   achieved {:>10.0}/s   ok {:>10.0}/s   errors {:.3}%",
            self.requests,
            self.achieved_rate_per_s,
            self.ok_rate_per_s,
            self.error_share * 100.0
        );
        let l = &self.latency;
        let _ = writeln!(
            text,
            "  latency  min {}  mean {:.2} ms  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            ms(l.min_us),
            l.mean_us / 1000.0,
            ms(l.p50_us),
            ms(l.p90_us),
            ms(l.p99_us),
            ms(l.p999_us),
            ms(l.max_us)
        );
        let _ = writeln!(text, "  over 1 s {:.3}%", self.over_1s_share * 100.0);
        for (kind, count) in &self.errors {
            let _ = writeln!(text, "  error {kind}: {count}");
        }
        text
    }
}
