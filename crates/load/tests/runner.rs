//! The runner against a real local HTTP server: counts, failure kinds, and open-loop timing.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use spate_load::{LoadConfig, Pace, Request, Scenario, run};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

struct Path(&'static str);

impl Scenario for Path {
    fn name(&self) -> String {
        self.0.into()
    }

    fn request(&self, _worker: u32, _seq: u64) -> Request {
        Request::get(self.0)
    }
}

async fn serve() -> String {
    let calls = Arc::new(AtomicU64::new(0));
    let stall_calls = calls.clone();
    let app = Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/flaky",
            get(move || {
                let n = calls.fetch_add(1, Ordering::Relaxed);
                async move {
                    if n.is_multiple_of(2) {
                        StatusCode::OK
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                }
            }),
        )
        .route(
            "/stall-once",
            get(move || {
                let n = stall_calls.fetch_add(1, Ordering::Relaxed);
                async move {
                    if n == 20 {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    "ok"
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

fn config(target: String, pace: Pace, requests: u64) -> LoadConfig {
    LoadConfig {
        target,
        connections: 4,
        pace,
        duration: None,
        requests: Some(requests),
        warmup: Duration::ZERO,
        timeout: Duration::from_secs(5),
        progress: false,
    }
}

#[tokio::test]
async fn closed_loop_counts_every_request_and_classifies_failures() {
    let target = serve().await;
    let report = run(
        config(target.clone(), Pace::Closed, 400),
        Arc::new(Path("/ok")),
    )
    .await;
    assert_eq!((report.requests, report.ok), (400, 400));
    assert!(report.errors.is_empty());
    assert!(report.latency.p50_us > 0 && report.latency.max_us >= report.latency.p99_us);
    assert_eq!(report.per_second.iter().map(|p| p.ok).sum::<u64>(), 400);

    let report = run(config(target, Pace::Closed, 400), Arc::new(Path("/flaky"))).await;
    assert_eq!(report.requests, 400);
    assert_eq!(report.ok, 200);
    assert_eq!(report.errors.get("http_500"), Some(&200));
    assert!((report.error_share - 0.5).abs() < 1e-9);
}

#[tokio::test]
async fn an_unreachable_server_is_reported_not_hidden() {
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let report = run(config(closed_port, Pace::Closed, 20), Arc::new(Path("/ok"))).await;
    assert_eq!(report.requests, 20);
    assert_eq!(report.ok, 0);
    assert_eq!(report.errors.get("connect"), Some(&20));
}

#[tokio::test]
async fn open_loop_charges_a_stall_to_every_request_scheduled_during_it() {
    let target = serve().await;
    // 100 requests/s on one connection for 1 s; request 20 stalls 500 ms.
    let mut open = config(target, Pace::Open { rate_per_s: 100.0 }, 100);
    open.connections = 1;
    let report = run(open, Arc::new(Path("/stall-once"))).await;
    assert_eq!(report.requests, 100);
    assert!(
        report.measured_seconds >= 0.95,
        "the schedule holds the offered rate"
    );
    // The 50 requests due during the stall each waited for the rest of it: request 20 + k waited about
    // 500 - 10 k ms, so about 30 of them more than 200 ms.
    let p90 = report.latency.p90_us;
    assert!(
        p90 > 200_000,
        "open loop p90 {p90} us should include waiting behind the stall"
    );

    // Closed loop against a fresh server: only the stalled request itself is slow.
    let mut closed = config(serve().await, Pace::Closed, 100);
    closed.connections = 1;
    let report = run(closed, Arc::new(Path("/stall-once"))).await;
    assert!(
        report.latency.p90_us < 100_000,
        "closed loop hides the stall: p90 {}",
        report.latency.p90_us
    );
    assert!(report.latency.max_us >= 400_000);
}

#[tokio::test]
async fn open_loop_sends_each_request_on_whichever_connection_is_free() {
    let target = serve().await;
    // 200 requests/s over 4 connections for 1 s; request 20 stalls 500 ms. Dealt round-robin, the
    // stalled connection's next 25 requests would wait behind it; taken by free connections, only the
    // stalled one is slow.
    let report = run(
        config(target, Pace::Open { rate_per_s: 200.0 }, 200),
        Arc::new(Path("/stall-once")),
    )
    .await;
    assert_eq!((report.requests, report.ok), (200, 200));
    assert!(
        report.latency.max_us >= 400_000,
        "the stalled request shows: max {} us",
        report.latency.max_us
    );
    assert!(
        report.latency.p99_us < 150_000,
        "no request waits behind another's connection: p99 {} us",
        report.latency.p99_us
    );
}
