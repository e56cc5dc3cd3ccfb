//! `--tls-cert` and `--tls-key`: HTTPS with a real client (curl), with API keys over it.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use support::Server;

/// A self-signed certificate for 127.0.0.1 and localhost, and its key, as PEM files in `dir`.
fn certificate(dir: &Path, name: &str) -> (String, String) {
    let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let rcgen::CertifiedKey { cert, key_pair } = rcgen::generate_simple_self_signed(names).unwrap();
    let cert_file = dir.join(format!("{name}.pem"));
    let key_file = dir.join(format!("{name}.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key_pair.serialize_pem()).unwrap();
    (
        cert_file.to_str().unwrap().to_string(),
        key_file.to_str().unwrap().to_string(),
    )
}

/// Runs curl with `args`; its exit code and what it printed.
fn curl(args: &[&str]) -> (i32, String) {
    let output = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "10"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("curl is installed (apt-get install curl)");
    let printed = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), printed)
}

#[test]
fn curl_reaches_the_api_over_tls_and_plain_http_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "server");
    let keys = dir.path().join("keys.toml");
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args([
            "auth",
            "new-key",
            "--name",
            "ops",
            "--role",
            "tally:write",
            "--role",
            "metrics",
        ])
        .arg("--file")
        .arg(&keys)
        .output()
        .unwrap();
    assert!(output.status.success());
    let api_key = String::from_utf8(output.stdout).unwrap().trim().to_string();
    let bearer = format!("Authorization: Bearer {api_key}");
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--apps",
            "tally",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--auth",
            keys.to_str().unwrap(),
        ],
        None,
    );
    let base = &server.base;
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let entries = format!("{base}/tally/accounts/alice/entries");
    for tag in 1..=3 {
        let body = format!("{{\"amount\": 7, \"tag\": {tag}}}");
        let (code, printed) = curl(&[
            "--cacert",
            &cert,
            "-H",
            &bearer,
            "-H",
            "content-type: application/json",
            "-d",
            &body,
            "-w",
            "\n%{http_code}",
            &entries,
        ]);
        assert_eq!(code, 0, "{printed}");
        assert!(printed.ends_with("\n201"), "{printed}");
    }
    let (code, printed) = curl(&[
        "--cacert",
        &cert,
        "-H",
        &bearer,
        &format!("{base}/tally/accounts/alice"),
    ]);
    assert_eq!(code, 0, "{printed}");
    let account: serde_json::Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(account["balance"], "21", "{account}");
    // Without the key, the same TLS connection answers 401.
    let (_, printed) = curl(&[
        "--cacert",
        &cert,
        "-w",
        "\n%{http_code}",
        &format!("{base}/tally/totals"),
    ]);
    assert!(printed.ends_with("\n401"), "{printed}");
    // A client that does not trust the certificate refuses it (curl's 60), one that trusts
    // another certificate too.
    let (code, printed) = curl(&[&format!("{base}/health")]);
    assert_eq!(code, 60, "{printed}");
    let (other_cert, _) = certificate(dir.path(), "other");
    let (code, printed) = curl(&["--cacert", &other_cert, &format!("{base}/health")]);
    assert_eq!(code, 60, "{printed}");
    // Plain HTTP to the TLS port gets no HTTP answer, and the server goes on serving.
    let plain = base.replace("https://", "http://");
    let (code, printed) = curl(&["-w", "%{http_code}", &format!("{plain}/health")]);
    assert!(code != 0 && !printed.contains("200"), "{code} {printed}");
    let (code, printed) = curl(&[
        "--cacert",
        &cert,
        "-w",
        "\n%{http_code}",
        &format!("{base}/health"),
    ]);
    assert_eq!(code, 0, "{printed}");
    assert!(printed.ends_with("\n200"), "{printed}");
    let (_, metrics) = curl(&["--cacert", &cert, "-H", &bearer, &format!("{base}/metrics")]);
    let cut = "spate_http_connections_cut_total{reason=\"tls_handshake\"} ";
    let handshakes_cut: u64 = (metrics.lines())
        .find_map(|line| line.strip_prefix(cut))
        .map_or(0, |n| n.parse().unwrap());
    // The two untrusting clients and the plain one.
    assert_eq!(handshakes_cut, 3, "{metrics}");
}

#[test]
fn a_key_that_does_not_match_its_certificate_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = certificate(dir.path(), "server");
    let (_, other_key) = certificate(dir.path(), "other");
    let data = dir.path().join("data");
    let refused = |args: &[&str]| {
        let args = [&["--apps", "tally", "--listen", "127.0.0.1:0"], args].concat();
        support::refused_serve(&data, &args)
    };
    let stderr = refused(&["--tls-cert", &cert, "--tls-key", &other_key]);
    assert!(
        stderr.contains("does not go with the certificate"),
        "{stderr}"
    );
    let stderr = refused(&["--tls-cert", &cert]);
    assert!(stderr.contains("--tls-key"), "{stderr}");
    let missing = dir.path().join("missing.pem");
    let stderr = refused(&[
        "--tls-cert",
        missing.to_str().unwrap(),
        "--tls-key",
        &other_key,
    ]);
    assert!(
        stderr.contains("cannot read a PEM certificate chain"),
        "{stderr}"
    );
}
