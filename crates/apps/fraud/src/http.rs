//! fraud's HTTP routes.
//!
//! - `POST /fraud/transactions`: one transaction object or an array of them (fields named as in the spec:
//!   `card, timestamp, country, response, amount, currency, merchant, city, code`, each a string of digits
//!   of the spec's width; `timestamp` and `amount` may also be JSON integers) → 200
//!   `{"scored", "flagged", "results": [{"fraud", "rule"}]}` in input order. Honours `Idempotency-Key`.
//! - `GET /fraud/cards/{card}` → the card's stored history with verdicts, newest first; the card masked.
//! - `GET /fraud/stats` → counts over all partitions, per-rule counts, memory per stored transaction, rate.
//! - `POST /fraud/history/generate` `{"cards", "length"?, "now_ms"?, "seeds"?: {"country", "merchant",
//!   "city", "amount", "response", "timestamp"}}` → generates the case study's history in place on every
//!   partition (a command, so replay regenerates it).

use crate::command::{Command, GenerateHistory};
use crate::generator::{
    CASE_STUDY_HISTORY_LEN, HISTORY_NOW_MS_MAX, HISTORY_WINDOW_MS, HistoryGenerator, Seeds,
    TIMESTAMP_MS_MAX,
};
use crate::history::UNSCORED;
use crate::ingest::{BatchKind, Ingest, IngestError};
use crate::record::{Digits, FIELD_NAMES, Txn, mask_card, parse_field};
use crate::state::{FraudState, PartitionStats, STATS_QUERY, card_key};
use crate::{APP_ID, APP_NAME};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use spate_server::api::{IdempotencyKey, JsonObject, json as json_response};
use spate_server::openapi::AppRouter;
use spate_server::{ApiError, ApiJson};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};
use utoipa_axum::routes;

/// Most transactions one request may carry.
pub const TXNS_PER_REQUEST_MAX: usize = 10_000;
/// How long a request waits for room in a full partition queue before answering 503.
const QUEUE_PATIENCE: Duration = Duration::from_secs(2);

/// The tag for fraud's routes in the API description.
const TAG: &str = "fraud";

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

pub fn routes(ingest: Ingest, entries_per_card_max: usize) -> AppRouter {
    let rate_per_s = Arc::new(AtomicU64::new(0));
    tokio::spawn(sample_rate(ingest.clone(), rate_per_s.clone()));
    AppRouter::new()
        .routes(routes!(score))
        .routes(routes!(card))
        .routes(routes!(stats))
        .routes(routes!(generate))
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

/// The body of `POST /fraud/transactions`: one transaction or an array of them. [`txn_from_json`]
/// reads it field by field, to name the field at fault, so its description is written out here.
#[derive(Deserialize)]
#[serde(transparent)]
struct Transactions(Value);

/// The name of a transaction's schema in the description.
const TRANSACTION_SCHEMA: &str = "Transaction";

impl PartialSchema for Transactions {
    fn schema() -> RefOr<Schema> {
        let one = Ref::from_schema_name(TRANSACTION_SCHEMA);
        let many = ArrayBuilder::new()
            .items(one.clone())
            .min_items(Some(1))
            .max_items(Some(TXNS_PER_REQUEST_MAX));
        OneOfBuilder::new()
            .description(Some(format!(
                "One transaction, or an array of 1 to {TXNS_PER_REQUEST_MAX} scored in order."
            )))
            .item(one)
            .item(many)
            .into()
    }
}

impl ToSchema for Transactions {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((TRANSACTION_SCHEMA.into(), transaction_schema()));
    }
}

/// A transaction as [`txn_from_json`] reads it: the record format's fields, each a string of digits
/// of the field's width (`parse_field`), `timestamp` and `amount` also as JSON integers.
fn transaction_schema() -> RefOr<Schema> {
    let digits = |widths: &str| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(format!("^[0-9]{{{widths}}}$")))
    };
    let digits_or_integer = |widths: &str, minimum: u64, maximum: u64| {
        OneOfBuilder::new().item(digits(widths)).item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(minimum))
                .maximum(Some(maximum)),
        )
    };
    let described = |schema: ObjectBuilder, description: &str| -> RefOr<Schema> {
        schema.description(Some(description)).into()
    };
    let fields: [(&str, RefOr<Schema>); 9] = [
        (
            "card",
            described(digits("14"), "The card number; it is stored encrypted."),
        ),
        (
            "timestamp",
            digits_or_integer("1,19", HISTORY_WINDOW_MS + 1, TIMESTAMP_MS_MAX)
                .description(Some(
                    "When, in ms since the epoch: later than 90 days after it, at most 19 digits.",
                ))
                .into(),
        ),
        ("country", described(digits("3"), "Country code.")),
        ("response", described(digits("2"), "Response code.")),
        (
            "amount",
            digits_or_integer("1,10", 0, crate::record::AMOUNT_MAX)
                .description(Some("The amount, at most 2147483647."))
                .into(),
        ),
        ("currency", described(digits("3"), "Currency code.")),
        ("merchant", described(digits("4"), "Merchant code.")),
        ("city", described(digits("5"), "City code.")),
        (
            "code",
            described(digits("1,10"), "Transaction code; leading zeros count."),
        ),
    ];
    let mut transaction = ObjectBuilder::new()
        .description(Some(
            "A card transaction, as the case study's records have it: each field a string of \
             digits of its width, leading zeros kept.",
        ))
        .additional_properties(Some(AdditionalProperties::FreeForm(false)));
    for (name, schema) in fields {
        transaction = transaction.property(name, schema).required(name);
    }
    transaction.into()
}

/// Verdicts on the transactions of a request.
#[derive(Serialize, ToSchema)]
struct ScoreAnswer {
    /// Transactions scored: all of the request's.
    scored: u64,
    /// Transactions a rule flagged.
    flagged: u64,
    /// One per transaction, in the request's order.
    results: Vec<Verdict>,
}

#[derive(Serialize, ToSchema)]
struct Verdict {
    /// Whether a rule flagged the transaction.
    fraud: bool,
    /// The rule that flagged it; 0 when none did.
    rule: u8,
}

/// Scores transactions against their cards' histories, then stores them with their verdicts.
///
/// Answered once they are durable.
#[utoipa::path(
    post,
    path = "/fraud/transactions",
    tag = TAG,
    operation_id = "scoreTransactions",
    params(IdempotencyKey),
    request_body = Transactions,
    responses(
        (status = 200, description = "Durable; the verdicts.", body = ScoreAnswer),
        (status = 400, description = "`bad_request`: a transaction is not as described; the message names it and its field.", body = spate_server::api::ErrorBody),
        (status = 415, description = "The body's `Content-Type` is not `application/json`.", body = spate_server::api::ErrorBody),
    ),
)]
async fn score(
    State(context): State<Context>,
    idempotency_key: IdempotencyKey,
    ApiJson(Transactions(body)): ApiJson<Transactions>,
) -> Result<Response, ApiError> {
    let batch_id = idempotency_key.command_id(APP_NAME)?;
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
    let answer = ScoreAnswer {
        scored: outcome.scored,
        flagged: outcome.flagged,
        results: (outcome.verdicts.iter())
            .map(|&rule| Verdict {
                fraud: rule != 0,
                rule,
            })
            .collect(),
    };
    Ok(json_response(StatusCode::OK, &answer))
}

/// A card's stored history.
#[derive(Serialize, ToSchema)]
struct CardHistory {
    /// The card, all but its last four digits masked.
    #[schema(example = "**********0042")]
    card: String,
    /// Newest first.
    transactions: Vec<StoredTransaction>,
}

/// A stored transaction, its fields as the record format writes them, and its verdict.
#[derive(Serialize, ToSchema)]
struct StoredTransaction {
    timestamp: String,
    country: String,
    response: String,
    amount: String,
    currency: String,
    merchant: String,
    city: String,
    code: String,
    /// Whether a rule flagged it; null for a transaction stored unscored (a generated history's).
    #[schema(required = true)]
    fraud: Option<bool>,
    /// The rule that flagged it, 0 when none did; null when unscored.
    #[schema(required = true)]
    rule: Option<u8>,
}

impl StoredTransaction {
    fn new(txn: &Txn, verdict: u8) -> Self {
        let scored = verdict != UNSCORED;
        Self {
            timestamp: txn.timestamp.to_string(),
            country: format!("{:03}", txn.country),
            response: format!("{:02}", txn.response),
            amount: txn.amount.to_string(),
            currency: format!("{:03}", txn.currency),
            merchant: format!("{:04}", txn.merchant),
            city: format!("{:05}", txn.city),
            code: txn.code.to_string(),
            fraud: scored.then_some(verdict != 0),
            rule: scored.then_some(verdict),
        }
    }
}

/// A card's stored transactions with their verdicts, newest first.
#[utoipa::path(
    get,
    path = "/fraud/cards/{card}",
    tag = TAG,
    operation_id = "getCardHistory",
    params(("card" = String, Path, description = "The card number, 14 digits.", pattern = "^[0-9]{14}$")),
    responses(
        (status = 200, description = "The card's history.", body = CardHistory),
        (status = 400, description = "`bad_request`: the card is not 14 digits.", body = spate_server::api::ErrorBody),
        (status = 404, description = "`not_found`: no transaction of this card is stored.", body = spate_server::api::ErrorBody),
    ),
)]
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
    let answer = CardHistory {
        card: mask_card(digits.value),
        transactions: (history.iter())
            .map(|(txn, verdict)| StoredTransaction::new(txn, *verdict))
            .collect(),
    };
    Ok(json_response(StatusCode::OK, &answer))
}

/// Counts over every partition.
#[derive(Serialize, ToSchema)]
struct FraudStats {
    /// Transactions scored.
    scored: u64,
    /// Transactions a rule flagged.
    flagged: u64,
    /// Transactions stored unscored (a generated or imported history).
    imported: u64,
    /// Flagged transactions per rule, for the rules that flagged any.
    flagged_by_rule: BTreeMap<String, u64>,
    /// Cards with a history.
    cards: u64,
    /// Transactions in the histories.
    stored_transactions: u64,
    /// Memory the histories take.
    history_bytes: u64,
    history_bytes_per_transaction: f64,
    /// Transactions scored in the last second.
    rate_per_s: u64,
}

/// Counts over every partition: transactions scored, flagged (per rule) and stored, and the memory
/// the histories take.
#[utoipa::path(
    get,
    path = "/fraud/stats",
    tag = TAG,
    operation_id = "getFraudStats",
    responses((status = 200, description = "The counts.", body = FraudStats)),
)]
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
    let flagged_by_rule = (total.flagged_by_rule.iter().enumerate())
        .filter(|(_, n)| **n > 0)
        .map(|(rule, n)| (rule.to_string(), *n))
        .collect();
    let answer = FraudStats {
        scored: total.scored,
        flagged: total.flagged(),
        imported: total.imported,
        flagged_by_rule,
        cards,
        stored_transactions: entries,
        history_bytes: heap_bytes,
        history_bytes_per_transaction: if entries > 0 {
            heap_bytes as f64 / entries as f64
        } else {
            0.0
        },
        rate_per_s: context.rate_per_s.load(Ordering::Relaxed),
    };
    Ok(json_response(StatusCode::OK, &answer))
}

/// A history to generate: `cards` cards (0 to `cards` - 1) of `length` transactions each, with
/// timestamps in the 90 days before `now_ms`, drawn by the case study's generator from `seeds`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct GenerateBody {
    /// Cards. `cards` x `length` may be at most 10,000,000,000, and the history must fit in 80% of
    /// the memory the machine has available.
    #[schema(minimum = 1, maximum = 2147483647)]
    cards: u32,
    /// Transactions per card, 20 (the case study's) when absent; a card keeps the newest
    /// `--fraud-entries-per-card` (32 unless set).
    #[schema(maximum = 1000)]
    length: Option<u32>,
    /// The end of the history, in ms since the epoch: now when absent. Later than 90 days after the
    /// epoch, and at most 10^19 (a timestamp has at most 19 digits).
    #[schema(minimum = 7776000001_u64, maximum = 10000000000000000000_u64)]
    now_ms: Option<u64>,
    #[serde(default)]
    seeds: SeedsBody,
}

/// Generator seeds (Java `Random` seeds); each defaults to the case study's.
#[derive(Deserialize, Default, ToSchema)]
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

/// The history generated.
#[derive(Serialize, ToSchema)]
struct GenerateAnswer {
    /// Transactions stored, over every partition.
    stored: u64,
    /// The end of the history.
    now_ms: u64,
    /// How long the partitions took.
    elapsed_ms: u64,
}

/// Generates the case study's card history in place on every partition: its transactions are added to
/// the cards' histories, unscored.
///
/// An operator's route (`admin` under `--auth`): it takes memory and time in proportion to the
/// history, about 80 s and 17 GB for 30 M cards x 20. It is generated in parts of 100,000 records, and
/// the partitions apply other commands between them. A generation cut short (a crash, a stop, a
/// refusal) keeps the parts it stored: send the same request again, with the same `Idempotency-Key`
/// and `now_ms`, to store the rest without storing any part twice.
#[utoipa::path(
    post,
    path = GENERATE_ROUTE,
    tag = TAG,
    operation_id = "generateHistory",
    params(IdempotencyKey),
    request_body = GenerateBody,
    responses(
        (status = 200, description = "The history is stored.", body = GenerateAnswer),
        (status = 400, description = "`bad_request`: a value is out of its range, or `cards` x `length` is over 10,000,000,000.", body = spate_server::api::ErrorBody),
        (status = 413, description = "`not_enough_memory`: the history would take more than 80% of the memory available; or the body is over the size limit.", body = spate_server::api::ErrorBody),
        (status = 415, description = "The body's `Content-Type` is not `application/json`.", body = spate_server::api::ErrorBody),
    ),
)]
async fn generate(
    State(context): State<Context>,
    idempotency_key: IdempotencyKey,
    ApiJson(JsonObject(body)): ApiJson<JsonObject<GenerateBody>>,
) -> Result<Response, ApiError> {
    let length = body.length.unwrap_or(CASE_STUDY_HISTORY_LEN);
    if body.cards == 0
        || body.cards > GenerateHistory::CARDS_MAX
        || length > GenerateHistory::LEN_MAX
    {
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
    let request_id = idempotency_key.command_id(APP_NAME)?;
    let started = std::time::Instant::now();
    let plan = HistoryPlan {
        seeds: body.seeds.seeds(),
        cards: body.cards,
        len: length,
        now_ms,
    };
    // On a task of its own, so that a client that goes away does not leave half a history.
    let stored = tokio::spawn(generate_in_parts(context.ingest.clone(), plan, request_id))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "generation_failed",
                e.to_string(),
            )
        })??;
    let answer = GenerateAnswer {
        stored,
        now_ms,
        elapsed_ms: started.elapsed().as_millis() as u64,
    };
    Ok(json_response(StatusCode::OK, &answer))
}

/// A whole history to generate, as a request asked for it.
struct HistoryPlan {
    seeds: Seeds,
    cards: u32,
    len: u32,
    now_ms: u64,
}

/// Records a part of a generated history draws. Every partition draws them all and keeps its own, so
/// a part holds a partition for about as long as drawing them takes: short enough that other apps'
/// commands on it wait little (the part's time is in BENCHMARKS.md).
const GENERATED_RECORDS_PER_PART: u64 = 100_000;
/// Parts queued on each partition besides the one it applies, so that it never waits for the next
/// while this task finds it; a command behind them waits for about this many parts more.
const GENERATED_PARTS_AHEAD: usize = 1;

/// Generates `plan`'s history as parts of whole cards, in order, each sent to every partition with the
/// streams' state at its first card (found here by drawing without building records), with at most
/// [`GENERATED_PARTS_AHEAD`] parts queued on each partition. Returns the transactions stored.
async fn generate_in_parts(
    ingest: Ingest,
    plan: HistoryPlan,
    request_id: Option<u128>,
) -> Result<u64, ApiError> {
    let partitions = ingest.engine().partition_count();
    // A history of empty cards draws nothing: one part.
    let cards_per_part = GENERATED_RECORDS_PER_PART
        .checked_div(u64::from(plan.len))
        .map_or(plan.cards, |cards| {
            cards.clamp(1, u64::from(u32::MAX)) as u32
        });
    let mut walker = HistoryGenerator::new(&plan.seeds, plan.cards, plan.len, plan.now_ms);
    let mut queued = std::collections::VecDeque::new();
    let mut stored = 0u64;
    let mut part = 0u32;
    loop {
        let from = walker.cursor();
        if from.card == plan.cards {
            break;
        }
        let cards_end = from.card.saturating_add(cards_per_part).min(plan.cards);
        for partition in 0..partitions {
            let command = Command::Generate(GenerateHistory {
                from,
                cards_end,
                cards_total: plan.cards,
                len: plan.len,
                now_ms: plan.now_ms,
                partition,
                partitions,
            });
            let command_id =
                request_id.map(|id| crate::ingest::generation_part_id(id, part, partition));
            let payload = ingest.seal(&command.encode());
            queued.push_back(
                ingest
                    .enqueue_sealed(partition, command_id, payload, None)
                    .await?,
            );
        }
        while queued.len() > GENERATED_PARTS_AHEAD * usize::from(partitions) {
            stored += stored_by(queued.pop_front().expect("more than none queued")).await?;
        }
        // Drawing without building records: about 0.2 ms a part, short enough for this runtime's
        // thread (a blocking task's hand-offs cost more, measured, on two busy cores).
        walker.skip_to(cards_end);
        part += 1;
    }
    for pending in queued {
        stored += stored_by(pending).await?;
    }
    Ok(stored)
}

/// The transactions a part of a generated history stored.
async fn stored_by(pending: spate_engine::Pending) -> Result<u64, ApiError> {
    let reply = spate_server::api::reply_bytes(pending.reply().await?)?;
    let reply = crate::command::BatchReply::decode(&reply).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "bad_reply",
            e.to_string(),
        )
    })?;
    Ok(u64::from(reply.stored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_is_described_with_the_record_fields_in_order() {
        let RefOr::T(Schema::Object(transaction)) = transaction_schema() else {
            panic!("a transaction is described by an object schema");
        };
        let described: Vec<&str> = transaction.properties.keys().map(String::as_str).collect();
        assert_eq!(described, FIELD_NAMES);
        assert_eq!(transaction.required, FIELD_NAMES);
    }
}
