//! The live dashboard at `/`, opened in a real browser (Debian's chromium, driven by playwright-core;
//! `scripts/browser-check.sh` installs both on first use) while `spate load` drives every app: the page
//! refreshes by itself, its numbers move and lie between two scrapes of `/metrics` and of each app's
//! endpoint, each app under load shows throughput and a panel, and no console error, page error or
//! failed request appears. The screenshots are saved in `target/tmp/` (`CARGO_TARGET_TMPDIR`). A
//! cluster node's page, which shows the nodes and their partitions too, is checked in `kafka.rs`. The
//! files themselves (types, Content-Security-Policy, nothing else under `/dashboard/`) are checked
//! without a browser too.

mod support;

use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::browser::{Key, check_dashboard};
use support::{Server, agent, new_key};

/// Apps and the `spate load` scenario that keeps each busy while the browser looks.
const LOADS: [(&str, &str); 6] = [
    ("tally", "adds"),
    ("leaderboard", "updates"),
    ("ski", "rides"),
    ("ledger", "transfers"),
    ("payments", "mix"),
    ("fraud", "http"),
];
/// Low rates: the browser and the load share the machine with the server.
const LOAD_REQUESTS_PER_S: &str = "50";
const LOAD_DURATION_S: &str = "120";

/// Runs `spate load APP SCENARIO` against `base` in the background.
fn start_load(base: &str, app: &str, scenario: &str) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spate"));
    command.args(["load", app, scenario, "--target", base]);
    command.args([
        "--rate",
        LOAD_REQUESTS_PER_S,
        "--duration-s",
        LOAD_DURATION_S,
    ]);
    command.args(["--connections", "2", "--warmup-s", "0"]);
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

struct Loads(Vec<Child>);

impl Drop for Loads {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The page's files, as a client that is not a browser sees them: each with its type and the policy
/// that keeps the page to its own script and origin, and nothing else under `/dashboard/`.
#[test]
fn the_dashboard_files_are_served_with_their_policy_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--apps", "tally"], None);
    let agent = agent();
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/dashboard/app.js", "text/javascript; charset=utf-8"),
        ("/dashboard/style.css", "text/css; charset=utf-8"),
    ] {
        let response = agent.get(&format!("{}{path}", server.base)).call().unwrap();
        let header = |name: &str| {
            (response.headers().get(name))
                .map(|value| value.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(header("content-type"), content_type, "{path}");
        let policy = header("content-security-policy");
        assert!(
            policy.contains("script-src 'self'") && policy.contains("connect-src 'self'"),
            "{path}: {policy}"
        );
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
    }
    for path in [
        "/dashboard/nope.js",
        "/dashboard/..%2Fapp.js",
        "/dashboard/app.js/x",
    ] {
        let (status, body) =
            support::raw_request(&server.base, &format!("GET {path} HTTP/1.1\r\n"));
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (status, &body["error"]["code"]),
            (404, &json!("not_found")),
            "{path}"
        );
    }
    let (status, _) =
        support::raw_request(&server.base, "POST / HTTP/1.1\r\nContent-Length: 0\r\n");
    assert_eq!(status, 405);
}

#[test]
fn the_dashboard_shows_every_app_under_load_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let kek = dir.path().join("kek");
    let server = Server::start(
        &dir.path().join("data"),
        &["--kek-file", kek.to_str().unwrap()],
        None,
    );
    let _loads = Loads(
        (LOADS.iter())
            .map(|&(app, scenario)| start_load(&server.base, app, scenario))
            .collect(),
    );
    let apps: Vec<&str> = LOADS.iter().map(|&(app, _)| app).collect();
    check_dashboard(&server.base, "dashboard.png", &apps, Key::None);
}

#[test]
fn behind_keys_the_dashboard_asks_for_one_and_shows_what_the_key_may_read() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let writer = new_key(&keys, "writer", &["tally:write"]);
    let reader = new_key(&keys, "reader", &["read"]);
    let observer = new_key(&keys, "observer", &["metrics"]);
    let server = Server::start(
        &dir.path().join("data"),
        &["--apps", "tally", "--auth", keys.to_str().unwrap()],
        None,
    );
    // `spate load` sends no key: a thread adds entries with the writer's.
    let stop = Arc::new(AtomicBool::new(false));
    let adder = {
        let (url, stop) = (
            format!("{}/tally/accounts/a/entries", server.base),
            stop.clone(),
        );
        std::thread::spawn(move || {
            let agent = agent();
            for tag in 0u64.. {
                if stop.load(Ordering::Relaxed) {
                    return tag;
                }
                let sent = (agent.post(&url))
                    .header("Authorization", format!("Bearer {writer}"))
                    .send_json(json!({"amount": 1, "tag": tag}));
                // The server goes away when a failed check ends the test.
                let Ok(reply) = sent else { return tag };
                assert_eq!(reply.status(), 201);
                std::thread::sleep(Duration::from_millis(10));
            }
            unreachable!()
        })
    };
    check_dashboard(
        &server.base,
        "dashboard-with-keys.png",
        &["tally"],
        Key::Read(&reader),
    );
    // A key that may read only the metrics: the charts still refresh, the panel says what it may not
    // read, and the page does not ask for another key.
    check_dashboard(
        &server.base,
        "dashboard-with-a-metrics-key.png",
        &["tally"],
        Key::MetricsOnly(&observer),
    );
    stop.store(true, Ordering::Relaxed);
    assert!(adder.join().unwrap() > 0);
}
