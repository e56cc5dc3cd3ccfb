//! `spate cluster status`: which node applies which partition, as a node of the cluster describes it.

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::Value;

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Show the cluster's nodes and the partitions each applies.
    Status(StatusArgs),
}

#[derive(Args)]
pub struct StatusArgs {
    /// Any node of the cluster (its HTTP address)
    #[arg(long, default_value = "127.0.0.1:8080")]
    node: String,
    /// A key with the role metrics, read or admin, for nodes started with --auth
    #[arg(long, env = "SPATE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Status(args) => status(&args.node, args.api_key.as_deref()),
    }
}

fn status(node: &str, api_key: Option<&str>) -> anyhow::Result<()> {
    let url = format!("http://{node}/cluster");
    let mut request = ureq::get(&url);
    if let Some(key) = api_key {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    let status: Value = request
        .call()
        .with_context(|| format!("asking {url} (is it a node started with --node-id?)"))?
        .body_mut()
        .read_json()
        .context("reading the cluster's description")?;
    print!("{}", render(&status));
    Ok(())
}

fn render(status: &Value) -> String {
    let mut out = format!(
        "{} partitions, {} without an owner (answered by node {})\n{:<8} {:<24} partitions\n",
        status["partitions"], status["partitions_unowned"], status["node_id"], "node", "address"
    );
    for node in status["nodes"].as_array().into_iter().flatten() {
        let partitions: Vec<String> = node["partitions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(Value::to_string)
            .collect();
        out.push_str(&format!(
            "{:<8} {:<24} {}\n",
            node["node_id"].to_string(),
            node["address"].as_str().unwrap_or("?"),
            partitions.join(",")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lists_every_node_and_its_partitions() {
        let status = serde_json::json!({
            "node_id": 2, "partitions": 4, "partitions_unowned": 1,
            "nodes": [
                {"node_id": 1, "address": "127.0.0.1:18081", "partitions": [0, 3]},
                {"node_id": 2, "address": "127.0.0.1:18082", "partitions": [1]},
            ],
        });
        let text = render(&status);
        assert!(text.starts_with("4 partitions, 1 without an owner (answered by node 2)"));
        assert!(
            text.contains("1        127.0.0.1:18081          0,3\n"),
            "{text}"
        );
        assert!(
            text.contains("2        127.0.0.1:18082          1\n"),
            "{text}"
        );
    }
}
