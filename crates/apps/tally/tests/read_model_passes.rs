//! A read model passes over its feed at most once per `EngineConfig::projection_pass_interval`: a group
//! commit that comes sooner after the last pass waits for the rest of the interval. One that requests
//! wait for (`Projection::requests_wait`) passes as each group commit comes.

mod support;

use spate_tally::{APP_ID, Command, TotalsProjection};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

const PASS_INTERVAL: Duration = Duration::from_secs(3);

/// Submits two adds on one partition, the second once the read model shows the first, and returns how
/// long after the read model showed the first it showed the second. The pass that applied the first
/// began before it showed, so with the interval a second pass cannot show anything sooner than the
/// interval after it, however long the second add took to be acknowledged.
fn second_add_shown_after_first(requests_wait: bool) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spate_tally::module().spec;
    spec.projection = Some(Box::new(support::TotalsWith {
        inner: TotalsProjection::new(Arc::new(RwLock::new(Default::default()))),
        before_each: || Ok(()),
        requests_wait,
    }));
    let (engine, runtime) = support::start(dir.path(), 1, spec, |config| {
        config.projection_pass_interval = PASS_INTERVAL;
    });
    let handle = engine.handle();
    let add_and_wait_until_shown = |tag: u64| {
        let add = Command::Add {
            account: "alice".into(),
            amount: 5,
            tag,
        };
        runtime
            .block_on(handle.submit(0, APP_ID, None, add.encode()))
            .unwrap();
        let acknowledged = Instant::now();
        while handle.projection_lag(APP_ID) != Some(0) {
            assert!(
                acknowledged.elapsed() < 4 * PASS_INTERVAL,
                "add {tag} is never shown"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        (acknowledged.elapsed(), Instant::now())
    };
    let (first_waited, first_shown) = add_and_wait_until_shown(1);
    assert!(
        first_waited < PASS_INTERVAL / 2,
        "the first pass waits for nothing: {first_waited:?}"
    );
    let (_, second_shown) = add_and_wait_until_shown(2);
    engine.shutdown().unwrap();
    second_shown - first_shown
}

#[test]
fn a_group_commit_soon_after_a_pass_waits_for_the_rest_of_the_interval() {
    let apart = second_add_shown_after_first(false);
    assert!(apart >= PASS_INTERVAL * 2 / 3, "{apart:?}");
}

#[test]
fn a_read_model_that_requests_wait_for_passes_at_once() {
    let apart = second_add_shown_after_first(true);
    assert!(apart < PASS_INTERVAL / 2, "{apart:?}");
}
