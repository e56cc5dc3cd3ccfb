//! fraud's HTTP routes.
//!
//! - `POST /fraud/transactions`: one transaction object or an array of them (fields named as in the spec:
//!   `card, timestamp, country, response, amount, currency, merchant, city, code`, each a string of digits
//!   of the spec's width; `timestamp` and `amount` may also be JSON integers) → 200
//!   `{"scored", "flagged", "results": [{"fraud", "rule"}]}` in input order. Honours `Idempotency-Key`.
//! - `GET /fraud/cards/{card}` → the card's stored history with verdicts, newest first.
//! - `GET /fraud/stats` → counts over all partitions, per-rule counts, memory per stored transaction, rate.
//! - `POST /fraud/history/generate` `{"cards", "length"?, "now_ms"?, "seeds"?: {"country", "merchant",
//!   "city", "amount", "response", "timestamp"}}` → generates the case study's history in place on every
//!   partition (a command, so replay regenerates it).

use crate::command::{Command, GenerateHistory};
use crate::generator::{CASE_STUDY_HISTORY_LEN, HISTORY_NOW_MS_MAX, HISTORY_WINDOW_MS, Seeds};
use crate::history::UNSCORED;
use crate::ingest::{BatchKind, Ingest, IngestError};
use crate::record::{Digits, FIELD_NAMES, Txn, parse_field};
use crate::state::{FraudState, PartitionStats, STATS_QUERY, card_key};
use crate::{APP_ID, APP_NAME};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use spate_server::api::{command_id, json as json_response};
use spate_server::{ApiError, ApiJson};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Most transactions one request may carry.
pub const TXNS_PER_REQUEST_MAX: usize = 10_000;
/// How long a request waits for room in a full partition queue before answering 503.
const QUEUE_PATIENCE: Duration = Duration::from_secs(2);

#[derive(Clone)]
struct Context {
    ingest: Ingest,
    rate_per_s: Arc<AtomicU64>,
    /// The most entries a card's history keeps (`--fraud-entries-per-card`).
    entries_per_card_max: usize,
}

/// Generating a history takes memory and partition time in proportion to what it asks for: an
/// operator's job, not a client's.
pub const ROUTE_ACCESS: spate_server::access::RouteAccess = spate_server::access::RouteAccess {
    admin_routes: &[GENERATE_ROUTE],
    party_kind: None,
    party_routes: &[],
};
const GENERATE_ROUTE: &str = "/fraud/history/generate";

pub fn routes(ingest: Ingest, entries_per_card_max: usize) -> Router {
    let rate_per_s = Arc::new(AtomicU64::new(0));
    tokio::spawn(sample_rate(ingest.clone(), rate_per_s.clone()));
    Router::new()
        .route("/fraud/transactions", post(score))
        .route("/fraud/cards/{card}", get(card))
        .route("/fraud/stats", get(stats))
        .route(GENERATE_ROUTE, post(generate))
        .with_state(Context {
            ingest,
            rate_per_s,
            entries_per_card_max,
        })
}

async fn sample_rate(ingest: Ingest, rate_per_s: Arc<AtomicU64>) {
    let mut interval = tokio::time::interval(Duration::from_secs(1));
    let mut previous = ingest.metrics().scored_total();
    loop {
        interval.tick().await;
        let now = ingest.metrics().scored_total();
        rate_per_s.store(now - previous, Ordering::Relaxed);
        previous = now;
    }
}

fn field_error(at: &str, field: &str, problem: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("{at}{field}: {problem}"))
}

/// A JSON transaction, checked field by field with the record format's rules.
fn txn_from_json(value: &Value, at: &str) -> Result<Txn, ApiError> {
    let object = value.as_object().ok_or_else(|| {
        ApiError::bad_request(format!("{at}: a transaction must be a JSON object"))
    })?;
    if let Some(unknown) = object.keys().find(|k| !FIELD_NAMES.contains(&k.as_str())) {
        return Err(field_error(at, unknown, "unknown field"));
    }
    let mut fields = [Digits::default(); 9];
    for (index, name) in FIELD_NAMES.iter().enumerate() {
        let text = match object.get(*name) {
            None => return Err(field_error(at, name, "missing")),
            Some(Value::String(text)) => text.clone(),
            Some(Value::Number(number))
                if matches!(*name, "timestamp" | "amount") && number.is_u64() =>
            {
                number.to_string()
            }
            Some(_) => return Err(field_error(at, name, "must be a string of digits")),
        };
        fields[index] =
            parse_field(index, text.as_bytes()).map_err(|e| field_error(at, name, e))?;
    }
    let txn = Txn::from_fields(fields).map_err(|e| field_error(at, "amount", e))?;
    if txn.timestamp_ms() <= HISTORY_WINDOW_MS {
        return Err(field_error(
            at,
            "timestamp",
            "must be later than 90 days after the epoch",
        ));
    }
    Ok(txn)
}

fn ingest_error(error: IngestError) -> ApiError {
    match error {
        IngestError::Engine(error) => error.into(),
        IngestError::InFlight => {
            ApiError::new(StatusCode::CONFLICT, "in_flight", error.to_string())
        }
        IngestError::Conflict => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_conflict",
            "this Idempotency-Key was used with a different body",
        ),
        IngestError::Rejected(message) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "rejected", message)
        }
    }
}

async fn score(
    State(context): State<Context>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let batch_id = command_id(&headers, APP_NAME)?;
    let txns = match &body {
        Value::Array(items) => {
            if items.is_empty() || items.len() > TXNS_PER_REQUEST_MAX {
                return Err(ApiError::bad_request(format!(
                    "send 1 to {TXNS_PER_REQUEST_MAX} transactions per request, got {}",
                    items.len()
                )));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, item)| txn_from_json(item, &format!("[{i}].")))
                .collect::<Result<Vec<_>, _>>()?
        }
        single => vec![txn_from_json(single, "")?],
    };
    let outcome = context
        .ingest
        .enqueue(
            BatchKind::Score {
                want_verdicts: true,
            },
            batch_id,
            &txns,
            Some(QUEUE_PATIENCE),
        )
        .await?
        .outcome()
        .await
        .map_err(ingest_error)?;
    let results: Vec<Value> = outcome
        .verdicts
        .iter()
        .map(|rule| json!({"fraud": *rule != 0, "rule": rule}))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({"scored": outcome.scored, "flagged": outcome.flagged, "results": results}),
    ))
}

async fn card(
    State(context): State<Context>,
    Path(card): Path<String>,
) -> Result<Response, ApiError> {
    let digits = parse_field(0, card.as_bytes())
        .map_err(|_| ApiError::bad_request("card must be exactly 14 digits"))?;
    let engine = context.ingest.engine();
    let partition = engine.partition_of(&card_key(digits.value));
    let history = engine
        .query::<FraudState, _>(partition, APP_ID, move |state| {
            state.store().history(digits.value)
        })
        .await?;
    if history.is_empty() {
        return Err(ApiError::not_found("no stored transactions for this card"));
    }
    let transactions: Vec<Value> = history
        .iter()
        .map(|(txn, verdict)| {
            let mut entry = Map::new();
            entry.insert("timestamp".into(), txn.timestamp.to_string().into());
            entry.insert("country".into(), format!("{:03}", txn.country).into());
            entry.insert("response".into(), format!("{:02}", txn.response).into());
            entry.insert("amount".into(), txn.amount.to_string().into());
            entry.insert("currency".into(), format!("{:03}", txn.currency).into());
            entry.insert("merchant".into(), format!("{:04}", txn.merchant).into());
            entry.insert("city".into(), format!("{:05}", txn.city).into());
            entry.insert("code".into(), txn.code.to_string().into());
            let scored = *verdict != UNSCORED;
            entry.insert(
                "fraud".into(),
                if scored {
                    (*verdict != 0).into()
                } else {
                    Value::Null
                },
            );
            entry.insert(
                "rule".into(),
                if scored {
                    (*verdict).into()
                } else {
                    Value::Null
                },
            );
            Value::Object(entry)
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({"card": card, "transactions": transactions}),
    ))
}

async fn stats(State(context): State<Context>) -> Result<Response, ApiError> {
    let engine = context.ingest.engine();
    let mut sum = PartitionStats::default();
    for partition in 0..engine.partition_count() {
        let answer = engine.read(partition, APP_ID, STATS_QUERY.to_vec()).await?;
        let part = PartitionStats::decode(&answer).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "bad_reply",
                format!("partition {partition} answered its stats badly: {e}"),
            )
        })?;
        sum.add(&part);
    }
    let PartitionStats {
        stats: total,
        cards,
        entries,
        heap_bytes,
    } = sum;
    let by_rule: Map<String, Value> = total
        .flagged_by_rule
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(rule, n)| (rule.to_string(), (*n).into()))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "scored": total.scored,
            "flagged": total.flagged(),
            "imported": total.imported,
            "flagged_by_rule": by_rule,
            "cards": cards,
            "stored_transactions": entries,
            "history_bytes": heap_bytes,
            "history_bytes_per_transaction": if entries > 0 { heap_bytes as f64 / entries as f64 } else { 0.0 },
            "rate_per_s": context.rate_per_s.load(Ordering::Relaxed),
        }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GenerateBody {
    cards: u32,
    length: Option<u32>,
    now_ms: Option<u64>,
    #[serde(default)]
    seeds: SeedsBody,
}

/// Generator seeds; each defaults to the case study's.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SeedsBody {
    country: Option<i64>,
    merchant: Option<i64>,
    city: Option<i64>,
    amount: Option<i64>,
    response: Option<i64>,
    timestamp: Option<i64>,
}

impl SeedsBody {
    fn seeds(&self) -> Seeds {
        let default = Seeds::default();
        Seeds {
            country: self.country.unwrap_or(default.country),
            merchant: self.merchant.unwrap_or(default.merchant),
            city: self.city.unwrap_or(default.city),
            amount: self.amount.unwrap_or(default.amount),
            response: self.response.unwrap_or(default.response),
            card: default.card,
            timestamp: self.timestamp.unwrap_or(default.timestamp),
        }
    }
}

/// Upper bound on generated history, to keep a typo from filling memory: 100 M cards x 100.
const GENERATED_RECORDS_MAX: u64 = 10_000_000_000;

/// Memory a generated history must leave free, of what the machine has available: the rest of the
/// server (and its snapshots' buffers) needs some.
const GENERATE_MEMORY_HEADROOM_PERCENT: u64 = 20;

/// The machine's available memory (`MemAvailable` in `/proc/meminfo`), if it can be read.
fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo
        .lines()
        .find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

async fn generate(
    State(context): State<Context>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<GenerateBody>,
) -> Result<Response, ApiError> {
    let length = body.length.unwrap_or(CASE_STUDY_HISTORY_LEN);
    if body.cards == 0 || body.cards > i32::MAX as u32 || length > 1000 {
        return Err(ApiError::bad_request(
            "cards must be 1..=2147483647 and length 0..=1000",
        ));
    }
    if u64::from(body.cards) * u64::from(length) > GENERATED_RECORDS_MAX {
        return Err(ApiError::bad_request(format!(
            "at most {GENERATED_RECORDS_MAX} records"
        )));
    }
    let needed_bytes = crate::history::memory_estimate_bytes(
        u64::from(body.cards),
        length as usize,
        context.entries_per_card_max,
    );
    if let Some(available) = available_memory_bytes() {
        let allowed = available / 100 * (100 - GENERATE_MEMORY_HEADROOM_PERCENT);
        if needed_bytes > allowed {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "not_enough_memory",
                format!(
                    "{} cards x {length} entries would take about {} MiB of memory; this machine \
                     has {} MiB available, of which a history may take {} MiB",
                    body.cards,
                    needed_bytes >> 20,
                    available >> 20,
                    allowed >> 20
                ),
            ));
        }
    }
    let now_ms = body.now_ms.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    });
    if now_ms <= HISTORY_WINDOW_MS || now_ms > HISTORY_NOW_MS_MAX {
        return Err(ApiError::bad_request(format!(
            "now_ms must be later than 90 days after the epoch and at most {HISTORY_NOW_MS_MAX}"
        )));
    }
    let request_id = command_id(&headers, APP_NAME)?;
    let engine = context.ingest.engine();
    let partitions = engine.partition_count();
    let mut pending = Vec::new();
    for partition in 0..partitions {
        let plan = GenerateHistory {
            seeds: body.seeds.seeds(),
            cards: body.cards,
            len: length,
            now_ms,
            partition,
            partitions,
        };
        let payload = context.ingest.seal(&Command::Generate(plan).encode());
        let id = request_id.map(|id| id ^ u128::from(partition));
        pending.push(
            engine
                .enqueue(partition, APP_ID, id, payload)
                .map_err(|r| ApiError::from(r.error))?,
        );
    }
    let started = std::time::Instant::now();
    let mut stored = 0u64;
    for part in pending {
        let reply = spate_server::api::reply_bytes(part.reply().await?)?;
        let reply = crate::command::BatchReply::decode(&reply).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "bad_reply",
                e.to_string(),
            )
        })?;
        stored += u64::from(reply.stored);
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"stored": stored, "now_ms": now_ms, "elapsed_ms": started.elapsed().as_millis() as u64}),
    ))
}
