//! `POST /leaderboards/scores`: many updates on many boards in one request (the case study's bulk body).

use super::parse::{
    Score, name_error, optional_operator_schema, parse_body, parse_operator, valid_name,
};
use super::{APP_NAME, DecimalScore, TAG, UPDATES_PER_REQUEST_MAX, enqueue, internal, outcome};
use crate::command::{Command, ItemResult, Outcome, UpdateItem};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use spate_engine::EngineHandle;
use spate_server::ApiError;
use spate_server::api::{ErrorBody, IdempotencyKey, json};
use std::borrow::Cow;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Score updates on several boards (the case study's bulk body).
// Borrowed from the request bytes: no allocation per update.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BulkBody<'a> {
    /// At most 10,000 updates in all.
    #[serde(borrow, deserialize_with = "spate_server::api::json_objects")]
    leaderboards: Vec<BulkBoard<'a>>,
}

/// Updates on one board.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BulkBoard<'a> {
    /// The board's name.
    #[serde(borrow)]
    #[schema(schema_with = super::parse::name_schema)]
    leaderboard_id: Cow<'a, str>,
    #[serde(borrow, deserialize_with = "spate_server::api::json_objects")]
    #[schema(max_items = 10_000)]
    scores: Vec<BulkScore<'a>>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BulkScore<'a> {
    /// The member's name.
    #[serde(borrow)]
    #[schema(schema_with = super::parse::name_schema)]
    member_id: Cow<'a, str>,
    score: Score,
    /// How `score` combines with the member's score: the board's operator when absent.
    #[serde(borrow)]
    #[schema(schema_with = optional_operator_schema, required = false)]
    mode: Option<Cow<'a, str>>,
}

/// One update's result in a bulk reply: the member's new score, or the error.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct BulkResult<'a> {
    leaderboard_id: &'a str,
    member_id: &'a str,
    /// The member's score after the update, if it succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    score: Option<DecimalScore>,
    /// Why the update failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    error: Option<BulkError>,
}

#[derive(Serialize, ToSchema, Clone)]
struct BulkError {
    /// `not_found` (no such board), `score_out_of_range` (the new score would leave the signed 128-bit
    /// range; unchanged), `board_full`, `unavailable` (the board's partition cannot take updates now;
    /// retry) or `error` (another failure, such as this `Idempotency-Key` used with another body).
    code: &'static str,
    message: String,
}

#[derive(Serialize, ToSchema)]
struct BulkReply<'a> {
    /// Updates applied.
    updated: usize,
    /// Updates refused; each result says why.
    failed: usize,
    /// One per update, in the request's order.
    results: Vec<BulkResult<'a>>,
}

/// Updates scores on several boards in one request.
///
/// Every update is checked before any is applied; then each board's updates apply in the request's
/// order, and one board's failure does not stop the others'.
#[utoipa::path(
    post,
    path = "/leaderboards/scores",
    tag = TAG,
    params(IdempotencyKey),
    request_body = BulkBody,
    responses(
        (status = 200, description = "Every update that succeeded is durable; each result says how it went.", body = BulkReply),
        (status = 400, description = "The body is malformed, a name or mode invalid, a score beyond 128 bits, or there are more than 10,000 updates; nothing was applied.", body = ErrorBody),
    ),
)]
pub(super) async fn bulk_update_scores(
    State(engine): State<EngineHandle>,
    idempotency_key: IdempotencyKey,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    // One command per board, queued together; results come back in the request's order.
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
    let request_id = idempotency_key.command_id(APP_NAME)?;
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
                    ItemResult::Scored { score, .. } => (Some(DecimalScore(score)), None),
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
    let reply = BulkReply {
        updated: total - failed,
        failed,
        results: results
            .into_iter()
            .map(|r| r.expect("every position has a result"))
            .collect(),
    };
    Ok(json(StatusCode::OK, &reply))
}

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa::PartialSchema;

    #[test]
    fn the_described_limit_is_the_enforced_one() {
        let board = serde_json::to_value(BulkBoard::schema()).unwrap();
        let described = &board["properties"]["scores"]["maxItems"];
        assert_eq!(described, &serde_json::json!(UPDATES_PER_REQUEST_MAX));
    }

    /// serde would take a board or an update from an array of its fields; the body is objects only.
    #[test]
    fn boards_and_updates_are_json_objects() {
        let object = br#"{"leaderboards": [{"leaderboardId": "b", "scores": [{"memberId": "m", "score": 1}]}]}"#;
        assert!(parse_body::<BulkBody>(object).is_ok());
        for array in [
            &br#"{"leaderboards": [["b", [{"memberId": "m", "score": 1}]]]}"#[..],
            br#"{"leaderboards": [{"leaderboardId": "b", "scores": [["m", 1, null]]}]}"#,
        ] {
            let Err(error) = parse_body::<BulkBody>(array) else {
                panic!("{} was taken", String::from_utf8_lossy(array));
            };
            assert!(error.message.contains("a JSON object"), "{}", error.message);
        }
    }
}
