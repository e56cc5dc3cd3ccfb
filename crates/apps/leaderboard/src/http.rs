//! leaderboard's HTTP routes: spate's own API under `/leaderboards`, and the case study's API under
//! `/leaderboard` (same paths and bodies, so its clients work unchanged). Scores travel as decimal
//! strings (exact beyond 2^53) and are accepted as JSON integers or strings.

use crate::board::{Board, BoardConfig, Cursor, Operator, Order, Season, Standing, TiePolicy};
use crate::command::{Command, ItemResult, NAME_BYTES_MAX, Outcome, UpdateItem};
use crate::state::LeaderboardState;
use crate::{APP_ID, APP_NAME};
use axum::Router;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use spate_engine::{CommandId, EngineHandle, Pending};
use spate_server::ApiError;
use spate_server::api::{command_id, json, reply_bytes};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// Most score updates in one request; larger batches are refused with 400 before anything is applied.
pub const UPDATES_PER_REQUEST_MAX: usize = crate::command::UPDATES_PER_COMMAND_MAX;
/// Most standings one page returns.
pub const PAGE_LIMIT_MAX: usize = 1_000;
/// Most boards one multi-board rank query names.
pub const BOARDS_PER_QUERY_MAX: usize = 64;
/// Board names that would collide with the API's own paths.
const RESERVED_BOARD_NAMES: &[&str] = &["ranks", "scores"];

type Params = Query<HashMap<String, String>>;

fn valid_name(name: &str) -> bool {
    let valid = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@');
    !name.is_empty() && name.len() <= NAME_BYTES_MAX && name.bytes().all(valid)
}

fn name_error(field: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{field} must be 1 to {NAME_BYTES_MAX} characters of A-Z, a-z, 0-9, '-', '_', '.', ':' or '@'"
    ))
}

fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(name_error(field))
    }
}

fn parse_score_text(field: &str, text: &str) -> Result<i128, ApiError> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ApiError::bad_request(format!(
            "{field} must be a decimal integer, got {:?}",
            truncate(text)
        )));
    }
    text.parse::<i128>().map_err(|_| {
        ApiError::bad_request(format!(
            "{field} is beyond the signed 128-bit range ({} to {})",
            i128::MIN,
            i128::MAX
        ))
    })
}

fn truncate(text: &str) -> &str {
    match text.char_indices().nth(48) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

fn parse_operator(field: &str, name: &str) -> Result<Operator, ApiError> {
    // The case study's modes name two of ours.
    let name = match name {
        "replace" => "set",
        other => other,
    };
    Operator::parse(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{field} must be one of {} (or the case study's \"replace\")",
            Operator::NAMES.join(", ")
        ))
    })
}

fn param_number<T>(
    params: &HashMap<String, String>,
    name: &str,
    default: T,
    max: T,
) -> Result<T, ApiError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let Some(text) = params.get(name) else {
        return Ok(default);
    };
    match text.parse::<T>() {
        Ok(value) if value <= max => Ok(value),
        _ => Err(ApiError::bad_request(format!(
            "{name} must be a whole number up to {max}, got {:?}",
            truncate(text)
        ))),
    }
}

fn param_season(params: &HashMap<String, String>) -> Result<Option<u32>, ApiError> {
    params
        .get("season")
        .map(|text| match text.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(ApiError::bad_request(format!(
                "season must be a season number from 1, got {:?}",
                truncate(text)
            ))),
        })
        .transpose()
}

fn internal(message: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        message.to_string(),
    )
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

fn board_json(name: &str, board: &Board) -> Value {
    let current = board.current();
    json!({
        "name": name,
        "order": board.config.order.name(),
        "ties": board.config.ties.name(),
        "operator": board.config.operator.name(),
        "season": current.number,
        "seasons": board.seasons.len(),
        "members": current.len(),
    })
}

fn standing_json(s: &Standing) -> Value {
    json!({"rank": s.rank, "member": s.member, "score": s.score.to_string()})
}

/// Every board on every partition, sorted by name.
async fn all_boards(engine: &EngineHandle) -> Result<Vec<(String, Value)>, ApiError> {
    let mut boards = Vec::new();
    for partition in 0..engine.partition_count() {
        let found: Vec<(String, Value)> = engine
            .query(partition, APP_ID, |state: &LeaderboardState| {
                state
                    .boards()
                    .map(|(name, board)| (name.clone(), board_json(name, board)))
                    .collect()
            })
            .await?;
        boards.extend(found);
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
            Ok(json(StatusCode::CREATED, &board_json(&body.name, &board)))
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

/// A score as JSON carries it: an integer, or a decimal string for values beyond what JSON numbers carry
/// exactly. Deserializing checks the 128-bit range, so a bad score fails with the field's position.
#[derive(Debug, Clone, Copy)]
struct Score(i128);

impl<'de> Deserialize<'de> for Score {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Score;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an integer score (send values beyond 64 bits as a decimal string)")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Score, E> {
                Ok(Score(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Score, E> {
                Ok(Score(v.into()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Score, E> {
                parse_score_text("score", v)
                    .map(Score)
                    .map_err(|e| E::custom(e.message))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

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

/// A JSON body parsed in place. Every malformed body is a 400 (the issue asks 400 for a score beyond
/// 128 bits, and one status for every body error is simpler for clients than 400 and 422 by cause).
fn parse_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// One command per board, queued together; results come back in the request's order.
async fn bulk_update(
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
        check_name(
            &format!("leaderboards[{b}].leaderboardId"),
            &board.leaderboard_id,
        )?;
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
        return Err(ApiError::not_found(format!(
            "{member:?} has no score on board {board:?}"
        )));
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
        return Err(ApiError::not_found(format!(
            "{member:?} has no score on board {board:?}"
        )));
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
            Ok(None) => json!({"board": board, "error": {"code": "not_found", "message": format!("{member:?} has no score on board {board:?}")}}),
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
            post(move |headers: HeaderMap, body: axum::body::Bytes| bulk_update(e, headers, body))
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
                            let mut info = board_json(&name, b);
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
                        _ => ApiError::not_found(format!("{member:?} has no score on board {board:?}")),
                    };
                    expect_deleted(outcome, missing)
                })
        })
        .route("/leaderboards/{board}/members/{member}/around", {
            let e = e.clone();
            get(move |Path((board, member)): Path<(String, String)>, Query(params): Params| around(e, board, member, params))
        })
        // The case study's API.
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
