//! leaderboard: ranked scores under heavy concurrent updates, exact ranks without scans.
//!
//! A board lives on the partition its name hashes to, so one thread applies all of its updates in
//! order: member -> score and score -> member change together without locks (the case study's spin
//! locks and their contention are gone by construction). Ranks come from an order-statistic B+tree
//! (`tree.rs`): rank, the member at a rank and a page of the ranking are O(log n).
//!
//! Randomness (the `random` tie policy) comes from the engine's per-command draw, so replay rebuilds
//! identical rankings.

mod board;
mod command;
mod http;
mod snapshot;
mod snapshot_vec;
mod state;
mod tree;

pub use board::{Board, BoardConfig, Operator, Order, Season, Standing, TiePolicy, UpdateError};
pub use command::{Command, ItemResult, Outcome, UpdateItem};
pub use http::{PAGE_LIMIT_MAX, UPDATES_PER_REQUEST_MAX};
pub use state::LeaderboardState;
pub use tree::{Entry, RankTree};

use spate_engine::AppSpec;
use spate_server::AppModule;

pub const APP_ID: spate_engine::AppId = 3;
pub const APP_NAME: &str = "leaderboard";

pub fn module() -> AppModule {
    let spec = AppSpec {
        id: APP_ID,
        name: APP_NAME,
        new_state: Box::new(|_| Box::new(LeaderboardState::default())),
        restore: Box::new(|_, input| Ok(Box::new(LeaderboardState::restore(input)?))),
        archives: false,
        projection: None,
    };
    AppModule {
        spec,
        routes: Box::new(|engine, _| Ok(http::routes(engine))),
        access: spate_server::access::RouteAccess::default(),
        message_only_error_paths: &[],
    }
}
