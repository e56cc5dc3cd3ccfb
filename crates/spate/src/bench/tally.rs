//! `spate bench tally`: `spate load tally adds` in closed loop, then in open loop at half the rate the
//! closed loop achieved, so the report shows latency at a sustainable offered load as well as at
//! saturation.

use super::args::BenchArgs;
use super::common::{load_table, start_server};
use crate::load::args::LoadArgs;
use crate::load::common::write_outputs;
use crate::load::load_http;

/// tally: closed loop to find the saturation rate, then open loop at half of it.
pub fn run(args: &BenchArgs) -> anyhow::Result<String> {
    let data_dir = tempfile::tempdir()?;
    let server = start_server(data_dir.path(), "tally", args.fraud.partitions)?;
    let mut load = LoadArgs::new("tally", "adds", &server.http);
    load.connections = args.connections;
    load.duration_s = args.duration_s;
    let closed = load_http(&load)?;
    write_outputs(&closed, &args.out, "tally-adds-closed")?;
    load.rate = Some((closed.ok_rate_per_s / 2.0).max(1.0));
    load.seed = 2;
    let open = load_http(&load)?;
    write_outputs(&open, &args.out, "tally-adds-open")?;
    drop(server);
    let mut text = String::from(
        "## tally: POST /tally/accounts/{name}/entries (10,000 accounts, idempotency keys)\n\n",
    );
    text += &load_table(&[
        ("closed loop", &closed, "tally-adds-closed"),
        ("open loop", &open, "tally-adds-open"),
    ]);
    Ok(text)
}
