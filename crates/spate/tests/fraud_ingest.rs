//! The fraud app's other ingest paths and tools against the real binary: bad input on the binary
//! stream, a producer that disconnects mid-batch, the pull bridge from a case-study source, and the
//! generator and offline scorer on files.

mod support;

use serde_json::{Value, json};
use spate_fraud::generator::{HistoryGenerator, Seeds};
use spate_fraud::record::{RECORD_BYTES, Txn};
use spate_fraud::stream::{Ack, KIND_SCORE, STATUS_DURABLE, STATUS_INVALID, encode_batch};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::fraud::{START_MS, by_rule, expected, generate_history, generated};
use support::{Server, agent, get, post};

fn records(txns: &[Txn]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for txn in txns {
        txn.write_record(&mut bytes);
    }
    bytes
}

fn read_ack(socket: &mut TcpStream) -> Ack {
    let mut len = [0; 4];
    socket.read_exact(&mut len).expect("an ack");
    let mut body = vec![0; u32::from_le_bytes(len) as usize];
    socket.read_exact(&mut body).unwrap();
    Ack::decode(&body).expect("a well-formed ack")
}

fn stats(server: &Server) -> Value {
    get(&agent(), &format!("{}/fraud/stats", server.base)).1
}

#[test]
fn malformed_records_are_skipped_and_bad_frames_refused_while_the_stream_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let server = Server::start_logging_to(dir.path(), &["--apps", "fraud"], None, log.into());
    let mut socket = TcpStream::connect(server.stream.as_ref().unwrap()).unwrap();
    let txns = generated(100, 3, 1000);
    let mut batch = records(&txns);
    batch[RECORD_BYTES + 20] = b'x';
    let bad_card = format!("{:014}", txns[1].card);
    socket
        .write_all(&encode_batch(KIND_SCORE, 1, 0, &batch))
        .unwrap();
    let ack = read_ack(&mut socket);
    assert_eq!(
        (ack.seq, ack.status, ack.scored, ack.malformed),
        (0, STATUS_DURABLE, 2, 1)
    );

    socket
        .write_all(&encode_batch(KIND_SCORE, 1, 1, &batch[..150]))
        .unwrap();
    let ack = read_ack(&mut socket);
    assert_eq!((ack.seq, ack.status), (1, STATUS_INVALID));
    assert!(ack.message.contains("100-byte records"), "{}", ack.message);
    socket.write_all(&encode_batch(9, 1, 2, &batch)).unwrap();
    let ack = read_ack(&mut socket);
    assert_eq!((ack.seq, ack.status), (2, STATUS_INVALID));

    socket
        .write_all(&encode_batch(KIND_SCORE, 1, 3, &records(&txns)))
        .unwrap();
    let ack = read_ack(&mut socket);
    assert_eq!((ack.seq, ack.status, ack.scored), (3, STATUS_DURABLE, 3));

    // A length beyond any batch is refused and the connection closed, before anything is read into memory.
    socket.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert_eq!(read_ack(&mut socket).status, STATUS_INVALID);
    let mut rest = Vec::new();
    assert_eq!(socket.read_to_end(&mut rest).unwrap_or(0), 0);

    assert_eq!(stats(&server)["scored"], 5);
    let metrics = support::metrics_text(&agent(), &server.base);
    assert!(
        metrics.contains("spate_fraud_records_rejected_total{source=\"stream\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("spate_fraud_transactions_scored_total 5"));

    // The skipped record is logged with its stream offset and only the last four digits of its card.
    let log = std::fs::read_to_string(&log_path).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("skipping a malformed record"))
        .expect("logged");
    assert!(
        line.contains(&format!("**********{}", &bad_card[10..])),
        "{line}"
    );
    assert!(line.contains("offset=121"), "{line}");
    assert!(
        !log.contains(&bad_card),
        "the card number appears in clear in the log"
    );
}

#[test]
fn a_producer_that_disconnects_mid_batch_loses_only_that_batch() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--apps", "fraud"], None);
    let address = server.stream.clone().unwrap();
    let txns = generated(100, 40, 1000);
    let first = encode_batch(KIND_SCORE, 5, 0, &records(&txns[..20]));
    let second = encode_batch(KIND_SCORE, 5, 1, &records(&txns[20..]));
    let mut socket = TcpStream::connect(&address).unwrap();
    socket.write_all(&first).unwrap();
    assert_eq!(read_ack(&mut socket).status, STATUS_DURABLE);
    socket.write_all(&second[..second.len() / 2]).unwrap();
    drop(socket);
    assert!(support::eventually(Duration::from_secs(5), || stats(
        &server
    )["scored"]
        == 20));
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(
        stats(&server)["scored"],
        20,
        "half a batch is never applied"
    );

    // Resending both (as a producer does after reconnecting) applies the second once and the first not again.
    let mut socket = TcpStream::connect(&address).unwrap();
    socket.write_all(&first).unwrap();
    socket.write_all(&second).unwrap();
    let acks = [read_ack(&mut socket), read_ack(&mut socket)];
    assert!(acks.iter().all(|a| a.status == STATUS_DURABLE));
    let stats = stats(&server);
    assert_eq!(stats["scored"], 40);
    assert_eq!(stats["flagged_by_rule"], by_rule(&expected(0, &txns).1));
}

fn spate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spate"));
    command.env("RUST_LOG", "warn").stdin(Stdio::null());
    command
}

#[test]
fn pull_scores_what_a_case_study_source_sends() {
    let (cards, count) = (200u32, 5000u64);
    let mut source = spate()
        .args([
            "fraud",
            "gen",
            "--serve",
            "127.0.0.1:0",
            "--count",
            &count.to_string(),
        ])
        .args([
            "--cards",
            &cards.to_string(),
            "--start-ms",
            &START_MS.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(source.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let source_address = line
        .trim()
        .strip_prefix("spate fraud source on ")
        .unwrap()
        .to_string();

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--apps", "fraud"], None);
    generate_history(&server, cards);
    let output = spate()
        .args(["fraud", "pull", "--source", &source_address])
        .args([
            "--server",
            server.stream.as_ref().unwrap(),
            "--count",
            &count.to_string(),
        ])
        .args(["--batch", "700"])
        .output()
        .unwrap();
    source.kill().unwrap();
    source.wait().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["scored"], count);
    let stats = stats(&server);
    assert_eq!(stats["scored"], count);
    let verdicts = expected(cards, &generated(cards, count, 1000)).1;
    assert_eq!(stats["flagged_by_rule"], by_rule(&verdicts));
}

#[test]
fn gen_writes_case_study_files_and_score_reproduces_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let (history, txns_path, out) = (
        dir.path().join("h.dat"),
        dir.path().join("t.dat"),
        dir.path().join("r.csv"),
    );
    let (cards, count) = (300u32, 4000u64);
    let status = spate()
        .args([
            "fraud",
            "gen",
            "--cards",
            &cards.to_string(),
            "--count",
            &count.to_string(),
        ])
        .args(["--start-ms", &START_MS.to_string(), "--history-out"])
        .arg(&history)
        .arg("--txns-out")
        .arg(&txns_path)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::metadata(&history).unwrap().len(),
        u64::from(cards) * 20 * RECORD_BYTES as u64
    );
    let txns = generated(cards, count, 1000);
    assert_eq!(std::fs::read(&txns_path).unwrap(), records(&txns));

    let status = spate()
        .args(["fraud", "score", "--history"])
        .arg(&history)
        .arg("--txns")
        .arg(&txns_path)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let verdicts = expected(cards, &txns).1;

    // The same files through a server: history imported over the stream, then the transactions scored.
    let server_dir = tempfile::tempdir().unwrap();
    let server = Server::start(server_dir.path(), &["--apps", "fraud"], None);
    let stream = server.stream.clone().unwrap();
    for (kind, file) in [("history", &history), ("score", &txns_path)] {
        let output = spate()
            .args([
                "fraud", "push", "--server", &stream, "--kind", kind, "--file",
            ])
            .arg(file)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stats = stats(&server);
    assert_eq!(stats["imported"], u64::from(cards) * 20);
    assert_eq!(stats["scored"], count);
    assert_eq!(stats["flagged_by_rule"], by_rule(&verdicts));

    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("seq,card,fraud,rule"));
    for (seq, line) in lines.enumerate() {
        let rule = verdicts[seq];
        let want = format!(
            "{seq},{:014},{},{rule}",
            txns[seq].card,
            u8::from(rule != 0)
        );
        assert_eq!(line, want);
    }
}

/// A card's stored transactions as (timestamp, `field`) pairs, sorted.
fn stored_pairs(base: &str, card: u64, field: &str) -> Vec<(String, String)> {
    let (status, history) = get(&agent(), &format!("{base}/fraud/cards/{card:014}"));
    assert_eq!(status, 200, "card {card}: {history}");
    let text = |entry: &Value, name: &str| entry[name].as_str().unwrap().to_string();
    let mut pairs: Vec<_> = (history["transactions"].as_array().unwrap().iter())
        .map(|entry| (text(entry, "timestamp"), text(entry, field)))
        .collect();
    pairs.sort();
    pairs
}

/// A long generation is many short commands, so other commands on its partitions wait for one part, not
/// for the whole history (issue 19, defect 2); the parts together are the history the seeds draw, and
/// a replay of the journal after kill -9 builds it again.
#[test]
fn a_history_is_generated_in_parts_that_make_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--apps", "fraud", "--partitions", "2"];
    let server = Server::start(dir.path(), &args, None);
    let agent = agent();
    let applied = |server: &Server| -> u64 {
        let text = support::metrics_text(&agent, &server.base);
        (text.lines())
            .filter(|line| line.starts_with("spate_commands_applied_total{"))
            .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    let before = applied(&server);
    // 100,000 records a part: 5,000 cards of 20, so three parts on each of the two partitions.
    let cards = 12_000;
    let url = format!("{}/fraud/history/generate", server.base);
    let body = json!({"cards": cards, "now_ms": START_MS, "seeds": {"city": 4}});
    let (status, reply) = post(&agent, &url, None, &body).unwrap();
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stored"], cards * 20, "{reply}");
    assert_eq!(
        applied(&server) - before,
        3 * 2,
        "commands applied for the history"
    );
    let seeds = Seeds {
        city: 4,
        ..Seeds::default()
    };
    let whole: Vec<Txn> = HistoryGenerator::new(&seeds, cards, 20, START_MS).collect();
    let check = |server: &Server, when: &str| {
        // Cards on both sides of each part's first card.
        for card in [0_u32, 4_999, 5_000, 9_999, 10_000, 11_999] {
            let mut want: Vec<_> = (whole.iter())
                .filter(|t| t.card == u64::from(card))
                .map(|t| (t.timestamp.to_string(), format!("{:05}", t.city)))
                .collect();
            want.sort();
            let got = stored_pairs(&server.base, u64::from(card), "city");
            assert_eq!(got, want, "{when}: card {card}");
        }
    };
    check(&server, "generated");
    server.kill9();
    let server = Server::start(dir.path(), &args, None);
    check(&server, "replayed after kill -9");
    assert_eq!(stats(&server)["imported"], cards * 20);
}

/// A part of a generated history is a record of a few bytes that stands for 100,000 records of work:
/// counted in records and journal bytes alone, a whole generation makes no snapshot fall due, and a
/// crash after it replays all of it. Time spent applying counts too (issue 17).
#[test]
fn a_snapshot_falls_due_by_time_spent_applying() {
    let never = "1000000000000";
    for (apply_ms, falls_due) in [(never, false), ("1", true)] {
        let dir = tempfile::tempdir().unwrap();
        let args = [
            "--apps",
            "fraud",
            "--partitions",
            "1",
            "--snapshot-interval-records",
            never,
            "--snapshot-interval-bytes",
            never,
            "--snapshot-interval-apply-ms",
            apply_ms,
        ];
        let server = Server::start(dir.path(), &args, None);
        let agent = agent();
        let url = format!("{}/fraud/history/generate", server.base);
        let body = json!({"cards": 12_000, "now_ms": START_MS});
        let (status, reply) = post(&agent, &url, None, &body).unwrap();
        assert_eq!(status, 200, "{reply}");
        // Long enough for the snapshot when it is due; the other case waits less for nothing.
        let wait = Duration::from_secs(if falls_due { 30 } else { 2 });
        let snapshotted = support::eventually(wait, || {
            support::snapshots_finished(&agent, &server.base, 0) >= 1
        });
        assert_eq!(
            snapshotted, falls_due,
            "--snapshot-interval-apply-ms {apply_ms}: a snapshot after three parts"
        );
    }
}

#[test]
fn generated_history_follows_the_seeds_given() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--apps", "fraud"], None);
    let url = format!("{}/fraud/history/generate", server.base);
    let body = json!({"cards": 5, "now_ms": START_MS, "seeds": {"amount": 5, "timestamp": 9}});
    assert_eq!(post(&agent(), &url, None, &body).unwrap().0, 200);
    let seeds = Seeds {
        amount: 5,
        timestamp: 9,
        ..Seeds::default()
    };
    let mut want: Vec<(String, String)> = HistoryGenerator::new(&seeds, 5, 20, START_MS)
        .filter(|t| t.card == 3)
        .map(|t| (t.timestamp.to_string(), t.amount.to_string()))
        .collect();
    want.sort();
    let got = stored_pairs(&server.base, 3, "amount");
    assert_eq!(got, want);
}
