//! A read model whose feed dropped group commits reads them back from the log. If the log cannot be
//! read then (a replicated log's brokers out of reach), the read model waits and tries again: it does
//! not stop, and it applies nothing after what it has not read.

mod hooked_log;
mod support;

use hooked_log::{HookedLogs, LogHooks};
use prometheus_client::registry::Registry;
use spate_engine::journal::JournalError;
use spate_engine::{Engine, EngineConfig, FileLogStore};
use spate_tally::{APP_ID, Command, Totals, TotalsProjection};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Reads of dropped records whose first `failures` fail, as a log out of reach does.
struct UnreachableAtFirst {
    failures: AtomicU32,
}

impl LogHooks for UnreachableAtFirst {
    fn before_read_range(&self) -> Result<(), JournalError> {
        let failed = (self.failures)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if failed {
            return Err(JournalError::Replicated("no broker answers (test)".into()));
        }
        Ok(())
    }
}

#[test]
fn a_read_model_that_cannot_read_what_its_feed_dropped_tries_again() {
    const ADDS: u64 = 40;
    const FAILURES: u32 = 2;
    let dir = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(dir.path());
    config.partitions = 1;
    config.projection_feed_batches_max = 1;
    let unreachable = Arc::new(UnreachableAtFirst {
        failures: AtomicU32::new(FAILURES),
    });
    let files = FileLogStore::new(dir.path(), config.journal.clone());
    let logs = Arc::new(HookedLogs::new(files, unreachable.clone()));
    let totals = Arc::new(RwLock::new(Totals::default()));
    let mut spec = spate_tally::module().spec;
    // Slow at its first event, so that the feed of one group commit fills behind it.
    let mut slowed = false;
    spec.projection = Some(Box::new(support::TotalsWith {
        inner: TotalsProjection::new(totals.clone()),
        before_each: move || {
            if !slowed {
                slowed = true;
                std::thread::sleep(Duration::from_millis(300));
            }
            Ok(())
        },
        requests_wait: false,
    }));
    let engine =
        Engine::start_on(logs.clone(), config, vec![spec], &mut Registry::default()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handle = engine.handle();
    // One group commit each: while the read model sleeps on the first, its feed holds one more and
    // the rest are dropped, to be read from the log.
    for tag in 0..ADDS {
        let add = Command::Add {
            account: "alice".into(),
            amount: 1,
            tag,
        };
        runtime
            .block_on(handle.submit(0, APP_ID, None, add.encode()))
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while totals.read().unwrap().entries < ADDS {
        assert!(
            handle.health().stopped_read_models.is_empty(),
            "the read model stopped"
        );
        assert!(
            Instant::now() < deadline,
            "the read model applied {} of {ADDS} adds",
            totals.read().unwrap().entries
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        totals.read().unwrap().entries,
        ADDS,
        "each add applied once"
    );
    assert_eq!(
        unreachable.failures.load(Ordering::Acquire),
        0,
        "reads of dropped group commits failed {FAILURES} times first"
    );
    assert!(handle.health().stopped_read_models.is_empty());
    engine.shutdown().unwrap();
}
