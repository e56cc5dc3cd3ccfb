//! ski's HTTP routes: the spec's eight operations, two of ours for the seed's other questions, and the
//! consumer's lag. Errors are `{"message": ...}`, as the spec's `ResponseMsg`.
//!
//! The first segment under `/skiers/` is a resortID in the spec's ride path and a skierID in the
//! others, so the routes name it `{first}` (the router needs one name per position).

use crate::command::{Command, Outcome, Ride, vertical_of};
use crate::model::{RideStore, StoreError};
use crate::state::SkiState;
use crate::stats::{Endpoint, EndpointStats};
use crate::{APP_ID, APP_NAME, Bounds, DAYS, SkiConfig};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};
use spate_engine::{EngineError, EngineHandle, Reply};
use spate_server::ApiError;
use spate_server::api::{command_id, reply_bytes};
use std::collections::BTreeSet;
use std::sync::Arc;

const RIDE_ROUTE: &str = "/skiers/{first}/seasons/{season}/days/{day}/skiers/{skier}";
const SEASONS_ROUTE: &str = "/resorts/{resort}/seasons";
const RESORT_DAY_ROUTE: &str = "/resorts/{resort}/seasons/{season}/day/{day}/skiers";
const SKIER_VERTICAL_ROUTE: &str = "/skiers/{first}/vertical";
const DAYS_ROUTE: &str = "/skiers/{first}/seasons/{season}/days";
const LIFTS_ROUTE: &str = "/skiers/{first}/seasons/{season}/days/{day}/lifts";

/// Every endpoint `GET /statistics` reports, with its URL as the spec writes it.
static ENDPOINTS: [Endpoint; 10] = [
    Endpoint {
        method: Method::POST,
        route: RIDE_ROUTE,
        url: "/skiers/{resortID}/seasons/{seasonID}/days/{dayID}/skiers/{skierID}",
    },
    Endpoint {
        method: Method::GET,
        route: RIDE_ROUTE,
        url: "/skiers/{resortID}/seasons/{seasonID}/days/{dayID}/skiers/{skierID}",
    },
    Endpoint {
        method: Method::GET,
        route: "/resorts",
        url: "/resorts",
    },
    Endpoint {
        method: Method::GET,
        route: SEASONS_ROUTE,
        url: "/resorts/{resortID}/seasons",
    },
    Endpoint {
        method: Method::POST,
        route: SEASONS_ROUTE,
        url: "/resorts/{resortID}/seasons",
    },
    Endpoint {
        method: Method::GET,
        route: RESORT_DAY_ROUTE,
        url: "/resorts/{resortID}/seasons/{seasonID}/day/{dayID}/skiers",
    },
    Endpoint {
        method: Method::GET,
        route: SKIER_VERTICAL_ROUTE,
        url: "/skiers/{skierID}/vertical",
    },
    Endpoint {
        method: Method::GET,
        route: DAYS_ROUTE,
        url: "/skiers/{skierID}/seasons/{seasonID}/days",
    },
    Endpoint {
        method: Method::GET,
        route: LIFTS_ROUTE,
        url: "/skiers/{skierID}/seasons/{seasonID}/days/{dayID}/lifts",
    },
    Endpoint {
        method: Method::GET,
        route: "/statistics",
        url: "/statistics",
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

impl IntoResponse for SkiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "message": self.message }))).into_response();
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
/// body over the server's limit, an unknown path), by the server's `api::shape_errors`.
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
        headers: &HeaderMap,
        command: Command,
    ) -> Result<Outcome, SkiError> {
        let id = command_id(headers, APP_NAME)?;
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

/// The spec's `LiftRide`; `waitTime` (sent by clients of older versions) is accepted and ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LiftRideBody {
    time: i64,
    #[serde(rename = "liftID")]
    lift_id: i64,
    #[serde(rename = "waitTime", default)]
    _wait_time: Option<IgnoredAny>,
}

/// Parses a JSON object body. serde would also read a struct from an array of its fields in order;
/// the spec's bodies are objects, so anything else is refused.
fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, SkiError> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(SkiError::bad_request(
            "invalid JSON body: expected a JSON object",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| SkiError::bad_request(format!("invalid JSON body: {e}")))
}

async fn post_ride(
    State(ski): Ctx,
    Path((resort, season, day, skier)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SkiError> {
    let config = ski.config;
    let resort = narrow(parse_id("resortID", &resort, config.resorts)?);
    let season = ski.season("seasonID", &season)?;
    let day = ski.day(&day)?;
    let skier = ski.skier(&skier)?;
    let ride: LiftRideBody = parse_json(&body)?;
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
        .submit(&skier_key(skier), &headers, Command::Ride(ride))
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

async fn get_resorts(State(ski): Ctx) -> Response {
    let bounds = ski.config.resorts;
    let resorts: Vec<Value> = (bounds.min..=bounds.max)
        .map(|id| json!({"resortName": resort_name(narrow(id)), "resortID": id}))
        .collect();
    Json(json!({ "resorts": resorts })).into_response()
}

async fn get_seasons(State(ski): Ctx, Path(resort): Path<String>) -> Result<Response, SkiError> {
    let resort = ski.resort(&resort)?;
    let seasons: Vec<String> = ski
        .seasons(resort)
        .await?
        .iter()
        .map(u16::to_string)
        .collect();
    Ok(Json(json!({ "seasons": seasons })).into_response())
}

/// `year` as the spec has it (a 4-character string) or as a JSON integer.
#[derive(Deserialize)]
#[serde(untagged)]
enum Year {
    Text(String),
    Number(i64),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SeasonBody {
    year: Year,
}

async fn post_season(
    State(ski): Ctx,
    Path(resort): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SkiError> {
    let resort = ski.resort(&resort)?;
    let body: SeasonBody = parse_json(&body)?;
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
    match ski.submit(&resort_key(resort), &headers, command).await? {
        // Adding a season twice is not an error: clients retry, and the list is the same afterwards.
        Outcome::SeasonAdded | Outcome::SeasonExisted => Ok(StatusCode::CREATED.into_response()),
        other => Err(unexpected(other)),
    }
}

async fn get_resort_day_skiers(
    State(ski): Ctx,
    Path((resort, season, day)): Path<(String, String, String)>,
) -> Result<Response, SkiError> {
    let resort = ski.resort(&resort)?;
    let season = ski.season("seasonID", &season)?;
    let day = ski.day(&day)?;
    let skiers = ski.store.unique_skiers(resort, season, day);
    // The spec names the resort's name field `time`.
    Ok(Json(json!({ "time": resort_name(resort), "numSkiers": skiers })).into_response())
}

async fn get_skier_vertical(
    State(ski): Ctx,
    Path(skier): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, SkiError> {
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
    let items: Vec<Value> = totals
        .iter()
        .map(|(season, vertical)| json!({"seasonID": season.to_string(), "totalVert": vertical}))
        .collect();
    Ok(Json(json!({ "resorts": items })).into_response())
}

async fn get_days(
    State(ski): Ctx,
    Path((skier, season)): Path<(String, String)>,
) -> Result<Response, SkiError> {
    let skier = ski.skier(&skier)?;
    let season = ski.season("seasonID", &season)?;
    let days = ski.store.days_skied(skier, season)?;
    let items: Vec<Value> = days
        .iter()
        .map(|d| json!({"dayID": d.day, "rides": d.rides, "vertical": d.vertical}))
        .collect();
    Ok(Json(json!({
        "skierID": skier,
        "seasonID": season.to_string(),
        "daysSkied": days.len(),
        "days": items,
    }))
    .into_response())
}

async fn get_lifts(
    State(ski): Ctx,
    Path((skier, season, day)): Path<(String, String, String)>,
) -> Result<Response, SkiError> {
    let skier = ski.skier(&skier)?;
    let season = ski.season("seasonID", &season)?;
    let day = ski.day(&day)?;
    let rides = ski.store.lifts(skier, season, day)?;
    if rides.is_empty() {
        return Err(SkiError::not_found(format!(
            "no rides for skier {skier} on day {day} of season {season}"
        )));
    }
    let lifts: Vec<Value> = rides
        .iter()
        .map(|r| json!({"resortID": r.resort, "time": r.time, "liftID": r.lift, "vertical": vertical_of(r.lift)}))
        .collect();
    let vertical: u64 = rides.iter().map(|r| vertical_of(r.lift)).sum();
    Ok(Json(json!({
        "skierID": skier,
        "seasonID": season.to_string(),
        "dayID": day,
        "vertical": vertical,
        "lifts": lifts,
    }))
    .into_response())
}

async fn get_statistics(State(ski): Ctx) -> Response {
    Json(ski.stats.report()).into_response()
}

/// The consumer's progress: durable rides not yet in the read model, and requests queued before the
/// partitions (the seed's "queue length" was the broker's depth, which these two together replace).
async fn get_lag(State(ski): Ctx) -> Response {
    let lag_records = ski.engine.projection_lag(APP_ID).unwrap_or(0);
    let queued: usize = ski.engine.health().queue_depth.iter().sum();
    let rides = ski.store.ride_count();
    Json(json!({ "lagRecords": lag_records, "queuedRequests": queued, "rides": rides }))
        .into_response()
}

pub(crate) fn routes(engine: EngineHandle, store: Arc<RideStore>, config: SkiConfig) -> Router {
    let stats = EndpointStats::new(&ENDPOINTS);
    let ski = Arc::new(Ski {
        engine,
        store,
        config,
        stats: stats.clone(),
    });
    Router::new()
        .route(RIDE_ROUTE, post(post_ride).get(get_day_vertical))
        .route("/resorts", get(get_resorts))
        .route(SEASONS_ROUTE, get(get_seasons).post(post_season))
        .route(RESORT_DAY_ROUTE, get(get_resort_day_skiers))
        .route(SKIER_VERTICAL_ROUTE, get(get_skier_vertical))
        .route(DAYS_ROUTE, get(get_days))
        .route(LIFTS_ROUTE, get(get_lifts))
        .route("/statistics", get(get_statistics))
        .route("/ski/lag", get(get_lag))
        .route_layer(axum::middleware::from_fn_with_state(
            stats,
            crate::stats::record,
        ))
        .with_state(ski)
}
