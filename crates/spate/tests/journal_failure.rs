//! A journal that cannot write (here: a file size limit, which fails writes as a full disk does) makes the
//! server refuse writes instead of acknowledging them, and loses nothing it did acknowledge.

mod support;

use serde_json::json;
use support::{Server, agent, get, post};

#[test]
fn a_failing_journal_refuses_writes_and_keeps_what_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    // tally only: an app that archives opens the archive's store, whose journal fjall preallocates
    // to 64 MiB, far past this test's file size limit.
    let args = ["--partitions", "1", "--apps", "tally"];
    let server = Server::start(dir.path(), &args, Some(64 * 1024));
    let agent = agent();
    let url = format!("{}/tally/accounts/alice/entries", server.base);
    let mut acknowledged = Vec::new();
    let mut refused_at = None;
    for tag in 0..10_000u64 {
        let (status, body) = post(&agent, &url, None, &json!({"amount": 1, "tag": tag})).unwrap();
        match status {
            201 => {
                assert!(
                    refused_at.is_none(),
                    "tag {tag} acknowledged after the journal failed"
                );
                acknowledged.push(tag);
            }
            503 => {
                assert_eq!(body["error"]["code"], "journal_failed", "{body}");
                refused_at.get_or_insert(tag);
                if tag > refused_at.unwrap() + 20 {
                    break;
                }
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert!(refused_at.is_some(), "64 KiB of journal never filled");
    assert!(!acknowledged.is_empty());
    let (status, health) = get(&agent, &format!("{}/health", server.base));
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["failed_partitions"], json!([0]));
    let (status, _) = get(&agent, &format!("{}/tally/accounts/alice", server.base));
    assert_eq!(
        status, 503,
        "reads of state that may be ahead of the disk are refused too"
    );
    server.kill9();

    // Restarted with room to write: exactly the acknowledged entries are there, and writes work again.
    let server = Server::start(dir.path(), &args, None);
    let (status, body) = get(
        &agent,
        &format!("{}/tally/accounts/alice?limit=10000", server.base),
    );
    assert_eq!(status, 200, "{body}");
    let tags: Vec<u64> = body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["tag"].as_u64().unwrap())
        .collect();
    assert_eq!(tags, acknowledged);
    let url = format!("{}/tally/accounts/alice/entries", server.base);
    let (status, _) = post(&agent, &url, None, &json!({"amount": 1, "tag": 99_999})).unwrap();
    assert_eq!(status, 201);
}
