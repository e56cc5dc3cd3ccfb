//! ski's HTTP routes: the spec's eight operations, two of ours for the seed's other questions, and the
//! consumer's lag. Errors are `{"message": ...}`, the spec's `ResponseMsg`.
//!
//! Routes are mounted at the spec's paths, parameter names included: the first segment under
//! `/skiers/` is a resortID in the ride path and a skierID in the others, which the router allows (it
//! matches a parameter by its position, not its name).

use crate::command::{Command, Outcome, Ride, vertical_of};
use crate::model::{RideStore, StoreError};
use crate::state::SkiState;
use crate::stats::{ApiStats, Endpoint, EndpointStats};
use crate::{APP_ID, APP_NAME, Bounds, DAYS, SkiConfig};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use spate_engine::{EngineError, EngineHandle, Reply};
use spate_server::ApiError;
use spate_server::api::{IdempotencyKey, reply_bytes};
use spate_server::openapi::AppRouter;
use std::collections::BTreeSet;
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

const RIDE_ROUTE: &str = "/skiers/{resortID}/seasons/{seasonID}/days/{dayID}/skiers/{skierID}";
const RESORTS_ROUTE: &str = "/resorts";
const SEASONS_ROUTE: &str = "/resorts/{resortID}/seasons";
const RESORT_DAY_ROUTE: &str = "/resorts/{resortID}/seasons/{seasonID}/day/{dayID}/skiers";
const RESORT_DAYS_ROUTE: &str = "/resorts/{resortID}/seasons/{seasonID}/days";
const SKIER_VERTICAL_ROUTE: &str = "/skiers/{skierID}/vertical";
const DAYS_ROUTE: &str = "/skiers/{skierID}/seasons/{seasonID}/days";
const LIFTS_ROUTE: &str = "/skiers/{skierID}/seasons/{seasonID}/days/{dayID}/lifts";
const STATISTICS_ROUTE: &str = "/statistics";
const LAG_ROUTE: &str = "/ski/lag";

/// The tag for ski's routes in the API description.
const TAG: &str = "ski";

/// Every endpoint `GET /statistics` reports.
static ENDPOINTS: [Endpoint; 10] = [
    Endpoint {
        method: Method::POST,
        route: RIDE_ROUTE,
    },
    Endpoint {
        method: Method::GET,
        route: RIDE_ROUTE,
    },
    Endpoint {
        method: Method::GET,
        route: RESORTS_ROUTE,
    },
    Endpoint {
        method: Method::GET,
        route: SEASONS_ROUTE,
    },
    Endpoint {
        method: Method::POST,
        route: SEASONS_ROUTE,
    },
    Endpoint {
        method: Method::GET,
        route: RESORT_DAY_ROUTE,
    },
    Endpoint {
        method: Method::GET,
        route: SKIER_VERTICAL_ROUTE,
    },
    Endpoint {
        method: Method::GET,
        route: DAYS_ROUTE,
    },
    Endpoint {
        method: Method::GET,
        route: LIFTS_ROUTE,
    },
    Endpoint {
        method: Method::GET,
        route: STATISTICS_ROUTE,
    },
];

/// The spec's error: a status and `{"message": ...}`.
#[derive(Debug)]
pub(crate) struct SkiError {
    status: StatusCode,
    message: String,
}

impl SkiError {
    fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }
}

// The spec's name for it; the errors the server makes outside ski's handlers have the same shape,
// described as the server's `MessageBody`.
/// An error: what is wrong.
#[derive(Serialize, ToSchema)]
struct ResponseMsg {
    /// What is wrong: names the field, the limit or what was not found.
    message: String,
}

impl IntoResponse for SkiError {
    fn into_response(self) -> Response {
        let body = ResponseMsg {
            message: self.message,
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Where the ski routes are: every error answer under these paths is the spec's `{"message"}`, those
/// of the ski handlers and those made outside them alike (a 405 from the method router, a rejection, a
/// body over the server's limit, an unknown path), by the server's `api::shape_error`.
pub(crate) const PATHS: &[&str] = &["/skiers/", "/resorts", "/statistics", "/ski/"];

impl From<ApiError> for SkiError {
    fn from(error: ApiError) -> Self {
        Self {
            status: error.status,
            message: error.message,
        }
    }
}

impl From<EngineError> for SkiError {
    fn from(error: EngineError) -> Self {
        ApiError::from(error).into()
    }
}

struct Ski {
    engine: EngineHandle,
    /// Read in the handlers themselves: a query reads a few adjacent keys, from fjall's memtables and
    /// block cache when recent, in microseconds; handing each read to the blocking pool cost more than
    /// the read (queries' p99 under the POST load went from 6 to 37-66 ms, BENCHMARKS.md).
    store: Arc<RideStore>,
    config: SkiConfig,
    stats: Arc<EndpointStats>,
}

type Ctx = State<Arc<Ski>>;

/// At most this much of a rejected value is echoed in a message.
fn shown(text: &str) -> &str {
    match text.char_indices().nth(32) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

fn in_bounds(field: &str, value: i64, bounds: Bounds) -> Result<u32, SkiError> {
    if bounds.contains(value) {
        Ok(value as u32)
    } else {
        Err(SkiError::bad_request(format!(
            "{field} must be from {bounds}, got {value}"
        )))
    }
}

fn parse_id(field: &str, text: &str, bounds: Bounds) -> Result<u32, SkiError> {
    let value = text.parse::<i64>().map_err(|_| {
        SkiError::bad_request(format!(
            "{field} must be an integer from {bounds}, got {:?}",
            shown(text)
        ))
    })?;
    in_bounds(field, value, bounds)
}

/// Configured ranges fit the stored widths ([`SkiConfig::check`]).
fn narrow(value: u32) -> u16 {
    u16::try_from(value).expect("configured ranges of 16-bit fields fit in 16 bits")
}

impl Ski {
    fn season(&self, field: &str, text: &str) -> Result<u16, SkiError> {
        parse_id(field, text, self.config.seasons).map(narrow)
    }

    fn day(&self, text: &str) -> Result<u16, SkiError> {
        parse_id("dayID", text, DAYS).map(narrow)
    }

    fn skier(&self, text: &str) -> Result<u32, SkiError> {
        parse_id("skierID", text, self.config.skiers)
    }

    /// A resortID in the spec's `/resorts/...` paths, where an unknown resort is a 404.
    fn resort(&self, text: &str) -> Result<u16, SkiError> {
        let resorts = self.config.resorts;
        let id = text.parse::<i64>().map_err(|_| {
            SkiError::bad_request(format!(
                "resortID must be an integer, got {:?}",
                shown(text)
            ))
        })?;
        if !resorts.contains(id) {
            return Err(SkiError::not_found(format!(
                "resort {id} not found; resorts are {resorts}"
            )));
        }
        Ok(narrow(id as u32))
    }

    async fn submit(
        &self,
        key: &[u8],
        idempotency_key: &IdempotencyKey,
        command: Command,
    ) -> Result<Outcome, SkiError> {
        let id = idempotency_key.command_id(APP_NAME)?;
        let partition = self.engine.partition_of(key);
        let reply: Reply = self
            .engine
            .submit(partition, APP_ID, id, command.encode())
            .await?;
        let bytes = reply_bytes(reply)?;
        match Outcome::decode(&bytes) {
            Some(Outcome::Undecodable) | None => Err(SkiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: "the partition could not decode a command this server encoded".into(),
            }),
            Some(outcome) => Ok(outcome),
        }
    }

    /// Seasons added to `resort` (from its partition, so a POST is visible at once) and seasons with
    /// rides there (from the read model).
    async fn seasons(&self, resort: u16) -> Result<BTreeSet<u16>, SkiError> {
        let partition = self.engine.partition_of(&resort_key(resort));
        let added = self
            .engine
            .query(partition, APP_ID, move |state: &SkiState| {
                state.seasons(resort)
            })
            .await?;
        Ok(added
            .into_iter()
            .chain(self.store.seasons_with_rides(resort))
            .collect())
    }
}

/// The read model's store failed a read: a 500 that says so.
impl From<StoreError> for SkiError {
    fn from(error: StoreError) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: error.to_string(),
        }
    }
}

fn resort_key(resort: u16) -> [u8; 3] {
    let [low, high] = resort.to_le_bytes();
    [b'r', low, high]
}

fn skier_key(skier: u32) -> [u8; 4] {
    skier.to_le_bytes()
}

fn resort_name(resort: u16) -> String {
    format!("Resort {resort}")
}

/// One ride up a lift.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct LiftRide {
    /// Minutes into the ski day when the ride began: 1 to 360 unless the server sets `--ski-times`.
    #[schema(value_type = i32, example = 217)]
    time: i64,
    /// The lift: 1 to 40 unless the server sets `--ski-lifts`. A ride on lift N climbs 10 x N m.
    #[serde(rename = "liftID")]
    #[schema(value_type = i32, example = 21)]
    lift_id: i64,
    /// Sent by clients of versions before 2.0: accepted and ignored.
    #[serde(rename = "waitTime", default)]
    #[schema(value_type = Option<serde_json::Value>, deprecated)]
    _wait_time: Option<IgnoredAny>,
}

/// Parses a body that must be a JSON object, as the spec's bodies are.
fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, SkiError> {
    spate_server::api::from_json_object(body)
        .map_err(|e| SkiError::bad_request(format!("invalid JSON body: {e}")))
}

// The path parameters, described as the spec has them; the ranges are the server's defaults.
const RESORT_ID: &str = "ID of the resort: 1 to 10 unless the server sets `--ski-resorts`.";
const SEASON_ID: &str =
    "ID of the ski season, its year: 1900 to 2100 unless the server sets `--ski-seasons`.";
const DAY_ID: &str = "Number of the ski day in the season, 1 to 366.";
const SKIER_ID: &str = "ID of the skier: 1 to 100000 unless the server sets `--ski-skiers`.";
// The spec types seasonID and dayID under `/skiers/` as strings, which hold integers all the same:
// their pattern says so.

/// Records a lift ride.
///
/// Answered once the ride is durable; the GETs see it once the read model has it (see `GET /ski/lag`).
#[utoipa::path(
    post,
    path = RIDE_ROUTE,
    tag = TAG,
    operation_id = "writeNewLiftRide",
    params(
        ("resortID" = i32, Path, description = RESORT_ID),
        ("seasonID" = String, Path, description = SEASON_ID, pattern = "^[0-9]+$"),
        ("dayID" = String, Path, description = DAY_ID, pattern = "^[0-9]+$"),
        ("skierID" = i32, Path, description = SKIER_ID),
        IdempotencyKey,
    ),
    request_body = LiftRide,
    responses(
        (status = 201, description = "The ride is durable."),
        (status = 400, description = "A path value or the body is invalid or out of range.", body = ResponseMsg),
    ),
)]
async fn post_ride(
    State(ski): Ctx,
    Path((resort, season, day, skier)): Path<(String, String, String, String)>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, SkiError> {
    let config = ski.config;
    let resort = narrow(parse_id("resortID", &resort, config.resorts)?);
    let season = ski.season("seasonID", &season)?;
    let day = ski.day(&day)?;
    let skier = ski.skier(&skier)?;
    let ride: LiftRide = parse_json(&body)?;
    let time = narrow(in_bounds("time", ride.time, config.times)?);
    let lift = narrow(in_bounds("liftID", ride.lift_id, config.lifts)?);
    let ride = Ride {
        resort,
        season,
        day,
        skier,
        time,
        lift,
    };
    match ski
        .submit(&skier_key(skier), &idempotency_key, Command::Ride(ride))
        .await?
    {
        Outcome::RideRecorded => Ok(StatusCode::CREATED.into_response()),
        other => Err(unexpected(other)),
    }
}

fn unexpected(outcome: Outcome) -> SkiError {
    SkiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: format!("unexpected outcome {outcome:?}"),
    }
}

/// The total vertical of a skier at a resort on one ski day, in metres.
#[utoipa::path(
    get,
    path = RIDE_ROUTE,
    tag = TAG,
    operation_id = "getSkierDayVertical",
    params(
        ("resortID" = i32, Path, description = RESORT_ID),
        ("seasonID" = String, Path, description = SEASON_ID, pattern = "^[0-9]+$"),
        ("dayID" = String, Path, description = DAY_ID, pattern = "^[0-9]+$"),
        ("skierID" = i32, Path, description = SKIER_ID),
    ),
    responses(
        (status = 200, description = "The day's vertical, a bare JSON integer.", body = u64, content_type = "application/json"),
        (status = 400, description = "A path value is invalid or out of range.", body = ResponseMsg),
        (status = 404, description = "The skier has no ride at this resort that day.", body = ResponseMsg),
    ),
)]
async fn get_day_vertical(
    State(ski): Ctx,
    Path((resort, season, day, skier)): Path<(String, String, String, String)>,
) -> Result<Response, SkiError> {
    let resort = narrow(parse_id("resortID", &resort, ski.config.resorts)?);
    let season = ski.season("seasonID", &season)?;
    let day = ski.day(&day)?;
    let skier = ski.skier(&skier)?;
    let vertical = ski.store.day_vertical(resort, season, day, skier)?;
    match vertical {
        Some(vertical) => Ok(Json(vertical).into_response()),
        None => Err(SkiError::not_found(format!(
            "no rides for skier {skier} at resort {resort} on day {day} of season {season}"
        ))),
    }
}

/// Every resort, by ID.
#[derive(Serialize, ToSchema)]
struct ResortsList {
    #[schema(inline)]
    resorts: Vec<ResortItem>,
}

#[derive(Serialize, ToSchema)]
struct ResortItem {
    #[serde(rename = "resortName")]
    resort_name: String,
    #[serde(rename = "resortID")]
    #[schema(value_type = i32)]
    resort_id: u32,
}

/// Every resort.
#[utoipa::path(
    get,
    path = RESORTS_ROUTE,
    tag = TAG,
    operation_id = "getResorts",
    responses((status = 200, description = "The resorts, by ID.", body = ResortsList)),
)]
async fn get_resorts(State(ski): Ctx) -> Json<ResortsList> {
    let bounds = ski.config.resorts;
    let resorts = (bounds.min..=bounds.max)
        .map(|id| ResortItem {
            resort_name: resort_name(narrow(id)),
            resort_id: id,
        })
        .collect();
    Json(ResortsList { resorts })
}

/// A resort's seasons.
#[derive(Serialize, ToSchema)]
struct SeasonsList {
    /// Years, in order.
    seasons: Vec<String>,
}

/// The seasons of a resort: those added to it and those with rides there.
#[utoipa::path(
    get,
    path = SEASONS_ROUTE,
    tag = TAG,
    operation_id = "getResortSeasons",
    params(("resortID" = i32, Path, description = RESORT_ID)),
    responses(
        (status = 200, description = "The resort's seasons; a season's rides count once the read model has them.", body = SeasonsList),
        (status = 400, description = "resortID is not an integer.", body = ResponseMsg),
        (status = 404, description = "No such resort.", body = ResponseMsg),
    ),
)]
async fn get_seasons(
    State(ski): Ctx,
    Path(resort): Path<String>,
) -> Result<Json<SeasonsList>, SkiError> {
    let resort = ski.resort(&resort)?;
    let seasons = ski
        .seasons(resort)
        .await?
        .iter()
        .map(u16::to_string)
        .collect();
    Ok(Json(SeasonsList { seasons }))
}

/// A season to add to a resort.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewSeason {
    /// The season's starting year, as a 4-character string such as "2019" or as an integer: 1900 to
    /// 2100 unless the server sets `--ski-seasons`.
    #[schema(inline, example = "2019")]
    year: Year,
}

// `year` as the spec has it (a 4-character string) or as a JSON integer.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
enum Year {
    Text(String),
    Number(i64),
}

/// Adds a season to a resort.
///
/// Adding a season it has already is not an error.
#[utoipa::path(
    post,
    path = SEASONS_ROUTE,
    tag = TAG,
    operation_id = "addSeason",
    params(("resortID" = i32, Path, description = RESORT_ID), IdempotencyKey),
    request_body(content = inline(NewSeason), description = "The new season."),
    responses(
        (status = 201, description = "The resort has the season."),
        (status = 400, description = "resortID is not an integer, or the year is invalid or out of range.", body = ResponseMsg),
        (status = 404, description = "No such resort.", body = ResponseMsg),
    ),
)]
async fn post_season(
    State(ski): Ctx,
    Path(resort): Path<String>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, SkiError> {
    let resort = ski.resort(&resort)?;
    let body: NewSeason = parse_json(&body)?;
    let season = match body.year {
        Year::Text(text) if text.len() == 4 => ski.season("year", &text)?,
        Year::Text(text) => {
            return Err(SkiError::bad_request(format!(
                "year must be a 4-character year such as \"2019\", got {:?}",
                shown(&text)
            )));
        }
        Year::Number(year) => narrow(in_bounds("year", year, ski.config.seasons)?),
    };
    let command = Command::AddSeason { resort, season };
    match ski
        .submit(&resort_key(resort), &idempotency_key, command)
        .await?
    {
        // Adding a season twice is not an error: clients retry, and the list is the same afterwards.
        Outcome::SeasonAdded | Outcome::SeasonExisted => Ok(StatusCode::CREATED.into_response()),
        other => Err(unexpected(other)),
    }
}

/// The skiers at a resort on one day.
#[derive(Serialize, ToSchema)]
struct ResortSkiers {
    /// The resort's name (the spec names this field `time`).
    #[schema(example = "Resort 3")]
    time: String,
    #[serde(rename = "numSkiers")]
    #[schema(value_type = i32)]
    num_skiers: u32,
}

/// The number of distinct skiers at a resort on one ski day.
#[utoipa::path(
    get,
    path = RESORT_DAY_ROUTE,
    tag = TAG,
    operation_id = "getResortSkiersDay",
    params(
        ("resortID" = i32, Path, description = RESORT_ID),
        ("seasonID" = i32, Path, description = SEASON_ID),
        ("dayID" = i32, Path, description = DAY_ID, minimum = 1, maximum = 366),
    ),
    responses(
        (status = 200, description = "The count, from the read model; 0 for a day without rides.", body = ResortSkiers),
        (status = 400, description = "A path value is invalid or out of range.", body = ResponseMsg),
        (status = 404, description = "No such resort.", body = ResponseMsg),
    ),
)]
async fn get_resort_day_skiers(
    State(ski): Ctx,
    Path((resort, season, day)): Path<(String, String, String)>,
) -> Result<Json<ResortSkiers>, SkiError> {
    let resort = ski.resort(&resort)?;
    let season = ski.season("seasonID", &season)?;
    let day = ski.day(&day)?;
    Ok(Json(ResortSkiers {
        time: resort_name(resort),
        num_skiers: ski.store.unique_skiers(resort, season, day),
    }))
}

/// A resort's days with rides in one season.
#[derive(Serialize, ToSchema)]
struct ResortSeasonDays {
    /// In order of day.
    days: Vec<ResortDaySkiers>,
}

#[derive(Serialize, ToSchema)]
struct ResortDaySkiers {
    #[serde(rename = "dayID")]
    day_id: u16,
    #[serde(rename = "numSkiers")]
    num_skiers: u32,
}

/// The days of a season with rides at a resort, each with its distinct skiers (not in the Ski Data API).
#[utoipa::path(
    get,
    path = RESORT_DAYS_ROUTE,
    tag = TAG,
    operation_id = "getResortSeasonDays",
    params(
        ("resortID" = i32, Path, description = RESORT_ID),
        ("seasonID" = i32, Path, description = SEASON_ID),
    ),
    responses(
        (status = 200, description = "The days, from the read model; none without rides.", body = ResortSeasonDays),
        (status = 400, description = "A path value is invalid or out of range.", body = ResponseMsg),
        (status = 404, description = "No such resort.", body = ResponseMsg),
    ),
)]
async fn get_resort_days(
    State(ski): Ctx,
    Path((resort, season)): Path<(String, String)>,
) -> Result<Json<ResortSeasonDays>, SkiError> {
    let resort = ski.resort(&resort)?;
    let season = ski.season("seasonID", &season)?;
    let days = (ski.store.skiers_per_day(resort, season).into_iter())
        .map(|(day_id, num_skiers)| ResortDaySkiers { day_id, num_skiers })
        .collect();
    Ok(Json(ResortSeasonDays { days }))
}

/// A skier's vertical at a resort, per season.
#[derive(Serialize, ToSchema)]
struct SkierVertical {
    /// One item per season, in order.
    #[schema(inline)]
    resorts: Vec<SeasonVertical>,
}

#[derive(Serialize, ToSchema)]
struct SeasonVertical {
    #[serde(rename = "seasonID")]
    season_id: String,
    /// Metres.
    #[serde(rename = "totalVert")]
    total_vert: u64,
}

/// The total vertical of a skier at a resort, per season.
#[utoipa::path(
    get,
    path = SKIER_VERTICAL_ROUTE,
    tag = TAG,
    operation_id = "getSkierResortTotals",
    params(
        ("skierID" = i32, Path, description = SKIER_ID),
        ("resort" = Vec<String>, Query, description = "The resort's ID; exactly one.", min_items = 1, max_items = 1),
        ("season" = Option<Vec<String>>, Query, description = "Seasons to report; every season with rides when absent."),
    ),
    responses(
        (status = 200, description = "The seasons with rides, from the read model.", body = SkierVertical),
        (status = 400, description = "A path or query value is invalid or out of range, resort is missing or repeated, or another query parameter is given.", body = ResponseMsg),
        (status = 404, description = "The skier has no ride at this resort in the seasons asked for.", body = ResponseMsg),
    ),
)]
async fn get_skier_vertical(
    State(ski): Ctx,
    Path(skier): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<SkierVertical>, SkiError> {
    let skier = ski.skier(&skier)?;
    let mut resorts = Vec::new();
    let mut seasons = Vec::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match name.as_ref() {
            "resort" => resorts.push(narrow(parse_id("resort", &value, ski.config.resorts)?)),
            "season" => seasons.push(ski.season("season", &value)?),
            other => {
                return Err(SkiError::bad_request(format!(
                    "unknown query parameter {:?}; use resort and season",
                    shown(other)
                )));
            }
        }
    }
    let [resort] = resorts[..] else {
        return Err(SkiError::bad_request(
            "give exactly one resort query parameter",
        ));
    };
    let seasons_wanted = (!seasons.is_empty()).then_some(&seasons[..]);
    let totals = ski.store.season_verticals(skier, resort, seasons_wanted)?;
    if totals.is_empty() {
        return Err(SkiError::not_found(format!(
            "no rides for skier {skier} at resort {resort} in the seasons asked for"
        )));
    }
    let resorts = totals
        .iter()
        .map(|(season, vertical)| SeasonVertical {
            season_id: season.to_string(),
            total_vert: *vertical,
        })
        .collect();
    Ok(Json(SkierVertical { resorts }))
}

/// The days a skier skied in a season.
#[derive(Serialize, ToSchema)]
struct SkierSeasonDays {
    #[serde(rename = "skierID")]
    skier_id: u32,
    #[serde(rename = "seasonID")]
    season_id: String,
    #[serde(rename = "daysSkied")]
    days_skied: usize,
    /// In day order.
    #[schema(inline)]
    days: Vec<DaySkied>,
}

#[derive(Serialize, ToSchema)]
struct DaySkied {
    #[serde(rename = "dayID")]
    day_id: u16,
    rides: u32,
    /// Metres.
    vertical: u64,
}

/// The days a skier skied in a season, with rides and vertical per day (not in the Ski Data API).
#[utoipa::path(
    get,
    path = DAYS_ROUTE,
    tag = TAG,
    operation_id = "getSkierSeasonDays",
    params(
        ("skierID" = i32, Path, description = SKIER_ID),
        ("seasonID" = String, Path, description = SEASON_ID, pattern = "^[0-9]+$"),
    ),
    responses(
        (status = 200, description = "The days, from the read model; none without rides.", body = SkierSeasonDays),
        (status = 400, description = "A path value is invalid or out of range.", body = ResponseMsg),
    ),
)]
async fn get_days(
    State(ski): Ctx,
    Path((skier, season)): Path<(String, String)>,
) -> Result<Json<SkierSeasonDays>, SkiError> {
    let skier = ski.skier(&skier)?;
    let season = ski.season("seasonID", &season)?;
    let days = ski.store.days_skied(skier, season)?;
    Ok(Json(SkierSeasonDays {
        skier_id: skier,
        season_id: season.to_string(),
        days_skied: days.len(),
        days: days
            .iter()
            .map(|d| DaySkied {
                day_id: d.day,
                rides: d.rides,
                vertical: d.vertical,
            })
            .collect(),
    }))
}

/// A skier's lift rides on one day.
#[derive(Serialize, ToSchema)]
struct SkierDayLifts {
    #[serde(rename = "skierID")]
    skier_id: u32,
    #[serde(rename = "seasonID")]
    season_id: String,
    #[serde(rename = "dayID")]
    day_id: u16,
    /// The day's total, in metres.
    vertical: u64,
    /// In the order they were stored.
    #[schema(inline)]
    lifts: Vec<LiftTaken>,
}

#[derive(Serialize, ToSchema)]
struct LiftTaken {
    #[serde(rename = "resortID")]
    resort_id: u16,
    time: u16,
    #[serde(rename = "liftID")]
    lift_id: u16,
    /// Metres.
    vertical: u64,
}

/// The lifts a skier rode on one day, at every resort (not in the Ski Data API).
#[utoipa::path(
    get,
    path = LIFTS_ROUTE,
    tag = TAG,
    operation_id = "getSkierDayLifts",
    params(
        ("skierID" = i32, Path, description = SKIER_ID),
        ("seasonID" = String, Path, description = SEASON_ID, pattern = "^[0-9]+$"),
        ("dayID" = String, Path, description = DAY_ID, pattern = "^[0-9]+$"),
    ),
    responses(
        (status = 200, description = "The rides, from the read model.", body = SkierDayLifts),
        (status = 400, description = "A path value is invalid or out of range.", body = ResponseMsg),
        (status = 404, description = "The skier has no ride that day.", body = ResponseMsg),
    ),
)]
async fn get_lifts(
    State(ski): Ctx,
    Path((skier, season, day)): Path<(String, String, String)>,
) -> Result<Json<SkierDayLifts>, SkiError> {
    let skier = ski.skier(&skier)?;
    let season = ski.season("seasonID", &season)?;
    let day = ski.day(&day)?;
    let rides = ski.store.lifts(skier, season, day)?;
    if rides.is_empty() {
        return Err(SkiError::not_found(format!(
            "no rides for skier {skier} on day {day} of season {season}"
        )));
    }
    Ok(Json(SkierDayLifts {
        skier_id: skier,
        season_id: season.to_string(),
        day_id: day,
        vertical: rides.iter().map(|r| vertical_of(r.lift)).sum(),
        lifts: rides
            .iter()
            .map(|r| LiftTaken {
                resort_id: r.resort,
                time: r.time,
                lift_id: r.lift,
                vertical: vertical_of(r.lift),
            })
            .collect(),
    }))
}

/// Request counts and latencies per endpoint of the spec.
#[utoipa::path(
    get,
    path = STATISTICS_ROUTE,
    tag = TAG,
    operation_id = "getPerformanceStats",
    responses((status = 200, description = "The endpoints that served a request.", body = ApiStats)),
)]
async fn get_statistics(State(ski): Ctx) -> Json<ApiStats> {
    Json(ski.stats.report())
}

/// The consumer's progress (the seed's "queue length" was the broker's depth, which the first two
/// together replace).
#[derive(Serialize, ToSchema)]
struct ConsumerLag {
    /// Durable rides not yet in the read model.
    #[serde(rename = "lagRecords")]
    lag_records: u64,
    /// Requests queued before the partitions.
    #[serde(rename = "queuedRequests")]
    queued_requests: usize,
    /// Rides in the read model.
    rides: u64,
}

/// How far the read model lags behind the durable rides (not in the Ski Data API).
#[utoipa::path(
    get,
    path = LAG_ROUTE,
    tag = TAG,
    operation_id = "getConsumerLag",
    responses((status = 200, description = "The lag and the queues.", body = ConsumerLag)),
)]
async fn get_lag(State(ski): Ctx) -> Json<ConsumerLag> {
    Json(ConsumerLag {
        lag_records: ski.engine.projection_lag(APP_ID).unwrap_or(0),
        queued_requests: ski.engine.health().queue_depth.iter().sum(),
        rides: ski.store.ride_count(),
    })
}

pub(crate) fn routes(engine: EngineHandle, store: Arc<RideStore>, config: SkiConfig) -> AppRouter {
    let stats = EndpointStats::new(&ENDPOINTS);
    let ski = Arc::new(Ski {
        engine,
        store,
        config,
        stats: stats.clone(),
    });
    AppRouter::new()
        .routes(routes!(post_ride, get_day_vertical))
        .routes(routes!(get_resorts))
        .routes(routes!(get_seasons, post_season))
        .routes(routes!(get_resort_day_skiers))
        .routes(routes!(get_resort_days))
        .routes(routes!(get_skier_vertical))
        .routes(routes!(get_days))
        .routes(routes!(get_lifts))
        .routes(routes!(get_statistics))
        .routes(routes!(get_lag))
        .route_layer(axum::middleware::from_fn_with_state(
            stats,
            crate::stats::record,
        ))
        .with_state(ski)
}
