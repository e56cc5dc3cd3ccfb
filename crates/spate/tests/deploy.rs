//! The files in `deploy/` against a real server: every metric the Grafana dashboard queries is one the
//! server exports, so a renamed metric fails here instead of leaving a panel empty.

mod support;

use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;
use support::{Server, agent, get, metrics_text, post};

fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/spate.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// The `spate_*` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("spate_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn every_metric_the_dashboard_queries_is_exported() {
    let dashboard = dashboard();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut queried = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("");
        assert!(!title.is_empty(), "a panel without a title: {panel}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            let names = metric_names(target["expr"].as_str().expect("expr"));
            assert!(!names.is_empty(), "{title}: a query of no spate metric");
            queried.extend(names);
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[], None);
    let agent = agent();
    let base = &server.base;
    // A write and an error, so that the families with labels have their first series.
    let entries = format!("{base}/tally/accounts/alice/entries");
    let written = post(&agent, &entries, None, &json!({"amount": 5, "tag": 1})).unwrap();
    assert_eq!(written.0, 201);
    assert_eq!(get(&agent, &format!("{base}/tally/accounts/nobody")).0, 404);
    let page = metrics_text(&agent, base);
    let exported: BTreeSet<&str> = (page.lines())
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = (queried.iter())
        .filter(|name| !exported.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics the server does not export: {missing:?}"
    );
}

#[test]
fn metric_names_are_read_from_promql() {
    assert_eq!(
        metric_names("sum by (le) (rate(spate_a_bucket{x=\"y\"}[1m])) / spate_b"),
        ["spate_a_bucket", "spate_b"]
    );
}

#[test]
fn the_packaged_config_names_every_option_of_serve() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let options: Vec<String> = (help.lines())
        .filter_map(|line| line.trim_start().strip_prefix("--"))
        .map(|rest| rest.split([' ', '=']).next().unwrap().replace('-', "_"))
        .filter(|name| name != "help" && name != "config")
        .collect();
    assert!(options.len() > 40, "{options:?}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/debian/spate.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    let named = |name: &str| {
        (config.lines()).any(|line| {
            let line = line.strip_prefix("# ").unwrap_or(line);
            line.starts_with(&format!("{name} = "))
        })
    };
    let missing: Vec<&String> = options.iter().filter(|name| !named(name)).collect();
    assert!(
        missing.is_empty(),
        "{} does not name these options of `spate serve`: {missing:?}",
        path.display()
    );
}
