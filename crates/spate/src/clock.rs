//! The wall clock in milliseconds since the epoch: what reports are dated with and generated data starts
//! from, for `spate fraud`, `spate load` and `spate bench` alike.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
