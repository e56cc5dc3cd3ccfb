//! ledger: two-phase transfers between participants (FSPIOP's financial service providers) with
//! positions, net-debit caps, duplicate checks and expiry.
//!
//! This crate holds the rules (`domain.rs`) and their checks; the engine adapter, the HTTP API and the
//! read model come next (issue 5).

pub mod domain;

#[cfg(test)]
mod tests;
