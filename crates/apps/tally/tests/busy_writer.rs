//! While the journal's writer is busy with one group commit and the next batch waits for it, requests
//! that come meanwhile would join that waiting batch whenever they were applied. The partition thread
//! leaves them in its queue until the writer can take the batch, then applies them all at once: the
//! tasks that queue requests need not wake it once per request. This holds the partition to that, and
//! to losing and reordering nothing when the writer frees.

mod hooked_log;

use hooked_log::{HookedLogs, LogHooks};
use prometheus_client::registry::Registry;
use spate_engine::journal::JournalError;
use spate_engine::{Engine, EngineConfig, FileLogStore, Reply};
use spate_tally::{APP_ID, Command, TallyState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Holds every append while closed, as a slow disk would.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
    /// An append is waiting at the closed gate.
    reached: AtomicBool,
    /// Answered for [`LogHooks::queues_batches`] (true: the files' default).
    queues_batches: bool,
}

impl Gate {
    fn set_closed(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.opened.notify_all();
    }
}

impl LogHooks for Gate {
    fn before_append(&self) -> Result<(), JournalError> {
        let closed = self.closed.lock().unwrap();
        if *closed {
            self.reached.store(true, Ordering::Release);
        }
        drop(self.opened.wait_while(closed, |closed| *closed));
        Ok(())
    }

    fn queues_batches(&self) -> bool {
        self.queues_batches
    }
}

fn add(tag: u64) -> Vec<u8> {
    Command::Add {
        account: "acct0".into(),
        amount: 1,
        tag,
    }
    .encode()
}

/// `spate_commands_applied_total`, summed over the registry's series.
fn applied(registry: &Registry) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .filter(|line| line.starts_with("spate_commands_applied_total"))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// A request the engine lost would otherwise hang the test rather than fail it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// An engine of one tally partition whose journal appends pass a gate, and the gate; its log answers
/// `queues_batches` for [`Log::queues_batches`](spate_engine::journal::Log::queues_batches).
fn gated_engine(dir: &std::path::Path, queues_batches: bool) -> (Engine, Registry, Arc<Gate>) {
    let gate = Arc::new(Gate {
        queues_batches,
        ..Gate::default()
    });
    let mut config = EngineConfig::new(dir);
    config.partitions = 1;
    let logs = HookedLogs::new(FileLogStore::new(dir, config.journal.clone()), gate.clone());
    let mut registry = Registry::default();
    let engine = Engine::start_on(
        Arc::new(logs),
        config,
        vec![spate_tally::module().spec],
        &mut registry,
    )
    .unwrap();
    (engine, registry, gate)
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Submits add 1 through the open gate, closes it, enqueues add 2, which the writer then holds, and
/// add 3, which opens the next batch; returns once add 3 is applied (and 50 ms more, time for a
/// descheduled partition thread to hand its batch over, were it to).
fn writer_held_and_add_3_applied(
    gate: &Gate,
    handle: &spate_engine::EngineHandle,
    registry: &Registry,
) -> Vec<spate_engine::Pending> {
    let reply = current_thread_runtime().block_on(handle.submit(0, APP_ID, None, add(1)));
    assert!(matches!(reply, Ok(Reply::Applied(_))), "{reply:?}");
    gate.set_closed(true);
    let mut pending = vec![handle.enqueue(0, APP_ID, None, add(2)).unwrap()];
    wait_until("the writer is at the gate", || {
        gate.reached.load(Ordering::Acquire)
    });
    pending.push(handle.enqueue(0, APP_ID, None, add(3)).unwrap());
    wait_until("add 3 is applied", || applied(registry) == 3);
    std::thread::sleep(Duration::from_millis(50));
    pending
}

/// Enqueues the adds after those `pending` holds, up to add 10, and leaves the partition 200 ms to
/// apply them, were it to.
fn enqueue_the_rest(handle: &spate_engine::EngineHandle, pending: &mut Vec<spate_engine::Pending>) {
    for tag in pending.len() as u64 + 2..=10 {
        pending.push(handle.enqueue(0, APP_ID, None, add(tag)).unwrap());
    }
    std::thread::sleep(Duration::from_millis(200));
}

/// Opens the gate, then checks that every pending add is acknowledged and that the account holds
/// adds 1 to 10 in order, once each.
fn open_and_check(
    gate: &Gate,
    handle: &spate_engine::EngineHandle,
    registry: &Registry,
    pending: Vec<spate_engine::Pending>,
) {
    let runtime = current_thread_runtime();
    gate.set_closed(false);
    for pending in pending {
        let reply =
            runtime.block_on(async { tokio::time::timeout(REPLY_TIMEOUT, pending.reply()).await });
        assert!(matches!(reply, Ok(Ok(Reply::Applied(_)))), "{reply:?}");
    }
    assert_eq!(applied(registry), 10);
    let account = runtime.block_on(handle.query(0, APP_ID, |state: &TallyState| {
        state.account("acct0").cloned()
    }));
    let tags: Vec<u64> = (account.unwrap().expect("acct0 exists").entries.iter())
        .map(|&(tag, _)| tag)
        .collect();
    assert_eq!(tags, (1..=10).collect::<Vec<_>>());
}

#[test]
fn requests_wait_in_the_queue_while_their_batch_waits_for_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, registry, gate) = gated_engine(dir.path(), true);
    let handle = engine.handle();
    // The writer holds a group commit (add 2); the next batch (add 3) went to it, ready to be taken.
    let mut pending = writer_held_and_add_3_applied(&gate, &handle, &registry);
    // An idle partition with an empty batch applies what comes: add 4 opens the batch that must wait.
    pending.push(handle.enqueue(0, APP_ID, None, add(4)).unwrap());
    wait_until("add 4 is applied", || applied(&registry) == 4);
    // The count goes up inside apply: this leaves the partition time to end its turn and wait.
    std::thread::sleep(Duration::from_millis(50));
    enqueue_the_rest(&handle, &mut pending);
    assert_eq!(
        applied(&registry),
        4,
        "requests were applied while their batch could not go to the writer"
    );
    open_and_check(&gate, &handle, &registry, pending);
}

/// A log whose appends are slow does not queue batches: the batch after the one being appended waits on
/// the partition, not in the writer's slot, and what comes meanwhile waits in the queue to join it.
#[test]
fn a_log_that_does_not_queue_batches_gets_one_only_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, registry, gate) = gated_engine(dir.path(), false);
    let handle = engine.handle();
    // Add 3 opened a batch; with the writer busy it stays on the partition.
    let mut pending = writer_held_and_add_3_applied(&gate, &handle, &registry);
    enqueue_the_rest(&handle, &mut pending);
    assert_eq!(
        applied(&registry),
        3,
        "a batch went to a busy writer (the partition went on applying)"
    );
    open_and_check(&gate, &handle, &registry, pending);
}
