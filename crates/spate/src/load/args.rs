//! The arguments of `spate load <app> <scenario>` (`LoadArgs`), which benchmarks also build and adjust.

use clap::Args;
use std::path::PathBuf;

#[derive(Args, Clone)]
pub struct LoadArgs {
    /// The app (`server`, `tally`, `fraud`, `leaderboard`, `ski`, `ledger`, `payments`, or `redis` for the peer)
    pub app: String,
    /// The scenario (an unknown one lists the known scenarios)
    pub scenario: String,
    /// Server base URL
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub target: String,
    /// The fraud stream's address (fraud stream)
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub stream: String,
    /// Connections (closed loop: each sends when its previous reply arrived)
    #[arg(long, default_value_t = 16)]
    pub connections: u32,
    /// Open loop at this many requests per second in all (latency from each scheduled send time)
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured seconds
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    /// Stop after this many measured requests instead
    #[arg(long)]
    pub requests: Option<u64>,
    /// Unmeasured seconds before measuring
    #[arg(long, default_value_t = 1.0)]
    pub warmup_s: f64,
    /// A request slower than this counts as a timeout
    #[arg(long, default_value_t = 10.0)]
    pub timeout_s: f64,
    /// Seed of the scenario's data
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Transactions per request (fraud), updates per request (leaderboard bulk, redis)
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Users the leaderboard scenarios, or skiers the ski scenarios, draw from; for ledger reads, the
    /// transfers each writer wrote
    #[arg(long, default_value_t = 100_000)]
    pub users: u64,
    /// ledger reads: connections of the `ledger batch` run that wrote the transfers
    #[arg(long, default_value_t = 4)]
    pub written_by: u32,
    /// FSPs the ledger scenario creates and moves money between
    #[arg(long, default_value_t = 16)]
    pub participants: u32,
    /// Cards the fraud generator draws from
    #[arg(long, default_value_t = 1_000_000)]
    pub cards: u32,
    /// Exit with status 1 when the share of failed requests is above this
    #[arg(long, default_value_t = 0.01)]
    pub max_error_share: f64,
    /// Write `<app>-<scenario>.json` and `.svg` here
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl LoadArgs {
    /// The defaults of `spate load <app> <scenario> --target <target>`, for benchmarks to adjust.
    pub fn new(app: &str, scenario: &str, target: &str) -> Self {
        Self {
            app: app.into(),
            scenario: scenario.into(),
            target: target.into(),
            stream: String::new(),
            connections: 16,
            rate: None,
            duration_s: 10.0,
            requests: None,
            warmup_s: 1.0,
            timeout_s: 10.0,
            seed: 1,
            batch: 1,
            users: 100_000,
            written_by: 4,
            participants: 16,
            cards: 1,
            max_error_share: 0.01,
            out: None,
        }
    }
}
