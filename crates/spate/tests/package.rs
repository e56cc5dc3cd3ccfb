//! The Debian package as an operator meets it: built (`scripts/package-deb.sh --dev`, the test build's
//! binary), installed with `dpkg -i`, its files and their owners and modes as promised, its systemd unit
//! valid, and the installed binary serving with the installed configuration as the `spate` user; then
//! purged. It installs into this machine, so it needs root (CI runs as root) and refuses to run where
//! spate is installed already or `/var/lib/spate` exists: it never touches an operator's data.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn installed() -> bool {
    Command::new("dpkg")
        .args(["-s", "spate"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The id of a user or group, by name.
fn id_of(flag: &str) -> u32 {
    run("id", &[flag, "spate"]).trim().parse().expect("an id")
}

/// Purges the package and removes what the purge keeps on purpose (data, keys, the user), also when
/// an assertion failed half-way.
struct Uninstall;

impl Drop for Uninstall {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "spate"]).output();
        let _ = std::fs::remove_dir_all("/var/lib/spate");
        let _ = std::fs::remove_dir_all("/etc/spate");
        let _ = Command::new("deluser").args(["--quiet", "spate"]).output();
    }
}

#[test]
fn the_deb_installs_and_the_installed_binary_serves_with_the_installed_config() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "installing a package needs root (CI runs as root)"
    );
    assert!(
        !installed() && !Path::new("/var/lib/spate").exists(),
        "spate is installed on this machine, or /var/lib/spate exists: not touching it"
    );
    let output_dir = tempfile::tempdir().unwrap();
    let built = run(
        "bash",
        &[
            repo().join("scripts/package-deb.sh").to_str().unwrap(),
            "--dev",
            output_dir.path().to_str().unwrap(),
        ],
    );
    let deb = built.lines().last().expect("the package's path").trim();
    assert!(deb.ends_with("_amd64.deb"), "{built}");

    let _uninstall = Uninstall;
    run("dpkg", &["-i", deb]);
    assert!(installed());

    // The files, their owners and modes.
    let version = run("/usr/bin/spate", &["--version"]);
    assert!(
        version.starts_with(&format!("spate {} (", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    let config = std::fs::read_to_string("/etc/spate/spate.toml").unwrap();
    let shipped = std::fs::read_to_string(repo().join("deploy/debian/spate.toml")).unwrap();
    assert_eq!(config, shipped);
    let (user, group) = (id_of("-u"), id_of("-g"));
    let data = std::fs::metadata("/var/lib/spate").unwrap();
    assert_eq!((data.uid(), data.gid()), (user, group));
    assert_eq!(data.permissions().mode() & 0o777, 0o700);
    let etc = std::fs::metadata("/etc/spate").unwrap();
    assert_eq!(
        (etc.uid(), etc.gid(), etc.mode() & 0o777),
        (0, group, 0o750)
    );
    let kek = std::fs::metadata("/etc/spate/payments.kek").unwrap();
    assert_eq!(
        (kek.uid(), kek.mode() & 0o777, kek.len()),
        (user, 0o600, 32)
    );
    let unit = "/usr/lib/systemd/system/spate.service";
    assert!(Path::new(unit).exists());
    if Path::new("/usr/bin/systemd-analyze").exists() {
        run("systemd-analyze", &["verify", unit]);
    }

    // The installed binary with the installed configuration, as the unit runs it (its user, its
    // config); the port is the only override, so that the test runs beside anything on 8080.
    let mut server = Command::new("/usr/bin/spate")
        .uid(user)
        .gid(group)
        .args(["serve", "--config", "/etc/spate/spate.toml"])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--fraud-stream-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("the server announces its address")
            .unwrap();
        if let Some(base) = line.strip_prefix("spate listening on ") {
            break base.to_string();
        }
    };
    let agent = ureq::Agent::new_with_defaults();
    let entries = format!("{base}/tally/accounts/alice/entries");
    let created = agent
        .post(&entries)
        .send_json(serde_json::json!({"amount": 5, "tag": 1}))
        .unwrap();
    assert_eq!(created.status(), 201);
    let account: serde_json::Value = agent
        .get(format!("{base}/tally/accounts/alice"))
        .call()
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    assert_eq!(account["balance"], "5", "{account}");
    // SAFETY: kill sends a signal to the child this test started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    assert!(server.wait().unwrap().success());
    // The data went where the installed config puts it, owned by the service's user.
    let meta = std::fs::metadata("/var/lib/spate/spate.meta").unwrap();
    assert_eq!(meta.uid(), user);

    run("dpkg", &["--purge", "spate"]);
    assert!(!installed() && !Path::new("/usr/bin/spate").exists());
    assert!(
        Path::new("/var/lib/spate/spate.meta").exists(),
        "a purge keeps the data"
    );
    assert!(
        Path::new("/etc/spate/payments.kek").exists(),
        "a purge keeps the key that decrypts stored card data"
    );
    assert!(
        !Path::new("/etc/spate/spate.toml").exists(),
        "a purge removes the conffile"
    );
}
