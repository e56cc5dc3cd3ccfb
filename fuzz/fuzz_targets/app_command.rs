//! Each app's commands as its apply decodes them (from its routes, another node or the journal): any
//! bytes, in any order, are applied or refused, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The first byte picks the app; the rest is up to 16 commands, each a length byte and that many
// bytes (the last takes what is left), applied in order to a fresh state.
fuzz_target!(|data: &[u8]| {
    let Some((&which, mut rest)) = data.split_first() else {
        return;
    };
    let specs = spate_fuzz::app_specs();
    let spec = &specs[usize::from(which) % specs.len()];
    let mut payloads = Vec::new();
    while let Some((&length, tail)) = rest.split_first() {
        if payloads.len() == 15 {
            payloads.push(tail);
            break;
        }
        let length = usize::from(length).min(tail.len());
        payloads.push(&tail[..length]);
        rest = &tail[length..];
    }
    spate_engine::untrusted::apply_client_commands(spec, payloads);
});
