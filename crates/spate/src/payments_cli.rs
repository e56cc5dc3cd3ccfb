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
        /// An admin key, for a server started with --auth
        #[arg(long, env = "SPATE_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
    },
    /// Make the keyring the nodes of a cluster share (fresh data, token and MAC keys wrapped by the
    /// KEK); give every node this file with --payments-keyring-file, and the same KEK.
    NewKeyring {
        /// The key-encrypting key that wraps it; created (mode 0600) if missing [default: as `spate serve`]
        #[arg(long, env = "SPATE_KEK_FILE")]
        kek_file: Option<PathBuf>,
        /// Where to write it; refused if it exists
        #[arg(long)]
        keyring_file: PathBuf,
    },
    /// Re-wrap the keyring's keys under a new key-encrypting key and start a new data key for new
    /// cards. Stop the server first (every node, in a cluster); start it again with the new key (and
    /// the rewritten keyring on every node).
    RotateKey {
        #[arg(long, env = "SPATE_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
        #[command(flatten)]
        keyring: KeyringFile,
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
        #[command(flatten)]
        keyring: KeyringFile,
        #[arg(long, env = "SPATE_KEK_FILE")]
        kek_file: Option<PathBuf>,
        files: Vec<PathBuf>,
    },
}

#[derive(clap::Args)]
pub struct KeyringFile {
    /// The keyring [default: as `spate serve`, <data-dir>/payments/keyring.json]
    #[arg(long = "keyring-file", env = "SPATE_PAYMENTS_KEYRING_FILE")]
    path: Option<PathBuf>,
}

impl KeyringFile {
    fn path(&self, data_dir: &Path) -> PathBuf {
        self.path
            .clone()
            .unwrap_or_else(|| Keyring::path_in(data_dir))
    }
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
        PaymentsCommand::Settle {
            url,
            regenerate,
            api_key,
        } => {
            let base = url.trim_end_matches('/');
            let address = match regenerate {
                Some(batch) => format!("{base}/admin/settlements/{batch}/files"),
                None => format!("{base}/admin/settlements"),
            };
            let mut request = ureq::post(&address);
            if let Some(key) = api_key {
                request = request.header("Authorization", format!("Bearer {key}"));
            }
            let mut response = request
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
        PaymentsCommand::NewKeyring {
            kek_file,
            keyring_file,
        } => {
            if keyring_file.exists() {
                bail!(
                    "{} exists; a cluster's nodes must share one keyring, so it is never replaced",
                    keyring_file.display()
                );
            }
            let kek_file = kek_path(kek_file)?;
            let (kek, created) = Kek::read_or_create(&kek_file)?;
            let keyring = Keyring::load_or_create(&keyring_file, &kek)?;
            println!(
                "wrote {} (data key {}) wrapped by {}{}; give every node this file \
                 (--payments-keyring-file) and the same KEK (--kek-file)",
                keyring_file.display(),
                keyring.active_data_key(),
                kek.id(),
                if created { " (created)" } else { "" }
            );
            Ok(())
        }
        PaymentsCommand::RotateKey {
            data_dir,
            keyring,
            kek_file,
            new_kek_file,
        } => {
            let old = existing_kek(&kek_path(kek_file)?, &data_dir)?;
            let (new, created) = Kek::load_or_create(&new_kek_file, &data_dir)?;
            if old.id() == new.id() {
                bail!("the new key-encrypting key is the old one");
            }
            let keyring = keyring.path(&data_dir);
            let rotation = rotate(&keyring, &old, &new)?;
            println!(
                "re-wrapped the keyring {} from {} to {}{}; new cards are sealed with data key {}",
                keyring.display(),
                rotation.old_kek,
                rotation.new_kek,
                if created { " (created)" } else { "" },
                rotation.new_data_key
            );
            Ok(())
        }
        PaymentsCommand::VerifySettlement {
            data_dir,
            keyring,
            kek_file,
            files,
        } => {
            let kek = existing_kek(&kek_path(kek_file)?, &data_dir)?;
            let keyring = Keyring::load(&keyring.path(&data_dir), &kek)?;
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
