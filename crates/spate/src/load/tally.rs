//! `spate load tally adds`: entries on 10,000 accounts, with idempotency keys.

use super::common::mix64;
use serde_json::json;
use spate_load::{Request, Scenario};

pub struct TallyAdds {
    pub seed: u64,
}

const TALLY_ACCOUNTS: u64 = 10_000;

impl Scenario for TallyAdds {
    fn name(&self) -> String {
        "tally adds".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let n = (u64::from(worker) << 40 | seq) ^ self.seed;
        let account = mix64(n) % TALLY_ACCOUNTS;
        let body = serde_json::to_vec(&json!({"amount": 1, "tag": n})).expect("JSON");
        Request::post_json(format!("/tally/accounts/acct-{account}/entries"), body).with_header(
            "idempotency-key",
            format!("load-{}-{worker}-{seq}", self.seed),
        )
    }
}
