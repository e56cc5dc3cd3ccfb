//! The ledger app against the real server: every FSPIOP error code it answers with, the two phases,
//! rejects and expiry, and a kill -9 crash test.

mod support;

use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::Duration;
use support::ledger::{
    Client, FSPS, b64, check_transfers, crash_client, create, fulfil_body, fulfilment, participant,
    prepare_body, put_as, transfer_id,
};
use support::{Server, agent, eventually, get, send};

fn start(dir: &std::path::Path) -> Server {
    Server::start(dir, &["--apps", "ledger"], None)
}

fn start_checkpointing(dir: &std::path::Path) -> Server {
    Server::start_checkpointing(dir, "ledger")
}

fn post(agent: &ureq::Agent, url: &str, body: &Value) -> (u16, Value) {
    send(agent, "POST", url, None, Some(body)).expect("answered")
}

/// PUT with the FSPIOP-Source header.
fn put(agent: &ureq::Agent, url: &str, source: &str, body: &Value) -> (u16, Value) {
    put_as(agent, url, source, body).expect("answered")
}

fn assert_error(reply: (u16, Value), status: u16, code: &str, words: &str) {
    let (got, body) = reply;
    assert_eq!(got, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(words), "{message:?} lacks {words:?}");
}

#[test]
fn two_phases_rejects_expiry_and_every_error_code() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let base = &server.base;
    let agent = agent();
    create(&agent, base, "dfsp1", "1000");
    create(&agent, base, "dfsp2", "500.5");
    create(&agent, base, "dfsp3", "0");
    assert_error(
        post(
            &agent,
            &format!("{base}/participants"),
            &json!({"name": "dfsp1", "currency": "USD", "ndc": "1"}),
        ),
        409,
        "3003",
        "exists",
    );
    let transfers = format!("{base}/transfers");

    // Prepare reserves; a resend answers the same; a modified resend is 3106.
    let first = prepare_body(1, "dfsp1", "dfsp2", "123.45", 60_000);
    let (status, body) = post(&agent, &transfers, &first);
    assert_eq!(
        (status, body["transferState"].clone()),
        (201, json!("RESERVED")),
        "{body}"
    );
    assert_eq!(
        post(&agent, &transfers, &first).1["transferState"],
        "RESERVED"
    );
    let mut modified = first.clone();
    modified["amount"]["amount"] = json!("123.46");
    assert_error(
        post(&agent, &transfers, &modified),
        409,
        "3106",
        "different content",
    );
    assert_eq!(participant(&agent, base, "dfsp1")["reserved"], "123.45");

    // Only the payee fulfils, with the right fulfilment; then it is COMMITTED, idempotently.
    let url = format!("{transfers}/{}", transfer_id(1));
    assert_error(
        put(&agent, &url, "dfsp1", &fulfil_body(1)),
        400,
        "3100",
        "only the payee",
    );
    assert_error(
        put(&agent, &url, "dfsp2", &fulfil_body(2)),
        400,
        "3100",
        "does not match",
    );
    let (status, body) = put(&agent, &url, "dfsp2", &fulfil_body(1));
    assert_eq!(
        (status, body["transferState"].clone()),
        (200, json!("COMMITTED")),
        "{body}"
    );
    assert_eq!(
        put(&agent, &url, "dfsp2", &fulfil_body(1)).1["transferState"],
        "COMMITTED"
    );
    assert!(eventually(Duration::from_secs(5), || {
        participant(&agent, base, "dfsp2")["position"] == "-123.45"
    }));
    let payer = participant(&agent, base, "dfsp1");
    assert_eq!(
        (payer["position"].clone(), payer["reserved"].clone()),
        (json!("123.45"), json!("0"))
    );
    let (_, entries) = get(&agent, &format!("{base}/participants/dfsp1/entries"));
    assert_eq!(entries["total"], 1);
    assert_eq!(entries["entries"][0]["change"], "123.45");
    let (_, got) = get(&agent, &url);
    assert_eq!(got["transferState"], "COMMITTED");
    assert_eq!(
        got["amount"],
        json!({"currency": "USD", "amount": "123.45"})
    );

    // Liquidity: dfsp3 has a cap of 0.
    assert_error(
        post(
            &agent,
            &transfers,
            &prepare_body(2, "dfsp3", "dfsp1", "1", 60_000),
        ),
        422,
        "4001",
        "net debit cap",
    );
    assert_eq!(
        get(&agent, &format!("{transfers}/{}", transfer_id(2))).1["transferState"],
        "ABORTED"
    );

    // Reject (and the error callback) release the reservation.
    for (n, how) in [(3, "reject"), (4, "error")] {
        assert_eq!(
            post(
                &agent,
                &transfers,
                &prepare_body(n, "dfsp1", "dfsp2", "10", 60_000)
            )
            .0,
            201
        );
        let url = format!("{transfers}/{}", transfer_id(n));
        let (status, body) = if how == "reject" {
            put(&agent, &url, "dfsp2", &json!({"transferState": "ABORTED"}))
        } else {
            put(
                &agent,
                &format!("{url}/error"),
                "dfsp2",
                &json!({"errorInformation": {"errorCode": "5100", "errorDescription": "payee says no"}}),
            )
        };
        assert_eq!(
            (status, body["transferState"].clone()),
            (200, json!("ABORTED")),
            "{body}"
        );
        assert_error(
            put(&agent, &url, "dfsp2", &fulfil_body(n)),
            400,
            "3100",
            "aborted",
        );
    }
    assert!(eventually(Duration::from_secs(5), || participant(
        &agent, base, "dfsp1"
    )["reserved"]
        == "0"));

    // Expiry: a fulfil after the expiration is 3303 and the reservation goes back.
    assert_eq!(
        post(
            &agent,
            &transfers,
            &prepare_body(5, "dfsp1", "dfsp2", "20", 400)
        )
        .0,
        201
    );
    assert_eq!(participant(&agent, base, "dfsp1")["reserved"], "20");
    std::thread::sleep(Duration::from_millis(500));
    let url = format!("{transfers}/{}", transfer_id(5));
    assert_error(
        put(&agent, &url, "dfsp2", &fulfil_body(5)),
        400,
        "3303",
        "expired",
    );
    assert!(eventually(Duration::from_secs(5), || participant(
        &agent, base, "dfsp1"
    )["reserved"]
        == "0"));
    // Without a fulfil, the periodic tick expires it.
    assert_eq!(
        post(
            &agent,
            &transfers,
            &prepare_body(6, "dfsp1", "dfsp2", "20", 300)
        )
        .0,
        201
    );
    assert!(eventually(Duration::from_secs(5), || {
        get(&agent, &format!("{transfers}/{}", transfer_id(6))).1["errorCode"] == "3303"
    }));
    assert!(eventually(Duration::from_secs(5), || participant(
        &agent, base, "dfsp1"
    )["reserved"]
        == "0"));

    // Unknown participants and transfers, validation.
    assert_error(
        post(
            &agent,
            &transfers,
            &prepare_body(7, "nobody", "dfsp1", "1", 60_000),
        ),
        400,
        "3202",
        "payer",
    );
    assert_error(
        post(
            &agent,
            &transfers,
            &prepare_body(8, "dfsp1", "nobody", "1", 60_000),
        ),
        400,
        "3203",
        "payee",
    );
    assert_error(
        post(
            &agent,
            &transfers,
            &prepare_body(9, "dfsp1", "dfsp2", "1", -1_000),
        ),
        400,
        "3303",
        "expiration",
    );
    let missing = format!("{transfers}/{}", transfer_id(99));
    assert_error(get(&agent, &missing), 404, "3208", "no transfer");
    assert_error(
        put(&agent, &missing, "dfsp2", &fulfil_body(99)),
        404,
        "3208",
        "no transfer",
    );
    assert_error(
        get(&agent, &format!("{base}/participants/nobody")),
        404,
        "3201",
        "no participant",
    );
    let bad_prepares = [
        ("transferId", json!("not-a-uuid"), "UUID"),
        ("payeeFsp", json!("dfsp1"), "must differ"),
        (
            "amount",
            json!({"currency": "USD", "amount": "0"}),
            "positive",
        ),
        (
            "amount",
            json!({"currency": "USD", "amount": "1.005"}),
            "decimals",
        ),
        (
            "amount",
            json!({"currency": "USD", "amount": "01"}),
            "not a decimal",
        ),
        (
            "amount",
            json!({"currency": "usd", "amount": "1"}),
            "three capital",
        ),
        ("condition", json!("short"), "32 bytes"),
        ("expiration", json!("tomorrow"), "RFC 3339"),
        // In UTC it is in the year 10000, which an answer could not write back.
        (
            "expiration",
            json!("9999-12-31T23:59:59-01:00"),
            "after 9999",
        ),
        ("payerFsp", json!("a b"), "payerFsp must be"),
        ("payeeFsp", json!(".."), "URL path"),
    ];
    for (n, (field, value, words)) in bad_prepares.into_iter().enumerate() {
        let mut body = prepare_body(100 + n as u64, "dfsp1", "dfsp2", "1", 60_000);
        body[field] = value;
        assert_error(post(&agent, &transfers, &body), 400, "3100", words);
    }
    let mut extra = prepare_body(120, "dfsp1", "dfsp2", "1", 60_000);
    extra["surprise"] = json!(1);
    assert_eq!(post(&agent, &transfers, &extra).0, 400);
    assert_error(
        put(&agent, &url, "dfsp2", &json!({"transferState": "RESERVED"})),
        400,
        "3100",
        "COMMITTED or ABORTED",
    );
    assert_error(
        put(
            &agent,
            &url,
            "dfsp2",
            &json!({"transferState": "ABORTED", "fulfilment": "short"}),
        ),
        400,
        "3100",
        "fulfilment must be 32 bytes",
    );

    // FSPIOP's own content type is accepted.
    let mut response = agent
        .post(&transfers)
        .header(
            "content-type",
            "application/vnd.interoperability.transfers+json;version=1.0",
        )
        .send(serde_json::to_vec(&prepare_body(130, "dfsp1", "dfsp2", "1", 60_000)).unwrap())
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    assert_eq!(
        response.body_mut().read_json::<Value>().unwrap()["transferState"],
        "RESERVED"
    );

    // The batch API: prepares, then fulfils, one result per operation in order; a bad operation is
    // reported in its place and the others still apply.
    let batch_url = format!("{transfers}/batch");
    let prepares: Vec<Value> = (200..203)
        .map(|n| json!({"prepare": prepare_body(n, "dfsp1", "dfsp2", "2", 60_000)}))
        .chain([json!({"prepare": {"transferId": "nope"}})])
        .collect();
    let (status, body) = post(&agent, &batch_url, &json!({"operations": prepares}));
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    for result in &results[..3] {
        assert_eq!(result["transferState"], "RESERVED", "{body}");
    }
    assert_eq!(results[3]["error"]["code"], "3100", "{body}");
    let fulfils: Vec<Value> = (200..203)
        .map(|n| json!({"fulfil": {"transferId": transfer_id(n), "source": "dfsp2", "fulfilment": b64(&fulfilment(n))}}))
        .chain([json!({"reject": {"transferId": transfer_id(200), "source": "dfsp2"}})])
        .collect();
    let (status, body) = post(&agent, &batch_url, &json!({"operations": fulfils}));
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    for result in &results[..3] {
        assert_eq!(result["transferState"], "COMMITTED", "{body}");
    }
    assert_eq!(
        results[3]["error"]["code"], "3100",
        "a committed transfer cannot be rejected: {body}"
    );
    assert_error(
        post(&agent, &batch_url, &json!({"operations": []})),
        400,
        "3100",
        "1 to 10000",
    );

    // Malformed and oversized bodies change nothing. The payer's position moves in a follow-up after
    // a commit is acknowledged: once the batch's three have moved, only prepare 130's 1 stays reserved.
    assert!(
        eventually(Duration::from_secs(10), || participant(
            &agent, base, "dfsp1"
        )["reserved"]
            == "1"),
        "{}",
        participant(&agent, base, "dfsp1")
    );
    let before = participant(&agent, base, "dfsp1");
    let (status, body) =
        support::post_raw(&agent, &transfers, None, None, b"{\"transferId\": ").unwrap();
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (400, json!("3100")),
        "{body}"
    );
    let (status, _) = support::post_oversized(base, "/transfers/batch");
    assert_eq!(status, 413);
    assert_eq!(participant(&agent, base, "dfsp1"), before);

    // The cap can move, but not below what is in use.
    let ndc = |value: &str| {
        put(
            &agent,
            &format!("{base}/participants/dfsp1/ndc"),
            "hub",
            &json!({"ndc": value}),
        )
    };
    assert_error(ndc("100"), 400, "3100", "at least position + reserved");
    assert_eq!(ndc("2000").1["ndc"], "2000");

    let (_, all) = get(&agent, &format!("{base}/participants"));
    assert!(
        eventually(Duration::from_secs(5), || {
            get(&agent, &format!("{base}/participants")).1["positionSums"]["USD"] == "0"
        }),
        "{all}"
    );
}

#[test]
fn kill_9_under_load_keeps_every_acknowledged_transfer_in_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_checkpointing(dir.path());
    let base = server.base.clone();
    let agent = agent();
    for fsp in FSPS {
        create(&agent, &base, fsp, "100000000");
    }
    let clients: Vec<Mutex<Client>> = (0..6).map(|_| Mutex::default()).collect();
    let loaded = |clients: &[Mutex<Client>]| {
        let committed = |c: &Mutex<Client>| {
            let c = c.lock().unwrap();
            c.acked.iter().filter(|a| a.1 == "COMMITTED").count()
        };
        clients.iter().map(committed).sum::<usize>() > 100
    };
    support::kill_under_load(server, &clients, loaded, |id, state, stop| {
        crash_client(&base, id as u64 + 1, state, stop)
    });
    let acked: Vec<_> = clients
        .iter()
        .flat_map(|c| c.lock().unwrap().acked.clone())
        .collect();
    let committed = acked.iter().filter(|a| a.1 == "COMMITTED").count();
    eprintln!(
        "{} transfers acknowledged before the kill, {committed} of them committed",
        acked.len()
    );
    assert!(
        committed > 100,
        "only {committed} transfers committed before the kill"
    );

    let server = start_checkpointing(dir.path());
    check_transfers(&server.base, &acked, "after kill -9");
}

/// The ledger's read model (`GET /participants`) once it has caught up, without the lag field.
fn caught_up_read_model(agent: &ureq::Agent, base: &str) -> Value {
    let mut model = Value::Null;
    assert!(eventually(Duration::from_secs(10), || {
        model = get(agent, &format!("{base}/participants")).1;
        model["lagRecords"] == 0
    }));
    model.as_object_mut().unwrap().remove("lagRecords");
    model
}

fn spate_ledger_rebuild(data_dir: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["ledger", "rebuild", "--data-dir"])
        .arg(data_dir)
        .output()
        .unwrap()
}

/// Commits, rejects and leaves reserved a few dozen transfers between three FSPs.
fn some_transfers(agent: &ureq::Agent, base: &str) {
    for name in ["dfsp1", "dfsp2", "dfsp3"] {
        create(agent, base, name, "100000");
    }
    for n in 0..90u64 {
        let (payer, payee) =
            [("dfsp1", "dfsp2"), ("dfsp2", "dfsp3"), ("dfsp3", "dfsp1")][n as usize % 3];
        let amount = format!("{}.{}", 1 + n % 7, 1 + n % 9);
        let (status, body) = post(
            agent,
            &format!("{base}/transfers"),
            &prepare_body(n, payer, payee, &amount, 600_000),
        );
        assert_eq!(status, 201, "{body}");
        let url = format!("{base}/transfers/{}", transfer_id(n));
        let (status, body) = match n % 3 {
            0 => put(agent, &url, payee, &fulfil_body(n)),
            1 => put(agent, &url, payee, &json!({"transferState": "ABORTED"})),
            _ => continue,
        };
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn the_read_model_is_rebuilt_from_every_event_only_when_the_journal_kept_them() {
    let small = [
        "--apps",
        "ledger",
        "--snapshot-interval-records",
        "40",
        "--projection-checkpoint-interval-records",
        "40",
        "--segment-bytes",
        "16384",
    ];
    let agent = agent();
    // Every record kept: the checkpoint goes, and the next start rebuilds the same read model.
    let dir = tempfile::tempdir().unwrap();
    let mut args = small.to_vec();
    args.extend(["--journal-retention", "all"]);
    let server = Server::start(dir.path(), &args, None);
    some_transfers(&agent, &server.base);
    let before = caught_up_read_model(&agent, &server.base);
    assert_eq!(before["transfers"]["RESERVED"], 30, "{before}");
    assert!(server.terminate().success());
    let checkpoint = dir.path().join("projections/ledger.snap");
    assert!(checkpoint.exists());
    let rebuilt = spate_ledger_rebuild(dir.path());
    assert!(
        rebuilt.status.success(),
        "{}",
        String::from_utf8_lossy(&rebuilt.stderr)
    );
    assert!(!checkpoint.exists());
    let server = Server::start(dir.path(), &args, None);
    assert_eq!(caught_up_read_model(&agent, &server.base), before);
    drop(server);

    // The default retention released old segments: a rebuild would lose events, so it is refused.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &small, None);
    some_transfers(&agent, &server.base);
    caught_up_read_model(&agent, &server.base);
    assert!(server.terminate().success());
    let refused = spate_ledger_rebuild(dir.path());
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("no longer holds every event"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(dir.path().join("projections/ledger.snap").exists());
}

#[test]
fn a_ledger_at_its_open_transfer_limit_refuses_new_prepares_until_some_are_final() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--apps", "ledger", "--ledger-open-transfers-max", "3"],
        None,
    );
    let (agent, base) = (agent(), server.base.clone());
    create(&agent, &base, "dfspa", "1000");
    create(&agent, &base, "dfspb", "1000");
    for n in 1..=3 {
        let (status, body) = post(
            &agent,
            &format!("{base}/transfers"),
            &prepare_body(n, "dfspa", "dfspb", "10", 60_000),
        );
        assert_eq!(status, 201, "{body}");
    }
    // The limit is read from the read model; wait until it counts all three.
    assert_eq!(
        caught_up_read_model(&agent, &base)["transfers"]["RESERVED"],
        3
    );
    assert_error(
        post(
            &agent,
            &format!("{base}/transfers"),
            &prepare_body(4, "dfspa", "dfspb", "10", 60_000),
        ),
        503,
        "2003",
        "--ledger-open-transfers-max",
    );
    // In a batch only the prepare is refused; the fulfil next to it commits.
    let batch = json!({"operations": [
        {"prepare": prepare_body(5, "dfspa", "dfspb", "10", 60_000)},
        {"fulfil": {"transferId": transfer_id(1), "source": "dfspb", "fulfilment": b64(&fulfilment(1))}},
    ]});
    let (status, body) = post(&agent, &format!("{base}/transfers/batch"), &batch);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["error"]["code"], "2003", "{body}");
    assert_eq!(body["results"][1]["transferState"], "COMMITTED", "{body}");
    let (status, body) = get(&agent, &format!("{base}/transfers/{}", transfer_id(4)));
    assert_eq!(status, 404, "the refused prepare left nothing: {body}");
    // The payer's position moves in a follow-up after the commit is acknowledged.
    let payer = || participant(&agent, &base, "dfspa");
    assert!(
        eventually(Duration::from_secs(10), || payer()["position"] == "10"),
        "{}",
        payer()
    );
    assert_eq!(payer()["reserved"], "20");
    // The committed transfer is no longer open: once the read model counts it, prepares go through.
    assert_eq!(
        caught_up_read_model(&agent, &base)["transfers"]["COMMITTED"],
        1
    );
    let (status, body) = post(
        &agent,
        &format!("{base}/transfers"),
        &prepare_body(6, "dfspa", "dfspb", "10", 60_000),
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = get(&agent, &format!("{base}/transfers/{}", transfer_id(1)));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["transferState"], "COMMITTED", "{body}");
}

#[test]
fn transfers_and_entries_long_out_of_memory_are_answered_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let (agent, base) = (agent(), server.base.clone());
    // More than a chunk of the payer's entry log (4,096 entries), so full chunks go to the archive.
    let count = 5_000u64;
    commit_in_two_batches(&agent, &base, count);
    assert!(server.terminate().success());

    let server = start(dir.path());
    let base = server.base.clone();
    let metrics = support::metrics_text(&agent, &base);
    let in_memory: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("spate_archive_memory_records{"))
        .collect();
    assert!(
        !in_memory.is_empty() && in_memory.iter().all(|line| line.ends_with(" 0")),
        "after a restart every archived record is in the store: {in_memory:?}"
    );
    let (status, body) = get(
        &agent,
        &format!("{base}/participants/dfspa/entries?offset=4090&limit=20"),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["total"], count, "{body}");
    let positions: Vec<&str> = body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["position"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (4091..4111).map(|p: u64| p.to_string()).collect();
    assert_eq!(positions, expected, "{body}");
    for n in [1, 2_500, count] {
        let (status, body) = get(&agent, &format!("{base}/transfers/{}", transfer_id(n)));
        assert_eq!(
            (status, &body["transferState"]),
            (200, &json!("COMMITTED")),
            "{body}"
        );
        let again = prepare_body(n, "dfspa", "dfspb", "1", 600_000);
        assert_error(
            post(&agent, &format!("{base}/transfers"), &again),
            409,
            "3106",
            "different content",
        );
    }
    assert_eq!(participant(&agent, &base, "dfspa")["position"], "5000");
}

/// Creates dfspa and dfspb, and commits transfers 1 to `count` of 1 from dfspa to dfspb: prepared in
/// one batch, fulfilled in another. Returns once the read model shows the payer's position.
fn commit_in_two_batches(agent: &ureq::Agent, base: &str, count: u64) {
    create(agent, base, "dfspa", "1000000");
    create(agent, base, "dfspb", "1000000");
    let batch_url = format!("{base}/transfers/batch");
    let prepares: Vec<Value> = (1..=count)
        .map(|n| json!({"prepare": prepare_body(n, "dfspa", "dfspb", "1", 600_000)}))
        .collect();
    let (status, body) = post(agent, &batch_url, &json!({"operations": prepares}));
    assert_eq!(status, 200, "{body}");
    let fulfils: Vec<Value> = (1..=count)
        .map(|n| json!({"fulfil": {"transferId": transfer_id(n), "source": "dfspb", "fulfilment": b64(&fulfilment(n))}}))
        .collect();
    let (status, body) = post(agent, &batch_url, &json!({"operations": fulfils}));
    assert_eq!(status, 200, "{body}");
    assert!(
        body["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["transferState"] == "COMMITTED"),
        "{body}"
    );
    let payer = || participant(agent, base, "dfspa");
    let position = count.to_string();
    assert!(
        eventually(Duration::from_secs(10), || payer()["position"] == position),
        "{}",
        payer()
    );
}

#[test]
fn a_flipped_byte_in_an_archive_table_is_found_by_the_scrub_and_never_served() {
    let dir = tempfile::tempdir().unwrap();
    // A memtable of a MiB: 5,000 archived transfers (about 1.5 MB) make at least one table on disk.
    let args = [
        "--apps",
        "ledger",
        "--partitions",
        "1",
        "--archive-memtable-mb",
        "1",
    ];
    let server = Server::start(dir.path(), &args, None);
    let (agent, base) = (agent(), server.base.clone());
    let count = 5_000u64;
    commit_in_two_batches(&agent, &base, count);
    let scrubbed = |base: &str| {
        let metrics = support::metrics_text(&agent, base);
        let value = |name: &str| {
            let prefix = format!("{name}{{store=\"archive\"}} ");
            let line = metrics.lines().find(|line| line.starts_with(&prefix));
            line.map(|line| line[prefix.len()..].parse::<f64>().unwrap())
        };
        (
            value("spate_store_scrub_passes_total"),
            value("spate_store_damaged"),
        )
    };
    assert!(server.terminate().success());

    // Undamaged: the first pass, at start-up, finds nothing.
    let server = Server::start(dir.path(), &args, None);
    assert!(eventually(Duration::from_secs(30), || {
        scrubbed(&server.base).0.is_some_and(|passes| passes >= 1.0)
    }));
    assert_eq!(scrubbed(&server.base).1, Some(0.0));
    let (status, health) = get(&agent, &format!("{}/health", server.base));
    assert_eq!((status, &health["status"]), (200, &json!("ok")), "{health}");
    assert!(server.terminate().success());

    let table = support::files_under(&dir.path().join("archive"))
        .into_iter()
        .filter(|path| {
            path.parent()
                .is_some_and(|parent| parent.ends_with("tables"))
        })
        .max_by_key(|path| std::fs::metadata(path).unwrap().len())
        .expect("a table of the archive on disk");
    let mut bytes = std::fs::read(&table).unwrap();
    // The data blocks come first.
    let inside_the_data = bytes.len() / 3;
    bytes[inside_the_data] ^= 0x10;
    std::fs::write(&table, &bytes).unwrap();

    let server = Server::start(dir.path(), &args, None);
    let base = server.base.clone();
    let health = || get(&agent, &format!("{base}/health"));
    assert!(
        eventually(Duration::from_secs(30), || health().0 == 503),
        "{:?}",
        health()
    );
    let (_, health) = health();
    assert_eq!(health["status"], "damaged", "{health}");
    assert_eq!(health["damaged_stores"][0]["store"], "archive", "{health}");
    assert_eq!(health["damaged_stores"][0]["keyspace"], "p000", "{health}");
    assert_eq!(scrubbed(&base).1, Some(1.0));
    // Every transfer is answered as it was committed, or refused as unreadable: never misread.
    let mut unreadable = 0;
    for n in 1..=count {
        let (status, body) = get(&agent, &format!("{base}/transfers/{}", transfer_id(n)));
        match status {
            200 => assert_eq!(body["transferState"], "COMMITTED", "{body}"),
            500 => {
                assert_eq!(body["error"]["code"], "archive", "{body}");
                unreadable += 1;
            }
            _ => panic!("transfer {n}: {status} {body}"),
        }
    }
    assert!(unreadable > 0, "the damaged block held some transfer");
}

/// A ledger with 50 committed transfers, archived; stopped cleanly.
fn stopped_ledger_with_an_archive() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let server = ledger_with_an_archive(dir.path());
    assert!(server.terminate().success());
    dir
}

/// A ledger in `dir` with 50 committed transfers, archived.
fn ledger_with_an_archive(dir: &std::path::Path) -> Server {
    let server = start(dir);
    let (agent, base) = (agent(), server.base.clone());
    create(&agent, &base, "dfspa", "100000");
    create(&agent, &base, "dfspb", "100000");
    for n in 1..=50 {
        let url = format!("{base}/transfers");
        let (status, body) = post(
            &agent,
            &url,
            &prepare_body(n, "dfspa", "dfspb", "1", 60_000),
        );
        assert_eq!(status, 201, "{body}");
        let url = format!("{base}/transfers/{}", transfer_id(n));
        let (status, body) = put(&agent, &url, "dfspb", &fulfil_body(n));
        assert_eq!(status, 200, "{body}");
    }
    server
}

#[test]
fn an_archive_store_that_lost_records_is_refused_at_start_up() {
    // The archive's records sit in fjall's journal until its memtable is flushed to a table. A flipped
    // byte or a cut there, unless fjall's recovery fails outright, makes it stop early and lose the
    // records after it: found missing against what the restored snapshot relies on.
    type Damage = fn(&mut Vec<u8>, usize);
    let damages: [(&str, Damage); 2] = [
        ("a flipped byte", |bytes, used| bytes[used / 2] ^= 0x20),
        ("a truncated file", |bytes, used| bytes.truncate(used / 2)),
    ];
    for (damage, apply) in damages {
        let dir = stopped_ledger_with_an_archive();
        let journal = dir.path().join("archive/0.jnl");
        let mut bytes = std::fs::read(&journal).unwrap();
        let used = bytes.iter().rposition(|b| *b != 0).unwrap();
        apply(&mut bytes, used);
        std::fs::write(&journal, &bytes).unwrap();
        let log = support::refused_start_up(dir.path(), "ledger", &[]);
        // Either fjall's recovery fails, or it cuts the journal short and spate sees records missing.
        assert!(
            log.contains("the archive store failed") || log.contains("archive store lost records"),
            "{damage}: {log}"
        );
    }
}

/// The archive's store takes a record only once the command that archived it is durable, so a store
/// holding records past the journal's end proves the journal lost acknowledged commands: start-up is
/// refused, rather than serving the store's copy of transfers that replay never rebuilds (a GET would
/// answer COMMITTED for a transfer the partition holds RESERVED, and a new prepare of a lost id would
/// be refused as a duplicate).
#[test]
fn an_archive_store_ahead_of_a_cut_journal_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let server = ledger_with_an_archive(dir.path());
    // The writer stores each group commit's transfers right after it is durable: by now the store holds
    // those of the first half of the journal at least. kill -9, not a stop: no final snapshot, which
    // would prove the loss on its own.
    server.kill9();
    support::cut_partition_0_journal_in_half(dir.path());

    let log = support::refused_start_up(dir.path(), "ledger", &[]);
    assert!(log.contains("the archive store holds records"), "{log}");
    assert!(log.contains("the journal lost"), "{log}");
}

#[test]
fn snapshots_and_checkpoints_fall_due_by_journal_bytes_too() {
    // A batch of a thousand operations is one journal record per step: counted in records alone, no
    // snapshot or read model checkpoint would ever fall due, and the journal would never be released.
    let dir = tempfile::tempdir().unwrap();
    let never = "1000000000";
    let server = Server::start(
        dir.path(),
        &[
            "--apps",
            "ledger",
            "--partitions",
            "1",
            "--snapshot-interval-records",
            never,
            "--snapshot-interval-bytes",
            "65536",
            "--projection-checkpoint-interval-records",
            never,
            "--projection-checkpoint-interval-bytes",
            "65536",
        ],
        None,
    );
    let (agent, base) = (agent(), server.base.clone());
    create(&agent, &base, "dfspa", "1000000");
    create(&agent, &base, "dfspb", "1000000");
    let snapshots = || support::snapshots_finished(&agent, &base, 0);
    assert_eq!(snapshots(), 0, "nothing fell due yet");
    let checkpoint = dir.path().join("projections/ledger.snap");
    assert!(!checkpoint.exists());
    let count = 1_000u64;
    let prepares: Vec<Value> = (1..=count)
        .map(|n| json!({"prepare": prepare_body(n, "dfspa", "dfspb", "1", 600_000)}))
        .collect();
    let (status, body) = post(
        &agent,
        &format!("{base}/transfers/batch"),
        &json!({"operations": prepares}),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        eventually(Duration::from_secs(10), || snapshots() >= 1),
        "no snapshot after more than 64 KiB of journal"
    );
    assert!(
        eventually(Duration::from_secs(10), || checkpoint.exists()),
        "no read model checkpoint after more than 64 KiB of journal"
    );
}
