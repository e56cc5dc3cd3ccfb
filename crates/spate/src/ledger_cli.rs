//! `spate ledger ...`: the ledger app's operator commands.

use anyhow::{Context, bail};
use clap::Subcommand;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum LedgerCommand {
    /// Rebuild the ledger's read model from every event in the journal at the next start: removes its
    /// checkpoint. Needs a journal that kept every record (`spate serve --journal-retention all` from
    /// the start); run it with the server stopped.
    Rebuild {
        #[arg(long, env = "SPATE_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
    },
}

/// The first LSN each partition's journal still holds (its oldest segment's name).
fn journal_starts(data_dir: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    let partitions = data_dir.join("partitions");
    let mut starts = Vec::new();
    for entry in std::fs::read_dir(&partitions)
        .with_context(|| format!("{} is not a spate data directory", data_dir.display()))?
    {
        let partition = entry?.path();
        let first = std::fs::read_dir(partition.join("journal"))?
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_suffix(".seg")?
                    .parse::<u64>()
                    .ok()
            })
            .min()
            .unwrap_or(0);
        starts.push((partition.display().to_string(), first));
    }
    starts.sort();
    Ok(starts)
}

pub fn run(command: LedgerCommand) -> anyhow::Result<()> {
    match command {
        LedgerCommand::Rebuild { data_dir } => {
            let released: Vec<String> = journal_starts(&data_dir)?
                .into_iter()
                .filter(|(_, first)| *first > 0)
                .map(|(partition, first)| format!("{partition} starts at record {first}"))
                .collect();
            if !released.is_empty() {
                bail!(
                    "the journal no longer holds every event ({}): a rebuild would lose what was released. \
                     Keep every record with `spate serve --journal-retention all` from the start",
                    released.join("; ")
                );
            }
            let checkpoint = data_dir
                .join("projections")
                .join(format!("{}.snap", spate_ledger::APP_NAME));
            match std::fs::remove_file(&checkpoint) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("removing {}", checkpoint.display()));
                }
            }
            println!(
                "the ledger's read model will be rebuilt from every event in the journal when `spate serve` next starts"
            );
            Ok(())
        }
    }
}
