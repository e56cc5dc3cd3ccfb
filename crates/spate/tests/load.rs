//! `spate load` against the real server: a clean run exits 0 and writes its report and chart; failures are
//! counted and turn the exit status non-zero above the threshold.

mod support;

use serde_json::Value;
use std::process::Command;
use support::Server;

fn load(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spate"))
        .arg("load")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_clean_run_reports_and_a_failing_one_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--apps", "tally"], None);
    let out = dir.path().join("report");
    let output = load(&[
        "tally",
        "adds",
        "--target",
        &server.base,
        "--requests",
        "300",
        "--connections",
        "4",
        "--warmup-s",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("tally-adds.json")).unwrap()).unwrap();
    assert_eq!(report["requests"], 300);
    assert_eq!(report["ok"], 300);
    let svg = std::fs::read_to_string(out.join("tally-adds.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
    // Every add was applied once: the totals projection counts as many entries as requests were sent.
    let agent = support::agent();
    let totals = format!("{}/tally/totals", server.base);
    assert!(support::eventually(
        std::time::Duration::from_secs(10),
        || { support::get(&agent, &totals).1["entries"] == 300 }
    ));

    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = load(&[
        "server",
        "health",
        "--target",
        &format!("http://127.0.0.1:{closed_port}"),
        "--requests",
        "20",
        "--warmup-s",
        "0",
    ]);
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("error connect: 20"), "{stdout}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("above --max-error-share"));
    assert!(!load(&["nosuch", "thing"]).status.success());
}
