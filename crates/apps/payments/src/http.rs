//! The payments API (PaymentIntents with manual capture as the model): `/v1/payments`, its captures,
//! cancels and refunds, the list and the events feed; `/admin/reload`, `/admin/reference` and
//! `/admin/settlements`.
//!
//! The edge does all work that needs the card number or the CVC: it checks them, seals the number,
//! computes the token and keeps the CVC's verdict only. Commands carry no clear card data.

use crate::card::{CardNumber, check_expiry, cvc_matches};
use crate::command::{
    Authorize, Command, Payment, PaymentId, ROUTE_BYTES, Refusal, Reply, Scoring, Status,
    StoredCard, Tax, decode, encode,
};
use crate::keys::Keyring;
use crate::model::{CursorExpired, FeedEntry, FeedPosition, ListFilter, PaymentsModel};
use crate::reference::{ReferenceData, currency_numeric, included_tax};
use crate::settle::{Settler, batch_name};
use crate::state::{PartitionQuery, PaymentsState};
use crate::{APP_ID, APP_NAME, reference::Reference};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use spate_engine::{EngineHandle, PartitionId};
use spate_server::ApiError;
use spate_server::access::{RouteAccess, Scope};
use spate_server::api::{command_id, json as json_response, reply_bytes};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Stripe's bound: amounts up to 999,999.99 in a two-decimal currency.
pub const AMOUNT_MAX: u64 = 99_999_999;
pub const METADATA_KEYS_MAX: usize = 20;
pub const METADATA_KEY_CHARS_MAX: usize = 40;
pub const METADATA_VALUE_CHARS_MAX: usize = 500;
pub const PAGE_LIMIT_MAX: usize = 100;
const PAGE_LIMIT_DEFAULT: usize = 10;
const TICK_INTERVAL: Duration = Duration::from_secs(1);

pub struct Payments {
    pub engine: EngineHandle,
    pub keyring: Arc<Keyring>,
    pub reference: Arc<Reference>,
    pub model: Arc<RwLock<PaymentsModel>>,
    pub settler: Arc<Settler>,
}

type Shared = State<Arc<Payments>>;

/// A merchant's key (`payments:merchant:ID`) authorizes, lists, reads, captures, cancels and refunds
/// its own payments; the events feed and `/admin/` are the operator's.
pub const ROUTE_ACCESS: RouteAccess = RouteAccess {
    admin_routes: &[],
    party_kind: Some("merchant"),
    party_routes: &[
        "/v1/payments",
        "/v1/payments/{id}",
        "/v1/payments/{id}/capture",
        "/v1/payments/{id}/cancel",
        "/v1/payments/{id}/refunds",
    ],
};

pub fn routes(payments: Arc<Payments>) -> Router {
    let authorized = (payments.model.read())
        .expect("the payments model lock is never poisoned")
        .authorized();
    spate_server::api::spawn_ticks(
        payments.engine.clone(),
        APP_ID,
        TICK_INTERVAL,
        encode(&Command::Tick),
        move || authorized.load(std::sync::atomic::Ordering::Relaxed) > 0,
    );
    Router::new()
        .route("/v1/payments", post(authorize).get(list))
        .route("/v1/payments/{id}", get(get_payment))
        .route("/v1/payments/{id}/capture", post(capture))
        .route("/v1/payments/{id}/cancel", post(cancel))
        .route("/v1/payments/{id}/refunds", post(refund))
        .route("/v1/events", get(events))
        .route("/admin/reload", post(reload))
        .route("/admin/reference", get(reference_summary))
        .route("/admin/settlements", post(settle))
        .route("/admin/settlements/{batch}/files", post(regenerate))
        .with_state(payments)
}

/// Digit runs this long are hidden from error messages: a parser's message can quote the value it
/// refused, and that value may be a card number.
const REDACTED_DIGITS_MIN: usize = 6;

fn redact_digits(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut run = String::new();
    for c in message.chars().chain(std::iter::once('\0')) {
        if c.is_ascii_digit() {
            run.push(c);
            continue;
        }
        if run.len() >= REDACTED_DIGITS_MIN {
            out.push_str("[redacted]");
        } else {
            out.push_str(&run);
        }
        run.clear();
        if c != '\0' {
            out.push(c);
        }
    }
    out
}

/// Parses a JSON body (any content type; an empty body is `{}`), with errors that name the problem
/// without quoting card data.
fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("invalid body: {}", redact_digits(&e.to_string())))
    })
}

fn require_key(headers: &HeaderMap) -> Result<spate_engine::CommandId, ApiError> {
    command_id(headers, APP_NAME)?.ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_required",
            "every POST needs an Idempotency-Key header (1 to 255 bytes)",
        )
    })
}

fn parse_id(text: &str) -> Result<PaymentId, ApiError> {
    PaymentId::parse(text).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "payment_not_found",
            format!("{text:?} is not a payment id (pay_ and 40 lowercase hex digits)"),
        )
    })
}

fn check_amount(field: &str, amount: u64) -> Result<u64, ApiError> {
    if (1..=AMOUNT_MAX).contains(&amount) {
        Ok(amount)
    } else {
        Err(ApiError::bad_request(format!(
            "{field} must be 1 to {AMOUNT_MAX} (minor units), got {amount}"
        )))
    }
}

fn seconds(ms: u64) -> u64 {
    ms / 1000
}

fn rate_percent(ppm: u64) -> String {
    let (whole, fraction) = (ppm / 10_000, ppm % 10_000);
    if fraction == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{fraction:04}")
            .trim_end_matches('0')
            .to_string()
    }
}

/// The payment object as the API shows it.
pub fn payment_json(p: &Payment) -> Value {
    let captures: Vec<Value> = p
        .captures
        .iter()
        .enumerate()
        .map(|(index, c)| {
            json!({
                "id": p.capture_id(index),
                "amount": c.amount,
                "status": c.status.name(),
                "batch": c.batch.map(batch_name),
                "created": seconds(c.created_ms),
            })
        })
        .collect();
    let refunds: Vec<Value> = p
        .refunds
        .iter()
        .enumerate()
        .map(|(index, r)| {
            json!({"id": p.refund_id(index), "amount": r.amount, "created": seconds(r.created_ms)})
        })
        .collect();
    let metadata: serde_json::Map<String, Value> = p
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({
        "id": p.id.to_string(),
        "object": "payment",
        "status": p.status.name(),
        "amount": p.amount,
        "amount_capturable": p.amount_capturable,
        "amount_captured": p.amount_captured(),
        "amount_refunded": p.amount_refunded(),
        "currency": p.currency,
        "merchant": p.merchant,
        "created": seconds(p.created_ms),
        "capture_before": seconds(p.capture_before_ms),
        "card": {
            "masked": p.card.masked,
            "token": p.card.token_text(),
            "exp_month": p.card.exp_month,
            "exp_year": p.card.exp_year,
        },
        "tax_amount": p.tax.amount,
        "tax": {
            "category": p.tax.category,
            "jurisdiction": p.tax.jurisdiction,
            "rate_percent": rate_percent(p.tax.rate_ppm),
        },
        "decline_reason": p.decline_reason,
        "fraud_rule": (p.fraud_rule != 0).then_some(p.fraud_rule),
        "captures": captures,
        "refunds": refunds,
        "metadata": metadata,
    })
}

fn refusal(refusal: Refusal, id: Option<PaymentId>) -> ApiError {
    let name = id.map_or_else(|| "the payment".to_string(), |id| id.to_string());
    match refusal {
        Refusal::NotFound => ApiError::new(
            StatusCode::NOT_FOUND,
            "payment_not_found",
            format!("no payment {name}"),
        ),
        Refusal::Exists => ApiError::new(
            StatusCode::CONFLICT,
            "payment_exists",
            format!("{name} exists; use another Idempotency-Key"),
        ),
        Refusal::WrongStatus { status, action } => ApiError::new(
            StatusCode::CONFLICT,
            "unexpected_state",
            format!("{name} is {}; it cannot be {action}", status.name()),
        ),
        Refusal::ExceedsCapturable { capturable } => ApiError::new(
            StatusCode::BAD_REQUEST,
            "amount_too_large",
            format!("amount exceeds what {name} can still capture ({capturable})"),
        ),
        Refusal::ExceedsRefundable { refundable } => ApiError::new(
            StatusCode::BAD_REQUEST,
            "amount_too_large",
            format!(
                "amount exceeds what {name} can refund ({refundable}: settled captures minus refunds)"
            ),
        ),
        Refusal::AlreadySettled => ApiError::new(
            StatusCode::CONFLICT,
            "capture_settled",
            format!("a capture of {name} has settled; refund it instead of canceling"),
        ),
        Refusal::SettlementInProgress => ApiError::new(
            StatusCode::CONFLICT,
            "settlement_in_progress",
            format!("a capture of {name} is in a settlement batch being written; retry after it"),
        ),
        Refusal::Malformed(message) => ApiError::bad_request(message),
    }
}

/// Submits a command for a payment's partition and renders the reply. A declined authorization answers
/// 402 with the payment; the status is a function of the reply, so a retry gets the same one.
async fn submit(
    payments: &Payments,
    id: PaymentId,
    command_id: spate_engine::CommandId,
    command: &Command,
) -> Result<Response, ApiError> {
    let partition = payments.engine.partition_of(id.route_key());
    let reply = payments
        .engine
        .submit(partition, APP_ID, Some(command_id), encode(command))
        .await?;
    let bytes = reply_bytes(reply)?;
    match decode::<Reply>(&bytes) {
        Ok(Reply::Payment(payment)) => {
            let status = if payment.status == Status::Declined {
                StatusCode::PAYMENT_REQUIRED
            } else {
                StatusCode::OK
            };
            Ok(json_response(status, &payment_json(&payment)))
        }
        Ok(Reply::Refused(r)) => Err(refusal(r, Some(id))),
        Ok(other) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("unexpected reply {other:?}"),
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("undecodable reply: {e}"),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CardRequest {
    number: String,
    exp_month: u8,
    exp_year: u16,
    cvc: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaxRequest {
    category: String,
    jurisdiction: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthorizeRequest {
    amount: u64,
    currency: String,
    merchant: String,
    card: CardRequest,
    tax: TaxRequest,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    capture_method: CaptureMethod,
}

#[derive(Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum CaptureMethod {
    /// Authorize now, capture later with `POST /v1/payments/{id}/capture`.
    #[default]
    Manual,
    /// Capture the whole amount with the authorization.
    Automatic,
}

/// Resolves a request against the reference data into the command; the CVC does not go further.
fn authorize_command(
    request: AuthorizeRequest,
    command_id: spate_engine::CommandId,
    keyring: &Keyring,
    reference: &ReferenceData,
) -> Result<Authorize, ApiError> {
    let amount = check_amount("amount", request.amount)?;
    let currency_numeric = currency_numeric(&request.currency).ok_or_else(|| {
        ApiError::bad_request(format!(
            "currency {:?} is not supported; use one of {}",
            request.currency,
            crate::reference::CURRENCIES
                .iter()
                .map(|(c, _)| *c)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let merchant = reference
        .merchants
        .get(&request.merchant)
        .ok_or_else(|| ApiError::bad_request(format!("unknown merchant {:?}", request.merchant)))?;
    let rate_ppm = reference
        .tax_rate_ppm(&request.tax.category, &request.tax.jurisdiction)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "no tax rate for category {:?} in jurisdiction {:?}",
                request.tax.category, request.tax.jurisdiction
            ))
        })?;
    if request.metadata.len() > METADATA_KEYS_MAX
        || request.metadata.iter().any(|(k, v)| {
            k.is_empty()
                || k.chars().count() > METADATA_KEY_CHARS_MAX
                || v.chars().count() > METADATA_VALUE_CHARS_MAX
        })
    {
        return Err(ApiError::bad_request(format!(
            "metadata holds at most {METADATA_KEYS_MAX} keys of 1 to {METADATA_KEY_CHARS_MAX} characters with values of at most {METADATA_VALUE_CHARS_MAX}"
        )));
    }
    let card = &request.card;
    let number =
        CardNumber::parse(&card.number).map_err(|e| ApiError::bad_request(e.to_string()))?;
    check_expiry(card.exp_month, card.exp_year)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let cvc_matches =
        cvc_matches(&number, &card.cvc).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let token = keyring.token(number.as_str());
    let unique = keyring.digest(b"payment id", &command_id.to_le_bytes());
    let payment = PaymentId::new(
        token[..ROUTE_BYTES]
            .try_into()
            .expect("a token is 32 bytes"),
        unique[..12].try_into().expect("a digest is 32 bytes"),
    );
    Ok(Authorize {
        payment,
        merchant: request.merchant.clone(),
        amount,
        currency: request.currency,
        currency_numeric,
        card: StoredCard {
            token: token[..16].try_into().expect("a token is 32 bytes"),
            masked: number.masked(),
            sealed: keyring.seal(&payment.0, number.as_str()),
            exp_month: card.exp_month,
            exp_year: card.exp_year,
        },
        cvc_matches,
        tax: Tax {
            category: request.tax.category,
            jurisdiction: request.tax.jurisdiction,
            rate_ppm,
            amount: included_tax(amount, rate_ppm),
        },
        capture_window_ms: reference.capture_window_ms(merchant),
        scoring: Scoring {
            enabled: reference.features.fraud_scoring,
            decline: reference.features.decline_on_fraud,
            mcc: merchant.mcc,
            country: merchant.country,
            city: merchant.city,
        },
        metadata: request.metadata.into_iter().collect(),
        capture_now: request.capture_method == CaptureMethod::Automatic,
    })
}

async fn authorize(
    State(payments): Shared,
    scope: Scope,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let command_id = require_key(&headers)?;
    let request: AuthorizeRequest = parse_body(&body)?;
    scope.permits(&request.merchant)?;
    let reference = payments.reference.current();
    let authorize = authorize_command(request, command_id, &payments.keyring, &reference)?;
    let id = authorize.payment;
    submit(
        &payments,
        id,
        command_id,
        &Command::Authorize(Box::new(authorize)),
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaptureRequest {
    amount: Option<u64>,
    final_capture: Option<bool>,
}

/// Every POST on one payment: the key, the id, the body, then the command made from them.
async fn on_payment<T: DeserializeOwned>(
    payments: &Payments,
    scope: &Scope,
    id: &str,
    headers: &HeaderMap,
    body: &[u8],
    command: impl FnOnce(PaymentId, T) -> Result<Command, ApiError>,
) -> Result<Response, ApiError> {
    let command_id = require_key(headers)?;
    let id = parse_id(id)?;
    let request: T = parse_body(body)?;
    if scope.party().is_some() {
        // A payment's merchant never changes, so reading it before the command is as good as in it.
        let merchant = (fetch_payments(payments, &[id]).await?)
            .remove(&id)
            .map(|payment| payment.merchant)
            .ok_or_else(|| refusal(Refusal::NotFound, Some(id)))?;
        scope.permits(&merchant)?;
    }
    submit(payments, id, command_id, &command(id, request)?).await
}

fn optional_amount(amount: Option<u64>) -> Result<Option<u64>, ApiError> {
    amount.map(|a| check_amount("amount", a)).transpose()
}

async fn capture(
    State(payments): Shared,
    scope: Scope,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    on_payment(
        &payments,
        &scope,
        &id,
        &headers,
        &body,
        |payment, r: CaptureRequest| {
            Ok(Command::Capture {
                payment,
                amount: optional_amount(r.amount)?,
                final_capture: r.final_capture.unwrap_or(true),
            })
        },
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

async fn cancel(
    State(payments): Shared,
    scope: Scope,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    on_payment(
        &payments,
        &scope,
        &id,
        &headers,
        &body,
        |payment, Empty {}| Ok(Command::Cancel { payment }),
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundRequest {
    amount: Option<u64>,
}

async fn refund(
    State(payments): Shared,
    scope: Scope,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    on_payment(
        &payments,
        &scope,
        &id,
        &headers,
        &body,
        |payment, r: RefundRequest| {
            Ok(Command::Refund {
                payment,
                amount: optional_amount(r.amount)?,
            })
        },
    )
    .await
}

async fn get_payment(
    State(payments): Shared,
    scope: Scope,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let partition = payments.engine.partition_of(id.route_key());
    let found = payments
        .engine
        .query_archive(partition, APP_ID, move |s: &PaymentsState, archive| {
            s.find_payment(&id, |key| archive.get(key))
                .map(|found| found.as_ref().map(payment_json))
        })
        .await?
        .map_err(ApiError::archive)?;
    let body = found.ok_or_else(|| refusal(Refusal::NotFound, Some(id)))?;
    scope.permits(body["merchant"].as_str().unwrap_or_default())?;
    Ok(json_response(StatusCode::OK, &body))
}

fn query_error(e: axum::extract::rejection::QueryRejection) -> ApiError {
    ApiError::bad_request(e.body_text())
}

fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit.unwrap_or(PAGE_LIMIT_DEFAULT) {
        limit @ 1..=PAGE_LIMIT_MAX => Ok(limit),
        other => Err(ApiError::bad_request(format!(
            "limit must be 1 to {PAGE_LIMIT_MAX}, got {other}"
        ))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    merchant: Option<String>,
    status: Option<String>,
    /// Unix seconds: payments created after this second.
    created_after: Option<u64>,
    starting_after: Option<String>,
    limit: Option<usize>,
}

async fn list(
    State(payments): Shared,
    scope: Scope,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(mut query) = query.map_err(query_error)?;
    // A merchant's key lists its own payments, whether it names itself or not.
    if let Some(party) = scope.party() {
        scope.permits(query.merchant.get_or_insert_with(|| party.to_string()))?;
    }
    let status = query
        .status
        .as_deref()
        .map(|s| {
            Status::parse(s).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "status must be one of {}",
                    Status::ALL.map(Status::name).join(", ")
                ))
            })
        })
        .transpose()?;
    let starting_after = query
        .starting_after
        .as_deref()
        .map(|s| {
            PaymentId::parse(s).ok_or_else(|| {
                ApiError::bad_request(format!("starting_after {s:?} is not a payment id"))
            })
        })
        .transpose()?;
    // A page goes on after the payment it names; one the server does not know lists from the top.
    let starting_after = match starting_after {
        Some(id) => (fetch_payments(&payments, &[id]).await?)
            .remove(&id)
            .map(|p| (p.created_ms, id)),
        None => None,
    };
    let filter = ListFilter {
        merchant: query.merchant,
        status,
        created_from_ms: query
            .created_after
            .map(|s| s.saturating_add(1).saturating_mul(1000)),
        starting_after,
        limit: page_limit(query.limit)?,
    };
    let model = payments.model.clone();
    let page = tokio::task::spawn_blocking(move || {
        let model = model
            .read()
            .expect("the payments model lock is never poisoned");
        model.list(&filter)
    })
    .await
    .map_err(read_model_error)?
    .map_err(read_model_error)?;
    let mut found = fetch_payments(&payments, &page.ids).await?;
    let data: Vec<Value> = (page.ids.iter())
        .filter_map(|id| found.remove(id))
        .map(|p| payment_json(&p))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": data, "has_more": page.has_more}),
    ))
}

/// The payments `ids` as their partitions hold them (in memory or archived), wherever those partitions
/// are applied; a payment no partition knows is left out.
async fn fetch_payments(
    payments: &Payments,
    ids: &[PaymentId],
) -> Result<HashMap<PaymentId, Payment>, ApiError> {
    let mut by_partition: BTreeMap<u16, Vec<PaymentId>> = BTreeMap::new();
    for id in ids {
        let partition = payments.engine.partition_of(id.route_key());
        by_partition.entry(partition).or_default().push(*id);
    }
    let mut found = HashMap::with_capacity(ids.len());
    for (partition, ids) in by_partition {
        let query = encode(&PartitionQuery::Payments(ids.clone()));
        let answer = payments.engine.read(partition, APP_ID, query).await?;
        let answered: Vec<Option<Payment>> = decode(&answer).map_err(|error| {
            read_model_error(format!(
                "partition {partition} could not read its payments ({error})"
            ))
        })?;
        let pairs = ids.into_iter().zip(answered);
        found.extend(pairs.filter_map(|(id, payment)| Some((id, payment?))));
    }
    Ok(found)
}

fn read_model_error(error: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "read_model",
        error.to_string(),
    )
}

/// `lsn.index` per partition joined by `_`; `-` for a partition not read yet.
fn format_cursor(cursor: &[Option<FeedPosition>]) -> String {
    cursor
        .iter()
        .map(|p| p.map_or_else(|| "-".to_string(), |(lsn, index)| format!("{lsn}.{index}")))
        .collect::<Vec<_>>()
        .join("_")
}

fn parse_cursor(text: &str) -> Option<Vec<Option<FeedPosition>>> {
    text.split('_')
        .map(|part| {
            if part == "-" {
                return Some(None);
            }
            let (lsn, index) = part.split_once('.')?;
            Some(Some((lsn.parse().ok()?, index.parse().ok()?)))
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    after: Option<String>,
    limit: Option<usize>,
}

async fn events(
    State(payments): Shared,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let limit = page_limit(query.limit)?;
    let cursor = match query.after.as_deref() {
        None | Some("") => Vec::new(),
        Some(text) => parse_cursor(text).ok_or_else(|| {
            ApiError::bad_request(format!(
                "after {text:?} is not a cursor (use next_cursor from the previous page)"
            ))
        })?,
    };
    // On the blocking pool: the model's lock may wait for a flush of its store.
    let model = payments.model.clone();
    let (events, cursor, has_more) = tokio::task::spawn_blocking(move || {
        let model = model
            .read()
            .expect("the payments model lock is never poisoned");
        let page = model.feed(&cursor, limit).map_err(|CursorExpired { partition }| {
            ApiError::new(
                StatusCode::GONE,
                "cursor_expired",
                format!(
                    "events of partition {partition} after this cursor are no longer kept; start again without `after`"
                ),
            )
        })?;
        let events: Vec<(PartitionId, FeedEntry)> = (page.events.into_iter())
            .map(|(partition, e)| (partition, e.clone()))
            .collect();
        Ok::<_, ApiError>((events, page.cursor, page.has_more))
    })
    .await
    .map_err(read_model_error)??;
    let ids: Vec<PaymentId> = events.iter().map(|(_, e)| e.payment).collect();
    let found = fetch_payments(&payments, &ids).await?;
    let data: Vec<Value> = (events.iter())
        .map(|(partition, e)| {
            let payment = found.get(&e.payment);
            json!({
                "id": format!("evt_{partition}_{}_{}", e.position.0, e.position.1),
                "type": e.kind.name(),
                "created": seconds(e.created_ms),
                "payment": e.payment.to_string(),
                "capture": e.capture.zip(payment).map(|(c, p)| p.capture_id(usize::from(c))),
                "data": {"object": payment.map(payment_json)},
            })
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": data,
            "has_more": has_more,
            "next_cursor": format_cursor(&cursor),
        }),
    ))
}

pub fn reference_json(reference: &ReferenceData) -> Value {
    let mut suspended: Vec<&String> = reference
        .merchants
        .iter()
        .filter(|(_, m)| m.suspended)
        .map(|(name, _)| name)
        .collect();
    suspended.sort();
    json!({
        "version": reference.version,
        "merchants": reference.merchants.len(),
        "suspended_merchants": suspended,
        "tax_rates": reference.tax_rates.len(),
        "features": {
            "fraud_scoring": reference.features.fraud_scoring,
            "decline_on_fraud": reference.features.decline_on_fraud,
        },
    })
}

async fn reload(State(payments): Shared) -> Result<Response, ApiError> {
    let data = payments.reference.reload().map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "reload_failed",
            format!("{e}; the previous reference data stays in force"),
        )
    })?;
    tracing::info!(version = data.version, "payments reference data reloaded");
    Ok(json_response(StatusCode::OK, &reference_json(&data)))
}

async fn reference_summary(State(payments): Shared) -> Response {
    json_response(
        StatusCode::OK,
        &reference_json(&payments.reference.current()),
    )
}

async fn settle(State(payments): Shared) -> Result<Response, ApiError> {
    let report = payments.settler.run().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "settlement_failed",
            format!("{e}; run it again: open batches are finished first"),
        )
    })?;
    Ok(json_response(StatusCode::OK, &report))
}

/// Writes a batch's files again from the journaled batch: the same bytes as the first time.
async fn regenerate(
    State(payments): Shared,
    Path(batch): Path<String>,
) -> Result<Response, ApiError> {
    let id = batch
        .strip_prefix("stl_")
        .and_then(|ms| ms.parse::<u64>().ok())
        .ok_or_else(|| {
            ApiError::not_found(format!("{batch:?} is not a batch id (stl_ and epoch ms)"))
        })?;
    let files = payments
        .settler
        .write_files(id)
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "settlement_failed", e))?;
    if files.is_empty() {
        return Err(ApiError::not_found(format!(
            "no batch {batch} with captures"
        )));
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"batch": batch, "files": files}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_digit_runs_are_redacted_from_messages() {
        assert_eq!(
            redact_digits(
                "invalid type: integer `4242424242424242`, expected a string at line 1 column 40"
            ),
            "invalid type: integer `[redacted]`, expected a string at line 1 column 40"
        );
        assert_eq!(redact_digits("12345 and 123456"), "12345 and [redacted]");
    }

    #[test]
    fn cursors_round_trip() {
        let cursor = vec![Some((12, 0)), None, Some((7, 3))];
        assert_eq!(parse_cursor(&format_cursor(&cursor)), Some(cursor));
        assert_eq!(parse_cursor("1.x"), None);
        assert_eq!(parse_cursor("1"), None);
    }

    #[test]
    fn rates_print_as_percentages() {
        assert_eq!(rate_percent(72_500), "7.25");
        assert_eq!(rate_percent(200_000), "20");
        assert_eq!(rate_percent(55_000), "5.5");
    }
}
