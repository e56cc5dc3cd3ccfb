//! The dashboard checked in a real browser: `scripts/browser-check.sh` (Debian's chromium driven by
//! playwright-core, both installed on first use) runs `scripts/dashboard-check.mjs`.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// The key the page is given, if the server asks for one.
#[derive(Clone, Copy)]
pub enum Key<'a> {
    None,
    /// A key of the role `read`: the page must show everything.
    Read(&'a str),
    /// A key of the role `metrics`: the charts must refresh, and the panels say what it may not read.
    MetricsOnly(&'a str),
}

/// Opens `base`'s dashboard with `key` while `apps` are under load, and panics with the check's
/// report unless it passes; the screenshot goes to `target/tmp/SCREENSHOT`. Returns the report (what
/// the page showed).
pub fn check_dashboard(base: &str, screenshot: &str, apps: &[&str], key: Key<'_>) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/browser-check.sh");
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join(screenshot);
    let mut command = Command::new(script);
    command.arg(base).arg(&screenshot).args(apps);
    match key {
        Key::None => {}
        Key::Read(key) => {
            command.env("SPATE_DASHBOARD_KEY", key);
        }
        Key::MetricsOnly(key) => {
            command.env("SPATE_DASHBOARD_KEY", key);
            command.env("SPATE_DASHBOARD_KEY_METRICS_ONLY", "1");
        }
    }
    let output = command.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        output.status.success(),
        "the dashboard check failed:\n{stdout}\n{stderr}"
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: the check printed {stdout:?}"));
    assert!(report["rounds"].as_u64().unwrap() >= 3, "{report}");
    assert!(screenshot.metadata().unwrap().len() > 0);
    report
}
