//! What the engine-level tests of tally share.

use prometheus_client::registry::Registry;
use spate_engine::{AppSpec, Engine, EngineConfig};

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
