//! Snapshot sections as each app (all six) reads them back from disk (through the one interface the engine
//! uses, `AppSpec::restore`): any bytes restore a state or give an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let specs = spate_fuzz::app_specs();
    let spec = &specs[usize::from(which) % specs.len()];
    let mut input = bytes;
    let _ = (spec.restore)(0, &mut input);
});
