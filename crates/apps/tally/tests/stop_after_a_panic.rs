//! The engine stops, and says why, when a partition's thread has died: a panic on the partition's
//! thread (here in a query; in apply it is the same thread) used to leave `Engine::shutdown` waiting for
//! ever for an answer the dead thread could not give, so `spate serve` hung on SIGTERM.

mod support;

use spate_tally::{APP_ID, TallyState};
use std::time::Duration;

#[test]
fn shutdown_ends_when_a_partition_thread_has_panicked() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, runtime) = support::start(dir.path(), 2, spate_tally::module().spec, |_| {});
    let handle = engine.handle();
    let answered = runtime.block_on(handle.query(1, APP_ID, |_: &TallyState| -> u8 {
        panic!("a fault on partition 1's thread")
    }));
    assert!(answered.is_err(), "a dead thread answers nothing");
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || stopped_tx.send(engine.shutdown()).unwrap());
    let stopped = stopped_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("shutdown ends");
    let error = stopped.expect_err("a partition died");
    assert!(error.contains("partition 1"), "{error}");
}
