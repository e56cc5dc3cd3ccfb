//! The case study's own API under `/leaderboard`: same paths, bodies and answers, so its clients work.
//! Board ids are the board names.

use super::parse::{Score, check_name, name_param, parse_body, parse_score_text};
use super::{
    BoardPath, DecimalScore, MemberPath, TAG, all_boards, create, internal, no_board, read_season,
    update_one,
};
use crate::board::{BoardConfig, Operator, Order, TiePolicy};
use crate::command::Outcome;
use crate::state::BoardSummary;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use spate_engine::EngineHandle;
use spate_server::ApiError;
use spate_server::api::{ErrorBody, IdempotencyKey, json};
use spate_server::openapi::AppRouter;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::Schema;
use utoipa::openapi::{OpenApi, RefOr};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

/// A board as the case study shows it.
#[derive(Serialize, ToSchema)]
struct CaseStudyBoard<'a> {
    /// The board's name.
    id: &'a str,
    /// Members with a score in its current season.
    size: u64,
}

impl<'a> CaseStudyBoard<'a> {
    fn of(board: &'a BoardSummary) -> Self {
        Self {
            id: &board.name,
            size: board.members,
        }
    }
}

/// The case study's listing: every board, or the one its query names.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
enum CaseStudyListing<'a> {
    One(CaseStudyBoard<'a>),
    All {
        leaderboards: Vec<CaseStudyBoard<'a>>,
    },
}

#[derive(Serialize, ToSchema)]
struct CaseStudyCreated<'a> {
    name: &'a str,
    /// The board's id in the other calls: its name.
    id: &'a str,
}

/// The case study's member response.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct CaseStudyMember<'a> {
    leaderboard_id: &'a str,
    member_id: &'a str,
    /// In decimal; empty when the member has no score.
    #[serde(serialize_with = "decimal_or_empty")]
    #[schema(value_type = String, pattern = "^(-?[0-9]+)?$")]
    score: Option<DecimalScore>,
}

fn decimal_or_empty<S: serde::Serializer>(
    score: &Option<DecimalScore>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match score {
        Some(score) => score.serialize(serializer),
        None => serializer.serialize_str(""),
    }
}

fn case_study_member(board: &str, member: &str, score: Option<i128>) -> Response {
    let answer = CaseStudyMember {
        leaderboard_id: board,
        member_id: member,
        score: score.map(DecimalScore),
    };
    json(StatusCode::OK, &answer)
}

/// A board's name in the query.
#[derive(Deserialize)]
struct NameQuery {
    name: Option<String>,
}

impl IntoParams for NameQuery {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![name_param(
            "name",
            ParameterIn::Query,
            "The board's name.",
            false,
        )]
    }
}

/// A score in the query.
#[derive(Deserialize)]
struct ScoreQuery {
    score: Option<String>,
}

impl IntoParams for ScoreQuery {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            ParameterBuilder::new()
                .name("score")
                .parameter_in(ParameterIn::Query)
                .description(Some(
                    "The score, a signed 128-bit decimal; when given, the body is not read.",
                ))
                .schema(Some(super::parse::score_text_schema()))
                .build(),
        ]
    }
}

/// The case study's create body. Its other fields (`kind`, the implementation to use) are ignored:
/// there is one implementation here.
#[derive(Deserialize, ToSchema)]
struct CaseStudyCreate {
    /// The board's name, unless the query gives it (then both must agree).
    #[schema(schema_with = super::parse::optional_name_schema, required = false)]
    name: Option<String>,
}

/// The case study's score body; it may repeat the board and member ids of the path, which are ignored.
#[derive(Deserialize, ToSchema)]
struct CaseStudyScore {
    score: Score,
}

/// Every board with its size, or (`?name=`) one board.
#[utoipa::path(
    get,
    path = "/leaderboard",
    tag = TAG,
    params(NameQuery),
    responses(
        (status = 200, description = "`{\"leaderboards\": [...]}`, sorted by id; or, with `name`, that board.", body = CaseStudyListing),
        (status = 404, description = "No board of that name.", body = ErrorBody),
    ),
)]
async fn case_study_list_boards(
    State(engine): State<EngineHandle>,
    Query(query): Query<NameQuery>,
) -> Result<Response, ApiError> {
    let boards = all_boards(&engine).await?;
    let listing = match query.name {
        Some(name) => match boards.iter().find(|b| b.name == name) {
            Some(board) => CaseStudyListing::One(CaseStudyBoard::of(board)),
            None => return Err(no_board(&name)),
        },
        None => CaseStudyListing::All {
            leaderboards: boards.iter().map(CaseStudyBoard::of).collect(),
        },
    };
    Ok(json(StatusCode::OK, &listing))
}

/// Creates a board named in the query or the body.
///
/// Its ties are broken at random, as the case study's were.
#[utoipa::path(
    post,
    path = "/leaderboard",
    tag = TAG,
    params(NameQuery, IdempotencyKey),
    request_body(content = Option<CaseStudyCreate>, description = "May be left out when the query names the board."),
    responses(
        (status = 200, description = "Durable: the new board.", body = CaseStudyCreated),
        (status = 400, description = "The body is malformed, no name is given, the query's and the body's differ, or the name is invalid or reserved.", body = ErrorBody),
        (status = 409, description = "`board_exists`: a board of that name exists already; or `in_flight`: a request with this `Idempotency-Key` is still being made durable.", body = ErrorBody),
    ),
)]
async fn case_study_create_board(
    State(engine): State<EngineHandle>,
    Query(query): Query<NameQuery>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, ApiError> {
    let from_body = if body.is_empty() {
        None
    } else {
        parse_body::<CaseStudyCreate>(&body)?.name
    };
    let name = match (query.name, from_body) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::bad_request(format!(
                "name {a:?} in the query and {b:?} in the body differ"
            )));
        }
        (Some(a), _) => a,
        (None, Some(b)) => b,
        (None, None) => {
            return Err(ApiError::bad_request(
                "give the board name as ?name= or in the body",
            ));
        }
    };
    // The case study broke ties at random; its boards keep that behaviour here.
    let config = BoardConfig {
        order: Order::Descending,
        ties: TiePolicy::Random,
        operator: Operator::Set,
    };
    match create(&engine, &idempotency_key, &name, config).await? {
        Outcome::Created { .. } => Ok(json(
            StatusCode::OK,
            &CaseStudyCreated {
                name: &name,
                id: &name,
            },
        )),
        Outcome::Exists { .. } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "board_exists",
            format!("leaderboard?name={name} already exists"),
        )),
        other => Err(internal(format!("unexpected outcome {other:?}"))),
    }
}

/// A board's size.
#[utoipa::path(
    get,
    path = "/leaderboard/{board}",
    tag = TAG,
    params(BoardPath),
    responses(
        (status = 200, description = "The board.", body = CaseStudyBoard),
        (status = 404, description = "No such board.", body = ErrorBody),
    ),
)]
async fn case_study_get_board(
    State(engine): State<EngineHandle>,
    Path(BoardPath { board }): Path<BoardPath>,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    let size = read_season(&engine, &board, None, |_, season| season.len()).await?;
    let answer = CaseStudyBoard {
        id: &board,
        size: size as u64,
    };
    Ok(json(StatusCode::OK, &answer))
}

/// A member's score (no rank: the case study's API).
#[utoipa::path(
    get,
    path = "/leaderboard/{board}/{member}",
    tag = TAG,
    params(MemberPath),
    responses(
        (status = 200, description = "The member's score, empty if it has none.", body = CaseStudyMember),
        (status = 404, description = "No such board.", body = ErrorBody),
    ),
)]
async fn case_study_get_score(
    State(engine): State<EngineHandle>,
    Path(MemberPath { board, member }): Path<MemberPath>,
) -> Result<Response, ApiError> {
    check_name("board", &board)?;
    check_name("member", &member)?;
    let name = member.clone();
    let score = read_season(&engine, &board, None, move |config, season| {
        season.member(config, &name).map(|s| s.score)
    })
    .await?;
    Ok(case_study_member(&board, &member, score))
}

/// Applies `operator` with the score of the query or else of the body.
async fn case_study_update(
    engine: EngineHandle,
    idempotency_key: IdempotencyKey,
    MemberPath { board, member }: MemberPath,
    query: ScoreQuery,
    body: Bytes,
    operator: Operator,
) -> Result<Response, ApiError> {
    let value = match query.score.as_deref() {
        Some(text) => parse_score_text("score", text)?,
        None if body.is_empty() => {
            return Err(ApiError::bad_request(
                "give the score as ?score= or as a body {\"score\": \"...\"}",
            ));
        }
        None => parse_body::<CaseStudyScore>(&body)?.score.0,
    };
    let (_, score, _) = update_one(
        &engine,
        &idempotency_key,
        &board,
        &member,
        Some(operator),
        value,
    )
    .await?;
    Ok(case_study_member(&board, &member, Some(score)))
}

/// Sets a member's score (a new member joins the board).
#[utoipa::path(
    put,
    path = "/leaderboard/{board}/{member}",
    tag = TAG,
    params(MemberPath, ScoreQuery, IdempotencyKey),
    request_body(content = Option<CaseStudyScore>, description = "Read only when the query gives no score."),
    responses(
        (status = 200, description = "Durable: the member's score after it.", body = CaseStudyMember),
        (status = 400, description = "No score is given, or it is malformed or beyond 128 bits, or a name is invalid.", body = ErrorBody),
        (status = 404, description = "No such board.", body = ErrorBody),
        (status = 409, description = "`board_full`: the member is new and the board holds the most members a board may hold; or `in_flight`: a request with this `Idempotency-Key` is still being made durable.", body = ErrorBody),
    ),
)]
async fn case_study_replace_score(
    State(engine): State<EngineHandle>,
    Path(path): Path<MemberPath>,
    Query(query): Query<ScoreQuery>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, ApiError> {
    case_study_update(engine, idempotency_key, path, query, body, Operator::Set).await
}

/// Adds to a member's score (a new member joins the board with it).
#[utoipa::path(
    patch,
    path = "/leaderboard/{board}/{member}",
    tag = TAG,
    params(MemberPath, ScoreQuery, IdempotencyKey),
    request_body(content = Option<CaseStudyScore>, description = "Read only when the query gives no score."),
    responses(
        (status = 200, description = "Durable: the member's score after it.", body = CaseStudyMember),
        (status = 400, description = "No score is given, or it is malformed or beyond 128 bits, or a name is invalid; or `score_out_of_range`: the sum would leave the signed 128-bit range (the score is unchanged).", body = ErrorBody),
        (status = 404, description = "No such board.", body = ErrorBody),
        (status = 409, description = "`board_full`: the member is new and the board holds the most members a board may hold; or `in_flight`: a request with this `Idempotency-Key` is still being made durable.", body = ErrorBody),
    ),
)]
async fn case_study_increment_score(
    State(engine): State<EngineHandle>,
    Path(path): Path<MemberPath>,
    Query(query): Query<ScoreQuery>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, ApiError> {
    case_study_update(
        engine,
        idempotency_key,
        path,
        query,
        body,
        Operator::Increment,
    )
    .await
}

pub(super) fn routes() -> AppRouter<EngineHandle> {
    let mut router = AppRouter::new()
        .routes(routes!(case_study_list_boards, case_study_create_board))
        .routes(routes!(case_study_get_board))
        .routes(routes!(
            case_study_get_score,
            case_study_replace_score,
            case_study_increment_score
        ));
    bodies_not_null(router.get_openapi_mut());
    router
}

/// utoipa describes a body that may be left out (`Option<T>`) as one that may also be `null`; these
/// bodies may be left out, but a `null` one is malformed like any body that is not `T`.
fn bodies_not_null(openapi: &mut OpenApi) {
    let operations = (openapi.paths.paths.values_mut())
        .flat_map(|item| [&mut item.post, &mut item.put, &mut item.patch])
        .flatten();
    for body in operations.filter_map(|operation| operation.request_body.as_mut()) {
        for content in body.content.values_mut() {
            if let Some(RefOr::T(Schema::OneOf(either))) = &content.schema {
                let not_null = either
                    .items
                    .iter()
                    .find(|item| matches!(item, RefOr::Ref(_)));
                content.schema = not_null.cloned();
            }
        }
    }
}
