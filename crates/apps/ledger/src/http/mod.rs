//! The ledger's HTTP API: participants, and FSPIOP-shaped transfers (prepare, fulfil, reject, get).
//!
//! A prepare is answered once its reservation is settled (RESERVED, or the refusal's FSPIOP code), which
//! takes three group commits: the transfer's partition, the payee's, the payer's, and back. FSPIOP itself
//! answers 202 and calls back; answering with the outcome saves the client a callback endpoint. GETs of
//! one transfer or participant are read from its partition (consistent with every acknowledged
//! write); `GET /participants` lists all of them from the read model, which may lag by a group commit.

mod batch;
mod parse;

pub use batch::BATCH_OPERATIONS_MAX;

use crate::amount;
use crate::domain::{
    AbortReason, Amount, Command, Entry, ErrorCode, Name, Refusal, Reply, Transfer, TransferId,
    TransferSpec, TransferState,
};
use crate::model::{LedgerModel, STATE_NAMES};
use crate::state::{
    LedgerState, decode, encode, entries_archive_key, owner_key, transfer_archive_key,
};
use crate::waiters::Waiters;
use crate::{APP_ID, domain::Owner};
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use parse::{
    Base64Url32, CorrelationId, Currency, Decimal, FspName, Money, Prepare, check_currency,
    check_name, format_time_ms, format_transfer_id, parse_32_bytes, parse_body, parse_time_ms,
    parse_transfer_id, refusal_error, transfer_spec, validation,
};
use serde::{Deserialize, Serialize};
use spate_engine::EngineHandle;
use spate_server::ApiError;
use spate_server::access::{RouteAccess, Scope};
use spate_server::api::{ErrorBody, ErrorDetail, json, reply_bytes};
use spate_server::openapi::AppRouter;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use utoipa::openapi::{Object, ObjectBuilder, Type};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

/// How long a prepare waits for its reservation before answering RECEIVED.
const RESERVATION_WAIT: Duration = Duration::from_secs(10);
/// Most entries one page returns.
const ENTRIES_PAGE_MAX: usize = 1_000;
/// How often every partition is told the time, so due transfers expire without other traffic.
const TICK_INTERVAL: Duration = Duration::from_secs(1);
/// The tag for the ledger's routes in the API description.
const TAG: &str = "ledger";

struct Ledger {
    engine: EngineHandle,
    model: Arc<RwLock<LedgerModel>>,
    waiters: Arc<Waiters>,
    /// New prepares are refused while the read model counts this many open transfers.
    open_transfers_max: u64,
}

type Ctx = State<Arc<Ledger>>;

impl Ledger {
    async fn submit(&self, owner: &Owner, command: &Command) -> Result<Reply, ApiError> {
        let partition = self.engine.partition_of(&owner_key(owner));
        let reply = self
            .engine
            .submit(partition, APP_ID, None, encode(command))
            .await?;
        let bytes = reply_bytes(reply)?;
        decode(&bytes).map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })
    }

    async fn read<R: Send + 'static>(
        &self,
        owner: &Owner,
        read: impl FnOnce(&LedgerState) -> R + Send + 'static,
    ) -> Result<R, ApiError> {
        let partition = self.engine.partition_of(&owner_key(owner));
        Ok(self.engine.query(partition, APP_ID, read).await?)
    }

    /// A participant's currency, from its partition.
    async fn currency_of(&self, name: &str) -> Result<Name, ApiError> {
        let lookup = name.to_string();
        self.read(&Owner::Participant(name.into()), move |state| {
            state
                .ledger
                .participant(&lookup)
                .map(|p| p.currency.clone())
        })
        .await?
        .ok_or_else(|| no_participant(name))
    }
}

/// The command for a new prepare, or the refusal when the ledger holds its maximum of open transfers,
/// which stay in memory until they are final. The count comes from the read model, which may lag by a
/// group commit, so the limit can be passed by what is in flight: it guards memory, not an exact figure.
fn prepare_command(
    model: &LedgerModel,
    open_transfers_max: u64,
    spec: TransferSpec,
) -> Result<Command, ApiError> {
    if model.open_transfers.len() as u64 >= open_transfers_max {
        return Err(refusal_error(Refusal {
            code: ErrorCode::ServiceUnavailable,
            message: format!(
                "the ledger holds its maximum of {open_transfers_max} open transfers \
                 (--ledger-open-transfers-max); retry once some are committed, aborted or expired"
            ),
        }));
    }
    Ok(model.prepare_command(spec))
}

fn no_participant(name: &str) -> ApiError {
    refusal_error(Refusal {
        code: ErrorCode::ParticipantNotFound,
        message: format!("no participant {name}"),
    })
}

/// FSPIOP's `transferState` in the API description: one of [`STATE_NAMES`].
fn transfer_state_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(STATE_NAMES))
        .description(Some(
            "RECEIVED: prepared, the payer's reservation on its way; RESERVED: waiting for the \
             payee's fulfilment; COMMITTED; ABORTED: rejected by the payee, refused or expired.",
        ))
        .build()
}

/// A transfer's id and state as FSPIOP shows them: the answer to a single transfer request and one
/// result of a batch.
// Written straight into the response, since a batch has thousands.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ledger::TransferOutcome)]
struct TransferOutcome {
    #[schema(value_type = CorrelationId)]
    transfer_id: String,
    #[schema(schema_with = transfer_state_schema)]
    transfer_state: &'static str,
    /// Why an ABORTED transfer was aborted, when it was not the payee's decision: FSPIOP's error code,
    /// such as "4001" (over the payer's net debit cap) or "3303" (expired).
    #[serde(skip_serializing_if = "Option::is_none")]
    error_code: Option<String>,
}

/// An operation of a batch that failed, and why.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ledger::FailedOperation)]
struct FailedOperation {
    /// The transfer's id, when the operation names a valid one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<CorrelationId>)]
    transfer_id: Option<String>,
    /// `code` is FSPIOP's error code, as in the error answers of the single requests.
    error: ErrorDetail,
}

/// One result of a batch, in the place of its operation.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = ledger::BatchResult)]
enum BatchResult {
    Done(TransferOutcome),
    Failed(FailedOperation),
}

fn transfer_outcome(id: TransferId, state: TransferState) -> TransferOutcome {
    let error_code = match state {
        TransferState::Aborted(AbortReason::Refused(code)) => Some(code.code().to_string()),
        TransferState::Aborted(AbortReason::Expired) => Some(ErrorCode::Expired.code().to_string()),
        _ => None,
    };
    TransferOutcome {
        transfer_id: format_transfer_id(id),
        transfer_state: state.name(),
        error_code,
    }
}

/// An operation of a batch that failed: with its transfer's id when it has one.
fn failed_operation(id: Option<TransferId>, error: ApiError) -> BatchResult {
    BatchResult::Failed(FailedOperation {
        transfer_id: id.map(format_transfer_id),
        error: ErrorDetail {
            code: error.code,
            message: error.message,
        },
    })
}

/// A new participant.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ledger::NewParticipant)]
struct NewParticipant {
    #[schema(value_type = FspName)]
    name: String,
    /// The one currency of its transfers.
    #[schema(value_type = Currency)]
    currency: String,
    /// Its net debit cap: how far its position plus reservations may go as a payer.
    #[schema(value_type = Decimal)]
    ndc: String,
}

/// A participant's account: amounts are decimals in its currency.
#[derive(Serialize, ToSchema)]
#[schema(as = ledger::Participant)]
struct ParticipantAnswer {
    #[schema(value_type = FspName)]
    name: String,
    #[schema(value_type = Currency)]
    currency: String,
    /// The net debit cap.
    #[schema(value_type = Decimal)]
    ndc: String,
    /// What it owes (negative: what it is owed) from committed transfers, such as "-12.5".
    position: String,
    /// What its prepared transfers hold of its cap until they are committed or aborted.
    reserved: String,
}

/// Creates a participant (an FSP) with its currency and net debit cap.
#[utoipa::path(
    post,
    path = "/participants",
    tag = TAG,
    request_body = NewParticipant,
    responses(
        (status = 201, description = "Created, with a position of 0.", body = ParticipantAnswer),
        (status = 400, description = "`3100`: a field is malformed; the message names it.", body = ErrorBody),
        (status = 409, description = "`3003`: a participant with this name exists.", body = ErrorBody),
    ),
)]
async fn create_participant(State(ledger): Ctx, body: Bytes) -> Result<Response, ApiError> {
    let body: NewParticipant = parse_body(&body)?;
    check_name("name", &body.name)?;
    check_currency(&body.currency)?;
    let ndc = amount::parse(&body.ndc, &body.currency).map_err(validation)?;
    let command = Command::CreateParticipant {
        name: body.name.as_str().into(),
        currency: body.currency.as_str().into(),
        ndc,
    };
    match ledger
        .submit(&Owner::Participant(body.name.as_str().into()), &command)
        .await?
    {
        Reply::Participant(_) => Ok(json(
            StatusCode::CREATED,
            &participant_answer(&body.name, &body.currency, ndc, 0, 0),
        )),
        Reply::Refused(refusal) => Err(refusal_error(refusal)),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(reply: &Reply) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("unexpected ledger reply {reply:?}"),
    )
}

fn participant_answer(
    name: &str,
    currency: &str,
    ndc: Amount,
    position: Amount,
    reserved: Amount,
) -> ParticipantAnswer {
    ParticipantAnswer {
        name: name.to_string(),
        currency: currency.to_string(),
        ndc: amount::format(ndc, currency),
        position: amount::format(position, currency),
        reserved: amount::format(reserved, currency),
    }
}

/// A participant's new net debit cap.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ledger::NewNdc)]
struct NewNdc {
    /// In the participant's currency; at least its position plus reservations.
    #[schema(value_type = Decimal)]
    ndc: String,
}

/// The description of the `{name}` path value.
const NAME_PARAM: &str = "The participant: 1 to 32 characters of A-Z, a-z, 0-9, '-', '_' or '.'.";

/// Sets a participant's net debit cap.
#[utoipa::path(
    put,
    path = "/participants/{name}/ndc",
    tag = TAG,
    params(("name" = inline(FspName), Path, description = NAME_PARAM)),
    request_body = NewNdc,
    responses(
        (status = 200, description = "Set; the participant after it.", body = ParticipantAnswer),
        (status = 400, description = "`3100`: the name or the cap is malformed, or the cap is below the participant's position plus reservations.", body = ErrorBody),
        (status = 404, description = "`3201`: no such participant.", body = ErrorBody),
    ),
)]
async fn set_ndc(
    State(ledger): Ctx,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: NewNdc = parse_body(&body)?;
    check_name("name", &name)?;
    let currency = ledger.currency_of(&name).await?;
    let ndc = amount::parse(&body.ndc, &currency).map_err(validation)?;
    let command = Command::SetNdc {
        name: name.as_str().into(),
        ndc,
    };
    match ledger
        .submit(&Owner::Participant(name.as_str().into()), &command)
        .await?
    {
        Reply::Participant(_) => get_participant(State(ledger), Scope::Whole, Path(name)).await,
        Reply::Refused(refusal) => Err(refusal_error(refusal)),
        other => Err(unexpected(&other)),
    }
}

/// A participant's account, read from its partition (it reflects every acknowledged write).
#[utoipa::path(
    get,
    path = "/participants/{name}",
    tag = TAG,
    params(("name" = inline(FspName), Path, description = NAME_PARAM)),
    responses(
        (status = 200, description = "The participant.", body = ParticipantAnswer),
        (status = 400, description = "`3100`: the name is malformed.", body = ErrorBody),
        (status = 404, description = "`3201`: no such participant.", body = ErrorBody),
    ),
)]
async fn get_participant(
    State(ledger): Ctx,
    scope: Scope,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    check_name("name", &name)?;
    scope.permits(&name)?;
    let lookup = name.clone();
    let found = ledger
        .read(&Owner::Participant(name.as_str().into()), move |state| {
            state
                .ledger
                .participant(&lookup)
                .map(|p| (p.currency.clone(), p.ndc, p.position, p.reserved))
        })
        .await?;
    let (currency, ndc, position, reserved) = found.ok_or_else(|| no_participant(&name))?;
    Ok(json(
        StatusCode::OK,
        &participant_answer(&name, &currency, ndc, position, reserved),
    ))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct Page {
    /// Entries to skip, oldest first.
    offset: Option<usize>,
    /// Entries to return, 1 to 1,000 (100 when absent).
    #[param(minimum = 1, maximum = 1_000)]
    limit: Option<usize>,
}

/// A page of a participant's entries.
#[derive(Serialize, ToSchema)]
#[schema(as = ledger::Entries)]
struct EntriesAnswer {
    #[schema(value_type = FspName)]
    name: String,
    /// Entries the participant has in all; `entries` is a page of them.
    total: usize,
    /// Where the page starts.
    offset: usize,
    entries: Vec<EntryAnswer>,
}

/// A change of a participant's position by a committed transfer.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ledger::Entry)]
struct EntryAnswer {
    #[schema(value_type = CorrelationId)]
    transfer_id: String,
    /// Added to the position: positive as the payer, negative as the payee.
    change: String,
    /// The position after it.
    position: String,
    /// When it was applied (RFC 3339).
    #[schema(format = DateTime)]
    timestamp: String,
}

/// A page of a participant's entries (the changes of its position), oldest first, read from its
/// partition.
#[utoipa::path(
    get,
    path = "/participants/{name}/entries",
    tag = TAG,
    params(("name" = inline(FspName), Path, description = NAME_PARAM), Page),
    responses(
        (status = 200, description = "The page.", body = EntriesAnswer),
        (status = 400, description = "`3100`: the name or the limit is malformed; or `bad_request`: a query value is not a number.", body = ErrorBody),
        (status = 404, description = "`3201`: no such participant.", body = ErrorBody),
    ),
)]
async fn get_entries(
    State(ledger): Ctx,
    scope: Scope,
    Path(name): Path<String>,
    Query(page): Query<Page>,
) -> Result<Response, ApiError> {
    check_name("name", &name)?;
    scope.permits(&name)?;
    let offset = page.offset.unwrap_or(0);
    let limit = page.limit.unwrap_or(100);
    if limit == 0 || limit > ENTRIES_PAGE_MAX {
        return Err(validation(format!("limit must be 1 to {ENTRIES_PAGE_MAX}")));
    }
    let lookup = name.clone();
    let partition = ledger
        .engine
        .partition_of(&owner_key(&Owner::Participant(name.as_str().into())));
    let found = ledger
        .engine
        .query_archive(partition, APP_ID, move |state: &LedgerState, archive| {
            let participant = state.ledger.participant(&lookup)?;
            let page = participant.entries.page(offset, limit, |chunk| {
                let key = entries_archive_key(&lookup, chunk);
                match archive.get(&key) {
                    // An error, not `decode_archived`'s panic: this runs on the partition's thread.
                    Ok(Some(bytes)) => decode::<Vec<Entry>>(&bytes).map_err(|error| {
                        format!("entries chunk {chunk} of {lookup} cannot be decoded: {error}")
                    }),
                    Ok(None) => Err(format!("entries chunk {chunk} of {lookup} is missing")),
                    Err(error) => Err(error.to_string()),
                }
            });
            Some(page.map(|page| {
                (
                    participant.currency.clone(),
                    participant.entries.len(),
                    page,
                )
            }))
        })
        .await?;
    let (currency, total, entries) = found
        .ok_or_else(|| no_participant(&name))?
        .map_err(ApiError::archive)?;
    let entries = entries
        .iter()
        .map(|e| EntryAnswer {
            transfer_id: format_transfer_id(e.transfer),
            change: amount::format(e.change, &currency),
            position: amount::format(e.position_after, &currency),
            timestamp: format_time_ms(e.timestamp_ms),
        })
        .collect();
    let answer = EntriesAnswer {
        name,
        total,
        offset,
        entries,
    };
    Ok(json(StatusCode::OK, &answer))
}

/// Every participant, with totals over the ledger.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ledger::Participants)]
struct ParticipantsAnswer<'a> {
    /// In order of name.
    participants: Vec<ParticipantAnswer>,
    /// The sum of the positions of each currency's participants: 0 whenever no transfer is between
    /// its steps.
    position_sums: HashMap<&'a str, String>,
    /// Transfers in each state, by FSPIOP state name (every state named).
    transfers: BTreeMap<&'static str, u64>,
    /// Journal records the read model has not taken in yet.
    lag_records: u64,
}

/// Every participant from the read model, which may lag by a group commit, with the sum of positions
/// per currency and the number of transfers in each state.
#[utoipa::path(
    get,
    path = "/participants",
    tag = TAG,
    responses((status = 200, description = "The participants.", body = ParticipantsAnswer)),
)]
async fn list_participants(State(ledger): Ctx) -> Response {
    let model = ledger
        .model
        .read()
        .expect("the ledger model lock is never poisoned");
    let mut names: Vec<&Name> = model.participants.keys().collect();
    names.sort();
    let participants = names
        .iter()
        .map(|name| {
            let p = &model.participants[*name];
            participant_answer(name, &p.currency, p.ndc, p.position, p.reserved)
        })
        .collect();
    let mut sums: HashMap<&str, Amount> = HashMap::new();
    for p in model.participants.values() {
        *sums.entry(&p.currency).or_default() += p.position;
    }
    let answer = ParticipantsAnswer {
        participants,
        position_sums: (sums.iter())
            .map(|(currency, sum)| (*currency, amount::format(*sum, currency)))
            .collect(),
        transfers: model.transfer_counts(),
        lag_records: ledger.engine.projection_lag(APP_ID).unwrap_or(0),
    };
    json(StatusCode::OK, &answer)
}

/// The refusal a settled prepare ended in, if any.
fn reservation_refusal(state: TransferState) -> Option<Refusal> {
    match state {
        TransferState::Aborted(AbortReason::Refused(code)) => Some(Refusal {
            code,
            message: match code {
                ErrorCode::PayerLiquidity => {
                    "the payer's position and reservations would exceed its net debit cap".into()
                }
                ErrorCode::PayerNotFound => "no such payer".into(),
                ErrorCode::PayeeNotFound => "no such payee".into(),
                _ => "the payer or payee does not hold this currency".into(),
            },
        }),
        TransferState::Aborted(AbortReason::Expired) => Some(Refusal {
            code: ErrorCode::Expired,
            message: "the transfer expired before it was reserved".into(),
        }),
        _ => None,
    }
}

fn settled(id: TransferId, state: TransferState) -> Result<Response, ApiError> {
    if let Some(refusal) = reservation_refusal(state) {
        return Err(refusal_error(refusal));
    }
    let status = if state == TransferState::Received {
        StatusCode::ACCEPTED
    } else {
        StatusCode::CREATED
    };
    Ok(json(status, &transfer_outcome(id, state)))
}

/// Prepares a transfer (FSPIOP's `POST /transfers`) and answers once the payer's reservation is
/// settled: RESERVED, or the refusal's FSPIOP error code.
///
/// FSPIOP answers 202 and calls back; this answers with the outcome, so the client needs no callback
/// endpoint. A reservation still unsettled after 10 seconds is answered RECEIVED (202): the client
/// asks again with `GET /transfers/{id}`.
#[utoipa::path(
    post,
    path = "/transfers",
    tag = TAG,
    params(("FSPIOP-Source" = Option<String>, Header, description = "The FSP making the request. Read only with a participant's key, which prepares only as the payer: if sent, it must name the payer.")),
    request_body = Prepare,
    responses(
        (status = 201, description = "Reserved: the transfer waits for the payee's fulfilment. A prepare sent again answers the transfer's state, whichever it is now.", body = TransferOutcome),
        (status = 202, description = "Received: the reservation is still on its way.", body = TransferOutcome),
        (status = 400, description = "`3100`: a field is malformed (the message names it), the payer and the payee are one, or they do not hold the transfer's currency; `3202`: no such payer; `3203`: no such payee; `3303`: the expiration is not in the future, or passed before the reservation.", body = ErrorBody),
        (status = 409, description = "`3106`: this transferId was prepared before with other content.", body = ErrorBody),
        (status = 422, description = "`4001`: the payer's position and reservations would exceed its net debit cap; the transfer is ABORTED.", body = ErrorBody),
        (status = 503, description = "`2003`: the ledger holds its maximum of open transfers; or the partition cannot take the request now (overloaded, moving, disk full, shutting down). Retry after `Retry-After`.", body = ErrorBody),
    ),
)]
async fn prepare(
    State(ledger): Ctx,
    scope: Scope,
    source: FspiopSource,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: Prepare = parse_body(&body)?;
    let spec = transfer_spec(&body)?;
    // A participant's key prepares only as the payer, and says so in FSPIOP-Source if it sends one.
    scope.permits(&spec.payer)?;
    if scope.party().is_some() && source.0.is_some() {
        scope.permits(&source.name()?)?;
    }
    let id = spec.id;
    let registration = ledger.waiters.register(1, vec![(0, id)]);
    let command = prepare_command(
        &ledger
            .model
            .read()
            .expect("the ledger model lock is never poisoned"),
        ledger.open_transfers_max,
        spec,
    )?;
    match ledger.submit(&Owner::Transfer(id), &command).await? {
        Reply::Transfer(_, TransferState::Received) => {
            let deadline = tokio::time::Instant::now() + RESERVATION_WAIT;
            registration.wait_for(&[0], deadline).await;
            // Still on its way if unsettled: the client asks again with GET, as FSPIOP clients do.
            settled(id, registration.state(0).unwrap_or(TransferState::Received))
        }
        Reply::Transfer(_, state) => settled(id, state),
        Reply::Refused(refusal) => Err(refusal_error(refusal)),
        other => Err(unexpected(&other)),
    }
}

/// `transferState` of a completion in the API description.
fn completion_state_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["COMMITTED", "ABORTED"]))
        .description(Some(
            "COMMITTED to fulfil the transfer, ABORTED to reject it.",
        ))
        .build()
}

/// The payee's answer to a prepared transfer (FSPIOP's `PUT /transfers/{id}`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schema(as = ledger::Completion)]
struct Completion {
    #[schema(schema_with = completion_state_schema)]
    transfer_state: String,
    /// The fulfilment of the prepare's condition (whose SHA-256 it is); needed to commit.
    #[schema(value_type = Option<Base64Url32>)]
    fulfilment: Option<String>,
    /// When the payee completed it: an RFC 3339 date-time; not kept.
    #[schema(format = DateTime)]
    completed_timestamp: Option<String>,
    /// Accepted as FSPIOP allows it; not read.
    #[serde(rename = "extensionList", default)]
    #[schema(value_type = Option<Value>)]
    _extension_list: Option<serde::de::IgnoredAny>,
}

/// The `FSPIOP-Source` header, taken alone: a `HeaderMap` extractor would copy all the request's
/// headers (two allocations per request).
struct FspiopSource(Option<HeaderValue>);

impl<S: Send + Sync> FromRequestParts<S> for FspiopSource {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Infallible> {
        Ok(Self(parts.headers.get("fspiop-source").cloned()))
    }
}

impl FspiopSource {
    /// The FSP making the request; an error if the header is missing or not a valid name.
    fn name(&self) -> Result<Name, ApiError> {
        let source = (self.0.as_ref())
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                validation("the FSPIOP-Source header names the FSP making the request")
            })?;
        check_name("FSPIOP-Source", source)?;
        Ok(source.into())
    }
}

/// The description of the `{id}` path value.
const TRANSFER_ID_PARAM: &str = "The transfer's id (a UUID).";

/// The description of the `FSPIOP-Source` header of a payee's request.
const PAYEE_SOURCE_PARAM: &str =
    "The FSP making the request: the transfer's payee (with a participant's key, the key's own).";

/// The payee fulfils (COMMITTED) or rejects (ABORTED) a reserved transfer.
///
/// A fulfil or a reject sent again after it succeeded answers the same.
#[utoipa::path(
    put,
    path = "/transfers/{id}",
    tag = TAG,
    params(
        ("id" = inline(CorrelationId), Path, description = TRANSFER_ID_PARAM),
        ("FSPIOP-Source" = inline(FspName), Header, description = PAYEE_SOURCE_PARAM),
    ),
    request_body = Completion,
    responses(
        (status = 200, description = "The transfer's new state: COMMITTED or ABORTED.", body = TransferOutcome),
        (status = 400, description = "`3100`: a field or header is malformed (the message names it), the source is not the payee, the fulfilment does not match the condition, or the transfer is not RESERVED; `3303`: it expired.", body = ErrorBody),
        (status = 404, description = "`3208`: no such transfer.", body = ErrorBody),
        (status = 409, description = "`3106`: the transfer was committed with another fulfilment.", body = ErrorBody),
    ),
)]
async fn complete(
    State(ledger): Ctx,
    scope: Scope,
    Path(id): Path<String>,
    source: FspiopSource,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: Completion = parse_body(&body)?;
    let id = parse_transfer_id(&id)?;
    let source = source.name()?;
    scope.permits(&source)?;
    if let Some(at) = &body.completed_timestamp {
        parse_time_ms("completedTimestamp", at)?;
    }
    // Checked whatever the state, as FSPIOP's schema checks it.
    let fulfilment = (body.fulfilment.as_deref())
        .map(|fulfilment| parse_32_bytes("fulfilment", fulfilment))
        .transpose()?;
    let command = match body.transfer_state.as_str() {
        "COMMITTED" => Command::Fulfil {
            id,
            source,
            fulfilment: fulfilment
                .ok_or_else(|| validation("a COMMITTED completion needs its fulfilment"))?,
        },
        "ABORTED" => Command::Reject { id, source },
        other => {
            return Err(validation(format!(
                "transferState must be COMMITTED or ABORTED, got {other:?}"
            )));
        }
    };
    finish(&ledger, id, command).await
}

async fn finish(ledger: &Ledger, id: TransferId, command: Command) -> Result<Response, ApiError> {
    match ledger.submit(&Owner::Transfer(id), &command).await? {
        Reply::Transfer(_, state) => Ok(json(StatusCode::OK, &transfer_outcome(id, state))),
        Reply::Refused(refusal) => Err(refusal_error(refusal)),
        other => Err(unexpected(&other)),
    }
}

/// The payee's error report (FSPIOP's `PUT /transfers/{id}/error`); other fields than these are
/// accepted and not read.
#[derive(Deserialize, ToSchema)]
#[schema(as = ledger::ErrorReport)]
struct ErrorReport {
    #[serde(
        rename = "errorInformation",
        deserialize_with = "spate_server::api::json_object"
    )]
    _error_information: ErrorInformation,
}

#[derive(Deserialize, ToSchema)]
#[schema(as = ledger::ErrorInformation)]
struct ErrorInformation {
    /// FSPIOP's error code, such as "5100"; the transfer is aborted whatever it says.
    #[serde(rename = "errorCode")]
    _error_code: String,
}

/// The payee reports an error, which rejects (aborts) a reserved transfer.
#[utoipa::path(
    put,
    path = "/transfers/{id}/error",
    tag = TAG,
    params(
        ("id" = inline(CorrelationId), Path, description = TRANSFER_ID_PARAM),
        ("FSPIOP-Source" = inline(FspName), Header, description = PAYEE_SOURCE_PARAM),
    ),
    request_body = ErrorReport,
    responses(
        (status = 200, description = "Aborted.", body = TransferOutcome),
        (status = 400, description = "`3100`: the body or a header is malformed, the source is not the payee, or the transfer is not RESERVED; `3303`: it expired.", body = ErrorBody),
        (status = 404, description = "`3208`: no such transfer.", body = ErrorBody),
    ),
)]
async fn error_callback(
    State(ledger): Ctx,
    scope: Scope,
    Path(id): Path<String>,
    source: FspiopSource,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ErrorReport { .. } = parse_body(&body)?;
    let id = parse_transfer_id(&id)?;
    let source = source.name()?;
    scope.permits(&source)?;
    finish(&ledger, id, Command::Reject { id, source }).await
}

/// A transfer's state and what was prepared, open or long final.
#[utoipa::path(
    get,
    path = "/transfers/{id}",
    tag = TAG,
    params(("id" = inline(CorrelationId), Path, description = TRANSFER_ID_PARAM)),
    responses(
        (status = 200, description = "The transfer.", body = TransferView),
        (status = 400, description = "`3100`: the id is not a UUID.", body = ErrorBody),
        (status = 404, description = "`3208`: no such transfer.", body = ErrorBody),
    ),
)]
async fn get_transfer(
    State(ledger): Ctx,
    scope: Scope,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_transfer_id(&id)?;
    let partition = ledger.engine.partition_of(&transfer_archive_key(id));
    // Most transfers asked for long after they were made are final and stored: read them without
    // queueing behind the partition's writes; the partition answers for the rest.
    let engine = ledger.engine.clone();
    let stored = tokio::task::spawn_blocking(move || {
        engine.read_stored(partition, APP_ID, &transfer_archive_key(id))
    })
    .await
    .map_err(ApiError::archive)?
    .map_err(ApiError::archive)?;
    // A stored transfer that does not decode fails this request with a 500 naming it; on the
    // partition's thread it would have stopped the partition.
    let decoded = move |bytes: &[u8]| {
        decode::<Transfer>(bytes).map_err(|error| {
            format!(
                "archived transfer {} cannot be decoded: {error}",
                format_transfer_id(id)
            )
        })
    };
    let found = match stored {
        Some(bytes) => Some(decoded(&bytes).map_err(ApiError::archive)?),
        None => ledger
            .engine
            .query_archive(
                partition,
                APP_ID,
                move |state: &LedgerState, archive| match state.ledger.open_transfer(id) {
                    Some(open) => Ok(Some(open.clone())),
                    None => match archive.get(&transfer_archive_key(id)) {
                        Ok(Some(bytes)) => decoded(&bytes).map(Some),
                        Ok(None) => Ok(None),
                        Err(error) => Err(error.to_string()),
                    },
                },
            )
            .await?
            .map_err(ApiError::archive)?,
    };
    let transfer = found.ok_or_else(|| {
        refusal_error(Refusal {
            code: ErrorCode::TransferNotFound,
            message: format!("no transfer {}", format_transfer_id(id)),
        })
    })?;
    let spec = &transfer.spec;
    // A participant sees the transfers it is the payer or the payee of.
    scope.permits_any(&[&spec.payer, &spec.payee])?;
    let body = TransferView {
        outcome: transfer_outcome(id, transfer.state),
        payer_fsp: &spec.payer,
        payee_fsp: &spec.payee,
        amount: Money {
            currency: spec.currency.to_string(),
            amount: amount::format(spec.amount, &spec.currency),
        },
        expiration: format_time_ms(spec.expiration_ms),
    };
    Ok(json(StatusCode::OK, &body))
}

/// A transfer's state and what was prepared.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ledger::Transfer)]
struct TransferView<'a> {
    #[serde(flatten)]
    outcome: TransferOutcome,
    #[schema(value_type = FspName)]
    payer_fsp: &'a str,
    #[schema(value_type = FspName)]
    payee_fsp: &'a str,
    amount: Money,
    #[schema(format = DateTime)]
    expiration: String,
}

/// A participant's key (`ledger:participant:NAME`) reads its own account and the transfers it is in,
/// prepares as the payer and completes as the payee; creating participants and setting their net debit
/// caps is the hub operator's (`ledger:write`).
pub const ROUTE_ACCESS: RouteAccess = RouteAccess {
    admin_routes: &[],
    party_kind: Some("participant"),
    party_routes: &[
        "/participants/{name}",
        "/participants/{name}/entries",
        "/transfers",
        "/transfers/batch",
        "/transfers/{id}",
        "/transfers/{id}/error",
    ],
};

pub(crate) fn routes(
    engine: EngineHandle,
    model: Arc<RwLock<LedgerModel>>,
    waiters: Arc<Waiters>,
    open_transfers_max: u64,
) -> AppRouter {
    // Tells every partition the time, so due transfers expire without traffic; only while some are
    // RESERVED.
    let reserved_model = model.clone();
    spate_server::api::spawn_ticks(
        engine.clone(),
        APP_ID,
        TICK_INTERVAL,
        encode(&Command::Tick),
        move || {
            reserved_model
                .read()
                .expect("the ledger model lock is never poisoned")
                .transfers_in(TransferState::Reserved)
                > 0
        },
    );
    let ledger = Arc::new(Ledger {
        engine,
        model,
        waiters,
        open_transfers_max,
    });
    AppRouter::new()
        .routes(routes!(create_participant, list_participants))
        .routes(routes!(get_participant))
        .routes(routes!(set_ndc))
        .routes(routes!(get_entries))
        .routes(routes!(prepare))
        .routes(routes!(batch::batch))
        .routes(routes!(complete, get_transfer))
        .routes(routes!(error_callback))
        .with_state(ledger)
}
