//! fraud: card transactions scored against each card's recent history by a rule set (the case study's 49
//! rules built in), with the verdict stored in the history. See `specs/fraud.md` for the exact semantics.

pub mod generator;
pub mod history;
pub mod java_random;
pub mod record;
pub mod rules;
