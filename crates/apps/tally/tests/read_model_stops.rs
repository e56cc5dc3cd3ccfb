//! A read model that meets an event it cannot apply while serving stops, rather than serve a model
//! that skipped it, and the engine says so: `Health::stopped_read_models` names it (`/health` answers
//! 503 `failing`), and shutdown reports the stopped thread.

mod support;

use spate_tally::{APP_ID, Command, TotalsProjection};
use std::io;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

#[test]
fn a_read_model_that_cannot_apply_an_event_stops_and_health_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spate_tally::module().spec;
    // Refuses the second event it is given, as a read model does with an event it cannot read.
    let mut seen = 0;
    spec.projection = Some(Box::new(support::TotalsWith {
        inner: TotalsProjection::new(Arc::new(RwLock::new(Default::default()))),
        before_each: move || {
            seen += 1;
            if seen == 2 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "an event of a newer kind",
                ));
            }
            Ok(())
        },
        requests_wait: false,
    }));
    // One partition: every add below goes to partition 0.
    let (engine, runtime) = support::start(dir.path(), 1, spec, |_| {});
    let handle = engine.handle();
    let add = |tag: u64| {
        Command::Add {
            account: "alice".into(),
            amount: 5,
            tag,
        }
        .encode()
    };
    runtime
        .block_on(handle.submit(0, APP_ID, None, add(1)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while handle.projection_lag(APP_ID) != Some(0) {
        assert!(Instant::now() < deadline, "the first event is applied");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(handle.health().stopped_read_models.is_empty());

    // The second event is refused: the read model stops, the partitions go on.
    runtime
        .block_on(handle.submit(0, APP_ID, None, add(2)))
        .unwrap();
    while handle.health().stopped_read_models.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the read model is reported stopped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let health = handle.health();
    assert_eq!(health.stopped_read_models, ["tally"]);
    assert!(health.failed_partitions.is_empty());
    runtime
        .block_on(handle.submit(0, APP_ID, None, add(3)))
        .expect("writes go on");
    assert!(
        handle.projection_lag(APP_ID).unwrap() >= 2,
        "the model applies nothing more"
    );

    let error = engine.shutdown().expect_err("a read model stopped");
    assert!(error.contains("projection"), "{error}");
}
