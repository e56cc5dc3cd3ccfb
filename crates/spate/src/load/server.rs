//! `spate load server health`: the trivial endpoint, for checking the tool against wrk or oha.

use spate_load::{Request, Scenario};

pub struct Health;

impl Scenario for Health {
    fn name(&self) -> String {
        "server health".into()
    }

    fn request(&self, _worker: u32, _seq: u64) -> Request {
        Request::get("/health")
    }
}
