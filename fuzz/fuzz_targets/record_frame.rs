//! Journal frames and the records inside them, as read back from disk or Kafka: any bytes give a
//! frame, an error or the end, never a panic; and a record decodes or is refused whatever its body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate_engine::record::{Frame, RecordRef, read_frame};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Frame::Valid {
        kind,
        body,
        total_bytes,
    } = read_frame(rest)
    {
        assert!(total_bytes <= rest.len(), "a frame longer than its bytes");
        let _ = RecordRef::decode(kind, body);
        rest = &rest[total_bytes..];
    }
    // A checksum stops almost every random frame above: decode bodies directly too.
    if let Some((&kind, body)) = data.split_first() {
        let _ = RecordRef::decode(kind, body);
    }
});
