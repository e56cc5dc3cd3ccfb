//! The case study's own API under `/leaderboard`: same paths, bodies and answers, so its clients work.
//! Board ids are the board names.

use super::parse::{Score, check_name, parse_body, parse_score_text};
use super::{Params, all_boards, create, internal, no_board, read_season, update_one};
use crate::board::{BoardConfig, Operator, Order, TiePolicy};
use crate::command::Outcome;
use axum::Router;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use spate_engine::EngineHandle;
use spate_server::ApiError;
use spate_server::api::json;
use std::collections::HashMap;

/// The case study's member response.
fn case_study_member(board: &str, member: &str, score: Option<i128>) -> Response {
    json(
        StatusCode::OK,
        &json!({"leaderboardId": board, "memberId": member, "score": score.map(|s| s.to_string()).unwrap_or_default()}),
    )
}

/// The case study's create body. Its other fields (`kind`, the implementation to use) are ignored:
/// there is one implementation here.
#[derive(Deserialize)]
struct CaseStudyCreate {
    name: Option<String>,
}

/// The case study's score body; it may repeat the board and member ids of the path, which are ignored.
#[derive(Deserialize)]
struct CaseStudyScore {
    score: Score,
}

async fn case_study_update(
    engine: EngineHandle,
    headers: HeaderMap,
    board: String,
    member: String,
    params: HashMap<String, String>,
    body: axum::body::Bytes,
    operator: Operator,
) -> Result<Response, ApiError> {
    let value = match params.get("score") {
        Some(text) => parse_score_text("score", text)?,
        None if body.is_empty() => {
            return Err(ApiError::bad_request(
                "give the score as ?score= or as a body {\"score\": \"...\"}",
            ));
        }
        None => parse_body::<CaseStudyScore>(&body)?.score.0,
    };
    let (_, score, _) =
        update_one(&engine, &headers, &board, &member, Some(operator), value).await?;
    Ok(case_study_member(&board, &member, Some(score)))
}

pub(super) fn routes(e: EngineHandle) -> Router {
    Router::new()
        .route("/leaderboard", {
            let (list, make) = (e.clone(), e.clone());
            get(move |Query(params): Params| async move {
                let boards = all_boards(&list).await?;
                let status = |(name, info): &(String, Value)| json!({"id": name, "size": info["members"]});
                match params.get("name") {
                    Some(name) => match boards.iter().find(|(n, _)| n == name) {
                        Some(board) => Ok(json(StatusCode::OK, &status(board))),
                        None => Err(no_board(name)),
                    },
                    None => Ok(json(StatusCode::OK, &json!({"leaderboards": boards.iter().map(status).collect::<Vec<_>>()}))),
                }
            })
            .post(move |Query(params): Params, headers: HeaderMap, body: axum::body::Bytes| async move {
                let from_body = if body.is_empty() {
                    None
                } else {
                    let parsed: CaseStudyCreate = parse_body(&body)?;
                    parsed.name
                };
                let name = match (params.get("name"), from_body) {
                    (Some(a), Some(b)) if *a != b => return Err(ApiError::bad_request(format!("name {a:?} in the query and {b:?} in the body differ"))),
                    (Some(a), _) => a.clone(),
                    (None, Some(b)) => b,
                    (None, None) => return Err(ApiError::bad_request("give the board name as ?name= or in the body")),
                };
                // The case study broke ties at random; its boards keep that behaviour here.
                let config = BoardConfig { order: Order::Descending, ties: TiePolicy::Random, operator: Operator::Set };
                match create(&make, &headers, &name, config).await? {
                    Outcome::Created { .. } => Ok(json(StatusCode::OK, &json!({"name": name, "id": name}))),
                    Outcome::Exists { .. } => Err(ApiError::new(StatusCode::CONFLICT, "board_exists", format!("leaderboard?name={name} already exists"))),
                    other => Err(internal(format!("unexpected outcome {other:?}"))),
                }
            })
        })
        .route("/leaderboard/{board}", {
            let e = e.clone();
            get(move |Path(board): Path<String>| async move {
                check_name("board", &board)?;
                let size = read_season(&e, &board, None, |_, season| season.len()).await?;
                Ok::<_, ApiError>(json(StatusCode::OK, &json!({"id": board, "size": size})))
            })
        })
        .route("/leaderboard/{board}/{member}", {
            let (read, replace, increment) = (e.clone(), e.clone(), e);
            get(move |Path((board, member)): Path<(String, String)>| async move {
                check_name("board", &board)?;
                check_name("member", &member)?;
                let name = member.clone();
                let score = read_season(&read, &board, None, move |config, season| season.member(config, &name).map(|s| s.score)).await?;
                Ok::<_, ApiError>(case_study_member(&board, &member, score))
            })
            .put(move |Path((board, member)): Path<(String, String)>, Query(params): Params, headers: HeaderMap, body: axum::body::Bytes| {
                case_study_update(replace, headers, board, member, params, body, Operator::Set)
            })
            .patch(move |Path((board, member)): Path<(String, String)>, Query(params): Params, headers: HeaderMap, body: axum::body::Bytes| {
                case_study_update(increment, headers, board, member, params, body, Operator::Increment)
            })
        })
}
