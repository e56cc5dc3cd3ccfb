//! An app whose projection sees no events of its own must neither show lag nor hold the journal while
//! another app writes: its position moves past the other app's records, and its checkpoints let old
//! segments go.

mod support;

use serde_json::json;
use std::time::Duration;
use support::{Server, agent, eventually, get, send};

fn segments(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("partitions"))
        .unwrap()
        .map(|partition| {
            std::fs::read_dir(partition.unwrap().path().join("journal"))
                .unwrap()
                .count()
        })
        .sum()
}

#[test]
fn an_idle_projection_shows_no_lag_and_holds_no_journal() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--apps",
        "tally,leaderboard",
        "--partitions",
        "2",
        "--segment-bytes",
        "16384",
        "--snapshot-interval-records",
        "200",
        "--projection-checkpoint-interval-records",
        "100",
    ];
    let server = Server::start(dir.path(), &args, None);
    let base = &server.base;
    let agent = agent();
    let board = json!({"name": "b", "operator": "increment"});
    let (status, _) = send(
        &agent,
        "POST",
        &format!("{base}/leaderboards"),
        None,
        Some(&board),
    )
    .unwrap();
    assert_eq!(status, 201);
    // Only the leaderboard writes; tally's projection (the totals) gets no event at all.
    for i in 0..3_000 {
        let body = json!({"score": 1});
        let url = format!("{base}/leaderboards/b/members/m{}", i % 50);
        let (status, reply) = send(&agent, "PUT", &url, None, Some(&body)).unwrap();
        assert_eq!(status, 200, "{reply}");
    }
    let caught_up = eventually(Duration::from_secs(5), || {
        get(&agent, &format!("{base}/tally/totals")).1["lag_records"] == 0
    });
    assert!(
        caught_up,
        "{}",
        get(&agent, &format!("{base}/tally/totals")).1
    );
    // 3,000 records of about 100 bytes fill about 18 segments of 16 KiB; with the idle projection's
    // checkpoints following along, all but the last few per partition are released.
    let released = eventually(Duration::from_secs(5), || segments(dir.path()) <= 8);
    assert!(released, "{} journal segments kept", segments(dir.path()));
}
