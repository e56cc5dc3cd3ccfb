//! `spate load ski rides|queries`: the course client's lift rides, and the seed's questions about them.

use super::common::mix64;
use spate_load::{Request, Scenario};

/// The `seq`-th ride of `worker`: `(resort, skier, lift, time)`, like the course assignment's client.
fn ski_ride(seed: u64, skiers: u64, worker: u32, seq: u64) -> (u64, u64, u64, u64) {
    let n = mix64((u64::from(worker) << 40 | seq) ^ seed);
    (
        1 + (n >> 20) % 10,
        1 + n % skiers,
        1 + (n >> 28) % 40,
        1 + (n >> 36) % 360,
    )
}

/// The season and day of every generated ride, as in the assignment.
const SKI_SEASON: u32 = 2022;
const SKI_DAY: u32 = 1;

pub struct SkiRides {
    pub seed: u64,
    pub skiers: u64,
}

impl Scenario for SkiRides {
    fn name(&self) -> String {
        "ski rides".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let (resort, skier, lift, time) = ski_ride(self.seed, self.skiers, worker, seq);
        Request::post_json(
            format!("/skiers/{resort}/seasons/{SKI_SEASON}/days/{SKI_DAY}/skiers/{skier}"),
            format!("{{\"time\":{time},\"liftID\":{lift}}}").into_bytes(),
        )
    }
}

pub struct SkiQueries {
    pub seed: u64,
    pub skiers: u64,
}

impl Scenario for SkiQueries {
    fn name(&self) -> String {
        "ski queries".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let (resort, skier, _, _) = ski_ride(self.seed, self.skiers, worker, seq);
        let path = match seq % 5 {
            0 => format!("/skiers/{skier}/seasons/{SKI_SEASON}/days"),
            1 => format!("/skiers/{skier}/seasons/{SKI_SEASON}/days/{SKI_DAY}/lifts"),
            2 => format!("/resorts/{resort}/seasons/{SKI_SEASON}/day/{SKI_DAY}/skiers"),
            3 => format!("/skiers/{skier}/vertical?resort={resort}"),
            _ => format!("/skiers/{resort}/seasons/{SKI_SEASON}/days/{SKI_DAY}/skiers/{skier}"),
        };
        Request::get(path).also_ok(&[404])
    }
}
