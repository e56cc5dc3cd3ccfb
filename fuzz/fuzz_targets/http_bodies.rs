//! Every app's routes through a real server (all six apps, two partitions, no fsync): any request
//! body, query string or path segment gets an HTTP answer within 10 s, and never a 5xx but 503 (a
//! full queue). A panic in a handler shows as a connection closed without an answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Every route but `POST /fraud/history/generate`, whose bound is the machine's memory: (method, path),
/// where `{}` is a segment the input may fill.
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/tally/accounts/{}/entries"),
    ("POST", "/tally/transfers"),
    ("GET", "/tally/accounts/{}"),
    ("GET", "/tally/totals"),
    ("POST", "/fraud/transactions"),
    ("GET", "/fraud/cards/{}"),
    ("GET", "/fraud/stats"),
    ("GET", "/leaderboards"),
    ("POST", "/leaderboards"),
    ("POST", "/leaderboards/scores"),
    ("GET", "/leaderboards/ranks"),
    ("GET", "/leaderboards/{}"),
    ("DELETE", "/leaderboards/{}"),
    ("POST", "/leaderboards/{}/reset"),
    ("GET", "/leaderboards/{}/top"),
    ("GET", "/leaderboards/b/members/{}"),
    ("PUT", "/leaderboards/b/members/{}"),
    ("DELETE", "/leaderboards/b/members/{}"),
    ("GET", "/leaderboards/b/members/{}/around"),
    ("GET", "/leaderboard"),
    ("POST", "/leaderboard"),
    ("GET", "/leaderboard/{}"),
    ("GET", "/leaderboard/b/{}"),
    ("PUT", "/leaderboard/b/{}"),
    ("POST", "/skiers/1/seasons/2024/days/{}/skiers/5"),
    ("GET", "/skiers/1/seasons/2024/days/1/skiers/{}"),
    ("GET", "/resorts"),
    ("GET", "/resorts/{}/seasons"),
    ("POST", "/resorts/{}/seasons"),
    ("GET", "/resorts/1/seasons/{}/day/1/skiers"),
    ("GET", "/skiers/{}/vertical"),
    ("GET", "/skiers/1/seasons/{}/days"),
    ("GET", "/skiers/1/seasons/2024/days/{}/lifts"),
    ("GET", "/statistics"),
    ("GET", "/ski/lag"),
    ("POST", "/participants"),
    ("GET", "/participants"),
    ("GET", "/participants/{}"),
    ("PUT", "/participants/{}/ndc"),
    ("GET", "/participants/{}/entries"),
    ("POST", "/transfers"),
    ("POST", "/transfers/batch"),
    ("PUT", "/transfers/{}"),
    ("GET", "/transfers/{}"),
    ("PUT", "/transfers/{}/error"),
    ("POST", "/v1/payments"),
    ("GET", "/v1/payments"),
    ("GET", "/v1/payments/{}"),
    ("POST", "/v1/payments/{}/capture"),
    ("POST", "/v1/payments/{}/cancel"),
    ("POST", "/v1/payments/{}/refunds"),
    ("GET", "/v1/events"),
    ("POST", "/admin/reload"),
    ("GET", "/admin/reference"),
    ("POST", "/admin/settlements"),
    ("POST", "/admin/settlements/{}/files"),
];

/// The server lives across inputs, with all it holds: LeakSanitizer would take that for leaks at exit.
#[unsafe(no_mangle)]
pub extern "C" fn __asan_default_options() -> *const std::ffi::c_char {
    c"detect_leaks=0".as_ptr()
}

/// Starts the server once, in a thread of its own, and returns its address.
fn server() -> SocketAddr {
    static SERVER: OnceLock<SocketAddr> = OnceLock::new();
    *SERVER.get_or_init(|| {
        let data_dir = spate_fuzz::scratch_dir().join("server");
        let address = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap();
        let mut engine = spate_engine::EngineConfig::new(data_dir.clone());
        engine.partitions = 2;
        engine.journal.durability = spate_engine::Durability::None;
        let config = spate_server::ServerConfig {
            listen: address,
            connections: Default::default(),
            auth_file: None,
            tls: None,
            engine,
            logs: None,
            cluster: None,
            watch_logs: None,
        };
        std::thread::spawn(move || {
            let modules = spate_fuzz::modules(&data_dir);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime
                .block_on(spate_server::serve(config, modules))
                .unwrap();
        });
        for _ in 0..600 {
            if TcpStream::connect(address).is_ok() {
                return address;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the server did not start");
    })
}

fn percent_encoded(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}

// The first byte picks the route, the second where the rest goes: the body, the query string, or the
// path's segment.
fuzz_target!(|data: &[u8]| {
    let [route, place, rest @ ..] = data else {
        return;
    };
    let (method, template) = ROUTES[usize::from(*route) % ROUTES.len()];
    let (segment, query, body) = match place % 3 {
        0 => ("x".to_string(), String::new(), rest),
        1 => (
            "x".to_string(),
            format!("?{}", percent_encoded(rest)),
            &[][..],
        ),
        _ => (percent_encoded(rest), String::new(), &[][..]),
    };
    let path = template.replace("{}", if segment.is_empty() { "x" } else { &segment });
    static REQUESTS: AtomicU64 = AtomicU64::new(0);
    let request_number = REQUESTS.fetch_add(1, Ordering::Relaxed);
    let address = server();
    let mut stream = TcpStream::connect(address).expect("the server accepts");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "{method} {path}{query} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nIdempotency-Key: fuzz-{request_number}\r\n\
         FSPIOP-Source: dfsp1\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = Vec::new();
    if let Err(error) = stream.read_to_end(&mut answer) {
        panic!("{method} {path}{query}: no whole answer: {error}");
    }
    let status: u16 = std::str::from_utf8(&answer)
        .ok()
        .and_then(|text| text.split(' ').nth(1)?.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "{method} {path}{query}: no HTTP answer: {:?}",
                String::from_utf8_lossy(&answer)
            )
        });
    assert!(
        status < 500 || status == 503,
        "{method} {path}{query} answered {status}: {}",
        String::from_utf8_lossy(&answer)
    );
});
