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
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use parse::{
    Score, check_name, name_param, operator_schema, optional_operator_schema,
    optional_order_schema, optional_ties_schema, order_schema, param_number, param_season,
    parse_body, parse_operator, ties_schema,
};
use serde::{Deserialize, Serialize};
use spate_engine::{CommandId, EngineHandle, Pending};
use spate_server::ApiError;
use spate_server::api::{ErrorBody, ErrorDetail, IdempotencyKey, json, reply_bytes};
use spate_server::openapi::AppRouter;
use utoipa::openapi::Required;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn, ParameterStyle};
use utoipa::openapi::schema::ArrayBuilder;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

/// Most score updates in one request; larger batches are refused with 400 before anything is applied.
pub const UPDATES_PER_REQUEST_MAX: usize = crate::command::UPDATES_PER_COMMAND_MAX;
/// Most standings one page returns.
pub const PAGE_LIMIT_MAX: usize = 1_000;
/// Most boards one multi-board rank query names.
pub const BOARDS_PER_QUERY_MAX: usize = 64;
/// Most standings `around` returns on each side of the member.
const AROUND_MAX: usize = PAGE_LIMIT_MAX / 2;
/// Largest page offset: half the address space, so that offset plus limit cannot overflow.
const PAGE_OFFSET_MAX: usize = usize::MAX / 2;
/// Board names that would collide with the API's own paths.
const RESERVED_BOARD_NAMES: &[&str] = &["ranks", "scores"];

/// The tag of leaderboard's routes in the API description.
const TAG: &str = "leaderboard";

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

/// A score in an answer: a decimal string, exact beyond 2^53.
#[derive(Debug, Clone, Copy)]
struct DecimalScore(i128);

impl Serialize for DecimalScore {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl utoipa::PartialSchema for DecimalScore {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        parse::score_text_schema()
    }
}

impl ToSchema for DecimalScore {}

/// A board in the path.
#[derive(Deserialize)]
struct BoardPath {
    board: String,
}

impl IntoParams for BoardPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![board_param()]
    }
}

/// A board and one of its members in the path.
#[derive(Deserialize)]
struct MemberPath {
    board: String,
    member: String,
}

impl IntoParams for MemberPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            board_param(),
            name_param("member", ParameterIn::Path, "The member's name.", true),
        ]
    }
}

fn board_param() -> Parameter {
    name_param("board", ParameterIn::Path, "The board's name.", true)
}

/// Which season a read is about.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SeasonQuery {
    /// The season's number, from 1; the current season when absent.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 4_294_967_295_u64)]
    season: Option<String>,
}

/// A page of a ranking: from the top, from an offset or after a cursor.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct PageQuery {
    /// Standings to return, at most 1,000; 10 when absent.
    #[param(value_type = Option<u32>, maximum = 1_000)]
    limit: Option<String>,
    /// Standings to skip from the top; 0 when absent. Not with `cursor`.
    #[param(value_type = Option<u64>, maximum = 9_223_372_036_854_775_807_u64)]
    offset: Option<String>,
    /// The `next_cursor` of the previous page: this page starts right after where it ended, however
    /// members moved since. Not with `offset`.
    #[param(value_type = Option<String>, pattern = "^[0-9A-Fa-f]{56}$")]
    cursor: Option<String>,
}

/// How many neighbours of a member to show.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct AroundQuery {
    /// Standings to show on each side of the member, at most 500; 5 when absent.
    #[param(value_type = Option<u32>, maximum = 500)]
    k: Option<String>,
}

/// One member on several boards. Both are required; optional here so that a missing one gets the
/// handler's message rather than the query parser's.
#[derive(Deserialize)]
struct RanksQuery {
    member: Option<String>,
    boards: Option<String>,
}

impl IntoParams for RanksQuery {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let boards = ArrayBuilder::new()
            .items(parse::name_schema())
            .min_items(Some(1))
            .max_items(Some(BOARDS_PER_QUERY_MAX));
        vec![
            name_param("member", ParameterIn::Query, "The member's name.", true),
            ParameterBuilder::new()
                .name("boards")
                .parameter_in(ParameterIn::Query)
                .required(Required::True)
                .description(Some(format!(
                    "The boards' names, separated by commas: at most {BOARDS_PER_QUERY_MAX}."
                )))
                .style(Some(ParameterStyle::Form))
                .explode(Some(false))
                .schema(Some(boards))
                .build(),
        ]
    }
}

/// A board: its settings and the size of one season.
#[derive(Serialize, ToSchema)]
struct BoardAnswer<'a> {
    name: &'a str,
    /// Which scores rank first: `descending`, the highest; `ascending`, the lowest.
    #[schema(schema_with = order_schema)]
    order: &'static str,
    /// How equal scores rank: `first`, whoever reached the score first; `random`, by a draw on each
    /// update.
    #[schema(schema_with = ties_schema)]
    ties: &'static str,
    /// How an update that names no operator combines with the member's score.
    #[schema(schema_with = operator_schema)]
    operator: &'static str,
    /// The season described, from 1: the current one unless the request chose another.
    season: u32,
    /// Seasons so far; the last one is current.
    seasons: u32,
    /// Members with a score in `season`.
    members: u64,
    /// When `season` began, in milliseconds since the Unix epoch; only in the answer about one board.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    season_started_ms: Option<u64>,
}

impl<'a> BoardAnswer<'a> {
    fn of(board: &'a BoardSummary) -> Self {
        Self {
            name: &board.name,
            order: board.config.order.name(),
            ties: board.config.ties.name(),
            operator: board.config.operator.name(),
            season: board.season,
            seasons: board.seasons,
            members: board.members,
            season_started_ms: None,
        }
    }
}

#[derive(Serialize, ToSchema)]
struct BoardList<'a> {
    /// Sorted by name.
    boards: Vec<BoardAnswer<'a>>,
}

/// A member's place in a ranking.
#[derive(Serialize, ToSchema)]
struct StandingAnswer<'a> {
    /// 1 is best.
    rank: u64,
    member: &'a str,
    score: DecimalScore,
}

impl<'a> StandingAnswer<'a> {
    fn of(standing: &'a Standing) -> Self {
        Self {
            rank: standing.rank,
            member: &standing.member,
            score: DecimalScore(standing.score),
        }
    }

    fn all(page: &'a [Standing]) -> Vec<Self> {
        page.iter().map(Self::of).collect()
    }
}

#[derive(Serialize, ToSchema)]
struct MemberAnswer<'a> {
    board: &'a str,
    season: u32,
    member: &'a str,
    score: DecimalScore,
    /// 1 is best.
    rank: u64,
}

#[derive(Serialize, ToSchema)]
struct TopAnswer<'a> {
    board: &'a str,
    /// Members with a score in the season.
    members: usize,
    /// Best first.
    entries: Vec<StandingAnswer<'a>>,
    /// Where this page ended, for `cursor`; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
struct AroundAnswer<'a> {
    board: &'a str,
    member: &'a str,
    /// Up to `k` standings above the member, the member's, up to `k` below; best first.
    entries: Vec<StandingAnswer<'a>>,
}

#[derive(Serialize, ToSchema)]
struct ResetAnswer<'a> {
    board: &'a str,
    /// The new season's number.
    season: u32,
}

#[derive(Serialize, ToSchema)]
struct RanksAnswer<'a> {
    member: &'a str,
    /// One per board asked for, in the order asked.
    boards: Vec<BoardRank<'a>>,
}

/// A member's standing on one board of several, or why there is none.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
enum BoardRank<'a> {
    Ranked {
        board: &'a str,
        /// The current season.
        season: u32,
        score: DecimalScore,
        /// 1 is best.
        rank: u64,
    },
    Failed {
        board: &'a str,
        /// `not_found` (no such board, or the member has no score on it), or the code of the 503 of a
        /// partition that cannot answer now (`overloaded`, `partition_moving`, ...).
        error: ErrorDetail,
    },
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
    idempotency_key: &IdempotencyKey,
    command: Command<'_>,
) -> Result<Outcome, ApiError> {
    let id = idempotency_key.command_id(APP_NAME)?;
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
        Some(None) => Err(no_season(board, season)),
        Some(Some(result)) => Ok(result),
    }
}

fn no_season(board: &str, season: Option<u32>) -> ApiError {
    ApiError::not_found(format!(
        "board {board:?} has no season {}",
        season.unwrap_or_default()
    ))
}

/// Every board on every partition, sorted by name.
async fn all_boards(engine: &EngineHandle) -> Result<Vec<BoardSummary>, ApiError> {
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
        boards.extend(summaries);
    }
    boards.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(boards)
}

/// Every board, with its settings and the size of its current season.
#[utoipa::path(
    get,
    path = "/leaderboards",
    tag = TAG,
    responses((status = 200, description = "The boards.", body = BoardList)),
)]
async fn list_boards(State(engine): State<EngineHandle>) -> Result<Response, ApiError> {
    let boards = all_boards(&engine).await?;
    let answer = BoardList {
        boards: boards.iter().map(BoardAnswer::of).collect(),
    };
    Ok(json(StatusCode::OK, &answer))
}

/// A new board's name and settings.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateBoardBody {
    /// Not `ranks` or `scores`, which are paths of the API.
    #[schema(schema_with = parse::name_schema)]
    name: String,
    /// Which scores rank first: `descending` (the default), the highest; `ascending`, the lowest.
    #[schema(schema_with = optional_order_schema, required = false)]
    order: Option<String>,
    /// How equal scores rank: `first` (the default), whoever reached the score first; `random`, by a
    /// draw on each update.
    #[schema(schema_with = optional_ties_schema, required = false)]
    ties: Option<String>,
    /// How an update that names no operator combines with the member's score: `set` (the default),
    /// `increment`, `best` or `worst` (the better or worse of the two by `order`).
    #[schema(schema_with = optional_operator_schema, required = false)]
    operator: Option<String>,
}

/// Creates board `name` (checked here) with `config`, once durable.
async fn create(
    engine: &EngineHandle,
    idempotency_key: &IdempotencyKey,
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
        idempotency_key,
        Command::Create {
            board: name,
            config,
        },
    )
    .await
}

/// Creates a board with its first season.
#[utoipa::path(
    post,
    path = "/leaderboards",
    tag = TAG,
    params(IdempotencyKey),
    request_body = CreateBoardBody,
    responses(
        (status = 201, description = "Durable: the new board.", body = BoardAnswer),
        (status = 400, description = "The body is malformed, the name invalid or reserved, or a setting unknown.", body = ErrorBody),
        (status = 409, description = "`board_exists`: a board of that name exists already; or `in_flight`: a request with this `Idempotency-Key` is still being made durable.", body = ErrorBody),
    ),
)]
async fn create_board(
    State(engine): State<EngineHandle>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: CreateBoardBody = parse_body(&body)?;
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
    match create(&engine, &idempotency_key, &body.name, config).await? {
        Outcome::Created { .. } => {
            let board = BoardSummary::of(&body.name, &Board::new(config, 0));
            Ok(json(StatusCode::CREATED, &BoardAnswer::of(&board)))
        }
        Outcome::Exists { .. } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "board_exists",
            format!("board {:?} exists already", body.name),
        )),
        other => Err(internal(format!("unexpected outcome {other:?}"))),
    }
}

/// A board's settings and the size of one of its seasons.
#[utoipa::path(
    get,
    path = "/leaderboards/{board}",
    tag = TAG,
    params(BoardPath, SeasonQuery),
    responses(
        (status = 200, description = "The board.", body = BoardAnswer),
        (status = 404, description = "No such board, or no such season of it.", body = ErrorBody),
    ),
)]
async fn get_board(
    State(engine): State<EngineHandle>,
    Path(BoardPath { board }): Path<BoardPath>,
    Query(season): Query<SeasonQuery>,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    let season = param_season(season.season.as_deref())?;
    let name = board.clone();
    let partition = engine.partition_of(board.as_bytes());
    let found = engine
        .query(partition, APP_ID, move |state: &LeaderboardState| {
            state.board(&name).map(|b| {
                let mut summary = BoardSummary::of(&name, b);
                let started_ms = b.season(season).map(|chosen| {
                    summary.season = chosen.number;
                    summary.members = chosen.len() as u64;
                    chosen.started_ms
                });
                (summary, started_ms)
            })
        })
        .await?;
    match found {
        None => Err(no_board(&board)),
        Some((_, None)) => Err(no_season(&board, season)),
        Some((summary, Some(started_ms))) => {
            let answer = BoardAnswer {
                season_started_ms: Some(started_ms),
                ..BoardAnswer::of(&summary)
            };
            Ok(json(StatusCode::OK, &answer))
        }
    }
}

fn expect_deleted(outcome: Outcome, missing: ApiError) -> Result<Response, ApiError> {
    match outcome {
        Outcome::Deleted => Ok(StatusCode::NO_CONTENT.into_response()),
        Outcome::NoSuchBoard | Outcome::NoSuchMember => Err(missing),
        other => Err(internal(format!("unexpected outcome {other:?}"))),
    }
}

/// Deletes a board, every season of it.
#[utoipa::path(
    delete,
    path = "/leaderboards/{board}",
    tag = TAG,
    params(BoardPath, IdempotencyKey),
    responses(
        (status = 204, description = "Durable: the board is gone."),
        (status = 404, description = "No such board.", body = ErrorBody),
    ),
)]
async fn delete_board(
    State(engine): State<EngineHandle>,
    Path(BoardPath { board }): Path<BoardPath>,
    idempotency_key: IdempotencyKey,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    let outcome = run(
        &engine,
        &idempotency_key,
        Command::DeleteBoard { board: &board },
    )
    .await?;
    expect_deleted(outcome, no_board(&board))
}

/// Starts a new, empty season of a board; the old seasons stay readable (`?season=`).
#[utoipa::path(
    post,
    path = "/leaderboards/{board}/reset",
    tag = TAG,
    params(BoardPath, IdempotencyKey),
    responses(
        (status = 201, description = "Durable: the new season.", body = ResetAnswer),
        (status = 404, description = "No such board.", body = ErrorBody),
    ),
)]
async fn reset_board(
    State(engine): State<EngineHandle>,
    Path(BoardPath { board }): Path<BoardPath>,
    idempotency_key: IdempotencyKey,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    match run(&engine, &idempotency_key, Command::Reset { board: &board }).await? {
        Outcome::Reset { season } => Ok(json(
            StatusCode::CREATED,
            &ResetAnswer {
                board: &board,
                season,
            },
        )),
        Outcome::NoSuchBoard => Err(no_board(&board)),
        other => Err(internal(format!("unexpected outcome {other:?}"))),
    }
}

/// A page of a board's ranking, best first.
#[utoipa::path(
    get,
    path = "/leaderboards/{board}/top",
    tag = TAG,
    params(BoardPath, SeasonQuery, PageQuery),
    responses(
        (status = 200, description = "The page.", body = TopAnswer),
        (status = 400, description = "A query value is malformed or over its limit, the cursor is not one this server returned, or both `offset` and `cursor` are given.", body = ErrorBody),
        (status = 404, description = "No such board, or no such season of it.", body = ErrorBody),
    ),
)]
async fn board_top(
    State(engine): State<EngineHandle>,
    Path(BoardPath { board }): Path<BoardPath>,
    Query(season): Query<SeasonQuery>,
    Query(page): Query<PageQuery>,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    let season = param_season(season.season.as_deref())?;
    let limit = param_number("limit", page.limit.as_deref(), 10usize, PAGE_LIMIT_MAX)?;
    let cursor = match page.cursor.as_deref() {
        None => None,
        Some(text) => Some(
            Cursor::parse(text)
                .ok_or_else(|| ApiError::bad_request("cursor is not one this server returned"))?,
        ),
    };
    if cursor.is_some() && page.offset.is_some() {
        return Err(ApiError::bad_request("give offset or cursor, not both"));
    }
    let offset = param_number("offset", page.offset.as_deref(), 0usize, PAGE_OFFSET_MAX)?;
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
    let answer = TopAnswer {
        board: &board,
        members: total,
        entries: StandingAnswer::all(&page),
        next_cursor: next,
    };
    Ok(json(StatusCode::OK, &answer))
}

/// A member's score and rank.
#[utoipa::path(
    get,
    path = "/leaderboards/{board}/members/{member}",
    tag = TAG,
    params(MemberPath, SeasonQuery),
    responses(
        (status = 200, description = "The member's standing.", body = MemberAnswer),
        (status = 404, description = "No such board, no such season of it, or the member has no score in it.", body = ErrorBody),
    ),
)]
async fn get_member_score(
    State(engine): State<EngineHandle>,
    Path(MemberPath { board, member }): Path<MemberPath>,
    Query(season): Query<SeasonQuery>,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    check_name("member", &member)?;
    let season = param_season(season.season.as_deref())?;
    let name = member.clone();
    let found = read_season(&engine, &board, season, move |config, season| {
        season.member(config, &name).map(|s| (season.number, s))
    })
    .await?;
    let Some((season, standing)) = found else {
        return Err(no_member(&member, &board));
    };
    let answer = MemberAnswer {
        board: &board,
        season,
        member: &member,
        score: DecimalScore(standing.score),
        rank: standing.rank,
    };
    Ok(json(StatusCode::OK, &answer))
}

/// A new score for a member.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SetScoreBody {
    score: Score,
    /// How `score` combines with the member's score: the board's operator when absent. A member
    /// without a score gets `score` whatever the operator.
    #[schema(schema_with = optional_operator_schema, required = false)]
    operator: Option<String>,
}

/// Applies one update and answers with the member's new score and rank.
async fn update_one(
    engine: &EngineHandle,
    idempotency_key: &IdempotencyKey,
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
    match run(engine, idempotency_key, command).await? {
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

/// Sets or changes a member's score on the board's current season (a new member joins it).
#[utoipa::path(
    put,
    path = "/leaderboards/{board}/members/{member}",
    tag = TAG,
    params(MemberPath, IdempotencyKey),
    request_body = SetScoreBody,
    responses(
        (status = 200, description = "Durable: the member's score and rank after it.", body = MemberAnswer),
        (status = 400, description = "The body is malformed, a name or the operator invalid, the score beyond 128 bits; or `score_out_of_range`: the new score would leave the signed 128-bit range (the score is unchanged).", body = ErrorBody),
        (status = 404, description = "No such board.", body = ErrorBody),
        (status = 409, description = "`board_full`: the member is new and the board holds the most members a board may hold; or `in_flight`: a request with this `Idempotency-Key` is still being made durable.", body = ErrorBody),
    ),
)]
async fn set_member_score(
    State(engine): State<EngineHandle>,
    Path(MemberPath { board, member }): Path<MemberPath>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: SetScoreBody = parse_body(&body)?;
    let operator = (body.operator.as_deref())
        .map(|o| parse_operator("operator", o))
        .transpose()?;
    let (season, score, rank) = update_one(
        &engine,
        &idempotency_key,
        &board,
        &member,
        operator,
        body.score.0,
    )
    .await?;
    let answer = MemberAnswer {
        board: &board,
        season,
        member: &member,
        score: DecimalScore(score),
        rank,
    };
    Ok(json(StatusCode::OK, &answer))
}

/// Removes a member from the board's current season.
#[utoipa::path(
    delete,
    path = "/leaderboards/{board}/members/{member}",
    tag = TAG,
    params(MemberPath, IdempotencyKey),
    responses(
        (status = 204, description = "Durable: the member is gone."),
        (status = 404, description = "No such board, or the member has no score on it.", body = ErrorBody),
    ),
)]
async fn delete_member(
    State(engine): State<EngineHandle>,
    Path(MemberPath { board, member }): Path<MemberPath>,
    idempotency_key: IdempotencyKey,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    check_name("member", &member)?;
    let command = Command::DeleteMember {
        board: &board,
        member: &member,
    };
    let outcome = run(&engine, &idempotency_key, command).await?;
    let missing = match outcome {
        Outcome::NoSuchBoard => no_board(&board),
        _ => no_member(&member, &board),
    };
    expect_deleted(outcome, missing)
}

/// A member's neighbourhood in the ranking: the standings just above and below it.
#[utoipa::path(
    get,
    path = "/leaderboards/{board}/members/{member}/around",
    tag = TAG,
    params(MemberPath, SeasonQuery, AroundQuery),
    responses(
        (status = 200, description = "The member and its neighbours.", body = AroundAnswer),
        (status = 404, description = "No such board, no such season of it, or the member has no score in it.", body = ErrorBody),
    ),
)]
async fn member_around(
    State(engine): State<EngineHandle>,
    Path(MemberPath { board, member }): Path<MemberPath>,
    Query(season): Query<SeasonQuery>,
    Query(around): Query<AroundQuery>,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    check_name("member", &member)?;
    let season = param_season(season.season.as_deref())?;
    let k = param_number("k", around.k.as_deref(), 5usize, AROUND_MAX)?;
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
    let answer = AroundAnswer {
        board: &board,
        member: &member,
        entries: StandingAnswer::all(&page),
    };
    Ok(json(StatusCode::OK, &answer))
}

/// One member's score and rank on several boards at once (their current seasons).
#[utoipa::path(
    get,
    path = "/leaderboards/ranks",
    tag = TAG,
    params(RanksQuery),
    responses(
        (status = 200, description = "The member's standing on each board, or why there is none.", body = RanksAnswer),
        (status = 400, description = "`member` or `boards` is missing or invalid, or there are more than 64 boards.", body = ErrorBody),
    ),
)]
async fn member_ranks(
    State(engine): State<EngineHandle>,
    Query(query): Query<RanksQuery>,
) -> Result<Response, ApiError> {
    let member = query
        .member
        .ok_or_else(|| ApiError::bad_request("member is required"))?;
    check_name("member", &member)?;
    let boards: Vec<&str> = query
        .boards
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("boards is required: a comma-separated list"))?
        .split(',')
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
            let (engine, board, name) = (engine.clone(), board.to_string(), member.clone());
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
    let detail = |error: ApiError| ErrorDetail {
        code: error.code,
        message: error.message,
    };
    let ranked = (boards.iter().zip(results)).map(|(board, result)| match result {
        Ok(Some((season, standing))) => BoardRank::Ranked {
            board,
            season,
            score: DecimalScore(standing.score),
            rank: standing.rank,
        },
        Ok(None) => BoardRank::Failed {
            board,
            error: detail(no_member(&member, board)),
        },
        Err(error) => BoardRank::Failed {
            board,
            error: detail(error),
        },
    });
    let answer = RanksAnswer {
        member: &member,
        boards: ranked.collect(),
    };
    Ok(json(StatusCode::OK, &answer))
}

pub(crate) fn routes(engine: EngineHandle) -> AppRouter {
    AppRouter::new()
        .routes(routes!(list_boards, create_board))
        .routes(routes!(bulk::bulk_update_scores))
        .routes(routes!(member_ranks))
        .routes(routes!(get_board, delete_board))
        .routes(routes!(reset_board))
        .routes(routes!(board_top))
        .routes(routes!(get_member_score, set_member_score, delete_member))
        .routes(routes!(member_around))
        .merge(case_study::routes())
        .with_state(engine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The maximum the description gives each parameter of `P`.
    fn described_maxima<P: IntoParams>() -> Vec<(String, Value)> {
        let params = P::into_params(|| None).into_iter();
        params
            .map(|param| {
                let maximum = serde_json::to_value(&param).unwrap()["schema"]["maximum"].clone();
                (param.name, maximum)
            })
            .collect()
    }

    #[test]
    fn the_described_limits_are_the_enforced_ones() {
        let maximum = |name: &str, max: Value| (name.to_string(), max);
        assert_eq!(
            described_maxima::<PageQuery>(),
            [
                maximum("limit", json!(PAGE_LIMIT_MAX)),
                maximum("offset", json!(PAGE_OFFSET_MAX)),
                maximum("cursor", Value::Null),
            ]
        );
        assert_eq!(
            described_maxima::<AroundQuery>(),
            [maximum("k", json!(AROUND_MAX))]
        );
        assert_eq!(
            described_maxima::<SeasonQuery>(),
            [maximum("season", json!(u32::MAX))]
        );
    }
}
