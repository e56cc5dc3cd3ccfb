//! The arguments of `spate bench`: which apps, the settings every benchmark shares, and each app's own
//! (`--leaderboard-*`, `--ski-*`, ...).

use clap::Args;
use std::path::PathBuf;

/// Apps with a benchmark, in report order.
pub const BENCHMARKS: &[&str] = &["fraud", "leaderboard", "ledger", "payments", "ski", "tally"];
/// Benchmarks that run only when named: `cluster` needs a Kafka cluster (`--kafka`).
pub const NAMED_ONLY: &[&str] = &["cluster"];

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub leaderboard: LeaderboardBench,
    #[command(flatten)]
    pub ski: SkiBench,
    #[command(flatten)]
    pub ledger: LedgerBench,
    #[command(flatten)]
    pub payments: PaymentsBench,
    /// Apps to benchmark [default: all: fraud, leaderboard, ledger, payments, ski, tally]; `cluster`
    /// (failover of three nodes, needs --kafka) runs only when named
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(BENCHMARKS.iter().chain(NAMED_ONLY)))]
    pub apps: Vec<String>,
    #[command(flatten)]
    pub cluster: ClusterBench,
    #[command(flatten)]
    pub fraud: FraudBench,
    /// Measured seconds of each HTTP load run
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    /// Connections of each HTTP load run
    #[arg(long, default_value_t = 16)]
    pub connections: u32,
    /// Where the report goes
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Kafka bootstrap servers: every server of this run keeps its journal there, each on a new topic
    /// [default: the embedded journal]
    #[arg(long)]
    pub kafka: Option<String>,
}

#[derive(Args)]
pub struct FraudBench {
    /// Cards in the history (the case study's local reference used 1,000,000)
    #[arg(long, default_value_t = 1_000_000)]
    pub cards: u32,
    /// Transactions per run
    #[arg(long, default_value_t = 10_000_000)]
    pub count: u64,
    /// Runs; the report quotes their median
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Records per stream batch
    #[arg(long, default_value_t = 2048)]
    pub batch: usize,
    /// Unacknowledged batches per producer
    #[arg(long, default_value_t = 4)]
    pub window: usize,
    /// Server partitions [default: one per core]
    #[arg(long)]
    pub partitions: Option<u16>,
}

#[derive(Args)]
pub struct LeaderboardBench {
    /// leaderboard: closed-loop connection counts tried for single updates; the best is the peak
    #[arg(long, value_delimiter = ',', default_values_t = [16u32, 32, 64])]
    pub leaderboard_connections: Vec<u32>,
    /// leaderboard: updates per bulk request
    #[arg(long, default_value_t = 100)]
    pub leaderboard_batch: usize,
    /// leaderboard: distinct users (the case study's load test had 100,000)
    #[arg(long, default_value_t = 100_000)]
    pub leaderboard_users: u64,
}

#[derive(Args)]
pub struct SkiBench {
    /// ski: totals of POSTs, each run as 32 x 1,000 then the rest with --ski-connections
    #[arg(long, value_delimiter = ',', default_values_t = [200_000u64, 500_000])]
    pub ski_totals: Vec<u64>,
    /// ski: connections of the second phase (the seed's 168 client threads)
    #[arg(long, default_value_t = 168)]
    pub ski_connections: u32,
    /// ski: queries per second offered while POSTs run
    #[arg(long, default_value_t = 2_000.0)]
    pub ski_query_rate: f64,
}

#[derive(Args)]
pub struct LedgerBench {
    /// ledger: numbers of simulated FSPs, one run each (the PoC's tables used 8, 16 and 32)
    #[arg(long, value_delimiter = ',', default_values_t = [8u32, 16, 32])]
    pub ledger_participants: Vec<u32>,
    /// ledger: closed-loop connections of each run
    #[arg(long, default_value_t = 64)]
    pub ledger_connections: u32,
    /// ledger: one more run of prepare then fulfil (16 FSPs) from this many connections, where group
    /// commits hold more requests each; 0 skips it
    #[arg(long, default_value_t = 256)]
    pub ledger_capacity_connections: u32,
    /// ledger: batch runs as CONNECTIONSxOPERATIONS (TigerBeetle-style batches of 8,000 from a few
    /// clients, and many clients with small batches)
    #[arg(long, value_delimiter = ',', default_values_t = ["4x8000".to_string(), "64x100".to_string(), "64x10".to_string()])]
    pub ledger_batches: Vec<String>,
    /// ledger: server partition counts, a fresh server and every run above for each (with one, every
    /// step of a transfer is local and shares its group commit)
    #[arg(long, value_delimiter = ',', default_values_t = [1u16, 2])]
    pub ledger_partitions: Vec<u16>,
    /// ledger: instead of the runs above, one run of prepare then fulfil this long on a fresh server
    /// (16 FSPs, the first of --ledger-partitions), with the server's memory and disk sampled every
    /// 10 s: the PoC's acceptance test is one hour at 6,020 financial transfers/s
    #[arg(long, default_value_t = 0.0)]
    pub ledger_soak_s: f64,
    /// ledger: instead of the runs above, store this many transfers with the batch API on a fresh
    /// server (the first of --ledger-partitions), then read random ones (`GET /transfers/{id}`) while
    /// the batch load goes on, for --duration-s
    #[arg(long, default_value_t = 0)]
    pub ledger_history: u64,
    /// ledger: with --ledger-history, the rate of the second read run, open loop (the first is
    /// closed loop, as many reads as 4 connections get)
    #[arg(long, default_value_t = 1000.0)]
    pub ledger_history_read_rate: f64,
    /// ledger: with --ledger-history, a third read run, open loop at --ledger-history-read-rate, under
    /// a batch load held to this many transfers/s (open loop, batches of 100) instead of as many as 4
    /// connections get; 0 skips it
    #[arg(long, default_value_t = 20_000.0)]
    pub ledger_history_write_rate: f64,
}

#[derive(Args)]
pub struct PaymentsBench {
    /// payments: closed-loop runs of authorizations; the report quotes their median
    #[arg(long, default_value_t = 3)]
    pub payments_runs: usize,
    /// payments: connections of the closed-loop and the open-loop runs
    #[arg(long, default_value_t = 64)]
    pub payments_connections: u32,
    /// payments: shares of the median peak offered in the open-loop runs
    #[arg(long, value_delimiter = ',', default_values_t = [0.5f64, 0.8])]
    pub payments_open_shares: Vec<f64>,
    /// payments: pending captures settled into files in the settlement run
    #[arg(long, default_value_t = 1_000_000)]
    pub payments_settle_captures: u64,
}

#[derive(Args)]
pub struct ClusterBench {
    /// Node kills of `spate bench cluster`
    #[arg(long, default_value_t = 20)]
    pub kills: usize,
}
