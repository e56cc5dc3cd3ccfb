//! The ski app against the real server: every operation of the spec and its errors, read models checked
//! against what a random workload implies (before and after a restart), and a kill -9 crash test.

mod support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::sync::Mutex;
use support::ski::{
    Client, Ride, check_model, crash_client, post_ride, rides_in_model, wait_for_model,
};
use support::{Server, agent, get, post_raw};

fn start(dir: &std::path::Path) -> Server {
    Server::start(dir, &["--apps", "ski"], None)
}

fn start_checkpointing(dir: &std::path::Path) -> Server {
    Server::start_checkpointing(dir, "ski")
}

#[test]
fn every_operation_of_the_spec_and_ours() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let base = &server.base;
    let agent = agent();

    let resorts = get(&agent, &format!("{base}/resorts")).1;
    let listed: Vec<u64> = resorts["resorts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["resortID"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, (1..=10).collect::<Vec<_>>());
    assert_eq!(resorts["resorts"][2]["resortName"], "Resort 3");
    assert_eq!(
        get(&agent, &format!("{base}/resorts/3/seasons")),
        (200, json!({"seasons": []}))
    );

    // A spec client's POST: JSON under any content type (or none), with or without waitTime.
    let ride = |day, skier, time, lift| Ride {
        resort: 3,
        season: 2022,
        day,
        skier,
        time,
        lift,
    };
    let first = ride(1, 77, 217, 21);
    for (content_type, body) in [
        (Some("application/json"), first.body()),
        (
            Some("text/plain"),
            br#"{"time": 100, "liftID": 5, "waitTime": 3}"#.to_vec(),
        ),
        (None, br#"{"liftID": 40, "time": 360}"#.to_vec()),
    ] {
        let (status, reply) =
            post_raw(&agent, &first.url(base), content_type, None, &body).unwrap();
        assert_eq!(status, 201, "{content_type:?}: {reply}");
    }
    assert_eq!(post_ride(&agent, base, &ride(2, 77, 10, 7), None), 201);
    assert_eq!(post_ride(&agent, base, &ride(1, 78, 11, 1), None), 201);
    wait_for_model(&agent, base, 5);

    let day_vertical = get(&agent, &first.url(base));
    assert_eq!(day_vertical, (200, json!(210 + 50 + 400)));
    let (status, missing) = get(&agent, &ride(3, 77, 1, 1).url(base));
    assert_eq!(status, 404);
    assert!(missing["message"].as_str().unwrap().contains("no rides"));

    assert_eq!(
        get(
            &agent,
            &format!("{base}/resorts/3/seasons/2022/day/1/skiers")
        ),
        (200, json!({"time": "Resort 3", "numSkiers": 2}))
    );
    assert_eq!(
        get(
            &agent,
            &format!("{base}/resorts/3/seasons/2022/day/9/skiers")
        ),
        (200, json!({"time": "Resort 3", "numSkiers": 0}))
    );
    assert_eq!(
        get(&agent, &format!("{base}/resorts/3/seasons/2022/days")),
        (
            200,
            json!({"days": [{"dayID": 1, "numSkiers": 2}, {"dayID": 2, "numSkiers": 1}]})
        )
    );
    assert_eq!(
        get(&agent, &format!("{base}/skiers/77/vertical?resort=3")),
        (
            200,
            json!({"resorts": [{"seasonID": "2022", "totalVert": 660 + 70}]})
        )
    );
    assert_eq!(
        get(
            &agent,
            &format!("{base}/skiers/77/vertical?resort=3&season=2021")
        )
        .0,
        404
    );
    assert_eq!(
        get(&agent, &format!("{base}/skiers/77/seasons/2022/days")),
        (
            200,
            json!({"skierID": 77, "seasonID": "2022", "daysSkied": 2, "days": [
                {"dayID": 1, "rides": 3, "vertical": 660},
                {"dayID": 2, "rides": 1, "vertical": 70},
            ]})
        )
    );
    let lifts = get(
        &agent,
        &format!("{base}/skiers/77/seasons/2022/days/1/lifts"),
    )
    .1;
    assert_eq!(lifts["vertical"], 660);
    assert_eq!(
        lifts["lifts"],
        json!([
            {"resortID": 3, "time": 217, "liftID": 21, "vertical": 210},
            {"resortID": 3, "time": 100, "liftID": 5, "vertical": 50},
            {"resortID": 3, "time": 360, "liftID": 40, "vertical": 400},
        ])
    );

    // Seasons: added ones at once (read from the resort's partition), plus those with rides.
    let seasons_url = format!("{base}/resorts/3/seasons");
    for body in [
        json!({"year": "2019"}),
        json!({"year": 2020}),
        json!({"year": "2019"}),
    ] {
        let bytes = serde_json::to_vec(&body).unwrap();
        let (status, reply) = post_raw(&agent, &seasons_url, None, None, &bytes).unwrap();
        assert_eq!(status, 201, "{body}: {reply}");
    }
    assert_eq!(
        get(&agent, &seasons_url),
        (200, json!({"seasons": ["2019", "2020", "2022"]}))
    );
    assert_eq!(
        get(&agent, &format!("{base}/resorts/4/seasons")),
        (200, json!({"seasons": []}))
    );

    // An Idempotency-Key makes a retried ride count once; reused with another body it is refused.
    let keyed = ride(5, 90, 1, 2);
    assert_eq!(post_ride(&agent, base, &keyed, Some("k1")), 201);
    assert_eq!(post_ride(&agent, base, &keyed, Some("k1")), 201);
    assert_eq!(post_ride(&agent, base, &ride(5, 90, 2, 2), Some("k1")), 422);
    wait_for_model(&agent, base, 6);
    assert_eq!(get(&agent, &keyed.url(base)), (200, json!(20)));

    let stats = get(&agent, &format!("{base}/statistics")).1;
    let rows = stats["endpointStats"].as_array().unwrap();
    let post_stats = rows
        .iter()
        .find(|r| {
            r["operation"] == "POST"
                && r["URL"] == "/skiers/{resortID}/seasons/{seasonID}/days/{dayID}/skiers/{skierID}"
        })
        .expect("POST ride statistics");
    // Seven answered 201 (one of them a keyed retry), one 422.
    assert_eq!(post_stats["count"], 8, "{stats}");
    assert!(
        post_stats["maxMicros"].as_u64().unwrap() >= post_stats["meanMicros"].as_u64().unwrap()
    );
    assert!(post_stats["mean"].is_u64() && post_stats["max"].is_u64());
    assert!(
        rows.iter()
            .any(|r| r["URL"] == "/resorts" && r["operation"] == "GET" && r["count"] == 1)
    );
}

#[test]
fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let base = &server.base;
    let agent = agent();
    let good = Ride {
        resort: 1,
        season: 2022,
        day: 1,
        skier: 1,
        time: 1,
        lift: 1,
    };
    assert_eq!(post_ride(&agent, base, &good, None), 201);
    wait_for_model(&agent, base, 1);
    let ride_path = |resort: &str, season: &str, day: &str, skier: &str| {
        format!("/skiers/{resort}/seasons/{season}/days/{day}/skiers/{skier}")
    };
    let ok_body = r#"{"time": 5, "liftID": 5}"#;
    // (method, path, body, status, words the message must contain)
    let cases: Vec<(&str, String, &str, u16, &str)> = vec![
        (
            "POST",
            ride_path("0", "2022", "1", "1"),
            ok_body,
            400,
            "resortID must be from 1 to 10",
        ),
        (
            "POST",
            ride_path("11", "2022", "1", "1"),
            ok_body,
            400,
            "resortID",
        ),
        (
            "POST",
            ride_path("x", "2022", "1", "1"),
            ok_body,
            400,
            "resortID must be an integer",
        ),
        (
            "POST",
            ride_path("1", "1899", "1", "1"),
            ok_body,
            400,
            "seasonID",
        ),
        (
            "POST",
            ride_path("1", "twenty", "1", "1"),
            ok_body,
            400,
            "seasonID must be an integer",
        ),
        (
            "POST",
            ride_path("1", "2022", "0", "1"),
            ok_body,
            400,
            "dayID must be from 1 to 366",
        ),
        (
            "POST",
            ride_path("1", "2022", "367", "1"),
            ok_body,
            400,
            "dayID",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "0"),
            ok_body,
            400,
            "skierID",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "100001"),
            ok_body,
            400,
            "skierID must be from 1 to 100000",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "99999999999999999999"),
            ok_body,
            400,
            "skierID must be an integer",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            r#"{"time": 0, "liftID": 5}"#,
            400,
            "time must be from 1 to 360",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            r#"{"time": 361, "liftID": 5}"#,
            400,
            "time",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            r#"{"time": 5, "liftID": 41}"#,
            400,
            "liftID must be from 1 to 40",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            r#"{"time": 5, "liftID": -1}"#,
            400,
            "liftID",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            r#"{"time": 5.5, "liftID": 5}"#,
            400,
            "invalid JSON body",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            r#"{"time": 5}"#,
            400,
            "liftID",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            r#"{"time": 5, "liftID": 5, "lift": 5}"#,
            400,
            "unknown field",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            r#"{"time": 5, "liftID""#,
            400,
            "invalid JSON body",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            "",
            400,
            "invalid JSON body",
        ),
        (
            "POST",
            ride_path("1", "2022", "1", "1"),
            "[5, 5]",
            400,
            "invalid JSON body",
        ),
        ("GET", ride_path("1", "2022", "1", "0"), "", 400, "skierID"),
        ("GET", ride_path("1", "2022", "400", "1"), "", 400, "dayID"),
        (
            "GET",
            ride_path("1", "2022", "1", "2"),
            "",
            404,
            "no rides for skier 2",
        ),
        (
            "GET",
            "/resorts/abc/seasons".into(),
            "",
            400,
            "resortID must be an integer",
        ),
        (
            "GET",
            "/resorts/11/seasons".into(),
            "",
            404,
            "resort 11 not found",
        ),
        (
            "POST",
            "/resorts/0/seasons".into(),
            r#"{"year": "2019"}"#,
            404,
            "resort 0 not found",
        ),
        (
            "POST",
            "/resorts/1/seasons".into(),
            r#"{"year": "19"}"#,
            400,
            "4-character year",
        ),
        (
            "POST",
            "/resorts/1/seasons".into(),
            r#"{"year": "20x9"}"#,
            400,
            "year must be an integer",
        ),
        (
            "POST",
            "/resorts/1/seasons".into(),
            r#"{"year": 2101}"#,
            400,
            "year must be from 1900 to 2100",
        ),
        ("POST", "/resorts/1/seasons".into(), r#"{}"#, 400, "year"),
        (
            "POST",
            "/resorts/1/seasons".into(),
            r#"{"year": "2019", "x": 1}"#,
            400,
            "unknown field",
        ),
        (
            "GET",
            "/resorts/1/seasons/2022/day/0/skiers".into(),
            "",
            400,
            "dayID",
        ),
        (
            "GET",
            "/resorts/1/seasons/abc/day/1/skiers".into(),
            "",
            400,
            "seasonID",
        ),
        (
            "GET",
            "/resorts/12/seasons/2022/day/1/skiers".into(),
            "",
            404,
            "resort 12 not found",
        ),
        (
            "GET",
            "/resorts/1/seasons/abc/days".into(),
            "",
            400,
            "seasonID",
        ),
        (
            "GET",
            "/resorts/12/seasons/2022/days".into(),
            "",
            404,
            "resort 12 not found",
        ),
        (
            "GET",
            "/skiers/1/vertical".into(),
            "",
            400,
            "exactly one resort",
        ),
        (
            "GET",
            "/skiers/1/vertical?resort=1&resort=2".into(),
            "",
            400,
            "exactly one resort",
        ),
        (
            "GET",
            "/skiers/1/vertical?resort=99".into(),
            "",
            400,
            "resort must be from 1 to 10",
        ),
        (
            "GET",
            "/skiers/1/vertical?resort=1&season=x".into(),
            "",
            400,
            "season must be an integer",
        ),
        (
            "GET",
            "/skiers/1/vertical?resort=1&colour=red".into(),
            "",
            400,
            "unknown query parameter",
        ),
        (
            "GET",
            "/skiers/0/vertical?resort=1".into(),
            "",
            400,
            "skierID",
        ),
        (
            "GET",
            "/skiers/2/vertical?resort=1".into(),
            "",
            404,
            "no rides for skier 2",
        ),
        (
            "GET",
            "/skiers/1/seasons/2022/days/1/lifts".into(),
            "",
            200,
            "",
        ),
        (
            "GET",
            "/skiers/1/seasons/2022/days/2/lifts".into(),
            "",
            404,
            "no rides for skier 1 on day 2",
        ),
        (
            "GET",
            "/skiers/1/seasons/20222/days".into(),
            "",
            400,
            "seasonID",
        ),
    ];
    for (method, path, body, status, words) in cases {
        let url = format!("{base}{path}");
        let (got, reply) = if method == "GET" {
            get(&agent, &url)
        } else {
            post_raw(
                &agent,
                &url,
                Some("application/json"),
                None,
                body.as_bytes(),
            )
            .unwrap()
        };
        assert_eq!(got, status, "{method} {path} {body}: {reply}");
        if status >= 400 {
            let message = reply["message"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path}: {reply}"));
            assert!(
                message.contains(words),
                "{method} {path}: {message:?} lacks {words:?}"
            );
        }
    }
    let (status, body) =
        support::raw_request(base, &format!("DELETE {} HTTP/1.1\r\n", good.url("")));
    assert_eq!(status, 405, "{body}");
    let reply: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    assert!(
        (reply["message"].as_str().unwrap_or("")).contains("DELETE"),
        "{reply}"
    );
    // An oversized body is refused from its Content-Length, before it is read; that refusal and a
    // path no ski route matches are in the spec's shape too (issue 19, defect 7).
    let path = good.url("");
    let refusals = [
        support::post_oversized(base, &path),
        support::raw_request(base, "GET /skiers/1/nowhere HTTP/1.1\r\n"),
        support::raw_request(
            base,
            "GET /resorts/1/seasons/2024/day/1/skiers/x HTTP/1.1\r\n",
        ),
    ];
    for ((status, body), expected) in refusals.into_iter().zip([413, 404, 404]) {
        assert_eq!(status, expected, "{body}");
        let reply: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        assert!(
            reply["message"].is_string() && reply.get("error").is_none(),
            "{reply}"
        );
    }

    assert_eq!(rides_in_model(&agent, base), 1);
    assert_eq!(get(&agent, &good.url(base)), (200, json!(10)));
    assert_eq!(
        get(&agent, &format!("{base}/resorts/1/seasons")),
        (200, json!({"seasons": ["2022"]}))
    );
    assert_eq!(get(&agent, &format!("{base}/health")).0, 200);
}

/// Everything the read model should answer about `rides`, asked and compared.
/// Rides over small ranges, so skiers ride several times a day, at several resorts and in two seasons.
fn random_rides(count: usize, seed: u64) -> Vec<Ride> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| Ride {
            resort: rng.random_range(1..=3),
            season: rng.random_range(2021..=2022),
            day: rng.random_range(1..=4),
            skier: rng.random_range(1..=25),
            time: rng.random_range(1..=360),
            lift: rng.random_range(1..=40),
        })
        .collect()
}

/// POSTs `rides` from four threads, asserting each is acknowledged.
fn post_all(base: &str, rides: &[Ride]) {
    std::thread::scope(|scope| {
        for chunk in rides.chunks(rides.len().div_ceil(4)) {
            scope.spawn(move || {
                let agent = agent();
                for ride in chunk {
                    assert_eq!(post_ride(&agent, base, ride, None), 201);
                }
            });
        }
    });
}

#[test]
fn read_models_equal_what_a_random_workload_implies_before_and_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_checkpointing(dir.path());
    let rides = random_rides(2_000, 11);
    post_all(&server.base, &rides);
    let agent = agent();
    wait_for_model(&agent, &server.base, rides.len() as u64);
    check_model(&agent, &server.base, &rides);

    assert!(server.terminate().success());
    let server = start_checkpointing(dir.path());
    wait_for_model(&agent, &server.base, rides.len() as u64);
    check_model(&agent, &server.base, &rides);
}

/// With a feed of one group commit and a checkpoint every 20 records, the projection keeps falling
/// behind: the writers drop batches from its feed instead of waiting, and it reads them from the journal.
/// The read model must still hold every ride exactly once.
#[test]
fn a_projection_whose_feed_overflows_reads_the_journal_and_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--apps",
        "ski",
        "--projection-feed-batches",
        "1",
        "--projection-checkpoint-interval-records",
        "20",
        "--segment-bytes",
        "32768",
        "--snapshot-interval-records",
        "300",
    ];
    let server = Server::start(dir.path(), &args, None);
    let rides = random_rides(3_000, 12);
    post_all(&server.base, &rides);
    let agent = agent();
    wait_for_model(&agent, &server.base, rides.len() as u64);
    check_model(&agent, &server.base, &rides);
    let metrics = support::metrics_text(&agent, &server.base);
    let reads: u64 = metrics
        .lines()
        .find(|l| l.starts_with("spate_projection_journal_reads_total{app=\"ski\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(
        reads > 0,
        "the feed never overflowed; the test proves nothing:\n{metrics}"
    );
    println!("{reads} reads from the journal");
    assert!(server.terminate().success());
    let server = Server::start(dir.path(), &args, None);
    wait_for_model(&agent, &server.base, rides.len() as u64);
    check_model(&agent, &server.base, &rides);
}

#[test]
fn kill_9_during_a_post_storm_keeps_every_acknowledged_ride_exactly_once() {
    let seed = support::crash_seed(23);
    let dir = tempfile::tempdir().unwrap();
    let server = start_checkpointing(dir.path());
    let base = server.base.clone();
    let clients: Vec<Mutex<Client>> = (0..8).map(|_| Mutex::default()).collect();
    let acked = |clients: &[Mutex<Client>]| -> usize {
        clients.iter().map(|c| c.lock().unwrap().acked.len()).sum()
    };
    let loaded = |clients: &[Mutex<Client>]| acked(clients) > 500;
    support::kill_under_load(server, &clients, loaded, |id, state, stop| {
        crash_client(&base, seed, id as u32, state, stop)
    });
    let acked_before = acked(&clients);
    let in_flight = clients
        .iter()
        .filter(|c| c.lock().unwrap().in_flight.is_some())
        .count();
    eprintln!("{acked_before} rides acknowledged before the kill, {in_flight} in flight");
    assert!(
        acked_before > 500,
        "only {acked_before} rides acknowledged before the kill"
    );

    let server = start_checkpointing(dir.path());
    let agent = agent();
    // Each client retries its in-flight ride with its key, as a client that timed out would: it
    // counts once whether or not it was durable before the kill.
    for state in &clients {
        let mut state = state.lock().unwrap();
        if let Some((key, ride)) = state.in_flight.take() {
            assert_eq!(post_ride(&agent, &server.base, &ride, Some(&key)), 201);
            state.acked.push(ride);
        }
    }
    let rides: Vec<Ride> = clients
        .iter()
        .flat_map(|c| c.lock().unwrap().acked.clone())
        .collect();
    wait_for_model(&agent, &server.base, rides.len() as u64);
    check_model(&agent, &server.base, &rides);
}

#[test]
fn a_damaged_or_missing_ride_store_is_refused_at_start_up() {
    // The rides sit in fjall's journal until its memtable is written to a table; a clean stop
    // persists it and checkpoints the positions it covers. A flipped byte in a ride's key fails the
    // checksum of its batch; a cut makes fjall's recovery stop early; a lost store holds nothing:
    // either way spate refuses to serve a read model that is behind its checkpoint. (A byte flipped
    // at a fixed offset may land where fjall reads it the same way: such a store is whole, and was
    // served, so the flip aims at a key.)
    type Damage = fn(&std::path::Path);
    let journal = |store: &std::path::Path| store.join("0.jnl");
    fn cut_or_flip(store: &std::path::Path, flip: bool) {
        let path = store.join("0.jnl");
        let mut bytes = std::fs::read(&path).unwrap();
        let used = bytes.iter().rposition(|b| *b != 0).unwrap();
        if flip {
            // Skier 100's ride key: skier, season and day, big-endian.
            let key = [0, 0, 0, 100, 0x07, 0xe6, 0, 1];
            let at = (bytes.windows(key.len()))
                .position(|window| window == key)
                .expect("skier 100's ride key in fjall's journal");
            bytes[at + 3] ^= 0x20;
        } else {
            bytes.truncate(used / 2);
        }
        std::fs::write(&path, &bytes).unwrap();
    }
    let damages: [(&str, Damage); 3] = [
        ("a flipped byte", |store| cut_or_flip(store, true)),
        ("a truncated file", |store| cut_or_flip(store, false)),
        ("a lost store", |store| {
            std::fs::remove_dir_all(store).unwrap()
        }),
    ];
    for (damage, apply) in damages {
        let dir = tempfile::tempdir().unwrap();
        let server = start(dir.path());
        let agent = agent();
        let rides: Vec<Ride> = (1..=200)
            .map(|n| Ride {
                resort: 1 + n % 3,
                season: 2022,
                day: 1 + n % 2,
                skier: n,
                time: n % 300 + 1,
                lift: n % 40 + 1,
            })
            .collect();
        for ride in &rides {
            assert_eq!(post_ride(&agent, &server.base, ride, None), 201);
        }
        wait_for_model(&agent, &server.base, rides.len() as u64);
        assert!(server.terminate().success());
        let store = dir.path().join("ski/model");
        assert!(journal(&store).exists(), "fjall's journal moved");
        apply(&store);
        let log = support::refused_start_up(dir.path(), "ski", &[]);
        assert!(
            log.contains("ski read model's store failed") || log.contains("behind its checkpoint"),
            "{damage}: {log}"
        );
    }
}
