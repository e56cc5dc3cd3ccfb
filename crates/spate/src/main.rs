//! The `spate` command line: parses options and wires the server, the engine and the apps together.

mod allocator;
mod auth_cli;
mod bench;
mod clock;
mod cluster_cli;
mod config;
mod fraud_cli;
mod ledger_cli;
mod load;
mod payments_cli;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "spate",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("SPATE_COMMIT"), ")"),
    about = "A fault-tolerant engine for high-rate transactions"
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run the server: the engine with the enabled apps behind HTTP.
    Serve(Box<config::ServeArgs>),
    /// The fraud app's tools: generator, offline scoring, stream producers.
    #[command(subcommand)]
    Fraud(fraud_cli::FraudCommand),
    /// The ledger app's tools: rebuild the read model from the journal.
    #[command(subcommand)]
    Ledger(ledger_cli::LedgerCommand),
    /// The payments app's tools: settlement, key rotation, settlement file checks.
    #[command(subcommand)]
    Payments(payments_cli::PaymentsCommand),
    /// Drive a running server with a scenario and report throughput, latency and errors.
    Load(load::args::LoadArgs),
    /// Benchmarks that start their own server and write a report.
    Bench(bench::args::BenchArgs),
    /// API keys for a server started with --auth.
    #[command(subcommand)]
    Auth(auth_cli::AuthCommand),
    /// A cluster's membership: which node applies which partition.
    #[command(subcommand)]
    Cluster(cluster_cli::ClusterCommand),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, never in files a log collector reads.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    for refused in allocator::tune() {
        tracing::warn!(
            setting = refused,
            "glibc refused an allocator setting: partitions may pause longer and restore slower \
             (allocator.rs)"
        );
    }
    match Cli::parse().command {
        Commands::Serve(args) => {
            let (server_config, app_names, app_options) = args.resolve()?;
            spate_server::keep_new_files_private(&server_config.engine.data_dir);
            let modules = config::modules(&app_names, &app_options)?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime
                .block_on(spate_server::serve(server_config, modules))
                .map_err(anyhow::Error::msg)
        }
        Commands::Fraud(command) => fraud_cli::run(command),
        Commands::Payments(command) => payments_cli::run(command),
        Commands::Ledger(command) => ledger_cli::run(command),
        Commands::Bench(command) => bench::run(command),
        Commands::Load(args) => load::run(args),
        Commands::Cluster(command) => cluster_cli::run(command),
        Commands::Auth(command) => auth_cli::run(command),
    }
}
