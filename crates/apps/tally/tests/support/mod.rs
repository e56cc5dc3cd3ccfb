//! What the engine-level tests of tally share.
#![allow(dead_code)] // each test binary uses part of this

use prometheus_client::registry::Registry;
use spate_engine::{AppSpec, Engine, EngineConfig, Lsn, PartitionId, Projection};
use spate_tally::TotalsProjection;
use std::io;

/// An engine of `partitions` running `spec` on `data_dir`, its configuration changed by `configure`
/// first, and a runtime to await its replies on.
pub fn start(
    data_dir: &std::path::Path,
    partitions: u16,
    spec: AppSpec,
    configure: impl FnOnce(&mut EngineConfig),
) -> (Engine, tokio::runtime::Runtime) {
    let mut config = EngineConfig::new(data_dir);
    config.partitions = partitions;
    configure(&mut config);
    let engine = Engine::start(config, vec![spec], &mut Registry::default()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (engine, runtime)
}

/// tally's totals as a test needs them: `before_each` runs ahead of every event they are given (an
/// error refuses the event, as a read model does with one it cannot read), and requests wait for them
/// if `requests_wait`.
pub struct TotalsWith<F> {
    pub inner: TotalsProjection,
    pub before_each: F,
    pub requests_wait: bool,
}

impl<F: FnMut() -> io::Result<()> + Send + Sync + 'static> Projection for TotalsWith<F> {
    fn apply(
        &mut self,
        partition: PartitionId,
        lsn: Lsn,
        at_ms: u64,
        event: &[u8],
    ) -> io::Result<()> {
        (self.before_each)()?;
        self.inner.apply(partition, lsn, at_ms, event)
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        self.inner.write_snapshot(out)
    }

    fn restore(&mut self, input: &mut dyn io::Read, positions: &[Lsn]) -> io::Result<()> {
        self.inner.restore(input, positions)
    }

    fn requests_wait(&self) -> bool {
        self.requests_wait
    }
}
