//! What fraud reads from clients: the case study's 100-byte records (files and the stream), the
//! stream's acknowledgements, and its commands as journaled: parsed or refused, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate_fraud::command::Command;
use spate_fraud::record::{parse_body, parse_record};
use spate_fraud::stream::Ack;

fuzz_target!(|data: &[u8]| {
    let _ = parse_record(data);
    let _ = parse_body(data);
    let _ = Ack::decode(data);
    let _ = Command::decode(data);
});
