//! What the apps that handle cards share, so that none depends on another: the fraud case study's
//! transaction record (`record`), its 49 rules (`rules`), the card histories they score against
//! (`history`), and the sealing of card numbers at rest with its key files (`cipher`). The fraud app
//! scores a stream with them; payments scores each authorization and keeps its key-encrypting key
//! with the same key-file code.

pub mod cipher;
pub mod history;
pub mod record;
pub mod rules;

/// A day in ms.
pub const DAY_MS: u64 = 86_400_000;
/// How far back a card's history reaches: the case study's 90 days.
pub const HISTORY_WINDOW_MS: u64 = 90 * DAY_MS;
