//! `spate payments ...`: the payments app's operator commands.

use anyhow::{Context, bail};
use clap::Subcommand;
use spate_payments::keys::{Kek, Keyring, default_kek_path, rotate};
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum PaymentsCommand {
    /// Settle pending captures now: asks a running server to write the batch files (open batches of an
    /// interrupted run are finished first) and prints its report.
    Settle {
        /// The server [default: http://127.0.0.1:8080]
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Instead, write the files of this batch (`stl_...`) again, byte for byte
        #[arg(long)]
        regenerate: Option<String>,
    },
    /// Re-wrap the data directory's keys under a new key-encrypting key and start a new data key for
    /// new cards. Stop the server first; start it again with the new key.
    RotateKey {
        #[arg(long, env = "SPATE_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
        /// The key-encrypting key the keyring is wrapped with now [default: as `spate serve`]
        #[arg(long, env = "SPATE_KEK_FILE")]
        kek_file: Option<PathBuf>,
        /// The new key-encrypting key; created (mode 0600) if missing
        #[arg(long)]
        new_kek_file: PathBuf,
    },
    /// Check settlement files: the trailer's count, total and MAC.
    VerifySettlement {
        #[arg(long, env = "SPATE_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
        #[arg(long, env = "SPATE_KEK_FILE")]
        kek_file: Option<PathBuf>,
        files: Vec<PathBuf>,
    },
}

fn kek_path(kek_file: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    kek_file
        .or_else(default_kek_path)
        .context("no --kek-file and no HOME to find the default key-encrypting key")
}

fn existing_kek(path: &Path, data_dir: &Path) -> anyhow::Result<Kek> {
    if !path.exists() {
        bail!("the key-encrypting key {} does not exist", path.display());
    }
    Ok(Kek::load_or_create(path, data_dir)?.0)
}

pub fn run(command: PaymentsCommand) -> anyhow::Result<()> {
    match command {
        PaymentsCommand::Settle { url, regenerate } => {
            let base = url.trim_end_matches('/');
            let address = match regenerate {
                Some(batch) => format!("{base}/admin/settlements/{batch}/files"),
                None => format!("{base}/admin/settlements"),
            };
            let mut response = ureq::post(&address)
                .config()
                .http_status_as_error(false)
                .build()
                .send_empty()
                .with_context(|| format!("POST {address}"))?;
            let status = response.status();
            let body = response.body_mut().read_to_string()?;
            println!("{body}");
            if !status.is_success() {
                bail!("settlement failed with HTTP {status}");
            }
            Ok(())
        }
        PaymentsCommand::RotateKey {
            data_dir,
            kek_file,
            new_kek_file,
        } => {
            let old = existing_kek(&kek_path(kek_file)?, &data_dir)?;
            let (new, created) = Kek::load_or_create(&new_kek_file, &data_dir)?;
            if old.id() == new.id() {
                bail!("the new key-encrypting key is the old one");
            }
            let rotation = rotate(&data_dir, &old, &new)?;
            println!(
                "re-wrapped the keyring of {} from {} to {}{}; new cards are sealed with data key {}",
                data_dir.display(),
                rotation.old_kek,
                rotation.new_kek,
                if created { " (created)" } else { "" },
                rotation.new_data_key
            );
            Ok(())
        }
        PaymentsCommand::VerifySettlement {
            data_dir,
            kek_file,
            files,
        } => {
            let kek = existing_kek(&kek_path(kek_file)?, &data_dir)?;
            let keyring = Keyring::open_or_create(&data_dir, &kek)?;
            let mut failed = 0;
            for file in &files {
                let bytes =
                    std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
                match spate_payments::settle::verify(&bytes, &keyring) {
                    Ok((records, total)) => {
                        println!("{}: ok, {records} records, total {total}", file.display())
                    }
                    Err(error) => {
                        failed += 1;
                        println!("{}: BAD: {error}", file.display());
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} of {} files failed verification", files.len());
            }
            Ok(())
        }
    }
}
