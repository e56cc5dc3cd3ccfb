//! ledger: two-phase transfers between participants (FSPIOP's financial service providers) with
//! positions, net-debit caps, duplicate checks and expiry.
//!
//! - `domain.rs`: the rules, as one partition applies them (pure; time comes with each command).
//! - `state.rs`: the rules on the engine: postcard-encoded commands, replies and events, follow-ups
//!   routed to the partition of the transfer or participant they concern.
//! - `snapshot.rs`: the partition's snapshot, written in steps while apply goes on.
//! - `model.rs`: the read model over all partitions, and the wake-up of prepares waiting for their
//!   reservation.
//! - `amount.rs`: FSPIOP decimal amounts held exactly in minor units. `http/`: the API, its request
//!   parsing and the batch endpoint.

mod amount;
pub mod domain;
mod http;
mod model;
mod snapshot;
mod state;
mod waiters;

#[cfg(test)]
mod tests;

pub use http::{BATCH_OPERATIONS_MAX, ROUTE_ACCESS};

use spate_engine::AppSpec;
use spate_server::AppModule;
use std::sync::{Arc, RwLock};

pub const APP_ID: spate_engine::AppId = 2;
pub const APP_NAME: &str = "ledger";

/// Open transfers (RECEIVED or RESERVED) the ledger holds before it refuses new prepares
/// (`--ledger-open-transfers-max`): about 5 GB at the ~500 bytes each costs in memory. Final transfers
/// leave memory for the engine's archive.
pub const OPEN_TRANSFERS_MAX_DEFAULT: u64 = 10_000_000;

/// The ledger, refusing new prepares (2003, HTTP 503) while it holds `open_transfers_max` open
/// transfers: a refusal is better than a process the kernel kills for memory and that then cannot
/// replay its journal into the same memory.
pub fn module(open_transfers_max: u64) -> AppModule {
    let model = Arc::new(RwLock::new(model::LedgerModel::default()));
    let waiters = Arc::new(waiters::Waiters::default());
    let spec = AppSpec {
        id: APP_ID,
        name: APP_NAME,
        new_state: Box::new(|_| Box::new(state::LedgerState::default())),
        restore: Box::new(|_, input| Ok(Box::new(state::LedgerState::restore(input)?))),
        archives: true,
        projection: Some(Box::new(model::LedgerProjection {
            model: model.clone(),
            waiters: waiters.clone(),
        })),
    };
    AppModule {
        spec,
        routes: Box::new(move |engine, _| {
            Ok(http::routes(engine, model, waiters, open_transfers_max))
        }),
        access: ROUTE_ACCESS,
        message_only_error_paths: &[],
    }
}
