//! Each read model's checkpoint (tally's totals, the ledger's, payments' and ski's models) as
//! start-up reads it through `Projection::restore`: any bytes restore a model or give an error, never
//! a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate_engine::Projection;
use std::sync::{Mutex, OnceLock};

fn projections() -> &'static Mutex<Vec<Box<dyn Projection>>> {
    static PROJECTIONS: OnceLock<Mutex<Vec<Box<dyn Projection>>>> = OnceLock::new();
    PROJECTIONS.get_or_init(|| {
        let data_dir = spate_fuzz::scratch_dir().join("checkpoints");
        std::fs::create_dir_all(&data_dir).unwrap();
        let projections = (spate_fuzz::modules(&data_dir).into_iter())
            .filter_map(|module| module.spec.projection)
            .collect();
        Mutex::new(projections)
    })
}

// The first byte picks the read model; the rest is its checkpoint.
fuzz_target!(|data: &[u8]| {
    let Some((&which, mut checkpoint)) = data.split_first() else {
        return;
    };
    let mut projections = projections().lock().unwrap();
    let count = projections.len();
    let _ = projections[usize::from(which) % count].restore(&mut checkpoint, &[0]);
});
