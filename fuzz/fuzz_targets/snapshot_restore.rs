//! Snapshot sections as each app reads them back from disk (through the one interface the engine
//! uses, `AppSpec::restore`): any bytes restore a state or give an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate_engine::AppSpec;
use std::sync::OnceLock;

fn specs() -> &'static [AppSpec] {
    static SPECS: OnceLock<Vec<AppSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        let mut fraud = spate_fraud::FraudConfig::new([7; 32]);
        fraud.stream_listen = None;
        vec![
            spate_tally::module().spec,
            spate_leaderboard::module().spec,
            spate_ledger::module(1_000_000).spec,
            spate_fraud::module(fraud).spec,
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let specs = specs();
    let spec = &specs[usize::from(which) % specs.len()];
    let mut input = bytes;
    let _ = (spec.restore)(0, &mut input);
});
