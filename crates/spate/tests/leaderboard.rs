//! The leaderboard app against the real server: the case study's concurrency checks, tie fairness,
//! consistency after deletes, bad input, and a kill -9 crash test.

mod support;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::{Server, agent, get, send};

fn start(dir: &std::path::Path) -> Server {
    Server::start(dir, &["--apps", "leaderboard"], None)
}

fn start_snapshotting(dir: &std::path::Path) -> Server {
    Server::start_checkpointing(dir, "leaderboard")
}

fn ok(result: Result<(u16, Value), ureq::Error>, expected: u16) -> Value {
    let (status, body) = result.expect("the server answers");
    assert_eq!(status, expected, "{body}");
    body
}

fn create(agent: &ureq::Agent, base: &str, body: Value) {
    ok(
        send(
            agent,
            "POST",
            &format!("{base}/leaderboards"),
            None,
            Some(&body),
        ),
        201,
    );
}

fn score_of(agent: &ureq::Agent, base: &str, board: &str, member: &str) -> String {
    let (status, body) = get(agent, &format!("{base}/leaderboard/{board}/{member}"));
    assert_eq!(status, 200, "{body}");
    body["score"]
        .as_str()
        .expect("score is a string")
        .to_string()
}

/// Runs `threads` threads, each calling `work(thread)`, and waits for all.
fn in_parallel(threads: usize, work: impl Fn(usize) + Sync) {
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let work = &work;
            scope.spawn(move || work(thread));
        }
    });
}

#[test]
fn case_study_concurrency_checks_over_its_own_api() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let base = server.base.clone();
    let agent = agent();
    // The case study creates a board by name and gets back the id its other calls use.
    let created = ok(
        send(
            &agent,
            "POST",
            &format!("{base}/leaderboard?name=concurrency"),
            None,
            None,
        ),
        200,
    );
    let board = created["id"].as_str().expect("an id").to_string();

    // 200 concurrent increments on two members leave each at exactly 100.
    in_parallel(20, |thread| {
        let agent = support::agent();
        for i in 0..10 {
            let member = if (thread + i) % 2 == 0 {
                "left"
            } else {
                "right"
            };
            ok(
                send(
                    &agent,
                    "PATCH",
                    &format!("{base}/leaderboard/{board}/{member}?score=1"),
                    None,
                    None,
                ),
                200,
            );
        }
    });
    assert_eq!(score_of(&agent, &base, &board, "left"), "100");
    assert_eq!(score_of(&agent, &base, &board, "right"), "100");

    // cores x 100 increments of different sizes on one member give the exact total, far beyond 64 bits.
    let cores = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2);
    let big = (i128::from(i64::MAX)) * (i128::from(i64::MAX));
    ok(
        send(
            &agent,
            "PUT",
            &format!("{base}/leaderboard/{board}/one"),
            None,
            Some(&json!({"score": big.to_string()})),
        ),
        200,
    );
    in_parallel(cores, |thread| {
        let agent = support::agent();
        for i in 0..100 {
            let amount = thread * 100 + i + 1;
            ok(
                send(
                    &agent,
                    "PATCH",
                    &format!("{base}/leaderboard/{board}/one?score={amount}"),
                    None,
                    None,
                ),
                200,
            );
        }
    });
    let n = (cores * 100) as i128;
    assert_eq!(
        score_of(&agent, &base, &board, "one"),
        (big + n * (n + 1) / 2).to_string()
    );

    // A retried increment with the same Idempotency-Key applies once; the key with another body is refused.
    let url = format!("{base}/leaderboard/{board}/keyed?score=7");
    for _ in 0..3 {
        let reply = ok(send(&agent, "PATCH", &url, Some("retry-1"), None), 200);
        assert_eq!(reply["score"], json!("7"), "{reply}");
    }
    let other = format!("{base}/leaderboard/{board}/keyed?score=8");
    let (status, reply) = send(&agent, "PATCH", &other, Some("retry-1"), None).unwrap();
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "{reply}"
    );
    assert_eq!(score_of(&agent, &base, &board, "keyed"), "7");

    let (status, body) = get(&agent, &format!("{base}/leaderboard/{board}"));
    assert_eq!((status, body["size"].as_u64()), (200, Some(4)), "{body}");
    let listed = get(&agent, &format!("{base}/leaderboard")).1;
    assert_eq!(listed["leaderboards"][0]["id"], json!(board), "{listed}");
}

/// Sets three members to the same new score each round; returns how often each ranked first.
fn first_places(agent: &ureq::Agent, base: &str, board: &str, rounds: u32) -> HashMap<String, u32> {
    let mut firsts = HashMap::new();
    for round in 1..=rounds {
        let scores: Vec<Value> = ["a", "b", "c"]
            .iter()
            .map(|m| json!({"memberId": m, "score": round, "mode": "replace"}))
            .collect();
        let body = json!({"leaderboards": [{"leaderboardId": board, "scores": scores}]});
        let reply = ok(
            send(
                agent,
                "POST",
                &format!("{base}/leaderboards/scores"),
                None,
                Some(&body),
            ),
            200,
        );
        assert_eq!(reply["failed"], json!(0), "{reply}");
        let top = get(agent, &format!("{base}/leaderboards/{board}/top?limit=3")).1;
        let scores: Vec<&str> = top["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["score"].as_str().unwrap())
            .collect();
        assert_eq!(scores, vec![round.to_string(); 3], "all three tie");
        *firsts
            .entry(top["entries"][0]["member"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    firsts
}

#[test]
fn random_ties_are_fair_and_first_ties_follow_arrival() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let agent = agent();
    create(
        &agent,
        &server.base,
        json!({"name": "random", "ties": "random"}),
    );
    create(&agent, &server.base, json!({"name": "arrival"}));

    let rounds = 240;
    let firsts = first_places(&agent, &server.base, "random", rounds);
    // Each of three members should come first in about a third of the rounds: binomial(240, 1/3) has a
    // standard deviation of 7.3, so 80 +- 40 fails only if the draw is biased (or not drawn at all).
    for member in ["a", "b", "c"] {
        let count = firsts.get(member).copied().unwrap_or(0);
        assert!(
            (40..=120).contains(&count),
            "{member} first in {count} of {rounds} rounds: {firsts:?}"
        );
    }
    // Under "first", whoever reached the score first ranks first, every round.
    let firsts = first_places(&agent, &server.base, "arrival", 20);
    assert_eq!(firsts.get("a"), Some(&20), "{firsts:?}");
}

#[test]
fn count_range_and_rank_stay_consistent_after_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let base = server.base.clone();
    let agent = agent();
    create(
        &agent,
        &base,
        json!({"name": "golf", "order": "ascending", "operator": "best"}),
    );
    let mut rng = StdRng::seed_from_u64(5);
    let mut model: HashMap<String, i64> = HashMap::new();
    // Several rounds of "best" updates: the lowest score per member counts.
    for _ in 0..3 {
        let scores: Vec<Value> = (0..300)
            .map(|i| {
                let member = format!("p{i}");
                let score = rng.random_range(-50..500i64);
                let best = model.entry(member.clone()).or_insert(score);
                *best = (*best).min(score);
                json!({"memberId": member, "score": score})
            })
            .collect();
        let body = json!({"leaderboards": [{"leaderboardId": "golf", "scores": scores}]});
        ok(
            send(
                &agent,
                "POST",
                &format!("{base}/leaderboards/scores"),
                None,
                Some(&body),
            ),
            200,
        );
    }
    let mut members: Vec<String> = model.keys().cloned().collect();
    members.sort();
    members.shuffle(&mut rng);
    for member in &members[..100] {
        ok(
            send(
                &agent,
                "DELETE",
                &format!("{base}/leaderboards/golf/members/{member}"),
                None,
                None,
            ),
            204,
        );
        model.remove(member);
        let (status, _) = send(
            &agent,
            "DELETE",
            &format!("{base}/leaderboards/golf/members/{member}"),
            None,
            None,
        )
        .unwrap();
        assert_eq!(status, 404);
    }
    // The reference order: ascending score, ties by arrival (the first "best" that reached the score).
    let info = get(&agent, &format!("{base}/leaderboards/golf")).1;
    assert_eq!(info["members"], json!(200), "{info}");
    let all = get(&agent, &format!("{base}/leaderboards/golf/top?limit=1000")).1;
    let entries = all["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 200);
    for (position, entry) in entries.iter().enumerate() {
        let member = entry["member"].as_str().unwrap();
        assert_eq!(entry["rank"], json!(position + 1));
        assert_eq!(entry["score"], json!(model[member].to_string()), "{member}");
        if position > 0 {
            let previous: i64 = entries[position - 1]["score"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(previous <= model[member], "ascending order at {position}");
        }
        let one = get(
            &agent,
            &format!("{base}/leaderboards/golf/members/{member}"),
        )
        .1;
        assert_eq!(one["rank"], json!(position + 1), "{one}");
    }
    for member in &members[..100] {
        let (status, _) = get(
            &agent,
            &format!("{base}/leaderboards/golf/members/{member}"),
        );
        assert_eq!(status, 404, "deleted {member}");
    }
    // Paging with the cursor walks the same list once; offset paging agrees.
    let mut walked = Vec::new();
    let mut url = format!("{base}/leaderboards/golf/top?limit=37");
    loop {
        let page = get(&agent, &url).1;
        walked.extend(page["entries"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(cursor) => url = format!("{base}/leaderboards/golf/top?limit=37&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(&walked, entries);
    let middle = get(
        &agent,
        &format!("{base}/leaderboards/golf/top?offset=100&limit=5"),
    )
    .1;
    assert_eq!(middle["entries"].as_array().unwrap()[..], entries[100..105]);
    // Around a member: k above, the member, k below.
    let pivot = entries[50]["member"].as_str().unwrap();
    let around = get(
        &agent,
        &format!("{base}/leaderboards/golf/members/{pivot}/around?k=3"),
    )
    .1;
    assert_eq!(around["entries"].as_array().unwrap()[..], entries[47..54]);
    // A member's rank on several boards at once.
    create(&agent, &base, json!({"name": "other"}));
    ok(
        send(
            &agent,
            "PUT",
            &format!("{base}/leaderboards/other/members/{pivot}"),
            None,
            Some(&json!({"score": 1})),
        ),
        200,
    );
    let ranks = get(
        &agent,
        &format!("{base}/leaderboards/ranks?member={pivot}&boards=golf,other,nosuch"),
    )
    .1;
    assert_eq!(ranks["boards"][0]["rank"], json!(51), "{ranks}");
    assert_eq!(ranks["boards"][1]["rank"], json!(1), "{ranks}");
    assert_eq!(
        ranks["boards"][2]["error"]["code"],
        json!("not_found"),
        "{ranks}"
    );
    // Reset: a new, empty season; the old one stays readable.
    ok(
        send(
            &agent,
            "POST",
            &format!("{base}/leaderboards/golf/reset"),
            None,
            None,
        ),
        201,
    );
    assert_eq!(
        get(&agent, &format!("{base}/leaderboards/golf")).1["members"],
        json!(0)
    );
    let old = get(
        &agent,
        &format!("{base}/leaderboards/golf/top?season=1&limit=1000"),
    )
    .1;
    assert_eq!(&old["entries"], &all["entries"]);
    ok(
        send(
            &agent,
            "DELETE",
            &format!("{base}/leaderboards/golf"),
            None,
            None,
        ),
        204,
    );
    assert_eq!(get(&agent, &format!("{base}/leaderboards/golf")).0, 404);
}

#[test]
fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let base = server.base.clone();
    let agent = agent();
    create(&agent, &base, json!({"name": "b"}));
    ok(
        send(
            &agent,
            "PUT",
            &format!("{base}/leaderboards/b/members/m"),
            None,
            Some(&json!({"score": 5})),
        ),
        200,
    );
    let beyond = "170141183460469231731687303715884105728";
    let too_many: Vec<Value> = (0..10_001)
        .map(|i| json!({"memberId": format!("m{i}"), "score": 1}))
        .collect();
    let cases: Vec<(&str, String, Option<Value>, u16, &str)> = vec![
        (
            "PUT",
            "/leaderboards/b/members/m".into(),
            Some(json!({"score": 1.5})),
            400,
            "expected an integer score",
        ),
        (
            "PUT",
            "/leaderboards/b/members/m".into(),
            Some(json!({"score": beyond})),
            400,
            "beyond the signed 128-bit range",
        ),
        (
            "PUT",
            "/leaderboards/b/members/m".into(),
            Some(json!({"score": "12x"})),
            400,
            "decimal integer",
        ),
        (
            "PUT",
            "/leaderboards/b/members/m".into(),
            Some(json!({"score": 1, "bonus": 2})),
            400,
            "unknown field",
        ),
        (
            "PUT",
            "/leaderboards/b/members/m".into(),
            Some(json!({"operator": "set"})),
            400,
            "missing field `score`",
        ),
        (
            "PUT",
            "/leaderboards/b/members/m".into(),
            Some(json!({"score": 1, "operator": "double"})),
            400,
            "operator must be one of",
        ),
        (
            "PUT",
            "/leaderboards/b/members/m".into(),
            Some(
                json!({"score": "170141183460469231731687303715884105727", "operator": "increment"}),
            ),
            400,
            "128-bit range",
        ),
        (
            "PUT",
            "/leaderboards/b/members/bad%20name".into(),
            Some(json!({"score": 1})),
            400,
            "member must be",
        ),
        (
            "PUT",
            format!("/leaderboards/b/members/{}", "x".repeat(129)),
            Some(json!({"score": 1})),
            400,
            "member must be 1 to 128",
        ),
        (
            "PUT",
            "/leaderboards/nosuch/members/m".into(),
            Some(json!({"score": 1})),
            404,
            "no board",
        ),
        (
            "PATCH",
            "/leaderboard/b/m?score=abc".into(),
            None,
            400,
            "decimal integer",
        ),
        ("PATCH", "/leaderboard/b/m".into(), None, 400, "?score="),
        (
            "POST",
            "/leaderboards".into(),
            Some(json!({"name": "b"})),
            409,
            "exists",
        ),
        (
            "POST",
            "/leaderboards".into(),
            Some(json!({"name": "ranks"})),
            400,
            "reserved",
        ),
        (
            "POST",
            "/leaderboards".into(),
            Some(json!({"name": "c", "order": "sideways"})),
            400,
            "order must be one of",
        ),
        (
            "POST",
            "/leaderboards".into(),
            Some(json!({"name": "c", "ties": "coin"})),
            400,
            "ties must be one of",
        ),
        (
            "POST",
            "/leaderboards/scores".into(),
            Some(json!({"leaderboards": [{"leaderboardId": "b", "scores": too_many}]})),
            400,
            "at most 10000",
        ),
        (
            "POST",
            "/leaderboards/scores".into(),
            Some(
                json!({"leaderboards": [{"leaderboardId": "b", "scores": [{"memberId": "m", "score": 1, "mode": "squash"}]}]}),
            ),
            400,
            "scores[0].mode",
        ),
        (
            "GET",
            "/leaderboards/b/top?limit=5000".into(),
            None,
            400,
            "limit must be",
        ),
        (
            "GET",
            "/leaderboards/b/top?cursor=00".into(),
            None,
            400,
            "cursor",
        ),
        (
            "GET",
            "/leaderboards/b/top?season=0".into(),
            None,
            400,
            "season must be",
        ),
        (
            "GET",
            "/leaderboards/b/top?season=9".into(),
            None,
            404,
            "no season 9",
        ),
        (
            "GET",
            "/leaderboards/b/members/m/around?k=-1".into(),
            None,
            400,
            "k must be",
        ),
        (
            "GET",
            "/leaderboards/ranks?member=m".into(),
            None,
            400,
            "boards is required",
        ),
    ];
    for (method, path, body, status, fragment) in cases {
        let (got, reply) = send(
            &agent,
            method,
            &format!("{base}{path}"),
            None,
            body.as_ref(),
        )
        .expect("answered");
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(got, status, "{method} {path}: {reply}");
        assert!(
            message.contains(fragment),
            "{method} {path}: {message:?} lacks {fragment:?}"
        );
    }
    let malformed = support::post_bytes(
        &agent,
        &format!("{base}/leaderboards/scores"),
        None,
        b"{\"leaderboards\": [".to_vec(),
    )
    .unwrap();
    assert_eq!(malformed.0, 400, "{}", malformed.1);
    // Nothing above changed the board.
    let top = get(&agent, &format!("{base}/leaderboards/b/top")).1;
    assert_eq!(
        top["entries"],
        json!([{"rank": 1, "member": "m", "score": "5"}])
    );
    assert_eq!(
        get(&agent, &format!("{base}/leaderboards")).1["boards"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// What a crash-test client had acknowledged, and the one request it had in flight when the server died.
#[derive(Default)]
struct Client {
    acked: Vec<(String, String, i64)>,
    in_flight: Option<(String, Value)>,
}

const BOARDS: [&str; 3] = ["alpha", "beta", "gamma"];

/// Increments random members (alone, or several boards in one bulk request) until the server dies.
fn crash_client(base: &str, seed: u64, id: usize, state: &Mutex<Client>, stop: &AtomicBool) {
    let agent = agent();
    let mut rng = StdRng::seed_from_u64(seed ^ id as u64);
    for counter in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let key = format!("client{id}-{counter}");
        let updates: Vec<(String, String, i64)> = (0..rng.random_range(1..=3))
            .map(|i| {
                (
                    BOARDS[(counter + i) % 3].to_string(),
                    format!("c{id}m{}", rng.random_range(0..4)),
                    rng.random_range(1..1000),
                )
            })
            .collect();
        let body = json!({"leaderboards": updates.iter().map(|(b, m, a)| json!({"leaderboardId": b, "scores": [{"memberId": m, "score": a, "mode": "increment"}]})).collect::<Vec<_>>()});
        state.lock().unwrap().in_flight = Some((key.clone(), body.clone()));
        // A partly refused request (503 for one board) is retried with the same key until all of it is
        // applied: the key makes the parts that were applied answer from the idempotency table.
        loop {
            match send(
                &agent,
                "POST",
                &format!("{base}/leaderboards/scores"),
                Some(&key),
                Some(&body),
            ) {
                Ok((200, reply)) if reply["failed"] == json!(0) => break,
                Ok((200, _)) | Ok((503, _)) => std::thread::sleep(Duration::from_millis(5)),
                Ok((status, reply)) => panic!("bulk update answered {status}: {reply}"),
                Err(_) => return,
            }
        }
        let mut state = state.lock().unwrap();
        state.acked.extend(updates);
        state.in_flight = None;
    }
}

#[test]
fn kill_9_under_load_loses_no_acknowledged_update_and_applies_none_twice() {
    let seed = support::crash_seed(17);
    let dir = tempfile::tempdir().unwrap();
    let server = start_snapshotting(dir.path());
    let base = server.base.clone();
    let agent = agent();
    for board in BOARDS {
        create(
            &agent,
            &base,
            json!({"name": board, "operator": "increment"}),
        );
    }
    let clients: Vec<Mutex<Client>> = (0..6).map(|_| Mutex::default()).collect();
    let acked = |clients: &[Mutex<Client>]| -> usize {
        clients.iter().map(|c| c.lock().unwrap().acked.len()).sum()
    };
    let loaded = |clients: &[Mutex<Client>]| acked(clients) > 100;
    support::kill_under_load(server, &clients, loaded, |id, state, stop| {
        crash_client(&base, seed, id, state, stop)
    });
    let acked_before = acked(&clients);
    let in_flight = clients
        .iter()
        .filter(|c| c.lock().unwrap().in_flight.is_some())
        .count();
    eprintln!(
        "{acked_before} updates acknowledged before the kill, {in_flight} requests in flight"
    );
    assert!(
        acked_before > 100,
        "only {acked_before} updates acknowledged before the kill"
    );

    let server = start_snapshotting(dir.path());
    // Each client retries its in-flight request with the same key: applied once, whether or not
    // (or in part) it was durable before the kill.
    for state in &clients {
        let mut state = state.lock().unwrap();
        if let Some((key, body)) = state.in_flight.take() {
            let reply = ok(
                send(
                    &agent,
                    "POST",
                    &format!("{}/leaderboards/scores", server.base),
                    Some(&key),
                    Some(&body),
                ),
                200,
            );
            assert_eq!(reply["failed"], json!(0), "{reply}");
            for board in body["leaderboards"].as_array().unwrap() {
                let score = &board["scores"][0];
                state.acked.push((
                    board["leaderboardId"].as_str().unwrap().into(),
                    score["memberId"].as_str().unwrap().into(),
                    score["score"].as_i64().unwrap(),
                ));
            }
        }
    }
    let mut expected: HashMap<(String, String), i64> = HashMap::new();
    for state in &clients {
        for (board, member, amount) in &state.lock().unwrap().acked {
            *expected.entry((board.clone(), member.clone())).or_default() += amount;
        }
    }
    for board in BOARDS {
        let top = get(
            &agent,
            &format!("{}/leaderboards/{board}/top?limit=1000", server.base),
        )
        .1;
        let entries = top["entries"].as_array().unwrap();
        let on_board = expected.keys().filter(|(b, _)| b == board).count();
        assert_eq!(entries.len(), on_board, "{board}: {top}");
        for entry in entries {
            let member = entry["member"].as_str().unwrap().to_string();
            let want = expected[&(board.to_string(), member.clone())];
            assert_eq!(entry["score"], json!(want.to_string()), "{board}/{member}");
        }
    }
}
