//! leaderboard's HTTP routes: spate's own API under `/leaderboards`, and the case study's API under
//! `/leaderboard` (same paths and bodies, so its clients work unchanged). Scores travel as decimal
//! strings (exact beyond 2^53) and are accepted as JSON integers or strings.

mod bulk;
mod case_study;
mod parse;

use crate::board::{Board, BoardConfig, Cursor, Operator, Order, Season, Standing, TiePolicy};
use crate::command::{Command, ItemResult, Outcome, UpdateItem};
use crate::state::{BOARDS_QUERY, BoardSummary, LeaderboardState};
use crate::{APP_ID, APP_NAME};
use axum::Router;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parse::{Score, check_name, param_number, param_season, parse_body, parse_operator};
use serde::Deserialize;
use serde_json::{Value, json};
use spate_engine::{CommandId, EngineHandle, Pending};
use spate_server::ApiError;
use spate_server::api::{command_id, json, reply_bytes};
use std::collections::HashMap;

/// Most score updates in one request; larger batches are refused with 400 before anything is applied.
pub const UPDATES_PER_REQUEST_MAX: usize = crate::command::UPDATES_PER_COMMAND_MAX;
/// Most standings one page returns.
pub const PAGE_LIMIT_MAX: usize = 1_000;
/// Most boards one multi-board rank query names.
pub const BOARDS_PER_QUERY_MAX: usize = 64;
/// Board names that would collide with the API's own paths.
const RESERVED_BOARD_NAMES: &[&str] = &["ranks", "scores"];

type Params = Query<HashMap<String, String>>;

fn internal(message: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        message.to_string(),
    )
}

fn no_member(member: &str, board: &str) -> ApiError {
    ApiError::not_found(format!("{member:?} has no score on board {board:?}"))
}

fn no_board(board: &str) -> ApiError {
    ApiError::not_found(format!(
        "no board {board:?}; create it with POST /leaderboards"
    ))
}

/// Queues a command on the board's partition; awaiting it gives the outcome once durable.
fn enqueue(
    engine: &EngineHandle,
    id: Option<CommandId>,
    command: &Command<'_>,
) -> Result<Pending, ApiError> {
    let partition = engine.partition_of(command.board().as_bytes());
    engine
        .enqueue(partition, APP_ID, id, command.encode())
        .map_err(|refused| refused.error.into())
}

async fn outcome(pending: Pending) -> Result<Outcome, ApiError> {
    let bytes = reply_bytes(pending.reply().await?)?;
    match Outcome::decode(&bytes).map_err(internal)? {
        Outcome::Invalid { reason } => Err(internal(format!(
            "the engine could not decode a command: {reason}"
        ))),
        outcome => Ok(outcome),
    }
}

async fn run(
    engine: &EngineHandle,
    headers: &HeaderMap,
    command: Command<'_>,
) -> Result<Outcome, ApiError> {
    let id = command_id(headers, APP_NAME)?;
    outcome(enqueue(engine, id, &command)?).await
}

/// Reads a board's season on its partition, after every command queued before it.
async fn read_season<R: Send + 'static>(
    engine: &EngineHandle,
    board: &str,
    season: Option<u32>,
    read: impl FnOnce(&BoardConfig, &Season) -> R + Send + 'static,
) -> Result<R, ApiError> {
    let partition = engine.partition_of(board.as_bytes());
    let name = board.to_string();
    let found = engine
        .query(partition, APP_ID, move |state: &LeaderboardState| {
            state
                .board(&name)
                .map(|b| b.season(season).map(|s| read(&b.config, s)))
        })
        .await?;
    match found {
        None => Err(no_board(board)),
        Some(None) => Err(ApiError::not_found(format!(
            "board {board:?} has no season {}",
            season.unwrap_or_default()
        ))),
        Some(Some(result)) => Ok(result),
    }
}

fn board_json(board: &BoardSummary) -> Value {
    json!({
        "name": board.name,
        "order": board.config.order.name(),
        "ties": board.config.ties.name(),
        "operator": board.config.operator.name(),
        "season": board.season,
        "seasons": board.seasons,
        "members": board.members,
    })
}

fn standing_json(s: &Standing) -> Value {
    json!({"rank": s.rank, "member": s.member, "score": s.score.to_string()})
}

/// Every board on every partition, sorted by name.
async fn all_boards(engine: &EngineHandle) -> Result<Vec<(String, Value)>, ApiError> {
    let mut boards = Vec::new();
    for partition in 0..engine.partition_count() {
        let answer = engine
            .read(partition, APP_ID, BOARDS_QUERY.to_vec())
            .await?;
        let summaries = BoardSummary::decode_all(&answer).map_err(|e| {
            internal(format!(
                "partition {partition} listed its boards badly: {e}"
            ))
        })?;
        boards.extend(summaries.iter().map(|b| (b.name.clone(), board_json(b))));
    }
    boards.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(boards)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: String,
    order: Option<String>,
    ties: Option<String>,
    operator: Option<String>,
}

async fn create(
    engine: &EngineHandle,
    headers: &HeaderMap,
    name: &str,
    config: BoardConfig,
) -> Result<Outcome, ApiError> {
    check_name("name", name)?;
    if RESERVED_BOARD_NAMES.contains(&name) {
        return Err(ApiError::bad_request(format!(
            "{name:?} is reserved; choose another board name"
        )));
    }
    run(
        engine,
        headers,
        Command::Create {
            board: name,
            config,
        },
    )
    .await
}

async fn create_board(
    engine: EngineHandle,
    headers: HeaderMap,
    body: CreateBody,
) -> Result<Response, ApiError> {
    let order = match body.order.as_deref() {
        None => Order::Descending,
        Some(text) => Order::parse(text).ok_or_else(|| {
            ApiError::bad_request(format!("order must be one of {}", Order::NAMES.join(", ")))
        })?,
    };
    let ties = match body.ties.as_deref() {
        None => TiePolicy::First,
        Some(text) => TiePolicy::parse(text).ok_or_else(|| {
            ApiError::bad_request(format!(
                "ties must be one of {}",
                TiePolicy::NAMES.join(", ")
            ))
        })?,
    };
    let operator = match body.operator.as_deref() {
        None => Operator::Set,
        Some(text) => parse_operator("operator", text)?,
    };
    let config = BoardConfig {
        order,
        ties,
        operator,
    };
    match create(&engine, &headers, &body.name, config).await? {
        Outcome::Created { .. } => {
            let board = Board::new(config, 0);
            Ok(json(
                StatusCode::CREATED,
                &board_json(&BoardSummary::of(&body.name, &board)),
            ))
        }
        Outcome::Exists { .. } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "board_exists",
            format!("board {:?} exists already", body.name),
        )),
        other => Err(internal(format!("unexpected outcome {other:?}"))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetScoreBody {
    score: Score,
    operator: Option<String>,
}

/// Applies one update and answers with the member's new score and rank.
async fn update_one(
    engine: &EngineHandle,
    headers: &HeaderMap,
    board: &str,
    member: &str,
    operator: Option<Operator>,
    value: i128,
) -> Result<(u32, i128, u64), ApiError> {
    check_name("board", board)?;
    check_name("member", member)?;
    let command = Command::Update {
        board,
        with_rank: true,
        items: vec![UpdateItem {
            member,
            operator,
            value,
        }],
    };
    match run(engine, headers, command).await? {
        Outcome::Updated { season, items } => match items.as_slice() {
            [
                ItemResult::Scored {
                    score,
                    rank: Some(rank),
                },
            ] => Ok((season, *score, *rank)),
            [ItemResult::Overflow] => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "score_out_of_range",
                format!(
                    "the new score of {member:?} would leave the signed 128-bit range; its score is unchanged"
                ),
            )),
            [ItemResult::BoardFull] => Err(ApiError::new(
                StatusCode::CONFLICT,
                "board_full",
                format!("board {board:?} holds the most members a board may hold"),
            )),
            other => Err(internal(format!("unexpected item results {other:?}"))),
        },
        Outcome::NoSuchBoard => Err(no_board(board)),
        other => Err(internal(format!("unexpected outcome {other:?}"))),
    }
}

async fn top(
    engine: EngineHandle,
    board: String,
    params: HashMap<String, String>,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    let season = param_season(&params)?;
    let limit = param_number(&params, "limit", 10usize, PAGE_LIMIT_MAX)?;
    let cursor = match params.get("cursor") {
        None => None,
        Some(text) => Some(
            Cursor::parse(text)
                .ok_or_else(|| ApiError::bad_request("cursor is not one this server returned"))?,
        ),
    };
    if cursor.is_some() && params.contains_key("offset") {
        return Err(ApiError::bad_request("give offset or cursor, not both"));
    }
    let offset = param_number(&params, "offset", 0usize, usize::MAX / 2)?;
    let (total, page, next) = read_season(&engine, &board, season, move |config, season| {
        let page = match cursor {
            Some(cursor) => season.page_after(config, &cursor, limit),
            None => season.page(config, offset, limit),
        };
        let next = match page.last() {
            Some(last) if (last.rank as usize) < season.len() => {
                season.cursor_after(&last.member).map(Cursor::to_text)
            }
            _ => None,
        };
        (season.len(), page, next)
    })
    .await?;
    let entries: Vec<Value> = page.iter().map(standing_json).collect();
    Ok(json(
        StatusCode::OK,
        &json!({"board": board, "members": total, "entries": entries, "next_cursor": next}),
    ))
}

async fn member_standing(
    engine: EngineHandle,
    board: String,
    member: String,
    params: HashMap<String, String>,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    check_name("member", &member)?;
    let season = param_season(&params)?;
    let name = member.clone();
    let found = read_season(&engine, &board, season, move |config, season| {
        season.member(config, &name).map(|s| (season.number, s))
    })
    .await?;
    let Some((season, standing)) = found else {
        return Err(no_member(&member, &board));
    };
    Ok(json(
        StatusCode::OK,
        &json!({"board": board, "season": season, "member": member, "score": standing.score.to_string(), "rank": standing.rank}),
    ))
}

async fn around(
    engine: EngineHandle,
    board: String,
    member: String,
    params: HashMap<String, String>,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    check_name("member", &member)?;
    let season = param_season(&params)?;
    let k = param_number(&params, "k", 5usize, PAGE_LIMIT_MAX / 2)?;
    let name = member.clone();
    let found = read_season(&engine, &board, season, move |config, season| {
        let rank = season.rank(&name)? as usize;
        let start = rank.saturating_sub(1 + k);
        Some(season.page(config, start, rank - start + k))
    })
    .await?;
    let Some(page) = found else {
        return Err(no_member(&member, &board));
    };
    let entries: Vec<Value> = page.iter().map(standing_json).collect();
    Ok(json(
        StatusCode::OK,
        &json!({"board": board, "member": member, "entries": entries}),
    ))
}

/// One member's standing on several boards at once; boards are read concurrently.
async fn ranks(
    engine: EngineHandle,
    params: HashMap<String, String>,
) -> Result<Response, ApiError> {
    let member = params
        .get("member")
        .ok_or_else(|| ApiError::bad_request("member is required"))?
        .clone();
    check_name("member", &member)?;
    let boards: Vec<String> = params
        .get("boards")
        .ok_or_else(|| ApiError::bad_request("boards is required: a comma-separated list"))?
        .split(',')
        .map(str::to_string)
        .collect();
    if boards.len() > BOARDS_PER_QUERY_MAX {
        return Err(ApiError::bad_request(format!(
            "at most {BOARDS_PER_QUERY_MAX} boards per query"
        )));
    }
    for board in &boards {
        check_name("boards", board)?;
    }
    // Spawned so that the boards' partitions are asked at once, not one after another.
    let reads: Vec<_> = boards
        .iter()
        .map(|board| {
            let (engine, board, name) = (engine.clone(), board.clone(), member.clone());
            tokio::spawn(async move {
                read_season(&engine, &board, None, move |config, season| {
                    season.member(config, &name).map(|s| (season.number, s))
                })
                .await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(reads.len());
    for read in reads {
        results.push(read.await.map_err(internal)?);
    }
    let entries: Vec<Value> = boards
        .iter()
        .zip(results)
        .map(|(board, result)| match result {
            Ok(Some((season, s))) => json!({"board": board, "season": season, "score": s.score.to_string(), "rank": s.rank}),
            Ok(None) => json!({"board": board, "error": {"code": "not_found", "message": no_member(&member, board).message}}),
            Err(error) => json!({"board": board, "error": {"code": error.code, "message": error.message}}),
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &json!({"member": member, "boards": entries}),
    ))
}

fn expect_deleted(outcome: Outcome, missing: ApiError) -> Result<Response, ApiError> {
    match outcome {
        Outcome::Deleted => Ok(StatusCode::NO_CONTENT.into_response()),
        Outcome::NoSuchBoard | Outcome::NoSuchMember => Err(missing),
        other => Err(internal(format!("unexpected outcome {other:?}"))),
    }
}

pub(crate) fn routes(engine: EngineHandle) -> Router {
    let e = engine;
    Router::new()
        .route("/leaderboards", {
            let (list, make) = (e.clone(), e.clone());
            get(move || async move {
                let boards: Vec<Value> = all_boards(&list).await?.into_iter().map(|(_, v)| v).collect();
                Ok::<_, ApiError>(json(StatusCode::OK, &json!({"boards": boards})))
            })
            .post(move |headers: HeaderMap, bytes: axum::body::Bytes| async move { create_board(make, headers, parse_body(&bytes)?).await })
        })
        .route("/leaderboards/scores", {
            let e = e.clone();
            post(move |headers: HeaderMap, body: axum::body::Bytes| bulk::bulk_update(e, headers, body))
        })
        .route("/leaderboards/ranks", {
            let e = e.clone();
            get(move |Query(params): Params| ranks(e, params))
        })
        .route("/leaderboards/{board}", {
            let (read, delete) = (e.clone(), e.clone());
            get(move |Path(board): Path<String>, Query(params): Params| async move {
                check_name("board", &board)?;
                let season = param_season(&params)?;
                let name = board.clone();
                let partition = read.partition_of(board.as_bytes());
                let found = read
                    .query(partition, APP_ID, move |state: &LeaderboardState| {
                        state.board(&name).map(|b| {
                            let mut info = board_json(&BoardSummary::of(&name, b));
                            let chosen = b.season(season).map(|s| (s.number, s.len(), s.started_ms));
                            if let Some((number, members, started_ms)) = chosen {
                                info["season"] = json!(number);
                                info["members"] = json!(members);
                                info["season_started_ms"] = json!(started_ms);
                            }
                            (info, chosen.is_some())
                        })
                    })
                    .await?;
                match found {
                    None => Err(no_board(&board)),
                    Some((_, false)) => Err(ApiError::not_found(format!("board {board:?} has no season {}", season.unwrap_or_default()))),
                    Some((info, true)) => Ok(json(StatusCode::OK, &info)),
                }
            })
            .delete(move |Path(board): Path<String>, headers: HeaderMap| async move {
                check_name("board", &board)?;
                let outcome = run(&delete, &headers, Command::DeleteBoard { board: &board }).await?;
                expect_deleted(outcome, no_board(&board))
            })
        })
        .route("/leaderboards/{board}/reset", {
            let e = e.clone();
            post(move |Path(board): Path<String>, headers: HeaderMap| async move {
                check_name("board", &board)?;
                match run(&e, &headers, Command::Reset { board: &board }).await? {
                    Outcome::Reset { season } => Ok(json(StatusCode::CREATED, &json!({"board": board, "season": season}))),
                    Outcome::NoSuchBoard => Err(no_board(&board)),
                    other => Err(internal(format!("unexpected outcome {other:?}"))),
                }
            })
        })
        .route("/leaderboards/{board}/top", {
            let e = e.clone();
            get(move |Path(board): Path<String>, Query(params): Params| top(e, board, params))
        })
        .route("/leaderboards/{board}/members/{member}", {
            let (read, write, delete) = (e.clone(), e.clone(), e.clone());
            get(move |Path((board, member)): Path<(String, String)>, Query(params): Params| member_standing(read, board, member, params))
                .put(move |Path((board, member)): Path<(String, String)>, headers: HeaderMap, bytes: axum::body::Bytes| async move {
                    let body: SetScoreBody = parse_body(&bytes)?;
                    let value = body.score.0;
                    let operator = body.operator.as_deref().map(|o| parse_operator("operator", o)).transpose()?;
                    let (season, score, rank) = update_one(&write, &headers, &board, &member, operator, value).await?;
                    Ok::<_, ApiError>(json(StatusCode::OK, &json!({"board": board, "season": season, "member": member, "score": score.to_string(), "rank": rank})))
                })
                .delete(move |Path((board, member)): Path<(String, String)>, headers: HeaderMap| async move {
                    check_name("board", &board)?;
                    check_name("member", &member)?;
                    let outcome = run(&delete, &headers, Command::DeleteMember { board: &board, member: &member }).await?;
                    let missing = match outcome {
                        Outcome::NoSuchBoard => no_board(&board),
                        _ => no_member(&member, &board),
                    };
                    expect_deleted(outcome, missing)
                })
        })
        .route("/leaderboards/{board}/members/{member}/around", {
            let e = e.clone();
            get(move |Path((board, member)): Path<(String, String)>, Query(params): Params| around(e, board, member, params))
        })
        .merge(case_study::routes(e))
}
