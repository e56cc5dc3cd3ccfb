//! The ski workload the tests share (one node and a cluster): rides, clients that POST them with
//! idempotency keys until the server dies, and the check that the read models equal what the
//! acknowledged rides imply.

use super::{agent, eventually, get, post_raw, retry_while_moving};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ride {
    pub resort: u32,
    pub season: u32,
    pub day: u32,
    pub skier: u32,
    pub time: u32,
    pub lift: u32,
}

impl Ride {
    pub fn url(&self, base: &str) -> String {
        format!(
            "{base}/skiers/{}/seasons/{}/days/{}/skiers/{}",
            self.resort, self.season, self.day, self.skier
        )
    }

    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({"time": self.time, "liftID": self.lift})).unwrap()
    }
}

pub fn post_ride(agent: &ureq::Agent, base: &str, ride: &Ride, key: Option<&str>) -> u16 {
    let url = ride.url(base);
    post_raw(agent, &url, Some("application/json"), key, &ride.body())
        .expect("the server answers")
        .0
}

pub fn rides_in_model(agent: &ureq::Agent, base: &str) -> u64 {
    let (status, lag) = read(agent, &format!("{base}/ski/lag"));
    assert_eq!(status, 200, "{lag}");
    lag["rides"].as_u64().unwrap()
}

/// Waits until the read model holds `rides` rides and the projection has no lag.
pub fn wait_for_model(agent: &ureq::Agent, base: &str, rides: u64) {
    let caught_up = eventually(Duration::from_secs(10), || {
        let lag = read(agent, &format!("{base}/ski/lag")).1;
        lag["rides"] == json!(rides) && lag["lagRecords"] == json!(0)
    });
    assert!(
        caught_up,
        "the read model did not reach {rides} rides: {}",
        read(agent, &format!("{base}/ski/lag")).1
    );
}

/// GET, sent again while the partition it goes to moves (in a cluster).
fn read(agent: &ureq::Agent, url: &str) -> (u16, Value) {
    retry_while_moving(|| get(agent, url))
}

pub fn vertical(lift: u32) -> u64 {
    u64::from(lift) * 10
}

pub fn check_model(agent: &ureq::Agent, base: &str, rides: &[Ride]) {
    let mut days: BTreeMap<(u32, u32, u32), Vec<Ride>> = BTreeMap::new();
    let mut unique: BTreeMap<(u32, u32, u32), BTreeSet<u32>> = BTreeMap::new();
    let mut totals: BTreeMap<(u32, u32), BTreeMap<u32, u64>> = BTreeMap::new();
    for ride in rides {
        days.entry((ride.skier, ride.season, ride.day))
            .or_default()
            .push(*ride);
        unique
            .entry((ride.resort, ride.season, ride.day))
            .or_default()
            .insert(ride.skier);
        *totals
            .entry((ride.skier, ride.resort))
            .or_default()
            .entry(ride.season)
            .or_default() += vertical(ride.lift);
    }
    for ((skier, season, day), those) in &days {
        let lifts = read(
            agent,
            &format!("{base}/skiers/{skier}/seasons/{season}/days/{day}/lifts"),
        )
        .1;
        let mut got: Vec<(u64, u64, u64)> = lifts["lifts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["resortID"].as_u64().unwrap(),
                    l["time"].as_u64().unwrap(),
                    l["liftID"].as_u64().unwrap(),
                )
            })
            .collect();
        let mut want: Vec<(u64, u64, u64)> = those
            .iter()
            .map(|r| (r.resort.into(), r.time.into(), r.lift.into()))
            .collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "lifts of skier {skier} on day {day} of {season}");
        let by_resort: BTreeSet<u32> = those.iter().map(|r| r.resort).collect();
        for resort in by_resort {
            let sum: u64 = those
                .iter()
                .filter(|r| r.resort == resort)
                .map(|r| vertical(r.lift))
                .sum();
            let url = format!("{base}/skiers/{resort}/seasons/{season}/days/{day}/skiers/{skier}");
            assert_eq!(read(agent, &url), (200, json!(sum)), "{url}");
        }
    }
    let skier_seasons: BTreeSet<(u32, u32)> = days
        .keys()
        .map(|&(skier, season, _)| (skier, season))
        .collect();
    for (skier, season) in skier_seasons {
        let reply = read(
            agent,
            &format!("{base}/skiers/{skier}/seasons/{season}/days"),
        )
        .1;
        let want: Vec<Value> = days
            .range((skier, season, 0)..=(skier, season, u32::MAX))
            .map(|(&(_, _, day), those)| {
                json!({"dayID": day, "rides": those.len(), "vertical": those.iter().map(|r| vertical(r.lift)).sum::<u64>()})
            })
            .collect();
        assert_eq!(reply["daysSkied"], json!(want.len()));
        assert_eq!(
            reply["days"],
            json!(want),
            "days of skier {skier} in {season}"
        );
    }
    for ((resort, season, day), skiers) in &unique {
        let reply = read(
            agent,
            &format!("{base}/resorts/{resort}/seasons/{season}/day/{day}/skiers"),
        )
        .1;
        assert_eq!(
            reply["numSkiers"],
            json!(skiers.len()),
            "{resort}/{season}/{day}"
        );
    }
    let resort_seasons: BTreeSet<(u32, u32)> = (unique.keys())
        .map(|&(resort, season, _)| (resort, season))
        .collect();
    for (resort, season) in resort_seasons {
        let want: Vec<Value> = (unique.iter())
            .filter(|&(&(r, s, _), _)| (r, s) == (resort, season))
            .map(|(&(_, _, day), skiers)| json!({"dayID": day, "numSkiers": skiers.len()}))
            .collect();
        let url = format!("{base}/resorts/{resort}/seasons/{season}/days");
        assert_eq!(read(agent, &url), (200, json!({"days": want})), "{url}");
    }
    for ((skier, resort), per_season) in &totals {
        let reply = read(
            agent,
            &format!("{base}/skiers/{skier}/vertical?resort={resort}"),
        )
        .1;
        let want: Vec<Value> = per_season
            .iter()
            .map(|(season, total)| json!({"seasonID": season.to_string(), "totalVert": total}))
            .collect();
        assert_eq!(
            reply["resorts"],
            json!(want),
            "skier {skier} at resort {resort}"
        );
    }
}

/// What a crash-test client had acknowledged, and the one ride it had in flight when the server died.
#[derive(Default)]
pub struct Client {
    pub acked: Vec<Ride>,
    pub in_flight: Option<(String, Ride)>,
}

/// POSTs rides, each distinct (the client owns its skiers; a skier's rides have distinct times), with an
/// Idempotency-Key, until the server dies.
pub fn crash_client(base: &str, seed: u64, id: u32, state: &Mutex<Client>, stop: &AtomicBool) {
    let agent = agent();
    let mut rng = StdRng::seed_from_u64(seed ^ u64::from(id));
    for counter in 0u32.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let ride = Ride {
            resort: rng.random_range(1..=10),
            season: 2022,
            day: 1 + counter / 360 % 3,
            skier: 1 + id * 10_000 + counter / 1080,
            time: 1 + counter % 360,
            lift: rng.random_range(1..=40),
        };
        let key = format!("client{id}-{counter}");
        state.lock().unwrap().in_flight = Some((key.clone(), ride));
        loop {
            let url = ride.url(base);
            match post_raw(
                &agent,
                &url,
                Some("application/json"),
                Some(&key),
                &ride.body(),
            ) {
                Ok((201, _)) => break,
                // A moving partition, or a slow server: the same ride again, with its key. While the
                // first try is still being made durable the key answers 409 (a key is only ever sent
                // with its own ride, so a 409 means nothing else).
                Ok((503, _)) => std::thread::sleep(Duration::from_millis(5)),
                Ok((409, _)) => std::thread::sleep(Duration::from_millis(50)),
                Err(error) if super::timed_out(&error) => {}
                Ok((status, reply)) => panic!("ride answered {status}: {reply}"),
                Err(_) => return,
            }
        }
        let mut state = state.lock().unwrap();
        state.acked.push(ride);
        state.in_flight = None;
    }
}
