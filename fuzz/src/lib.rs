//! What the fuzz targets share: every app, built as the server builds it, with its files in a
//! temporary directory that lives as long as the process.

use spate_engine::AppSpec;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A directory for the process's files, removed by no one (a fuzz run ends by being stopped).
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap().keep())
}

/// The payments app's settings for a server whose data is in `data_dir`.
pub fn payments_config(data_dir: &Path) -> spate_payments::PaymentsConfig {
    spate_payments::PaymentsConfig {
        data_dir: data_dir.to_path_buf(),
        kek_file: data_dir.with_extension("kek"),
        keyring_file: spate_payments::keys::Keyring::path_in(data_dir),
        create_keyring: true,
        settlement_dir: data_dir.join("settlements"),
        reference: Default::default(),
        settle_every: None,
        feed_events_per_partition: 10_000,
        store_cache_bytes: 8 << 20,
    }
}

/// Every app's module, with its stores under `data_dir`.
pub fn modules(data_dir: &Path) -> Vec<spate_server::AppModule> {
    let mut fraud = spate_fraud::FraudConfig::new([7; 32]);
    fraud.stream_listen = None;
    vec![
        spate_tally::module(),
        spate_leaderboard::module(),
        spate_ledger::module(1_000_000),
        spate_fraud::module(fraud),
        spate_ski::module(Default::default(), data_dir, 8 << 20).unwrap(),
        spate_payments::module(payments_config(data_dir)).unwrap(),
    ]
}

/// Every app's spec, built once.
pub fn app_specs() -> &'static [AppSpec] {
    static SPECS: OnceLock<Vec<AppSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        let data_dir = scratch_dir().join("specs");
        std::fs::create_dir_all(&data_dir).unwrap();
        modules(&data_dir).into_iter().map(|m| m.spec).collect()
    })
}
