//! `--auth`: API keys with roles, against the real binary. Every endpoint of every app is walked with no
//! key, an unknown key, a key of another app, a reader's, every app's writer's and an admin's; a ledger
//! participant's and a merchant's keys are held to their own party.

mod support;

use serde_json::{Value, json};
use support::endpoints::Need::{self, Admin, Read, Write};
use support::endpoints::{APPS, ENDPOINTS};
use support::ledger::{fulfil_body, prepare_body, transfer_id};
use support::{Server, agent, new_key, new_key_with};

/// Sends `method path` with `key` and a JSON `body`; the status, the headers' `WWW-Authenticate` and
/// the JSON answer.
fn call(
    agent: &ureq::Agent,
    base: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, Option<String>, Value) {
    let uri = format!("{base}{path}");
    let mut request = ureq::http::Request::builder().method(method).uri(&uri);
    if let Some(key) = key {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let bytes = body.map_or_else(Vec::new, |b| serde_json::to_vec(b).unwrap());
    let request = request
        .header("content-type", "application/json")
        .body(bytes)
        .unwrap();
    let mut response = agent.run(request).expect("answered");
    let challenge =
        (response.headers().get("www-authenticate")).map(|v| v.to_str().unwrap().to_string());
    let status = response.status().as_u16();
    let value = response.body_mut().read_json().unwrap_or(Value::Null);
    (status, challenge, value)
}

/// The `code` of a refusal, in the app's error shape (ski's is `{"message"}`, with no code).
fn refusal_code(app: &str, body: &Value) -> String {
    if app == "ski" {
        assert!(
            body["message"].is_string() && body.get("error").is_none(),
            "{body}"
        );
        return "ski".into();
    }
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["code"].as_str().unwrap().to_string()
}

#[test]
fn every_endpoint_refuses_requests_without_a_key_or_beyond_its_roles() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let admin = new_key(&keys, "ops", &["admin"]);
    let reader = new_key(&keys, "auditor", &["read"]);
    let writer_roles: Vec<String> = APPS.iter().map(|app| format!("{app}:write")).collect();
    let writer_roles: Vec<&str> = writer_roles.iter().map(String::as_str).collect();
    let writer = new_key(&keys, "every app", &writer_roles);
    let tally_writer = new_key(&keys, "tally only", &["tally:write"]);
    let metrics = new_key(&keys, "prometheus", &["metrics"]);
    let data = dir.path().join("data");
    let kek = dir.path().join("kek");
    let server = Server::start(
        &data,
        &[
            "--auth",
            keys.to_str().unwrap(),
            "--kek-file",
            kek.to_str().unwrap(),
        ],
        None,
    );
    let agent = agent();
    let base = &server.base;
    let passes = |status: u16| status != 401 && status != 403;
    for &(method, path, app, need) in ENDPOINTS {
        let what = format!("{method} {path}");
        let send = |key: Option<&str>| call(&agent, base, method, path, key, &[], Some(&json!({})));
        let (status, challenge, body) = send(None);
        assert_eq!(status, 401, "{what} without a key: {body}");
        assert_eq!(challenge.as_deref(), Some("Bearer"), "{what}");
        let code = refusal_code(app, &body);
        assert!(code == "unauthenticated" || code == "ski", "{what}: {body}");
        let (status, _, body) = send(Some("spate_0000"));
        assert_eq!(status, 401, "{what} with an unknown key: {body}");
        let other_app = if app == "tally" {
            &metrics
        } else {
            &tally_writer
        };
        let (status, _, body) = send(Some(other_app));
        assert_eq!(status, 403, "{what} with another app's key: {body}");
        let code = refusal_code(app, &body);
        assert!(code == "forbidden" || code == "ski", "{what}: {body}");
        let (status, _, body) = send(Some(&reader));
        assert_eq!(
            passes(status),
            need == Read,
            "{what} with a reader's key: {status} {body}"
        );
        let (status, _, body) = send(Some(&writer));
        assert_eq!(
            passes(status),
            need != Admin,
            "{what} with a writer's key: {status} {body}"
        );
        let (status, _, body) = send(Some(&admin));
        assert!(passes(status), "{what} with the admin key: {status} {body}");
    }
    // What a load balancer probes is open; what Prometheus scrapes needs a key.
    let (status, _, _) = call(&agent, base, "GET", "/health", None, &[], None);
    assert_eq!(status, 200);
    for (key, expected) in [
        (None, 401),
        (Some(&tally_writer), 403),
        (Some(&metrics), 200),
        (Some(&reader), 200),
    ] {
        let (status, _, _) = call(
            &agent,
            base,
            "GET",
            "/metrics",
            key.map(String::as_str),
            &[],
            None,
        );
        assert_eq!(status, expected, "/metrics");
    }
    let text = agent
        .get(format!("{base}/metrics"))
        .header("Authorization", format!("Bearer {metrics}"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let refused = |reason: &str| -> u64 {
        let line = format!("spate_http_refused_total{{reason=\"{reason}\"}} ");
        (text.lines())
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map_or(0, |n| n.parse().unwrap())
    };
    let endpoints = ENDPOINTS.len() as u64;
    assert_eq!(refused("no_key"), endpoints + 1, "{text}");
    assert_eq!(refused("unknown_key"), endpoints);
    let count = |needs: &[Need]| ENDPOINTS.iter().filter(|e| needs.contains(&e.3)).count() as u64;
    // Another app's key everywhere, the reader's beyond reads, the writer's on admin routes, and
    // the tally writer's on /metrics.
    let forbidden = endpoints + count(&[Write, Admin]) + count(&[Admin]) + 1;
    assert_eq!(refused("forbidden"), forbidden, "{text}");
}

#[test]
fn a_participants_and_a_merchants_keys_act_only_for_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let admin = new_key(&keys, "hub", &["admin"]);
    let dfsp1 = new_key(&keys, "dfsp1", &["ledger:participant:dfsp1"]);
    let dfsp2 = new_key(&keys, "dfsp2", &["ledger:participant:dfsp2"]);
    let dfsp3 = new_key(&keys, "dfsp3", &["ledger:participant:dfsp3"]);
    let acme = new_key(&keys, "acme", &["payments:merchant:acme_shop"]);
    let grocer = new_key(&keys, "grocer", &["payments:merchant:corner_grocer"]);
    let kek = dir.path().join("kek");
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--apps",
            "ledger,payments",
            "--auth",
            keys.to_str().unwrap(),
            "--kek-file",
            kek.to_str().unwrap(),
        ],
        None,
    );
    let agent = agent();
    let base = &server.base;
    let send =
        |method: &str, path: &str, key: &str, headers: &[(&str, &str)], body: Option<&Value>| {
            let (status, _, body) = call(&agent, base, method, path, Some(key), headers, body);
            (status, body)
        };
    let out_of_scope = |(status, body): (u16, Value)| {
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["error"]["code"], "out_of_scope", "{body}");
    };

    // The ledger: only the hub operator makes participants and sets their caps.
    for name in ["dfsp1", "dfsp2", "dfsp3"] {
        let body = json!({"name": name, "currency": "USD", "ndc": "1000"});
        let (status, body) = send("POST", "/participants", &dfsp1, &[], Some(&body));
        assert_eq!(status, 403, "{body}");
        let (status, body) = send(
            "POST",
            "/participants",
            &admin,
            &[],
            Some(&json!({"name": name, "currency": "USD", "ndc": "1000"})),
        );
        assert_eq!(status, 201, "{body}");
    }
    let (status, _) = send(
        "PUT",
        "/participants/dfsp1/ndc",
        &dfsp1,
        &[],
        Some(&json!({"ndc": "5000"})),
    );
    assert_eq!(status, 403, "a participant does not set its own cap");
    assert_eq!(send("GET", "/participants/dfsp1", &dfsp1, &[], None).0, 200);
    out_of_scope(send("GET", "/participants/dfsp2", &dfsp1, &[], None));
    out_of_scope(send(
        "GET",
        "/participants/dfsp2/entries",
        &dfsp1,
        &[],
        None,
    ));
    assert_eq!(send("GET", "/participants", &dfsp1, &[], None).0, 403);

    // dfsp1 prepares as the payer only, and only dfsp2 (the payee) completes.
    let prepare = prepare_body(1, "dfsp1", "dfsp2", "10", 60_000);
    let (status, body) = send(
        "POST",
        "/transfers",
        &dfsp1,
        &[("FSPIOP-Source", "dfsp1")],
        Some(&prepare),
    );
    assert!(status == 201 || status == 202, "{status} {body}");
    out_of_scope(send(
        "POST",
        "/transfers",
        &dfsp1,
        &[],
        Some(&prepare_body(2, "dfsp2", "dfsp1", "10", 60_000)),
    ));
    out_of_scope(send(
        "POST",
        "/transfers",
        &dfsp1,
        &[("FSPIOP-Source", "dfsp3")],
        Some(&prepare_body(3, "dfsp1", "dfsp2", "10", 60_000)),
    ));
    let transfer = format!("/transfers/{}", transfer_id(1));
    out_of_scope(send(
        "PUT",
        &transfer,
        &dfsp1,
        &[("FSPIOP-Source", "dfsp2")],
        Some(&fulfil_body(1)),
    ));
    let error = json!({"errorInformation": {"errorCode": "5100", "errorDescription": "no"}});
    out_of_scope(send(
        "PUT",
        &format!("{transfer}/error"),
        &dfsp1,
        &[("FSPIOP-Source", "dfsp2")],
        Some(&error),
    ));
    let (status, body) = send(
        "PUT",
        &transfer,
        &dfsp2,
        &[("FSPIOP-Source", "dfsp2")],
        Some(&fulfil_body(1)),
    );
    assert_eq!(
        (status, body["transferState"].as_str()),
        (200, Some("COMMITTED")),
        "{body}"
    );
    // Payer and payee see the transfer; a third party does not.
    assert_eq!(send("GET", &transfer, &dfsp1, &[], None).0, 200);
    assert_eq!(send("GET", &transfer, &dfsp2, &[], None).0, 200);
    out_of_scope(send("GET", &transfer, &dfsp3, &[], None));
    let batch = json!({"operations": [
        {"prepare": prepare_body(4, "dfsp1", "dfsp2", "1", 60_000)},
        {"prepare": prepare_body(5, "dfsp2", "dfsp1", "1", 60_000)},
        {"reject": {"transferId": transfer_id(4), "source": "dfsp2"}},
    ]});
    let (status, body) = send("POST", "/transfers/batch", &dfsp1, &[], Some(&batch));
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert!(results[0]["transferState"].is_string(), "{body}");
    for refused in &results[1..] {
        assert!(
            refused.to_string().contains("out_of_scope") || refused.to_string().contains("403"),
            "{body}"
        );
    }
    let (status, body) = send(
        "GET",
        &format!("/transfers/{}", transfer_id(5)),
        &admin,
        &[],
        None,
    );
    assert_eq!(status, 404, "the refused prepare was never made: {body}");

    // Payments: a merchant authorizes, reads, lists and captures its own payments only.
    let authorization = |merchant: &str| {
        json!({
            "amount": 1000,
            "currency": "usd",
            "merchant": merchant,
            "card": {"number": "4242424242424242", "exp_month": 12, "exp_year": 2030, "cvc": "123"},
            "tax": {"category": "general", "jurisdiction": "US-CA"},
        })
    };
    let (status, paid) = send(
        "POST",
        "/v1/payments",
        &acme,
        &[("Idempotency-Key", "a1")],
        Some(&authorization("acme_shop")),
    );
    assert_eq!(status, 200, "{paid}");
    let (status, _) = send(
        "POST",
        "/v1/payments",
        &grocer,
        &[("Idempotency-Key", "g1")],
        Some(&authorization("corner_grocer")),
    );
    assert_eq!(status, 200);
    out_of_scope(send(
        "POST",
        "/v1/payments",
        &acme,
        &[("Idempotency-Key", "a2")],
        Some(&authorization("corner_grocer")),
    ));
    let payment = format!("/v1/payments/{}", paid["id"].as_str().unwrap());
    assert_eq!(send("GET", &payment, &acme, &[], None).0, 200);
    out_of_scope(send("GET", &payment, &grocer, &[], None));
    out_of_scope(send(
        "POST",
        &format!("{payment}/capture"),
        &grocer,
        &[("Idempotency-Key", "g2")],
        Some(&json!({})),
    ));
    out_of_scope(send(
        "POST",
        &format!("{payment}/cancel"),
        &grocer,
        &[("Idempotency-Key", "g3")],
        Some(&json!({})),
    ));
    out_of_scope(send(
        "GET",
        "/v1/payments?merchant=acme_shop",
        &grocer,
        &[],
        None,
    ));
    assert_eq!(send("GET", "/v1/events", &grocer, &[], None).0, 403);
    // The summary counts every merchant's payments: an operator's view.
    assert_eq!(
        send("GET", "/v1/payments/summary", &grocer, &[], None).0,
        403
    );
    let listed = support::eventually(std::time::Duration::from_secs(10), || {
        let (status, body) = send("GET", "/v1/payments", &grocer, &[], None);
        assert_eq!(status, 200, "{body}");
        let merchants: Vec<_> = (body["data"].as_array().unwrap().iter())
            .map(|p| p["merchant"].as_str().unwrap().to_string())
            .collect();
        assert!(merchants.iter().all(|m| m == "corner_grocer"), "{body}");
        merchants.len() == 1
    });
    assert!(listed, "the grocer's list holds its payment and no other");
    let (status, body) = send(
        "POST",
        &format!("{payment}/capture"),
        &acme,
        &[("Idempotency-Key", "a3")],
        Some(&json!({})),
    );
    assert_eq!(
        (status, body["amount_captured"].as_u64()),
        (200, Some(1000)),
        "{body}"
    );
}

#[test]
fn a_key_over_its_rate_is_answered_429_and_other_keys_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let bursty = new_key_with(&keys, "bursty", &["tally:read"], &["--requests-per-s", "5"]);
    let calm = new_key(&keys, "calm", &["tally:read"]);
    let server = Server::start(
        &dir.path().join("data"),
        &["--apps", "tally", "--auth", keys.to_str().unwrap()],
        None,
    );
    let agent = agent();
    let (mut served, mut limited) = (0, 0);
    for _ in 0..40 {
        let (status, _, body) = call(
            &agent,
            &server.base,
            "GET",
            "/tally/totals",
            Some(&bursty),
            &[],
            None,
        );
        match status {
            200 => served += 1,
            429 => {
                assert_eq!(body["error"]["code"], "rate_limited", "{body}");
                limited += 1;
            }
            other => panic!("{other} {body}"),
        }
        let (status, _, _) = call(
            &agent,
            &server.base,
            "GET",
            "/tally/totals",
            Some(&calm),
            &[],
            None,
        );
        assert_eq!(status, 200, "another key is not limited");
    }
    // A second's worth at once, and what refills while the 80 requests are made.
    assert!((5..=10).contains(&served), "{served} served");
    assert_eq!(served + limited, 40);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (status, _, _) = call(
        &agent,
        &server.base,
        "GET",
        "/tally/totals",
        Some(&bursty),
        &[],
        None,
    );
    assert_eq!(status, 200, "the bucket refills");
}

#[test]
fn a_server_reachable_from_other_machines_needs_keys() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |args: &[&str]| support::refused_serve(dir.path(), args);
    let stderr = refused(&["--apps", "tally", "--listen", "0.0.0.0:0"]);
    assert!(stderr.contains("needs --auth FILE"), "{stderr}");
    let keys = dir.path().join("keys.toml");
    new_key(&keys, "ops", &["admin"]);
    let stderr = refused(&[
        "--apps",
        "fraud",
        "--listen",
        "127.0.0.1:0",
        "--auth",
        keys.to_str().unwrap(),
        "--fraud-stream-listen",
        "0.0.0.0:0",
    ]);
    assert!(stderr.contains("loopback only"), "{stderr}");
    std::fs::write(
        &keys,
        "[[key]]\nname = \"x\"\nsha256 = \"00\"\nroles = [\"admin\"]\n",
    )
    .unwrap();
    let stderr = refused(&[
        "--apps",
        "tally",
        "--listen",
        "127.0.0.1:0",
        "--auth",
        keys.to_str().unwrap(),
    ]);
    assert!(stderr.contains("64 hex digits"), "{stderr}");
}
