//! `spate load redis zincrby`: the leaderboard workload on Redis, the peer of `leaderboard updates|bulk`.

use super::leaderboard::{LEADERBOARD_BOARD, leaderboard_update};
use spate_load::{Request, Scenario};

pub struct RedisZincrby {
    pub seed: u64,
    pub users: u64,
}

impl Scenario for RedisZincrby {
    fn name(&self) -> String {
        "redis zincrby".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let (user, amount) = leaderboard_update(self.seed, self.users, worker, seq);
        let member = format!("user-{user}").into_bytes();
        let key = LEADERBOARD_BOARD.as_bytes().to_vec();
        Request::Redis(vec![
            vec![
                b"ZINCRBY".to_vec(),
                key.clone(),
                amount.to_string().into_bytes(),
                member.clone(),
            ],
            vec![b"ZREVRANK".to_vec(), key, member],
        ])
    }
}
