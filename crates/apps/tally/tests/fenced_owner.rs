//! A cluster node fenced off a partition's log (paused while another node took the partition over) has
//! applied commands that will never be in the log. When it stops the partition, it must not publish a
//! snapshot that holds them, even though it meanwhile follows the new owner's records to past that
//! snapshot's LSN: recovering from such a snapshot skips the log's own records at those LSNs, which the
//! new owner acknowledged. (Found as an acknowledged add missing after a rolling restart in
//! `tests/kafka.rs`; this reproduces the interleaving on one engine, with the journal's fence simulated.)

mod hooked_log;

use hooked_log::{HookedLogs, LogHooks};
use prometheus_client::registry::Registry;
use spate_engine::cluster::{ReadSender, Remote, ReplySender};
use spate_engine::journal::JournalError;
use spate_engine::record::{Envelope, Origin, begin_record, finish_record};
use spate_engine::{
    Engine, EngineConfig, EngineError, EngineHandle, FileLogStore, Lsn, PartitionId, Reply,
};
use spate_tally::{APP_ID, Command, TallyState};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Once fenced, every append waits until the fence is confirmed, then fails, as a fenced Kafka producer's
/// commit does a round trip later.
#[derive(Default)]
struct Fence {
    up: AtomicBool,
    /// An append is waiting at the fence: the command it holds was applied.
    reached: AtomicBool,
    confirmed: Mutex<bool>,
    confirmation: Condvar,
}

impl Fence {
    fn confirm(&self) {
        *self.confirmed.lock().unwrap() = true;
        self.confirmation.notify_all();
    }
}

impl LogHooks for Fence {
    fn before_append(&self) -> Result<(), JournalError> {
        if !self.up.load(Ordering::Acquire) {
            return Ok(());
        }
        self.reached.store(true, Ordering::Release);
        let confirmed = self.confirmed.lock().unwrap();
        drop(self.confirmation.wait_while(confirmed, |c| !*c));
        Err(JournalError::Failed)
    }
}

/// The only node: nothing is forwarded anywhere.
struct NoOtherNode;

impl Remote for NoOtherNode {
    fn forward(&self, partition: PartitionId, _: spate_engine::cluster::Command, to: ReplySender) {
        let _ = to.send(Err(EngineError::NotOwner(partition)));
    }

    fn deliver(&self, _: PartitionId, _: Vec<u8>) {}

    fn read(&self, partition: PartitionId, _: u8, _: Vec<u8>, to: ReadSender) {
        let _ = to.send(Err(EngineError::NotOwner(partition)));
    }

    fn query_refused(&self, _: PartitionId) {}
}

fn add(tag: u64) -> Vec<u8> {
    Command::Add {
        account: "acct0".into(),
        amount: 5,
        tag,
    }
    .encode()
}

/// `count` records another owner committed, as the node's follower hands them over.
fn other_owners_records(count: u64) -> Vec<u8> {
    let mut frames = Vec::new();
    for tag in 0..count {
        let envelope = Envelope {
            app: APP_ID,
            origin: Origin::Client { command_id: None },
            timestamp_ms: 0,
            random: 0,
        };
        let start = begin_record(&mut frames, &envelope, &add(100 + tag));
        finish_record(&mut frames, start);
    }
    frames
}

/// The LSNs of the snapshots published in `dir` (`<lsn>.snap`).
fn published_snapshots(dir: &Path) -> Vec<Lsn> {
    let Ok(files) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    files
        .filter_map(|file| {
            let name = file.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".snap")?.parse().ok()
        })
        .collect()
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A node on the shared log in `log_dir` (its journal files; snapshots stay in `data_dir`), applying
/// no partition until activated.
fn node(data_dir: &Path, log_dir: &Path, fence: &Arc<Fence>) -> Engine {
    let mut config = EngineConfig::new(data_dir);
    config.partitions = 1;
    config.snapshot_interval_records = u64::MAX; // only a stop writes one
    let logs = HookedLogs::new(
        FileLogStore::new(log_dir, config.journal.clone()),
        fence.clone(),
    );
    Engine::start_node(
        Arc::new(logs),
        Arc::new(NoOtherNode),
        config,
        vec![spate_tally::module().spec],
        &mut Registry::default(),
    )
    .unwrap()
}

/// The tags of acct0's entries, as the partition here holds them: the membership has just shown this
/// node holding it (it extends the read lease).
fn tags(runtime: &tokio::runtime::Runtime, engine: &Engine) -> Vec<u64> {
    let handle = engine.handle();
    handle.extend_read_leases(&[0], Instant::now() + Duration::from_secs(60));
    let account = runtime
        .block_on(acct0(&handle))
        .unwrap()
        .expect("acct0 exists");
    account.entries.iter().map(|&(tag, _)| tag).collect()
}

async fn acct0(handle: &EngineHandle) -> Result<Option<spate_tally::Account>, EngineError> {
    handle
        .query(0, APP_ID, |state: &TallyState| {
            state.account("acct0").cloned()
        })
        .await
}

fn acknowledged(runtime: &tokio::runtime::Runtime, engine: &Engine, tag: u64) {
    let reply = runtime.block_on(engine.handle().submit(0, APP_ID, None, add(tag)));
    assert!(matches!(reply, Ok(Reply::Applied(_))), "{reply:?}");
}

#[test]
fn a_fenced_owner_publishes_no_snapshot_of_what_it_applied_past_its_log() {
    let (log_dir, node_dir, new_owner_dir) = (tempdir(), tempdir(), tempdir());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fence = Arc::new(Fence::default());
    let engine = node(node_dir.path(), log_dir.path(), &fence);
    let handle = engine.handle();
    handle.activate(0).unwrap();
    acknowledged(&runtime, &engine, 1);
    let durable_end: Lsn = 1;
    let snapshot_dir = node_dir.path().join("partitions/p000/snapshots");

    // Fenced: another node owns the log now. A command still applied here will never be in it.
    fence.up.store(true, Ordering::Release);
    let never_durable = handle.enqueue(0, APP_ID, None, add(2)).unwrap();
    wait_until("the command is applied and at the fence", || {
        fence.reached.load(Ordering::Acquire)
    });
    std::thread::scope(|scope| {
        // The membership stops the partition: its last snapshot holds the command above.
        let stopped = scope.spawn(|| handle.deactivate(0));
        wait_until("the partition is no longer here", || {
            handle.local_partitions().is_empty()
        });
        // Meanwhile the node follows the new owner's records, to past that snapshot's LSN.
        handle.follow(0, durable_end, 5, other_owners_records(5));
        fence.confirm();
        let stopped = stopped.join().unwrap();
        assert!(stopped.is_err(), "the fenced partition stopped cleanly");
    });
    let refused = runtime.block_on(never_durable.reply());
    assert_eq!(refused, Err(EngineError::JournalFailed));

    // A snapshot's thread that outlived the stop would publish it within moments: look for a while,
    // by name (`snapshot::list` would remove the file it is still writing).
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let published = published_snapshots(&snapshot_dir);
        assert!(
            published.iter().all(|lsn| *lsn <= durable_end),
            "a snapshot past the log's durable end {durable_end} was published: {published:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The new owner acknowledges five adds on the log; then the partition comes back to this node,
    // which must hold exactly what the log holds.
    let unfenced = Arc::new(Fence::default());
    let new_owner = node(new_owner_dir.path(), log_dir.path(), &unfenced);
    new_owner.handle().activate(0).unwrap();
    for tag in 100..105 {
        acknowledged(&runtime, &new_owner, tag);
    }
    assert_eq!(tags(&runtime, &new_owner), [1, 100, 101, 102, 103, 104]);
    new_owner.handle().deactivate(0).unwrap();
    fence.up.store(false, Ordering::Release);
    handle.activate(0).unwrap();
    assert_eq!(tags(&runtime, &engine), [1, 100, 101, 102, 103, 104]);
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A snapshot of another history at the same LSNs (as a node fenced off the log wrote before the fix
/// above, or any other) is not continued with this log: recovery checks the record it ends at against
/// the log's, sets it aside and replays the log.
#[test]
fn a_snapshot_of_another_history_is_set_aside_at_recovery() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let unfenced = Arc::new(Fence::default());
    let snapshot_of = |dir: &Path| dir.join("partitions/p000/snapshots");
    // Another history: adds 1 and 2, and a snapshot after them (LSN 2).
    let other = tempdir();
    let engine = node(other.path(), other.path(), &unfenced);
    engine.handle().activate(0).unwrap();
    for tag in [1, 2] {
        acknowledged(&runtime, &engine, tag);
    }
    engine.handle().deactivate(0).unwrap();
    let (lsn, foreign) =
        spate_engine::snapshot::list(&snapshot_of(other.path())).unwrap()[0].clone();
    assert_eq!(lsn, 2);

    // This log: adds 1, 100 and 101. Its partition comes back with the other history's snapshot as its
    // newest.
    let this = tempdir();
    let engine = node(this.path(), this.path(), &unfenced);
    engine.handle().activate(0).unwrap();
    for tag in [1, 100, 101] {
        acknowledged(&runtime, &engine, tag);
    }
    engine.handle().deactivate(0).unwrap();
    for (_, own) in spate_engine::snapshot::list(&snapshot_of(this.path())).unwrap() {
        std::fs::remove_file(own).unwrap();
    }
    let planted = snapshot_of(this.path()).join(foreign.file_name().unwrap());
    std::fs::copy(&foreign, &planted).unwrap();
    engine.handle().activate(0).unwrap();
    assert_eq!(tags(&runtime, &engine), [1, 100, 101]);
    assert!(!planted.exists(), "the foreign snapshot was not set aside");
}

/// Fencing keeps an old owner's writes out of the log, not its reads: a node paused while its lease
/// moved would answer from a state that misses the new owner's acknowledged writes. A cluster node
/// answers reads of a partition only while the membership's read lease lasts, and refuses them as
/// `NotOwner` after (the server then forwards them to the owner).
#[test]
fn a_node_answers_reads_only_while_its_read_lease_lasts() {
    let (log_dir, node_dir) = (tempdir(), tempdir());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let engine = node(node_dir.path(), log_dir.path(), &Arc::new(Fence::default()));
    let handle = engine.handle();
    handle.activate(0).unwrap();
    acknowledged(&runtime, &engine, 1);
    assert_eq!(
        runtime.block_on(acct0(&handle)).map(|_| ()),
        Err(EngineError::NotOwner(0)),
        "read before the membership showed this node holding the partition"
    );
    let lease = Duration::from_millis(300);
    handle.extend_read_leases(&[0], Instant::now() + lease);
    assert!(runtime.block_on(acct0(&handle)).unwrap().is_some());
    std::thread::sleep(lease);
    assert_eq!(
        runtime.block_on(acct0(&handle)).map(|_| ()),
        Err(EngineError::NotOwner(0)),
        "read after the lease ran out"
    );
    // Writes do not need it: the log's fence guards them.
    acknowledged(&runtime, &engine, 2);
    handle.extend_read_leases(&[0], Instant::now() + Duration::from_secs(60));
    assert_eq!(tags(&runtime, &engine), [1, 2]);
}
