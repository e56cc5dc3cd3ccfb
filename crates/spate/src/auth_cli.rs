//! `spate auth new-key`: makes an API key for a server started with `--auth FILE`.

use anyhow::Context;
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum AuthCommand {
    /// Make a key: print it once, and add its hash with its roles to the key file.
    NewKey(NewKeyArgs),
}

#[derive(Args)]
pub struct NewKeyArgs {
    /// A name for the key, for logs and refusals (who holds it)
    #[arg(long)]
    name: String,
    /// A role (repeat for more): admin, read, metrics, APP:read, APP:write or APP:KIND:NAME, such as
    /// ledger:participant:dfsp1 or payments:merchant:m_1
    #[arg(long = "role", required = true)]
    roles: Vec<String>,
    /// The most requests per second the key may make; more are answered 429 [default: no limit]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    requests_per_s: Option<u32>,
    /// The key file to add it to (created if missing); without it, the entry is printed instead
    #[arg(long)]
    file: Option<PathBuf>,
}

pub fn run(command: AuthCommand) -> anyhow::Result<()> {
    match command {
        AuthCommand::NewKey(args) => new_key(args),
    }
}

fn new_key(args: NewKeyArgs) -> anyhow::Result<()> {
    let apps = crate::config::apps_with_party_kinds();
    for role in &args.roles {
        spate_server::access::check_role(role, &apps).map_err(anyhow::Error::msg)?;
    }
    anyhow::ensure!(
        !args.name.is_empty() && !args.name.contains(['"', '\\', '\n']),
        "--name must be non-empty, without quotes, backslashes or newlines"
    );
    let (key, hash) = spate_server::access::new_key();
    let roles: Vec<String> = args.roles.iter().map(|r| format!("{r:?}")).collect();
    let mut entry = format!(
        "[[key]]\nname = \"{}\"\nsha256 = \"{hash}\"\nroles = [{}]\n",
        args.name,
        roles.join(", ")
    );
    if let Some(rate) = args.requests_per_s {
        entry += &format!("requests_per_s = {rate}\n");
    }
    match &args.file {
        Some(path) => {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            file.write_all(format!("\n{entry}").as_bytes())
                .and_then(|()| file.sync_all())
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!(
                "added key {:?} to {}; restart the server to use it. The key (shown once, only its hash is kept):",
                args.name,
                path.display()
            );
        }
        None => {
            eprintln!(
                "add this to the key file; the key follows it (shown once, only its hash is kept):"
            );
            eprint!("{entry}");
        }
    }
    println!("{key}");
    Ok(())
}
