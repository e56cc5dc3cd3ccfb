//! tally: named accounts holding a balance and the list of tagged entries that made it, with transfers
//! between accounts on different partitions.
//!
//! It is the smallest app that uses every engine mechanism, and the one the engine's crash tests drive:
//! - client commands with idempotency keys (`add`),
//! - a cross-partition follow-up (`transfer` debits on the payer's partition, credits on the payee's),
//! - a projection (the totals over every account, built from entry events),
//! - queries served from the owning partition (an account) and from the projection (the totals).

mod command;
mod http;
mod state;

pub use command::{Command, Outcome};
pub use state::{Account, TallyState, Totals, TotalsProjection};

use spate_engine::AppSpec;
use spate_server::AppModule;
use std::sync::{Arc, RwLock};

pub const APP_ID: spate_engine::AppId = 10;
pub const APP_NAME: &str = "tally";

pub fn module() -> AppModule {
    let totals = Arc::new(RwLock::new(Totals::default()));
    let spec = AppSpec {
        id: APP_ID,
        name: APP_NAME,
        new_state: Box::new(|_| Box::new(state::TallyState::default())),
        restore: Box::new(|_, input| Ok(Box::new(state::TallyState::restore(input)?))),
        archives: false,
        projection: Some(Box::new(TotalsProjection::new(totals.clone()))),
    };
    AppModule {
        spec,
        routes: Box::new(move |engine, _| Ok(http::routes(engine, totals))),
        access: spate_server::access::RouteAccess::default(),
        message_only_error_paths: &[],
    }
}
