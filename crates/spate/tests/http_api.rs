//! The HTTP surface against the real server: health, metrics, the error shape, and bad input.

mod support;

use serde_json::json;
use support::{Server, agent, get, post, post_bytes};

#[test]
fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[], None);
    let agent = agent();
    let base = &server.base;
    let entries = format!("{base}/tally/accounts/alice/entries");
    assert_eq!(
        post(&agent, &entries, None, &json!({"amount": 5, "tag": 1}))
            .unwrap()
            .0,
        201
    );

    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "malformed JSON",
            b"{\"amount\": 5,".to_vec(),
            400,
            "malformed JSON",
        ),
        (
            "wrong type",
            br#"{"amount": "5", "tag": 1}"#.to_vec(),
            422,
            "amount",
        ),
        (
            "out of range",
            br#"{"amount": 9223372036854775808, "tag": 1}"#.to_vec(),
            422,
            "amount",
        ),
        (
            "unknown field",
            br#"{"amount": 5, "tag": 1, "extra": 0}"#.to_vec(),
            422,
            "extra",
        ),
        ("missing field", br#"{"amount": 5}"#.to_vec(), 422, "tag"),
    ];
    for (what, body, status, mentions) in cases {
        let (got, answer) = post_bytes(&agent, &entries, None, body).expect("answered");
        assert_eq!(got, status, "{what}: {answer}");
        let message = answer["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no error shape: {answer}"));
        assert!(
            message.contains(mentions),
            "{what}: message {message:?} should mention {mentions:?}"
        );
    }
    let (status, answer) = support::post_oversized(base, "/tally/accounts/alice/entries");
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains("over the limit"), "{answer}");
    let bad_name = format!("{base}/tally/accounts/{}/entries", "x".repeat(65));
    let (status, answer) = post(&agent, &bad_name, None, &json!({"amount": 5, "tag": 1})).unwrap();
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = post(
        &agent,
        &entries,
        Some(&"k".repeat(256)),
        &json!({"amount": 5, "tag": 1}),
    )
    .unwrap();
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );
    let transfer = format!("{base}/tally/transfers");
    for (body, mentions) in [
        (
            json!({"from": "alice", "to": "alice", "amount": 1, "tag": 2}),
            "differ",
        ),
        (
            json!({"from": "alice", "to": "bob", "amount": 0, "tag": 2}),
            "greater than 0",
        ),
        (
            json!({"from": "alice", "to": "..", "amount": 1, "tag": 2}),
            "URL path",
        ),
    ] {
        let (status, answer) = post(&agent, &transfer, None, &body).unwrap();
        assert_eq!(status, 400, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains(mentions),
            "{answer}"
        );
    }
    let (status, answer) = post(
        &agent,
        &transfer,
        None,
        &json!({"from": "alice", "to": "bob", "amount": 6, "tag": 3}),
    )
    .unwrap();
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("insufficient_funds"))
    );

    // Idempotency: the same key and body is answered once; the same key with another body is refused.
    let once = json!({"amount": 7, "tag": 4});
    assert_eq!(
        post(&agent, &entries, Some("key-1"), &once).unwrap(),
        (201, json!({"balance": "12"}))
    );
    assert_eq!(
        post(&agent, &entries, Some("key-1"), &once).unwrap(),
        (201, json!({"balance": "12"}))
    );
    let (status, _) = post(
        &agent,
        &entries,
        Some("key-1"),
        &json!({"amount": 8, "tag": 4}),
    )
    .unwrap();
    assert_eq!(status, 422);

    // Nothing above changed state but the two applied adds.
    let (status, account) = get(&agent, &format!("{base}/tally/accounts/alice"));
    assert_eq!(status, 200);
    assert_eq!(account["balance"], "12");
    assert_eq!(account["entry_count"], 2);
    assert_eq!(get(&agent, &format!("{base}/tally/accounts/nobody")).0, 404);
    assert_eq!(get(&agent, &format!("{base}/no/such/route")).0, 404);

    let (status, health) = get(&agent, &format!("{base}/health"));
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    let metrics = support::metrics_text(&agent, base);
    for name in [
        "spate_commands_applied_total",
        "spate_journal_commit_seconds_bucket",
        "spate_queue_depth",
        "spate_http_request_seconds_bucket",
        "spate_http_errors_total",
    ] {
        assert!(metrics.contains(name), "metric {name} missing");
    }
    // Every store on disk is scrubbed from start-up on, and none is damaged.
    for store in ["archive", "payments", "ski"] {
        let passes = format!("spate_store_scrub_passes_total{{store=\"{store}\"}} ");
        let scrubbed = || {
            let metrics = support::metrics_text(&agent, base);
            let passes = metrics.lines().find_map(|line| line.strip_prefix(&passes));
            passes.is_some_and(|passes| passes.parse::<u64>().unwrap() >= 1)
        };
        assert!(
            support::eventually(std::time::Duration::from_secs(30), scrubbed),
            "{store} was never scrubbed"
        );
        let damaged = format!("spate_store_damaged{{store=\"{store}\"}} 0");
        assert!(support::metrics_text(&agent, base).contains(&damaged));
        // And each has a thread that frees what it replaces outside its version lock.
        let releases = format!("spate_store_releases_total{{store=\"{store}\",what=\"table\"}} ");
        assert!(support::metrics_text(&agent, base).contains(&releases));
    }
    assert!(
        server.terminate().success(),
        "SIGTERM shuts down cleanly with exit 0"
    );
}

/// Errors that axum itself answers (no handler runs) come in the one error shape too, not as plain
/// text or an empty body (issue 19, defect 7).
#[test]
fn errors_before_any_handler_have_the_error_shape() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[], None);
    let base = &server.base;
    let cases = [
        ("DELETE /tally/totals HTTP/1.1\r\n", 405, "DELETE"),
        ("GET /tally/accounts/x?limit=abc HTTP/1.1\r\n", 400, "limit"),
        ("GET /tally/accounts/%FF HTTP/1.1\r\n", 400, "UTF-8"),
    ];
    for (head, status, mentions) in cases {
        let (got, body) = support::raw_request(base, head);
        assert_eq!(got, status, "{head:?}: {body}");
        let answer: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{head:?}: not JSON ({e}): {body:?}"));
        let message = answer["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{head:?}: no error shape: {answer}"));
        assert!(
            message.contains(mentions),
            "{head:?}: {message:?} should mention {mentions:?}"
        );
        assert!(answer["error"]["code"].is_string(), "{head:?}: {answer}");
    }
}

/// Sends `head` (request line and headers, CRLF each) and then `body`, over a new connection; the
/// answer's status and body. Sending stops quietly if the server answers and closes first.
fn raw_with_body(base: &str, head: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let address = base.strip_prefix("http://").unwrap();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(stream, "{head}Host: {address}\r\nConnection: close\r\n\r\n").unwrap();
    for piece in body.chunks(64 << 10) {
        if stream.write_all(piece).is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_string();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (
        status,
        answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
    )
}

/// Issue 19, defect 7: a chunked body over the limit, and Content-Length with Transfer-Encoding
/// (chunked wins, as HTTP/1.1 says), are answered in the error shape.
#[test]
fn chunked_bodies_are_refused_in_the_error_shape() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--apps", "tally"], None);
    let json_head = "POST /tally/transfers HTTP/1.1\r\nContent-Type: application/json\r\n";
    let mut oversized = Vec::new();
    for _ in 0..80 {
        oversized.extend_from_slice(format!("{:x}\r\n", 64 << 10).as_bytes());
        oversized.extend_from_slice(&[b' '; 64 << 10]);
        oversized.extend_from_slice(b"\r\n");
    }
    oversized.extend_from_slice(b"0\r\n\r\n");
    let cases = [
        (
            format!("{json_head}Transfer-Encoding: chunked\r\n"),
            oversized,
            413,
            "limit",
        ),
        (
            format!("{json_head}Content-Length: 3\r\nTransfer-Encoding: chunked\r\n"),
            b"3\r\n{\"a\r\n0\r\n\r\n".to_vec(),
            400,
            "JSON",
        ),
    ];
    for (head, body, status, mentions) in cases {
        let (got, answer) = raw_with_body(&server.base, &head, &body);
        assert_eq!(got, status, "{head:?}: {answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("{head:?}: not JSON ({e}): {answer:?}"));
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(mentions), "{head:?}: {answer}");
    }
}

/// The head of the one answer on `stream` (up to its blank line), with its body read past.
fn read_one_answer(stream: &mut std::io::BufReader<std::net::TcpStream>) -> String {
    use std::io::{BufRead, Read};
    let mut head = String::new();
    loop {
        let mut line = String::new();
        let read = stream.read_line(&mut line).unwrap();
        assert!(read > 0, "the connection closed inside an answer: {head:?}");
        if line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    let length: usize = (head.lines())
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse().unwrap());
    stream.read_exact(&mut vec![0; length]).unwrap();
    head
}

/// A request whose body the server did not read (here a refusal before any handler, sent before the
/// body) is answered with `Connection: close`, so the client does not send its next request on a
/// connection being closed (a flaky "peer disconnected" in CI); a body read to its end keeps the
/// connection alive, chunked or not.
#[test]
fn an_unread_body_closes_its_connection_and_says_so() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--apps", "tally"], None);
    let address = server.base.strip_prefix("http://").unwrap().to_string();
    let connect = || {
        let stream = std::net::TcpStream::connect(&address).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        stream
    };
    let entry = |tag: u32| format!(r#"{{"amount":1,"tag":{tag}}}"#);
    let (first, second) = (entry(1), entry(2));
    let mut stream = connect();
    write!(
        stream,
        "POST /tally/accounts/a/entries HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{first}\
         POST /tally/accounts/a/entries HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{second}\r\n0\r\n\r\n",
        first.len(),
        second.len(),
    )
    .unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    for framing in ["Content-Length", "chunked"] {
        let head = read_one_answer(&mut reader);
        assert!(head.starts_with("http/1.1 2"), "{framing}: {head}");
        assert!(!head.contains("connection: close"), "{framing}: {head}");
    }
    // The body is held back until the answer is in: the server answers 415 without reading it.
    let mut stream = connect();
    write!(
        stream,
        "POST /tally/accounts/a/entries HTTP/1.1\r\nHost: {address}\r\nContent-Type: text/plain\r\n\
         Content-Length: {}\r\n\r\n",
        first.len()
    )
    .unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let head = read_one_answer(&mut reader);
    assert!(head.starts_with("http/1.1 415"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
}

/// Everything the server writes is its user's only, whatever umask it was started with (issue 19,
/// defect 9: journals, snapshots and the keyring were 0644 under a 0755 data directory).
#[test]
fn every_file_the_server_writes_is_its_users_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[], None);
    let agent = agent();
    let url = format!("{}/tally/accounts/alice/entries", server.base);
    let (status, _) = post(&agent, &url, None, &json!({"amount": 5, "tag": 1})).unwrap();
    assert_eq!(status, 201);
    assert!(server.terminate().success());
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode();
    let mut checked = 0;
    let mut dirs = vec![data.clone()];
    while let Some(next) = dirs.pop() {
        assert_eq!(
            mode(&next) & 0o077,
            0,
            "{}: {:o}",
            next.display(),
            mode(&next)
        );
        for entry in std::fs::read_dir(&next).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                assert_eq!(
                    mode(&path) & 0o077,
                    0,
                    "{}: {:o}",
                    path.display(),
                    mode(&path)
                );
                checked += 1;
            }
        }
    }
    // Journals, snapshots, projection checkpoints, the keyring, the stores on disk.
    assert!(checked >= 10, "only {checked} files");
    for key in [data.with_extension("kek"), data.with_extension("fraud-key")] {
        assert_eq!(mode(&key) & 0o077, 0, "{}", key.display());
    }
}

/// Headers over the limit that hyper's read buffer lets through (it checks its size between reads, so
/// that at the default 64 KiB, headers of up to about 100 KiB sent at once passed and were served) are
/// refused by the server with 431 in the error shape. (hyper answers its own 431, without a body, when
/// they arrive in pieces.)
#[test]
fn headers_over_the_limit_are_refused_even_when_they_arrive_at_once() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--apps", "tally"], None);
    let address = server.base.strip_prefix("http://").unwrap();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let filler = "x".repeat(100 << 10);
    let request = format!(
        "GET /health HTTP/1.1\r\nHost: {address}\r\nX-Large: {filler}\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.60?}");
    if answer.contains("content-length: 0\r\n") {
        // hyper refused them while they were still arriving (a busy machine): also a refusal.
        return;
    }
    assert!(answer.contains("\"headers_too_large\""), "{answer}");
    assert!(answer.contains("over the limit of 65536"), "{answer}");
}

/// A client that sends its headers or its body too slowly, or never, or keeps a connection idle, is cut
/// after the configured timeouts, and the server keeps serving everyone else meanwhile, even with every
/// connection it allows taken (issue 19, defect 6).
#[test]
fn slow_idle_and_stalled_clients_are_cut_and_others_are_served() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let limits = [
        "--header-read-timeout-ms",
        "1000",
        "--body-read-timeout-ms",
        "1000",
        "--connections-max",
        "8",
        "--header-bytes-max",
        "16384",
    ];
    let server = Server::start(dir.path(), &limits, None);
    let base = &server.base;
    let address = base.strip_prefix("http://").unwrap().to_string();
    let connect = || {
        let stream = std::net::TcpStream::connect(&address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream
    };
    // Reads until the server closes the connection; what it answered, and when it closed.
    let until_closed = |mut stream: std::net::TcpStream| {
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer);
        assert!(read.is_ok(), "still open after 20 s: {read:?}");
        (String::from_utf8_lossy(&answer).to_string(), Instant::now())
    };
    let started = Instant::now();
    // Twenty slowloris connections, an HTTP/0.9 line, a connection left idle after one request: more
    // than the eight connections allowed.
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut stream = connect();
        write!(
            stream,
            "GET /health HTTP/1.1\r\nHost: {address}\r\nX-Slow: 1"
        )
        .unwrap();
        slow.push(stream);
    }
    let mut old = connect();
    write!(old, "GET /\r\n").unwrap();
    let mut idle = connect();
    write!(idle, "GET /health HTTP/1.1\r\nHost: {address}\r\n\r\n").unwrap();
    // Everyone else is still served: once the slow ones are cut, the queued ones get their turn.
    let agent = agent();
    let (status, health) = get(&agent, &format!("{base}/health"));
    assert_eq!(status, 200, "{health}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "/health waited {:?}",
        started.elapsed()
    );
    for stream in slow.into_iter().chain([old]) {
        let (answer, closed_at) = until_closed(stream);
        assert!(
            !answer.contains(" 200 "),
            "a request that never ended was answered: {answer:?}"
        );
        assert!(closed_at - started < Duration::from_secs(20));
    }
    let (answer, _) = until_closed(idle);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");

    // A body shorter than its Content-Length: an answer in the error shape once it stalls.
    let mut stalled = connect();
    write!(
        stalled,
        "POST /tally/accounts/alice/entries HTTP/1.1\r\nHost: {address}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"amount\": 1"
    )
    .unwrap();
    let (answer, _) = until_closed(stalled);
    assert!(answer.starts_with("HTTP/1.1 4"), "{answer:?}");
    assert!(answer.contains("stopped arriving"), "{answer:?}");

    // Headers over the limit: refused with 431, though the server's close with our bytes unread may
    // reset the connection before the answer is read (and the write), so the metrics tell.
    let mut large = connect();
    let filler = "x".repeat(32 << 10);
    let _ = write!(
        large,
        "GET /health HTTP/1.1\r\nHost: {address}\r\nX-Large: {filler}\r\n\r\n"
    );
    let mut answer = Vec::new();
    let _ = large.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer:.40?}"
    );

    let metrics = support::metrics_text(&agent, base);
    let cut = |reason: &str| -> f64 {
        let prefix = format!("spate_http_connections_cut_total{{reason=\"{reason}\"}} ");
        (metrics.lines())
            .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(cut("header_timeout") >= 21.0, "{metrics}");
    assert!(cut("body_timeout") >= 1.0, "{metrics}");
    assert!(cut("malformed") >= 1.0, "{metrics}");
}

/// Options that would make a server useless or crash it are refused at start-up, naming what is wrong: a
/// timeout of 0 would cut every connection at once, one linger time alone would do nothing, a
/// linger beyond 10 s is a mistake (and past the clock's range, a crash), and so are read models
/// that pass over their feed less often than once a second.
#[test]
fn bad_serve_options_are_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let max = u64::MAX.to_string();
    let cases: [(&[&str], &str); 6] = [
        (
            &["--header-read-timeout-ms", "0"],
            "--header-read-timeout-ms must be at least 1",
        ),
        (
            &["--body-read-timeout-ms", "0"],
            "--body-read-timeout-ms must be at least 1",
        ),
        (
            &["--linger-quiet-us", "100"],
            "--linger-quiet-us and --linger-max-us work together",
        ),
        (
            &["--linger-max-us", "100"],
            "--linger-quiet-us and --linger-max-us work together",
        ),
        (
            &["--linger-quiet-us", "100", "--linger-max-us", &max],
            "--linger-max-us must be at most 10000000",
        ),
        (
            &["--projection-pass-interval-us", "1000001"],
            "--projection-pass-interval-us must be at most 1000000",
        ),
    ];
    for (options, expected) in cases {
        let log = support::refused_start_up(dir.path(), "tally", options);
        assert!(log.contains(expected), "{options:?}: {log}");
    }
}

/// A client may send any token as a method: each must not become a new series in `/metrics`
/// (issue 19, defect 1: 25,000 such requests made `/metrics` 496 MB).
#[test]
fn unknown_methods_do_not_grow_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[], None);
    let agent = agent();
    let base = &server.base;
    let (status, _) = get(&agent, &format!("{base}/health"));
    assert_eq!(status, 200);
    support::metrics_text(&agent, base); // so that `/metrics` has a series of its own from here on
    for i in 0..50 {
        let (status, _) = support::raw_request(base, &format!("ZZ{i} /health HTTP/1.1\r\n"));
        assert!((400..500).contains(&status), "method ZZ{i}: {status}");
    }
    let metrics = support::metrics_text(&agent, base);
    assert!(!metrics.contains("ZZ"), "a client's method became a label");
    let series = |metrics: &str| {
        metrics
            .lines()
            .filter(|line| line.contains("method=\"other\""))
            .count()
    };
    // One series for all 50, and still the same lines after 50 more.
    for i in 50..100 {
        support::raw_request(base, &format!("ZZ{i} /health HTTP/1.1\r\n"));
    }
    let again = support::metrics_text(&agent, base);
    assert_eq!(series(&metrics), series(&again));
    assert_eq!(metrics.lines().count(), again.lines().count());
    assert!(
        series(&again) > 0,
        "the odd methods were not counted at all"
    );
}

/// A snapshot's start and each of its steps are intervals in which the partition applies nothing:
/// `/metrics` shows each in `spate_apply_pause_seconds` and the longest in
/// `spate_apply_pause_max_seconds`, by cause; each again as its own share
/// (`spate_apply_pause_own_seconds`), never longer than the pause itself.
#[test]
fn snapshot_pauses_are_in_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--partitions", "2", "--snapshot-interval-records", "20"],
        None,
    );
    let agent = agent();
    let base = &server.base;
    for i in 0..100 {
        let url = format!("{base}/tally/accounts/a{i}/entries");
        let (status, _) = post(&agent, &url, None, &json!({"amount": 1, "tag": i})).unwrap();
        assert_eq!(status, 201);
    }
    let metrics = support::metrics_text(&agent, base);
    let value = |prefix: &str| -> f64 {
        metrics
            .lines()
            .filter_map(|line| {
                line.strip_prefix(prefix)?
                    .split_once("} ")?
                    .1
                    .parse::<f64>()
                    .ok()
            })
            .sum()
    };
    let snapshots = value("spate_snapshot_seconds_count{");
    let paused = value("spate_apply_pause_seconds_count{partition=\"0\",cause=\"snapshot\"")
        + value("spate_apply_pause_seconds_count{partition=\"1\",cause=\"snapshot\"");
    // 100 commands, a snapshot every 20 per partition: at least one per partition, each begun and
    // written in one step or more, each a pause.
    assert!(snapshots >= 2.0, "snapshots: {snapshots}\n{metrics}");
    assert!(
        paused >= 2.0 * snapshots,
        "{paused} pauses for {snapshots} snapshots"
    );
    for partition in ["0", "1"] {
        let longest = value(&format!(
            "spate_apply_pause_max_seconds{{partition=\"{partition}\",cause=\"snapshot\""
        ));
        assert!(longest > 0.0, "partition {partition}: {longest}");
        let own = value(&format!(
            "spate_apply_pause_own_max_seconds{{partition=\"{partition}\",cause=\"snapshot\""
        ));
        assert!(
            own > 0.0 && own <= longest,
            "partition {partition}: {own} of {longest}"
        );
        let own_count = value(&format!(
            "spate_apply_pause_own_seconds_count{{partition=\"{partition}\",cause=\"snapshot\""
        ));
        let count = value(&format!(
            "spate_apply_pause_seconds_count{{partition=\"{partition}\",cause=\"snapshot\""
        ));
        assert_eq!(own_count, count, "partition {partition}");
    }
}

/// `spate --version` names the version and the commit the binary was built from (issue 20).
#[test]
fn the_version_names_its_commit() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .arg("--version")
        .output()
        .unwrap();
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(
        printed.starts_with(&format!("spate {} (", env!("CARGO_PKG_VERSION"))),
        "{printed}"
    );
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(head) = head {
        assert!(printed.contains(&head), "{printed} should name {head}");
    }
}
