//! Runs the real `spate` binary for the integration tests.

#![allow(dead_code)] // each test binary uses part of this

pub mod browser;
pub mod endpoints;
pub mod fraud;
pub mod ledger;
pub mod payments;
pub mod ski;
pub mod tally;

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub base: String,
    /// The fraud stream address, when the server announced one.
    pub stream: Option<String>,
}

/// How long a server may take to stop after SIGTERM: its final snapshots are small in these tests.
const TERMINATE_TIMEOUT: Duration = Duration::from_secs(120);

impl Server {
    /// Starts `spate serve` on a free port with `data_dir`; `file_bytes_max` limits the size of any file
    /// it writes (RLIMIT_FSIZE), which makes writes past it fail as a full disk would.
    pub fn start(data_dir: &Path, extra: &[&str], file_bytes_max: Option<u64>) -> Self {
        Self::start_logging_to(data_dir, extra, file_bytes_max, Stdio::inherit())
    }

    /// As [`Server::start`], with the server's log (stderr) sent to `log`.
    pub fn start_logging_to(
        data_dir: &Path,
        extra: &[&str],
        file_bytes_max: Option<u64>,
        log: Stdio,
    ) -> Self {
        let command = Command::new(env!("CARGO_BIN_EXE_spate"));
        Self::spawn(command, data_dir, extra, file_bytes_max, log)
    }

    /// As [`Server::start`], through `launcher`: a program and its arguments (such as `nsenter ... --`)
    /// that runs the server in its own place, so that the server is the child this handle kills.
    pub fn start_via(launcher: &[String], data_dir: &Path, extra: &[&str]) -> Self {
        let mut command = Command::new(&launcher[0]);
        command
            .args(&launcher[1..])
            .arg(env!("CARGO_BIN_EXE_spate"));
        Self::spawn(command, data_dir, extra, None, Stdio::inherit())
    }

    fn spawn(
        mut command: Command,
        data_dir: &Path,
        extra: &[&str],
        file_bytes_max: Option<u64>,
        log: Stdio,
    ) -> Self {
        command.args(["serve", "--data-dir"]).arg(data_dir);
        if !extra.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        // Tests run in parallel: never the default stream port.
        if !extra.contains(&"--fraud-stream-listen") {
            command.args(["--fraud-stream-listen", "127.0.0.1:0"]);
        }
        command
            .args(extra)
            // The payments key-encrypting key and the fraud card key: beside the data directory (never
            // inside it: a journal on Kafka outlives the data directory), never in HOME.
            .env("SPATE_KEK_FILE", data_dir.with_extension("kek"))
            .env("SPATE_FRAUD_KEY_FILE", data_dir.with_extension("fraud-key"))
            .env("RUST_LOG", server_log_level())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        if let Some(limit) = file_bytes_max {
            use std::os::unix::process::CommandExt;
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    // Ignored, SIGXFSZ turns an oversized write into an EFBIG error instead of a kill.
                    libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    let rlimit = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().expect("spawn spate");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stdout = BufReader::new(stdout);
        let mut stream = None;
        let base = loop {
            let mut line = String::new();
            stdout
                .read_line(&mut line)
                .expect("read spate's announcements");
            if let Some(address) = line.trim().strip_prefix("spate fraud stream on ") {
                stream = Some(address.to_string());
            } else {
                break line
                    .trim()
                    .strip_prefix("spate listening on ")
                    .unwrap_or_else(|| panic!("unexpected line from spate: {line:?}"))
                    .to_string();
            }
        };
        Self {
            child,
            base,
            stream,
        }
    }

    /// Starts `spate serve --apps <apps>` snapshotting and checkpointing projections every few hundred
    /// records with small journal segments, so that a restart must restore both from their files and
    /// replay only the journal after them. Snapshots go in small steps, so that commands are applied
    /// between the steps of every snapshot an app writes in steps.
    pub fn start_checkpointing(data_dir: &Path, apps: &str) -> Self {
        let small = [
            "--apps",
            apps,
            "--snapshot-interval-records",
            "300",
            "--snapshot-step-bytes",
            "256",
            "--projection-checkpoint-interval-records",
            "500",
            "--segment-bytes",
            "32768",
        ];
        Self::start(data_dir, &small, None)
    }

    /// Sends `signal` (such as SIGHUP) to the server.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// Stops the server with SIGTERM and returns how it exited; a server that has not exited within
    /// [`TERMINATE_TIMEOUT`] fails the test (then is killed), rather than hanging it.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + TERMINATE_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("reap") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not stop within {TERMINATE_TIMEOUT:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// True when a request got no answer in the agent's time (the server is slow, not gone): a client
/// that wants to go on retries or moves to its next request instead of stopping.
pub fn timed_out(error: &ureq::Error) -> bool {
    matches!(error, ureq::Error::Timeout(_))
}

/// POSTs JSON; `Err` only when no HTTP answer came (connection refused or reset).
pub fn post(
    agent: &ureq::Agent,
    url: &str,
    key: Option<&str>,
    body: &Value,
) -> Result<(u16, Value), ureq::Error> {
    post_bytes(
        agent,
        url,
        key,
        serde_json::to_vec(body).expect("JSON encodes"),
    )
}

/// POSTs raw bytes as `application/json` (for malformed and oversized bodies).
pub fn post_bytes(
    agent: &ureq::Agent,
    url: &str,
    key: Option<&str>,
    body: Vec<u8>,
) -> Result<(u16, Value), ureq::Error> {
    post_raw(agent, url, Some("application/json"), key, &body)
}

/// POSTs `body` as it is, with `content_type` if given; `Err` only when no HTTP answer came.
pub fn post_raw(
    agent: &ureq::Agent,
    url: &str,
    content_type: Option<&str>,
    key: Option<&str>,
    body: &[u8],
) -> Result<(u16, Value), ureq::Error> {
    let mut headers = Vec::new();
    if let Some(content_type) = content_type {
        headers.push(("content-type", content_type));
    }
    if let Some(key) = key {
        headers.push(("Idempotency-Key", key));
    }
    post_with_headers(agent, url, &headers, body)
}

/// POSTs `body` with `headers`; the status and the JSON answer (`null` if none), `Err` only when no
/// HTTP answer came.
pub fn post_with_headers(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, Value), ureq::Error> {
    let mut request = agent.post(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut response = request.send(body)?;
    let status = response.status().as_u16();
    let value = response
        .body_mut()
        .read_json::<Value>()
        .unwrap_or(Value::Null);
    Ok((status, value))
}

/// POSTs headers announcing a 5 MiB body to `path` of the server at `base` (`http://host:port`), sends
/// no body, and returns the status and body of the answer: the server must refuse it from the header
/// alone. (Sending the body races the server closing the connection after its 413.)
pub fn post_oversized(base: &str, path: &str) -> (u16, String) {
    raw_request(
        base,
        &format!(
            "POST {path} HTTP/1.1\r\nContent-Type: application/json\r\n\
             Idempotency-Key: oversized\r\nContent-Length: {}\r\n",
            5 << 20
        ),
    )
}

/// Sends `head` (a request line and headers, each ending in CRLF) to the server at `base`
/// (`http://host:port`) over a new connection, with `Host` and `Connection: close` added and no body,
/// for requests no HTTP client would make; returns the answer's status and body.
pub fn raw_request(base: &str, head: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let address = base.strip_prefix("http://").expect("an http:// base");
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "{head}Host: {address}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"));
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

pub fn get(agent: &ureq::Agent, url: &str) -> (u16, Value) {
    let mut response = agent.get(url).call().expect("GET answered");
    let status = response.status().as_u16();
    (
        status,
        response
            .body_mut()
            .read_json::<Value>()
            .unwrap_or(Value::Null),
    )
}

/// The server's `/metrics` page (Prometheus text).
pub fn metrics_text(agent: &ureq::Agent, base: &str) -> String {
    agent
        .get(format!("{base}/metrics"))
        .call()
        .expect("GET /metrics answered")
        .body_mut()
        .read_to_string()
        .expect("/metrics is text")
}

/// Snapshots of `partition` finished since the server started (`spate_snapshot_seconds_count`).
pub fn snapshots_finished(agent: &ureq::Agent, base: &str, partition: u16) -> u64 {
    partition_count(agent, base, "spate_snapshot_seconds_count", partition)
}

/// The count `metric` shows for `partition` in `/metrics` (0 if it shows none).
pub fn partition_count(agent: &ureq::Agent, base: &str, metric: &str, partition: u16) -> u64 {
    let prefix = format!("{metric}{{partition=\"{partition}\"}} ");
    metrics_text(agent, base)
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map_or(0, |count| count.parse().expect("a count"))
}

/// How long a check waits out `503 partition_moving` answers: a rebalance can start at any moment in a
/// cluster (a slow heartbeat on a loaded machine is enough), and takeover takes up to about 10 s.
pub const MOVING_WAIT: Duration = Duration::from_secs(60);

/// Sends `request` again while it is answered `503 partition_moving`, as a client must (the answer
/// carries `Retry-After`), for up to [`MOVING_WAIT`]; returns the first other answer, or the last 503.
pub fn retry_while_moving(mut request: impl FnMut() -> (u16, Value)) -> (u16, Value) {
    let deadline = Instant::now() + MOVING_WAIT;
    loop {
        let (status, body) = request();
        let moving = status == 503 && body["error"]["code"] == "partition_moving";
        if !moving || Instant::now() > deadline {
            return (status, body);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// [`retry_while_moving`] for a request retried with its idempotency key, whose first try may still be
/// being made durable: a 409 then means "in flight", and is retried too (the caller sends a key only
/// with its own body, so a 409 means nothing else).
pub fn retry_with_key(mut request: impl FnMut() -> (u16, Value)) -> (u16, Value) {
    let deadline = Instant::now() + MOVING_WAIT;
    loop {
        let (status, body) = retry_while_moving(&mut request);
        if status != 409 || Instant::now() > deadline {
            return (status, body);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every file under `root`, recursively.
pub fn files_under(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Polls `check` until it returns true or `timeout` passes.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends any method with an optional JSON body; `Err` only when no HTTP answer came.
pub fn send(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> Result<(u16, Value), ureq::Error> {
    let bytes = body.map(|b| serde_json::to_vec(b).expect("JSON encodes"));
    let mut response = match method {
        "GET" | "DELETE" => {
            let mut request = if method == "GET" {
                agent.get(url)
            } else {
                agent.delete(url)
            };
            if let Some(key) = key {
                request = request.header("Idempotency-Key", key);
            }
            request.call()?
        }
        _ => {
            let mut request = match method {
                "POST" => agent.post(url),
                "PUT" => agent.put(url),
                "PATCH" => agent.patch(url),
                other => panic!("no helper for {other}"),
            };
            request = request.header("content-type", "application/json");
            if let Some(key) = key {
                request = request.header("Idempotency-Key", key);
            }
            match bytes {
                Some(bytes) => request.send(bytes)?,
                None => request.send_empty()?,
            }
        }
    };
    let status = response.status().as_u16();
    let value = response
        .body_mut()
        .read_json::<Value>()
        .unwrap_or(Value::Null);
    Ok((status, value))
}

/// The servers' log filter: `SPATE_TEST_SERVER_LOG` if set (`info` to follow a failure), else `warn`.
pub fn server_log_level() -> String {
    std::env::var("SPATE_TEST_SERVER_LOG").unwrap_or_else(|_| "warn".into())
}

/// The crash tests' seed: `SPATE_CRASH_SEED` if set, else `default`.
pub fn crash_seed(default: u64) -> u64 {
    std::env::var("SPATE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs `client(id, state, stop)` on a thread per state, kills the server with SIGKILL once 1.5 s have
/// passed and `loaded(states)` holds (or after a minute, when the caller's own check will fail), then
/// tells the clients to stop and waits for them. Each client records what was acknowledged in its state
/// and returns once a request finds the server gone (or `stop` is set). Waiting for `loaded` keeps a
/// slow machine from killing the server before there is load to lose.
pub fn kill_under_load<T: Sync>(
    server: Server,
    states: &[T],
    loaded: impl Fn(&[T]) -> bool,
    client: impl Fn(usize, &T, &std::sync::atomic::AtomicBool) + Sync,
) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for (id, state) in states.iter().enumerate() {
            let (client, stop) = (&client, &stop);
            scope.spawn(move || client(id, state, stop));
        }
        std::thread::sleep(Duration::from_millis(1500));
        eventually(Duration::from_secs(60), || loaded(states));
        server.kill9();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

/// Runs `spate serve --data-dir <data_dir> <args>`, which must refuse to start at once (a bad option
/// or file): its log.
pub fn refused_serve(data_dir: &Path, args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spate"));
    command
        .args(["serve", "--data-dir"])
        .arg(data_dir)
        .args(args);
    refused(command)
}

/// Runs `command`, a server that must refuse to start, and waits for it to exit (60 s at most: a
/// server that starts is killed and fails the test rather than hanging it): its log.
pub fn refused(mut command: Command) -> String {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read as it comes, so that a long log cannot fill the pipe and hold the server up.
    let mut stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut log = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut log).unwrap();
        String::from_utf8_lossy(&log).into_owned()
    });
    let exited = eventually(Duration::from_secs(60), || {
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        child.kill().unwrap();
    }
    let status = child.wait().unwrap();
    let log = log.join().unwrap();
    assert!(exited, "the server started: {command:?}\n{log}");
    assert!(
        !status.success(),
        "the server exited with success: {command:?}\n{log}"
    );
    log
}

/// Cuts the newest segment of partition 0's journal under `data_dir` to half of what it holds, as a
/// disk that lost the tail of what was written would: the records in the lost half are gone.
pub fn cut_partition_0_journal_in_half(data_dir: &Path) {
    let journal = data_dir.join("partitions/p000/journal");
    let segment = (std::fs::read_dir(&journal).unwrap().flatten())
        .map(|entry| entry.path())
        .max()
        .unwrap();
    let bytes = std::fs::read(&segment).unwrap();
    let used = bytes.iter().rposition(|b| *b != 0).unwrap();
    std::fs::write(&segment, &bytes[..used / 2]).unwrap();
}

/// Runs `spate serve --apps <apps> <extra>` on `dir`, which must refuse to start: its log.
pub fn refused_start_up(dir: &Path, apps: &str, extra: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spate"));
    command
        .args(["serve", "--apps", apps, "--listen", "127.0.0.1:0"])
        .args(extra)
        .args(["--fraud-stream-listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn");
    refused(command)
}

/// Makes a key with `roles` in the key file through `spate auth new-key`, and returns it.
pub fn new_key(file: &Path, name: &str, roles: &[&str]) -> String {
    new_key_with(file, name, roles, &[])
}

/// As [`new_key`], with more options of `spate auth new-key`.
pub fn new_key_with(file: &Path, name: &str, roles: &[&str], options: &[&str]) -> String {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_spate"));
    command
        .args(["auth", "new-key", "--name", name, "--file"])
        .arg(file)
        .args(options);
    for role in roles {
        command.args(["--role", role]);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let key = String::from_utf8(output.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("spate_"), "{key}");
    assert!(
        !std::fs::read_to_string(file).unwrap().contains(&key),
        "only the key's hash is kept"
    );
    key
}
