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
use crate::reference::{CURRENCIES, ReferenceData, currency_numeric, included_tax};
use crate::settle::{FileReport, SettleReport, Settler, batch_name};
use crate::state::{PartitionQuery, PaymentsState};
use crate::{APP_ID, APP_NAME, reference::Reference};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use spate_engine::{EngineHandle, PartitionId};
use spate_server::ApiError;
use spate_server::access::{RouteAccess, Scope};
use spate_server::api::{
    ErrorBody, IdempotencyKey, from_json_object, json as json_response, reply_bytes,
};
use spate_server::openapi::AppRouter;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use utoipa::openapi::schema::{KnownFormat, Object, ObjectBuilder, SchemaFormat, SchemaType, Type};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

/// Stripe's bound: amounts up to 999,999.99 in a two-decimal currency.
pub const AMOUNT_MAX: u64 = 99_999_999;
pub const METADATA_KEYS_MAX: usize = 20;
pub const METADATA_KEY_CHARS_MAX: usize = 40;
pub const METADATA_VALUE_CHARS_MAX: usize = 500;
pub const PAGE_LIMIT_MAX: usize = 100;
const PAGE_LIMIT_DEFAULT: usize = 10;
const TICK_INTERVAL: Duration = Duration::from_secs(1);

/// The tag of payments' routes in the API description.
const TAG: &str = "payments";

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

pub fn routes(payments: Arc<Payments>) -> AppRouter {
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
    AppRouter::new()
        .routes(routes!(authorize, list))
        .routes(routes!(summary))
        .routes(routes!(get_payment))
        .routes(routes!(capture))
        .routes(routes!(cancel))
        .routes(routes!(refund))
        .routes(routes!(events))
        .routes(routes!(reload))
        .routes(routes!(reference_summary))
        .routes(routes!(settle))
        .routes(routes!(regenerate))
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
    from_json_object(body).map_err(|e| {
        ApiError::bad_request(format!("invalid body: {}", redact_digits(&e.to_string())))
    })
}

/// The `Idempotency-Key` header, as the description of the operations that need it; their handlers
/// take it as an [`IdempotencyKey`] and [`require_key`] checks it is there.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
struct RequiredIdempotencyKey {
    /// 1 to 255 bytes, on every POST under `/v1/payments`. A request repeated with the same key and
    /// body gets the first one's answer and changes nothing; the same key with another body is refused
    /// with 422.
    #[param(rename = "Idempotency-Key", min_length = 1, max_length = 255)]
    #[expect(
        dead_code,
        reason = "only describes the header, which `require_key` reads"
    )]
    idempotency_key: String,
}

fn require_key(key: &IdempotencyKey) -> Result<spate_engine::CommandId, ApiError> {
    key.command_id(APP_NAME)?.ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_required",
            "every POST needs an Idempotency-Key header (1 to 255 bytes)",
        )
    })
}

/// What the POSTs under `/v1/payments` answer 422 for (their bodies' faults are 400s).
const KEY_REUSED: &str =
    "`idempotency_key_reused`: this `Idempotency-Key` was used with another request body.";
const PAYMENT_ID: &str = "The payment's id: `pay_` and 40 lowercase hex digits.";
const PAYMENT_NOT_FOUND: &str =
    "`payment_not_found`: no payment has this id, or it is not a payment id.";

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

/// A payment's `status`: one of [`Status::ALL`]'s names.
fn status_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(Status::ALL.map(Status::name)))
        .build()
}

/// A supported currency as answered: one of [`CURRENCIES`]' codes, in lowercase.
fn currency_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some("ISO 4217, lowercase."))
        .enum_values(Some(CURRENCIES.iter().map(|(code, _)| *code)))
        .build()
}

/// A supported currency as a request may write it: one of [`CURRENCIES`]' codes in any case
/// (`usd`, `USD`), which a JSON Schema pattern spells letter by letter (`[uU][sS][dD]`).
fn currency_request_schema() -> Object {
    let any_case = |code: &str| -> String {
        (code.chars())
            .map(|c| format!("[{}{}]", c, c.to_ascii_uppercase()))
            .collect()
    };
    let codes: Vec<String> = CURRENCIES.iter().map(|(code, _)| any_case(code)).collect();
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(
            "ISO 4217 in any case (`usd`, `USD`); answers give it in lowercase.",
        ))
        .pattern(Some(format!("^({})$", codes.join("|"))))
        .build()
}

/// An amount in minor units as [`check_amount`] takes it, of JSON type `types`.
fn amount_schema_of(types: SchemaType) -> Object {
    ObjectBuilder::new()
        .schema_type(types)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::UInt64)))
        .minimum(Some(1))
        .maximum(Some(AMOUNT_MAX))
        .build()
}

fn amount_schema() -> Object {
    amount_schema_of(Type::Integer.into())
}

/// An amount that may be left out or null: what is left to take.
fn amount_or_null_schema() -> Object {
    amount_schema_of(SchemaType::from_iter([Type::Integer, Type::Null]))
}

/// `metadata` as `authorize_command` bounds it.
fn metadata_schema() -> Object {
    let key = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(METADATA_KEY_CHARS_MAX));
    let value = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(METADATA_VALUE_CHARS_MAX));
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(
            "The caller's labels, kept with the payment and shown as sent.",
        ))
        .max_properties(Some(METADATA_KEYS_MAX))
        .property_names(Some(key))
        .additional_properties(Some(value))
        .build()
}

/// A page size as [`page_limit`] takes it.
fn page_limit_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .description(Some(format!(
            "Items to return, 1 to {PAGE_LIMIT_MAX} ({PAGE_LIMIT_DEFAULT} when absent)."
        )))
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::UInt64)))
        .minimum(Some(1))
        .maximum(Some(PAGE_LIMIT_MAX))
        .build()
}

/// The `object` of a payment.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum PaymentObject {
    Payment,
}

/// The `object` of a page.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum ListObject {
    List,
}

/// A payment as the API shows it: its card only masked and as a token, never the number or the CVC.
#[derive(Serialize, ToSchema)]
struct PaymentAnswer {
    #[schema(pattern = "^pay_[0-9a-f]{40}$")]
    id: String,
    object: PaymentObject,
    #[schema(schema_with = status_schema)]
    status: &'static str,
    /// In minor units, tax included.
    amount: u64,
    /// What can still be captured.
    amount_capturable: u64,
    /// Captures pending or settled.
    amount_captured: u64,
    amount_refunded: u64,
    #[schema(schema_with = currency_schema)]
    currency: String,
    merchant: String,
    /// Unix seconds.
    created: u64,
    /// Unix seconds: an authorization not captured by then expires.
    capture_before: u64,
    card: CardAnswer,
    /// The tax included in `amount`, in minor units.
    tax_amount: u64,
    tax: TaxAnswer,
    /// Why it was declined (`expired_card`, `incorrect_cvc`, `fraud_rule_N`); null unless declined.
    decline_reason: Option<String>,
    /// The fraud rule that fired, also when it did not decline; null when none did.
    fraud_rule: Option<u8>,
    captures: Vec<CaptureAnswer>,
    refunds: Vec<RefundAnswer>,
    #[schema(schema_with = metadata_schema)]
    metadata: BTreeMap<String, String>,
}

#[derive(Serialize, ToSchema)]
struct CardAnswer {
    /// The first 6 and last 4 digits, the others as `*`.
    #[schema(pattern = "^[0-9]{6}[*]{2,9}[0-9]{4}$")]
    masked: String,
    /// The same for every payment with this card number.
    #[schema(pattern = "^tok_[0-9a-f]{32}$")]
    token: String,
    exp_month: u8,
    exp_year: u16,
}

#[derive(Serialize, ToSchema)]
struct TaxAnswer {
    category: String,
    jurisdiction: String,
    /// The rate applied, in decimal (`7.25`).
    rate_percent: String,
}

#[derive(Serialize, ToSchema)]
struct CaptureAnswer {
    #[schema(pattern = "^cap_[0-9a-f]{40}_[0-9]+$")]
    id: String,
    amount: u64,
    /// `pending` (waiting for or in a settlement batch), `succeeded`, `failed` (the merchant is
    /// suspended) or `canceled`.
    status: &'static str,
    /// The settlement batch it went into, once it did.
    #[schema(pattern = "^stl_[0-9]+$")]
    batch: Option<String>,
    /// Unix seconds.
    created: u64,
}

#[derive(Serialize, ToSchema)]
struct RefundAnswer {
    #[schema(pattern = "^re_[0-9a-f]{40}_[0-9]+$")]
    id: String,
    amount: u64,
    /// Unix seconds.
    created: u64,
}

impl From<&Payment> for PaymentAnswer {
    fn from(p: &Payment) -> Self {
        let captures = (p.captures.iter().enumerate())
            .map(|(index, c)| CaptureAnswer {
                id: p.capture_id(index),
                amount: c.amount,
                status: c.status.name(),
                batch: c.batch.map(batch_name),
                created: seconds(c.created_ms),
            })
            .collect();
        let refunds = (p.refunds.iter().enumerate())
            .map(|(index, r)| RefundAnswer {
                id: p.refund_id(index),
                amount: r.amount,
                created: seconds(r.created_ms),
            })
            .collect();
        Self {
            id: p.id.to_string(),
            object: PaymentObject::Payment,
            status: p.status.name(),
            amount: p.amount,
            amount_capturable: p.amount_capturable,
            amount_captured: p.amount_captured(),
            amount_refunded: p.amount_refunded(),
            currency: p.currency.clone(),
            merchant: p.merchant.clone(),
            created: seconds(p.created_ms),
            capture_before: seconds(p.capture_before_ms),
            card: CardAnswer {
                masked: p.card.masked.clone(),
                token: p.card.token_text(),
                exp_month: p.card.exp_month,
                exp_year: p.card.exp_year,
            },
            tax_amount: p.tax.amount,
            tax: TaxAnswer {
                category: p.tax.category.clone(),
                jurisdiction: p.tax.jurisdiction.clone(),
                rate_percent: rate_percent(p.tax.rate_ppm),
            },
            decline_reason: p.decline_reason.clone(),
            fraud_rule: (p.fraud_rule != 0).then_some(p.fraud_rule),
            captures,
            refunds,
            metadata: p.metadata.iter().cloned().collect(),
        }
    }
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
        Refusal::TooManyCaptures { captures_max } => ApiError::new(
            StatusCode::CONFLICT,
            "too_many_captures",
            format!("{name} has {captures_max} captures, as many as a payment may have"),
        ),
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
            Ok(json_response(status, &PaymentAnswer::from(&*payment)))
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

/// The card, checked here and never kept in clear: the number leaves this request sealed, masked and as
/// a token, the CVC as a verdict only.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CardRequest {
    /// 12 to 19 digits that pass the Luhn check.
    #[schema(pattern = "^[0-9]{12,19}$")]
    number: String,
    #[schema(minimum = 1, maximum = 12)]
    exp_month: u8,
    #[schema(minimum = 2000, maximum = 2099)]
    exp_year: u16,
    /// 3 digits, 4 for American Express; one of the wrong length declines.
    #[schema(pattern = "^[0-9]{3,4}$")]
    cvc: String,
}

/// Picks the tax rate, which the amount includes.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct TaxRequest {
    /// A category of the reference data's tax rates (`general`, `food`, ...).
    category: String,
    /// A jurisdiction of the reference data's tax rates (`US-CA`, `FR`, ...).
    jurisdiction: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct AuthorizeRequest {
    /// In minor units, tax included.
    #[schema(schema_with = amount_schema)]
    amount: u64,
    #[schema(schema_with = currency_request_schema)]
    currency: String,
    /// A merchant of the reference data (`GET /admin/reference`).
    merchant: String,
    #[serde(deserialize_with = "spate_server::api::json_object")]
    card: CardRequest,
    #[serde(deserialize_with = "spate_server::api::json_object")]
    tax: TaxRequest,
    #[serde(default)]
    #[schema(schema_with = metadata_schema)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    capture_method: CaptureMethod,
}

/// `manual` (the default): authorize now, capture later with `POST /v1/payments/{id}/capture`;
/// `automatic`: capture the whole amount with the authorization.
#[derive(Deserialize, Default, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "lowercase")]
enum CaptureMethod {
    #[default]
    Manual,
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
        // Stored and answered in one case, so a retry that writes it in another is the same command.
        currency: request.currency.to_ascii_lowercase(),
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

/// Authorizes a card payment: the card is checked and the amount held, to be captured later (or at once
/// with `capture_method: automatic`). A declined authorization is a payment too, answered with 402.
#[utoipa::path(
    post,
    path = "/v1/payments",
    tag = TAG,
    params(RequiredIdempotencyKey),
    request_body = AuthorizeRequest,
    responses(
        (status = 200, description = "Authorized (or captured, with `capture_method: automatic`).", body = PaymentAnswer),
        (status = 400, description = "`idempotency_key_required`: no `Idempotency-Key`; `bad_request`: the body is not JSON of this shape, or a value is refused (the amount, currency, merchant, tax rate, metadata, card number, expiry or CVC) or the `Idempotency-Key` is malformed.", body = ErrorBody),
        (status = 402, description = "Declined (expired card, incorrect CVC or a fraud rule): the payment, with `decline_reason`.", body = PaymentAnswer),
        (status = 409, description = "`payment_exists`: another key's payment has this key's payment id, use another key; `in_flight`: a request with this `Idempotency-Key` is still being made durable, retry shortly.", body = ErrorBody),
        (status = 422, description = KEY_REUSED, body = ErrorBody),
    ),
)]
async fn authorize(
    State(payments): Shared,
    scope: Scope,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, ApiError> {
    let command_id = require_key(&idempotency_key)?;
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

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CaptureRequest {
    /// What to capture, in minor units; everything capturable when absent.
    #[schema(schema_with = amount_or_null_schema)]
    amount: Option<u64>,
    /// Whether this is the last capture, releasing what is left (the default); `false` keeps the rest
    /// capturable.
    final_capture: Option<bool>,
}

/// Every POST on one payment: the key, the id, the body, then the command made from them.
async fn on_payment<T: DeserializeOwned>(
    payments: &Payments,
    scope: &Scope,
    id: &str,
    idempotency_key: &IdempotencyKey,
    body: &[u8],
    command: impl FnOnce(PaymentId, T) -> Result<Command, ApiError>,
) -> Result<Response, ApiError> {
    let command_id = require_key(idempotency_key)?;
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

/// Captures some or all of an authorized payment; the capture is settled by the next settlement batch.
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/capture",
    tag = TAG,
    params(("id" = String, Path, description = PAYMENT_ID, pattern = "^pay_[0-9a-f]{40}$"), RequiredIdempotencyKey),
    request_body = Option<CaptureRequest>,
    responses(
        (status = 200, description = "Durable; the payment after it (`captured` once nothing more can be captured).", body = PaymentAnswer),
        (status = 400, description = "`amount_too_large`: more than the payment can still capture; `idempotency_key_required`: no `Idempotency-Key`; `bad_request`: the body is not JSON of this shape, the amount is out of range or the `Idempotency-Key` is malformed.", body = ErrorBody),
        (status = 404, description = PAYMENT_NOT_FOUND, body = ErrorBody),
        (status = 409, description = "`unexpected_state`: the payment is not `authorized`; `too_many_captures`: the payment has 1,000 captures, as many as a payment may have; `in_flight`: a request with this `Idempotency-Key` is still being made durable, retry shortly.", body = ErrorBody),
        (status = 422, description = KEY_REUSED, body = ErrorBody),
    ),
)]
async fn capture(
    State(payments): Shared,
    scope: Scope,
    Path(id): Path<String>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, ApiError> {
    on_payment(
        &payments,
        &scope,
        &id,
        &idempotency_key,
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

/// No fields.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Empty {}

/// Cancels an authorized or captured payment: the hold is released and captures not settled yet are
/// voided.
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/cancel",
    tag = TAG,
    params(("id" = String, Path, description = PAYMENT_ID, pattern = "^pay_[0-9a-f]{40}$"), RequiredIdempotencyKey),
    request_body = Option<Empty>,
    responses(
        (status = 200, description = "Durable; the payment, `canceled`.", body = PaymentAnswer),
        (status = 400, description = "`idempotency_key_required`: no `Idempotency-Key`; `bad_request`: the body is not `{}` or the `Idempotency-Key` is malformed.", body = ErrorBody),
        (status = 404, description = PAYMENT_NOT_FOUND, body = ErrorBody),
        (status = 409, description = "`unexpected_state`: the payment is neither `authorized` nor `captured`; `capture_settled`: a capture has settled, refund it instead; `settlement_in_progress`: a capture is in a settlement batch being written, retry after it; `in_flight`: a request with this `Idempotency-Key` is still being made durable, retry shortly.", body = ErrorBody),
        (status = 422, description = KEY_REUSED, body = ErrorBody),
    ),
)]
async fn cancel(
    State(payments): Shared,
    scope: Scope,
    Path(id): Path<String>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, ApiError> {
    on_payment(
        &payments,
        &scope,
        &id,
        &idempotency_key,
        &body,
        |payment, Empty {}| Ok(Command::Cancel { payment }),
    )
    .await
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RefundRequest {
    /// What to refund, in minor units; everything refundable when absent.
    #[schema(schema_with = amount_or_null_schema)]
    amount: Option<u64>,
}

/// Refunds some or all of a payment's settled captures.
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/refunds",
    tag = TAG,
    params(("id" = String, Path, description = PAYMENT_ID, pattern = "^pay_[0-9a-f]{40}$"), RequiredIdempotencyKey),
    request_body = Option<RefundRequest>,
    responses(
        (status = 200, description = "Durable; the payment after it.", body = PaymentAnswer),
        (status = 400, description = "`amount_too_large`: more than the settled captures minus the refunds, or nothing is left to refund; `idempotency_key_required`: no `Idempotency-Key`; `bad_request`: the body is not JSON of this shape, the amount is out of range or the `Idempotency-Key` is malformed.", body = ErrorBody),
        (status = 404, description = PAYMENT_NOT_FOUND, body = ErrorBody),
        (status = 422, description = KEY_REUSED, body = ErrorBody),
    ),
)]
async fn refund(
    State(payments): Shared,
    scope: Scope,
    Path(id): Path<String>,
    idempotency_key: IdempotencyKey,
    body: Bytes,
) -> Result<Response, ApiError> {
    on_payment(
        &payments,
        &scope,
        &id,
        &idempotency_key,
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

/// Payments by status over every merchant, and the captures waiting for a settlement batch.
#[derive(Serialize, ToSchema)]
struct PaymentsSummary {
    /// Payments per status, from the read model: it may lag the acknowledgements by about a millisecond.
    by_status: BTreeMap<&'static str, u64>,
    /// Captures pending in no settlement batch yet, read from every partition: the next
    /// `POST /admin/settlements` puts them in a batch.
    captures_to_settle: u64,
}

/// Payments by status over every merchant, and the captures the next settlement takes (an operator's
/// view: a merchant's key is refused).
#[utoipa::path(
    get,
    path = "/v1/payments/summary",
    tag = TAG,
    responses((status = 200, description = "The counts.", body = PaymentsSummary)),
)]
async fn summary(State(payments): Shared) -> Result<Response, ApiError> {
    let by_status = {
        let model = (payments.model.read()).expect("the payments model lock is never poisoned");
        (Status::ALL.iter())
            .map(|&status| (status.name(), model.count(status)))
            .collect()
    };
    let mut captures_to_settle = 0;
    for partition in 0..payments.engine.partition_count() {
        let query = encode(&PartitionQuery::Spooled);
        let answer = payments.engine.read(partition, APP_ID, query).await?;
        // A node of a version before this query answers it with nothing: the summary is refused
        // until every node runs this version.
        let spooled: u64 = decode(&answer).map_err(|error| {
            read_model_error(format!(
                "partition {partition} could not count its pending captures (its node may run an \
                 older version): {error}"
            ))
        })?;
        captures_to_settle += spooled;
    }
    let summary = PaymentsSummary {
        by_status,
        captures_to_settle,
    };
    Ok(json_response(StatusCode::OK, &summary))
}

/// A payment, as its partition holds it now.
#[utoipa::path(
    get,
    path = "/v1/payments/{id}",
    tag = TAG,
    params(("id" = String, Path, description = PAYMENT_ID, pattern = "^pay_[0-9a-f]{40}$")),
    responses(
        (status = 200, description = "The payment.", body = PaymentAnswer),
        (status = 404, description = PAYMENT_NOT_FOUND, body = ErrorBody),
    ),
)]
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
                .map(|found| found.as_ref().map(PaymentAnswer::from))
        })
        .await?
        .map_err(ApiError::archive)?;
    let answer = found.ok_or_else(|| refusal(Refusal::NotFound, Some(id)))?;
    scope.permits(&answer.merchant)?;
    Ok(json_response(StatusCode::OK, &answer))
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

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only this merchant's payments (a merchant's key lists only its own, named or not).
    merchant: Option<String>,
    #[param(schema_with = status_schema)]
    status: Option<String>,
    /// Unix seconds: only payments created after this second.
    created_after: Option<u64>,
    /// The last payment of the previous page: this page goes on after it (from the top if the server
    /// does not know it).
    #[param(pattern = "^pay_[0-9a-f]{40}$")]
    starting_after: Option<String>,
    #[param(schema_with = page_limit_schema)]
    limit: Option<usize>,
}

/// A page of payments, newest first.
#[derive(Serialize, ToSchema)]
struct PaymentList {
    object: ListObject,
    data: Vec<PaymentAnswer>,
    /// Whether more payments follow: ask again with `starting_after` the last one's id.
    has_more: bool,
}

/// Lists payments, newest first, from the read model: a payment may appear a moment after it was
/// written; each payment shown is read from its partition.
#[utoipa::path(
    get,
    path = "/v1/payments",
    tag = TAG,
    params(ListQuery),
    responses(
        (status = 200, description = "A page of payments.", body = PaymentList),
        (status = 400, description = "`bad_request`: a query value is malformed or out of range, or a query parameter is unknown.", body = ErrorBody),
    ),
)]
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
    let data = (page.ids.iter())
        .filter_map(|id| found.remove(id))
        .map(|p| PaymentAnswer::from(&p))
        .collect();
    let answer = PaymentList {
        object: ListObject::List,
        data,
        has_more: page.has_more,
    };
    Ok(json_response(StatusCode::OK, &answer))
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

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// `next_cursor` of the previous page; absent or empty to start from the oldest event kept.
    after: Option<String>,
    #[param(schema_with = page_limit_schema)]
    limit: Option<usize>,
}

/// A page of the events feed.
#[derive(Serialize, ToSchema)]
struct EventList {
    object: ListObject,
    data: Vec<EventAnswer>,
    /// Whether more events follow now.
    has_more: bool,
    /// Where the next page starts: pass it as `after`, also to poll for events to come.
    next_cursor: String,
}

#[derive(Serialize, ToSchema)]
struct EventAnswer {
    #[schema(pattern = "^evt_[0-9]+_[0-9]+_[0-9]+$")]
    id: String,
    /// `payment.authorized`, `payment.declined`, `payment.capture_requested`, `payment.canceled`,
    /// `payment.refunded`, `payment.expired`, `capture.succeeded` or `capture.failed`.
    #[serde(rename = "type")]
    kind: &'static str,
    /// Unix seconds.
    created: u64,
    /// The id of the payment it is about.
    #[schema(pattern = "^pay_[0-9a-f]{40}$")]
    payment: String,
    /// The id of the capture a `capture.*` event is about; null for the others (and while
    /// `data.object` is null).
    #[schema(pattern = "^cap_[0-9a-f]{40}_[0-9]+$")]
    capture: Option<String>,
    data: EventData,
}

#[derive(Serialize, ToSchema)]
struct EventData {
    /// The payment as it is now (not as it was at the event); null if its partition does not know it.
    object: Option<PaymentAnswer>,
}

/// The events of every payment, oldest first, from the read model (bounded: the oldest are dropped).
/// Events of different partitions have no order between them beyond their times; the cursor is exact.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = TAG,
    params(EventsQuery),
    responses(
        (status = 200, description = "A page of events.", body = EventList),
        (status = 400, description = "`bad_request`: `after` is not a cursor, `limit` is out of range, or a query parameter is unknown.", body = ErrorBody),
        (status = 410, description = "`cursor_expired`: events after this cursor are no longer kept; start again without `after`.", body = ErrorBody),
    ),
)]
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
    let data = (events.iter())
        .map(|(partition, e)| {
            let payment = found.get(&e.payment);
            EventAnswer {
                id: format!("evt_{partition}_{}_{}", e.position.0, e.position.1),
                kind: e.kind.name(),
                created: seconds(e.created_ms),
                payment: e.payment.to_string(),
                capture: e
                    .capture
                    .zip(payment)
                    .map(|(c, p)| p.capture_id(usize::from(c))),
                data: EventData {
                    object: payment.map(PaymentAnswer::from),
                },
            }
        })
        .collect();
    let answer = EventList {
        object: ListObject::List,
        data,
        has_more,
        next_cursor: format_cursor(&cursor),
    };
    Ok(json_response(StatusCode::OK, &answer))
}

/// The reference data in force, summed up.
#[derive(Serialize, ToSchema)]
struct ReferenceAnswer {
    /// 1 at start, one more per reload.
    version: u64,
    /// Merchants known.
    merchants: usize,
    /// Merchants whose captures fail at settlement, by name.
    suspended_merchants: Vec<String>,
    /// (category, jurisdiction) pairs with a tax rate.
    tax_rates: usize,
    features: FeaturesAnswer,
}

#[derive(Serialize, ToSchema)]
struct FeaturesAnswer {
    /// Whether authorizations are scored by the fraud rules.
    fraud_scoring: bool,
    /// Whether a fraud rule that fires declines (else it is only recorded, as `fraud_rule`).
    decline_on_fraud: bool,
}

impl From<&ReferenceData> for ReferenceAnswer {
    fn from(reference: &ReferenceData) -> Self {
        let mut suspended_merchants: Vec<String> = (reference.merchants.iter())
            .filter(|(_, m)| m.suspended)
            .map(|(name, _)| name.clone())
            .collect();
        suspended_merchants.sort();
        Self {
            version: reference.version,
            merchants: reference.merchants.len(),
            suspended_merchants,
            tax_rates: reference.tax_rates.len(),
            features: FeaturesAnswer {
                fraud_scoring: reference.features.fraud_scoring,
                decline_on_fraud: reference.features.decline_on_fraud,
            },
        }
    }
}

/// Reads the reference data (merchants, tax rates, feature switches) again from its files; requests
/// already under way finish with the version they started with.
#[utoipa::path(
    post,
    path = "/admin/reload",
    tag = TAG,
    responses(
        (status = 200, description = "The reference data now in force.", body = ReferenceAnswer),
        (status = 422, description = "`reload_failed`: the files could not be read or are invalid; the previous reference data stays in force.", body = ErrorBody),
    ),
)]
async fn reload(State(payments): Shared) -> Result<Response, ApiError> {
    let data = payments.reference.reload().map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "reload_failed",
            format!("{e}; the previous reference data stays in force"),
        )
    })?;
    tracing::info!(version = data.version, "payments reference data reloaded");
    Ok(json_response(
        StatusCode::OK,
        &ReferenceAnswer::from(&*data),
    ))
}

/// The reference data in force.
#[utoipa::path(
    get,
    path = "/admin/reference",
    tag = TAG,
    responses((status = 200, description = "The reference data in force.", body = ReferenceAnswer)),
)]
async fn reference_summary(State(payments): Shared) -> Response {
    let answer = ReferenceAnswer::from(&*payments.reference.current());
    json_response(StatusCode::OK, &answer)
}

/// Settles now: finishes the batches a failed run left open, then puts every pending capture in a new
/// batch, writes its files (one per merchant and currency) and marks its captures `succeeded` (or
/// `failed`, for a suspended merchant).
#[utoipa::path(
    post,
    path = "/admin/settlements",
    tag = TAG,
    responses(
        (status = 200, description = "The batches finished and written by this run.", body = SettleReport),
        (status = 503, description = "`settlement_failed`: the run stopped (a partition unavailable, a file not written); run it again, open batches are finished first. Or the server cannot take the request now; retry after `Retry-After`.", body = ErrorBody),
    ),
)]
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

/// A batch and the files written for it.
#[derive(Serialize, ToSchema)]
struct BatchFiles {
    #[schema(pattern = "^stl_[0-9]+$")]
    batch: String,
    files: Vec<FileReport>,
}

/// Writes a batch's files again from the journaled batch: the same bytes as the first time.
#[utoipa::path(
    post,
    path = "/admin/settlements/{batch}/files",
    tag = TAG,
    params(("batch" = String, Path, description = "The batch's id: `stl_` and its cutoff in Unix milliseconds.", pattern = "^stl_[0-9]+$")),
    responses(
        (status = 200, description = "The files, written again.", body = BatchFiles),
        (status = 404, description = "`not_found`: no batch with captures has this id, or it is not a batch id.", body = ErrorBody),
        (status = 503, description = "`settlement_failed`: a partition could not be read or a file not written; try again. Or the server cannot take the request now; retry after `Retry-After`.", body = ErrorBody),
    ),
)]
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
    Ok(json_response(StatusCode::OK, &BatchFiles { batch, files }))
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

    /// The message of `parse_body`'s refusal of `body` as a `T`.
    fn refusal_of<T: DeserializeOwned>(body: &[u8]) -> String {
        match parse_body::<T>(body) {
            Ok(_) => panic!("{} was taken", String::from_utf8_lossy(body)),
            Err(error) => error.message,
        }
    }

    #[test]
    fn bodies_are_objects_not_arrays_of_their_fields() {
        let not_object = "expected a JSON object";
        assert!(refusal_of::<CaptureRequest>(b"[null, null]").contains(not_object));
        assert!(refusal_of::<RefundRequest>(b"[5]").contains(not_object));
        assert!(refusal_of::<Empty>(b"[]").contains(not_object));
        let card_as_array = br#"{"amount": 100, "currency": "usd", "merchant": "acme_shop",
            "card": ["0", 1, 2030, "123"], "tax": {"category": "general", "jurisdiction": "US-CA"}}"#;
        assert!(refusal_of::<AuthorizeRequest>(card_as_array).contains(not_object));
        let tax_as_array = br#"{"amount": 100, "currency": "usd", "merchant": "acme_shop",
            "card": {"number": "0", "exp_month": 1, "exp_year": 2030, "cvc": "123"},
            "tax": ["general", "US-CA"]}"#;
        assert!(refusal_of::<AuthorizeRequest>(tax_as_array).contains(not_object));
        let capture: CaptureRequest =
            parse_body(br#"{"amount": 5, "final_capture": null}"#).unwrap();
        assert_eq!((capture.amount, capture.final_capture), (Some(5), None));
        let Empty {} = parse_body(b" ").unwrap();
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
