//! `spate bench [app...]`: each app's benchmark against a fresh server on a temporary data directory,
//! written as one Markdown report (`REPORT.md`) with JSON and SVG charts next to it. This module runs the
//! named benchmarks in order and assembles the report; each app's is in a file of its own:
//!
//! - fraud: `fraud.rs`.
//! - leaderboard: `leaderboard.rs`.
//! - ski: `ski.rs`.
//! - ledger: `ledger.rs`.
//! - payments: `payments.rs`.
//! - cluster (only when named, with `--kafka`): failover of three nodes, `cluster.rs`.
//! - tally: `tally.rs`.
//!
//! Their arguments are in `args.rs`, what they share in `common.rs`.

pub mod args;
mod cluster;
mod common;
mod fraud;
mod leaderboard;
mod ledger;
mod payments;
mod ski;
mod tally;

use args::{BENCHMARKS, BenchArgs, NAMED_ONLY};
use common::{KAFKA, machine, take_longest_pause, utc_date};

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let apps: Vec<&str> = if args.apps.is_empty() {
        BENCHMARKS.to_vec()
    } else {
        BENCHMARKS
            .iter()
            .chain(NAMED_ONLY)
            .copied()
            .filter(|b| args.apps.iter().any(|a| a == b))
            .collect()
    };
    std::fs::create_dir_all(&args.out)?;
    if let Some(kafka) = &args.kafka {
        KAFKA.set(kafka.clone()).expect("run is called once");
    }
    let command_line = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let journal = match &args.kafka {
        Some(kafka) => format!("Kafka at {kafka} (acks=all, a transaction per group commit)"),
        None => "embedded (fdatasync per group commit)".into(),
    };
    let mut report = format!(
        "# spate benchmark report\n\n- machine: {}\n- date: {}\n- journal: {journal}\n- command: `spate {command_line}`\n\n",
        machine(),
        utc_date(crate::clock::wall_ms())
    );
    for app in apps {
        let section = match app {
            "fraud" => fraud::run(&args.fraud, &args.out)?,
            "tally" => tally::run(&args)?,
            "leaderboard" => leaderboard::run(&args)?,
            "ski" => ski::run(&args)?,
            "ledger" => ledger::run(&args)?,
            "payments" => payments::run(&args)?,
            "cluster" => cluster::run(&args)?,
            other => unreachable!("no benchmark for {other}"),
        };
        report += &section;
        report += "\n";
        report += &take_longest_pause();
        report += "\n";
        std::fs::write(args.out.join("REPORT.md"), &report)?;
    }
    println!("{report}");
    eprintln!("report written to {}", args.out.join("REPORT.md").display());
    Ok(())
}
