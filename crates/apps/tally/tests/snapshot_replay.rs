//! Property: the state recovered from a snapshot plus the journal after it equals the state recovered by
//! replaying the whole journal, and both equal the state before the stop; under random commands,
//! including cross-partition transfers, and random snapshot points.

use prometheus_client::registry::Registry;
use proptest::prelude::*;
use spate_engine::{Engine, EngineConfig, StateMachine};
use spate_tally::{APP_ID, Command, TallyState};
use std::path::Path;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Add { account: u8, amount: i64 },
    Transfer { from: u8, to: u8, amount: i64 },
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..6u8, -50..100i64).prop_map(|(account, amount)| Op::Add { account, amount }),
        3 => (0..6u8, 1..6u8, 1..80i64).prop_map(|(from, step, amount)| Op::Transfer { from, to: (from + step) % 6, amount }),
        1 => Just(Op::Snapshot),
    ]
}

const PARTITIONS: u16 = 3;

fn start(dir: &Path) -> Engine {
    let mut config = EngineConfig::new(dir);
    config.partitions = PARTITIONS;
    config.snapshot_interval_records = u64::MAX; // only the test decides when
    Engine::start(
        config,
        vec![spate_tally::module().spec],
        &mut Registry::default(),
    )
    .unwrap()
}

/// Every partition's app state, as snapshot bytes (sorted, so equal states compare equal).
async fn states(engine: &Engine) -> Vec<Vec<u8>> {
    let handle = engine.handle();
    let mut all = Vec::new();
    for partition in 0..PARTITIONS {
        let bytes = handle
            .query(partition, APP_ID, |state: &TallyState| {
                let mut bytes = Vec::new();
                state.write_snapshot(&mut bytes).unwrap();
                bytes
            })
            .await
            .unwrap();
        all.push(bytes);
    }
    all
}

/// Waits until in-flight follow-ups have landed: the states stop changing.
async fn settled(engine: &Engine) -> Vec<Vec<u8>> {
    let mut last = states(engine).await;
    loop {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let now = states(engine).await;
        if now == last {
            return now;
        }
        last = now;
    }
}

fn snapshots(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for partition in std::fs::read_dir(dir.join("partitions")).unwrap() {
        let snapshot_dir = partition.unwrap().path().join("snapshots");
        for entry in std::fs::read_dir(snapshot_dir).into_iter().flatten() {
            found.push(entry.unwrap().path());
        }
    }
    found
}

async fn check(ops: Vec<Op>) {
    let a = tempfile::tempdir().unwrap();
    let engine = start(a.path());
    let handle = engine.handle();
    for (tag, op) in ops.iter().enumerate() {
        let (key, command) = match op {
            Op::Add { account, amount } => (
                format!("a{account}"),
                Command::Add {
                    account: format!("a{account}"),
                    amount: *amount,
                    tag: tag as u64,
                },
            ),
            Op::Transfer { from, to, amount } => (
                format!("a{from}"),
                Command::Transfer {
                    from: format!("a{from}"),
                    to: format!("a{to}"),
                    amount: *amount,
                    tag: tag as u64,
                },
            ),
            Op::Snapshot => {
                tokio::task::block_in_place(|| handle.snapshot_now()).unwrap();
                continue;
            }
        };
        let partition = handle.partition_of(key.as_bytes());
        handle
            .submit(partition, APP_ID, None, command.encode())
            .await
            .unwrap();
    }
    let before = settled(&engine).await;
    tokio::task::block_in_place(|| engine.shutdown()).unwrap();

    // b: the same data directory without any snapshot, so recovery replays every journal from LSN 0.
    let b = tempfile::tempdir().unwrap();
    copy_dir(a.path(), b.path());
    for path in snapshots(b.path()) {
        std::fs::remove_file(path).unwrap();
    }
    // a: drop the newest (shutdown) snapshot of each partition, so recovery is an older snapshot + replay.
    for partition in std::fs::read_dir(a.path().join("partitions")).unwrap() {
        let snapshot_dir = partition.unwrap().path().join("snapshots");
        let mut files: Vec<_> = std::fs::read_dir(&snapshot_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        if let Some(newest) = files.pop() {
            std::fs::remove_file(newest).unwrap();
        }
    }
    for dir in [a.path(), b.path()] {
        let engine = start(dir);
        let after = settled(&engine).await;
        assert_eq!(after, before, "recovered state differs ({})", dir.display());
        tokio::task::block_in_place(|| engine.shutdown()).unwrap();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn snapshot_plus_replay_equals_full_replay(ops in prop::collection::vec(op(), 1..120)) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(check(ops));
    }
}
