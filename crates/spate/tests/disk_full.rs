//! A data directory whose file system fills up: the server refuses writes with 503 `disk_full` before
//! its journal fails, serves reads meanwhile, takes writes again once space is freed, and loses nothing
//! it acknowledged. The file system is real and small: a 16 MiB tmpfs mounted in a mount namespace of
//! its own (`unshare`, which needs root, as CI has), kept by a holder process that the servers join
//! (`nsenter`), so that the file system outlives a server killed with SIGKILL. A server stopped while
//! the file system has no room left at all cannot write its final snapshot: it says so in its exit
//! status, and the next start replays the journal instead.

mod support;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{Server, agent, eventually, get, metrics_text, post};

const DISK_MB: u64 = 16;
const RESERVE_MB: u64 = 4;

/// A tmpfs of `DISK_MB` at `root`, seen only by the holder and the processes that join it; `root` is
/// a temporary directory, removed once the holder is gone.
struct SmallDisk {
    holder: Child,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs -o size={DISK_MB}m tmpfs \"$0\" && echo mounted && exec sleep 3600"
            ))
            .arg(root)
            .stdout(Stdio::piped())
            .spawn()
            .expect("run unshare (util-linux)");
        let mut line = String::new();
        BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "mounted",
            "could not mount a tmpfs in a new mount namespace (this test needs root)"
        );
        Self {
            holder,
            root: root.to_path_buf(),
            _dir: dir,
        }
    }

    /// Runs the rest of a command line inside the namespace.
    fn launcher(&self) -> Vec<String> {
        let pid = self.holder.id().to_string();
        ["nsenter", "--target", &pid, "--mount", "--"]
            .map(String::from)
            .to_vec()
    }

    fn run(&self, command: &[&str]) {
        let launcher = self.launcher();
        let status = Command::new(&launcher[0])
            .args(&launcher[1..])
            .args(command)
            .status()
            .unwrap();
        assert!(status.success(), "{command:?} failed: {status}");
    }

    /// Starts tally on one partition in the namespace, its data directory on the disk, the disk
    /// guard's reserve at [`RESERVE_MB`].
    fn start_tally(&self) -> Server {
        let reserve = RESERVE_MB.to_string();
        let args = [
            "--partitions",
            "1",
            "--apps",
            "tally",
            "--segment-bytes",
            "262144",
            "--disk-reserve-mb",
            &reserve,
        ];
        Server::start_via(&self.launcher(), &self.root.join("data"), &args)
    }

    fn filler(&self) -> String {
        self.root.join("filler").display().to_string()
    }

    /// Takes every byte left: writes zeros until the file system refuses.
    fn fill_up(&self) {
        let filler = self.root.join("filler-rest").display().to_string();
        self.run(&[
            "sh",
            "-c",
            "dd if=/dev/zero of=\"$0\" bs=4096 2>/dev/null; test \"$(df --output=avail -B1 \"$0\" | tail -1)\" -lt 4096",
            &filler,
        ]);
    }

    fn free_up(&self) {
        self.run(&[
            "rm",
            "-f",
            &self.filler(),
            &format!("{}-rest", self.filler()),
        ]);
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

fn tags(base: &str) -> Vec<u64> {
    let (status, body) = get(
        &agent(),
        &format!("{base}/tally/accounts/alice?limit=10000"),
    );
    assert_eq!(status, 200, "{body}");
    body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["tag"].as_u64().unwrap())
        .collect()
}

fn entries_url(base: &str) -> String {
    format!("{base}/tally/accounts/alice/entries")
}

fn health(base: &str) -> Value {
    let (status, body) = get(&agent(), &format!("{base}/health"));
    assert_eq!(
        status, 200,
        "a full disk leaves the server up for reads: {body}"
    );
    body
}

fn metric(base: &str, name: &str) -> f64 {
    let text = metrics_text(&agent(), base);
    text.lines()
        .filter(|line| line.starts_with(name))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn a_full_disk_refuses_writes_serves_reads_and_recovers_when_space_is_freed() {
    let disk = SmallDisk::mount();
    let server = disk.start_tally();
    let agent = agent();
    let url = entries_url(&server.base);

    // Leave 384 KiB above the reserve, for the server's own writes to use up.
    let free_bytes = health(&server.base)["disk"]["free_bytes"].as_u64().unwrap();
    let filler_bytes = free_bytes - (RESERVE_MB << 20) - (384 << 10);
    disk.run(&["fallocate", "-l", &filler_bytes.to_string(), &disk.filler()]);

    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for tag in 0..100_000u64 {
        let (status, body) = post(&agent, &url, None, &json!({"amount": 1, "tag": tag})).unwrap();
        match status {
            201 => acknowledged.push(tag),
            503 => {
                assert_eq!(body["error"]["code"], "disk_full", "{body}");
                let message = body["error"]["message"].as_str().unwrap();
                assert!(
                    message.contains(&format!("less than the {RESERVE_MB} MiB reserve")),
                    "{message}"
                );
                refused += 1;
                if refused == 20 {
                    break;
                }
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert_eq!(refused, 20, "384 KiB of journal never filled");
    assert!(
        acknowledged.len() > 100,
        "{} acknowledged",
        acknowledged.len()
    );

    // Reads go on, and show exactly what was acknowledged; the journal never failed.
    assert_eq!(tags(&server.base), acknowledged);
    let body = health(&server.base);
    assert_eq!(body["status"], "read_only", "{body}");
    assert_eq!(body["disk"]["writes_refused"], true, "{body}");
    assert!(metric(&server.base, "spate_commands_rejected_disk_full") >= 20.0);
    assert_eq!(metric(&server.base, "spate_journal_failures"), 0.0);

    // Space freed: writes come back by themselves.
    disk.free_up();
    let mut tag = 1_000_000;
    assert!(
        eventually(Duration::from_secs(10), || {
            tag += 1;
            let (status, _) = post(&agent, &url, None, &json!({"amount": 1, "tag": tag})).unwrap();
            if status == 201 {
                acknowledged.push(tag);
            }
            status == 201
        }),
        "writes still refused after the filler was removed"
    );
    assert_eq!(health(&server.base)["status"], "ok");
    server.kill9();

    // Every acknowledged entry is there after a crash, exactly once.
    let server = disk.start_tally();
    assert_eq!(tags(&server.base), acknowledged);
}

#[test]
fn a_final_snapshot_with_no_room_fails_the_stop_and_loses_nothing() {
    let disk = SmallDisk::mount();
    let server = disk.start_tally();
    let agent = agent();
    let url = entries_url(&server.base);
    let acknowledged: Vec<u64> = (0..200).collect();
    for &tag in &acknowledged {
        let (status, body) = post(&agent, &url, None, &json!({"amount": 1, "tag": tag})).unwrap();
        assert_eq!(status, 201, "{body}");
    }

    // Not a byte left for the snapshot SIGTERM writes.
    disk.fill_up();
    let status = server.terminate();
    assert_eq!(
        status.code(),
        Some(1),
        "the stop must exit with an error (not succeed, nor die of a signal) when its final snapshot \
         had no room: {status}"
    );

    // The journal holds every acknowledged entry; the failed snapshot left nothing a start trips on.
    disk.free_up();
    let server = disk.start_tally();
    assert_eq!(tags(&server.base), acknowledged);
    let url = entries_url(&server.base);
    let (status, body) = post(&agent, &url, None, &json!({"amount": 1, "tag": 200})).unwrap();
    assert_eq!(status, 201, "{body}");
    assert!(
        server.terminate().success(),
        "a stop with room must succeed"
    );
}
