//! `POST /leaderboards/scores`: many updates on many boards in one request (the case study's bulk body).

use super::parse::{Score, name_error, parse_body, parse_operator, valid_name};
use super::{APP_NAME, UPDATES_PER_REQUEST_MAX, enqueue, internal, outcome};
use crate::command::{Command, ItemResult, Outcome, UpdateItem};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use spate_engine::EngineHandle;
use spate_server::ApiError;
use spate_server::api::{command_id, json};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The case study's (and our) bulk body, borrowed from the request bytes: no allocation per update.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody<'a> {
    #[serde(borrow)]
    leaderboards: Vec<BulkBoard<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BulkBoard<'a> {
    #[serde(borrow)]
    leaderboard_id: Cow<'a, str>,
    #[serde(borrow)]
    scores: Vec<BulkScore<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BulkScore<'a> {
    #[serde(borrow)]
    member_id: Cow<'a, str>,
    score: Score,
    #[serde(borrow)]
    mode: Option<Cow<'a, str>>,
}

/// One update's result in a bulk reply.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BulkResult<'a> {
    leaderboard_id: &'a str,
    member_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "decimal")]
    score: Option<i128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<BulkError>,
}

#[derive(Serialize, Clone)]
struct BulkError {
    code: &'static str,
    message: String,
}

fn decimal<S: serde::Serializer>(score: &Option<i128>, serializer: S) -> Result<S::Ok, S::Error> {
    match score {
        Some(score) => serializer.collect_str(score),
        None => serializer.serialize_none(),
    }
}

/// One command per board, queued together; results come back in the request's order.
pub(super) async fn bulk_update(
    engine: EngineHandle,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: BulkBody<'_> = parse_body(&bytes)?;
    let total: usize = body.leaderboards.iter().map(|b| b.scores.len()).sum();
    if total > UPDATES_PER_REQUEST_MAX {
        return Err(ApiError::bad_request(format!(
            "at most {UPDATES_PER_REQUEST_MAX} score updates per request, got {total}"
        )));
    }
    // Validate everything before queueing anything: a bad item refuses the whole request.
    let mut by_board: BTreeMap<&str, Vec<(usize, UpdateItem<'_>)>> = BTreeMap::new();
    let mut position = 0;
    for (b, board) in body.leaderboards.iter().enumerate() {
        if !valid_name(&board.leaderboard_id) {
            return Err(name_error(&format!("leaderboards[{b}].leaderboardId")));
        }
        for (s, score) in board.scores.iter().enumerate() {
            if !valid_name(&score.member_id) {
                return Err(name_error(&format!(
                    "leaderboards[{b}].scores[{s}].memberId"
                )));
            }
            let operator = score
                .mode
                .as_deref()
                .map(|m| parse_operator(&format!("leaderboards[{b}].scores[{s}].mode"), m))
                .transpose()?;
            by_board.entry(&board.leaderboard_id).or_default().push((
                position,
                UpdateItem {
                    member: &score.member_id,
                    operator,
                    value: score.score.0,
                },
            ));
            position += 1;
        }
    }
    let request_id = command_id(&headers, APP_NAME)?;
    let mut queued = Vec::with_capacity(by_board.len());
    for (board, items) in &by_board {
        // Each board's share of a keyed request gets its own id, derived from the key and the board.
        let id = request_id.map(|id| {
            xxhash_rust::xxh3::xxh3_128(&[&id.to_le_bytes()[..], board.as_bytes()].concat())
        });
        let command = Command::Update {
            board,
            with_rank: false,
            items: items.iter().map(|(_, item)| *item).collect(),
        };
        queued.push((*board, items, enqueue(&engine, id, &command)));
    }
    let mut results: Vec<Option<BulkResult<'_>>> = (0..total).map(|_| None).collect();
    let mut failed = 0usize;
    for (board, items, pending) in queued {
        let outcome = match pending {
            Ok(pending) => outcome(pending).await,
            Err(error) => Err(error),
        };
        let board_error = match &outcome {
            Ok(Outcome::Updated { items: scored, .. }) if scored.len() == items.len() => None,
            Ok(Outcome::Updated { .. }) => return Err(internal("fewer results than updates")),
            Ok(Outcome::NoSuchBoard) => Some(BulkError {
                code: "not_found",
                message: format!("no board {board:?}"),
            }),
            Ok(other) => return Err(internal(format!("unexpected outcome {other:?}"))),
            Err(error) => Some(BulkError {
                code: if error.status == StatusCode::SERVICE_UNAVAILABLE {
                    "unavailable"
                } else {
                    "error"
                },
                message: error.message.clone(),
            }),
        };
        for (index, (position, item)) in items.iter().enumerate() {
            let (score, error) = match (&board_error, &outcome) {
                (Some(error), _) => (None, Some(error.clone())),
                (None, Ok(Outcome::Updated { items: scored, .. })) => match scored[index] {
                    ItemResult::Scored { score, .. } => (Some(score), None),
                    ItemResult::Overflow => (
                        None,
                        Some(BulkError {
                            code: "score_out_of_range",
                            message:
                                "the new score would leave the signed 128-bit range; unchanged"
                                    .into(),
                        }),
                    ),
                    ItemResult::BoardFull => (
                        None,
                        Some(BulkError {
                            code: "board_full",
                            message: "the board holds the most members a board may hold".into(),
                        }),
                    ),
                },
                (None, _) => unreachable!("an outcome without a board error is Updated"),
            };
            failed += usize::from(error.is_some());
            results[*position] = Some(BulkResult {
                leaderboard_id: board,
                member_id: item.member,
                score,
                error,
            });
        }
    }
    #[derive(Serialize)]
    struct Reply<'a> {
        updated: usize,
        failed: usize,
        results: Vec<BulkResult<'a>>,
    }
    let reply = Reply {
        updated: total - failed,
        failed,
        results: results
            .into_iter()
            .map(|r| r.expect("every position has a result"))
            .collect(),
    };
    Ok(json(StatusCode::OK, &reply))
}
