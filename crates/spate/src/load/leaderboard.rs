//! `spate load leaderboard updates|bulk`: increments of random users on one board, which the Redis peer's
//! scenario (`redis.rs`) reproduces.

use super::common::mix64;
use anyhow::{Context, bail};
use serde_json::json;
use spate_load::{Request, Scenario};

/// The board the leaderboard scenarios (and the Redis peer's sorted set) update.
pub const LEADERBOARD_BOARD: &str = "load";

/// The `seq`-th update of `worker`: a user and an increment, the same for spate and Redis.
pub fn leaderboard_update(seed: u64, users: u64, worker: u32, seq: u64) -> (u64, u64) {
    let n = mix64((u64::from(worker) << 40 | seq) ^ seed);
    (n % users, 1 + (n >> 32) % 100)
}

pub struct LeaderboardUpdates {
    pub seed: u64,
    pub users: u64,
}

impl Scenario for LeaderboardUpdates {
    fn name(&self) -> String {
        "leaderboard updates".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let (user, amount) = leaderboard_update(self.seed, self.users, worker, seq);
        let body =
            serde_json::to_vec(&json!({"score": amount, "operator": "increment"})).expect("JSON");
        Request::json(
            spate_load::Method::PUT,
            format!("/leaderboards/{LEADERBOARD_BOARD}/members/user-{user}"),
            body,
        )
    }
}

pub struct LeaderboardBulk {
    pub seed: u64,
    pub users: u64,
    pub batch: usize,
}

impl Scenario for LeaderboardBulk {
    fn name(&self) -> String {
        format!("leaderboard bulk of {}", self.batch)
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        use std::fmt::Write;
        // Written directly: building a JSON value per update would cost the load tool more CPU than the
        // server spends on it, on the same cores.
        let mut body =
            format!("{{\"leaderboards\":[{{\"leaderboardId\":\"{LEADERBOARD_BOARD}\",\"scores\":[");
        for i in 0..self.batch as u64 {
            let (user, amount) =
                leaderboard_update(self.seed, self.users, worker, seq * self.batch as u64 + i);
            let comma = if i == 0 { "" } else { "," };
            write!(
                body,
                "{comma}{{\"memberId\":\"user-{user}\",\"score\":{amount},\"mode\":\"increment\"}}"
            )
            .expect("writing to a String");
        }
        body.push_str("]}]}");
        Request::post_json("/leaderboards/scores", body.into_bytes())
    }
}

/// Creates the leaderboard scenarios' board unless it exists.
pub fn create_load_board(target: &str) -> anyhow::Result<()> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .post(format!("{}/leaderboards", target.trim_end_matches('/')))
        .send_json(json!({"name": LEADERBOARD_BOARD, "operator": "increment"}))
        .with_context(|| format!("creating board {LEADERBOARD_BOARD:?} at {target}"))?;
    match response.status().as_u16() {
        201 | 409 => Ok(()),
        status => bail!(
            "creating board {LEADERBOARD_BOARD:?} answered {status}: {}",
            response.body_mut().read_to_string()?
        ),
    }
}
