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
use crate::model::{LedgerModel, Waiters};
use crate::state::{
    LedgerState, decode, decode_archived, encode, entries_archive_key, owner_key,
    transfer_archive_key,
};
use crate::{APP_ID, domain::Owner};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post, put};
use parse::{
    Prepare, check_currency, check_name, format_time_ms, format_transfer_id, parse_32_bytes,
    parse_body, parse_time_ms, parse_transfer_id, refusal_error, transfer_spec, validation,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use spate_engine::EngineHandle;
use spate_server::ApiError;
use spate_server::access::{RouteAccess, Scope};
use spate_server::api::{json, reply_bytes};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How long a prepare waits for its reservation before answering RECEIVED.
const RESERVATION_WAIT: Duration = Duration::from_secs(10);
/// Most entries one page returns.
const ENTRIES_PAGE_MAX: usize = 1_000;
/// How often every partition is told the time, so due transfers expire without other traffic.
const TICK_INTERVAL: Duration = Duration::from_secs(1);

struct Ledger {
    engine: EngineHandle,
    model: Arc<RwLock<LedgerModel>>,
    waiters: Waiters,
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

/// A transfer's id and state as FSPIOP shows them, or what went wrong with an operation on it: the body
/// of a single transfer request and one result of a batch. Written straight into the response, since a
/// batch has thousands.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TransferBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    transfer_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    transfer_state: Option<&'static str>,
    /// Why an ABORTED transfer was aborted, when it was not the payee's decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    error_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<OperationError>,
}

#[derive(Serialize)]
struct OperationError {
    code: String,
    message: String,
}

fn transfer_body(id: TransferId, state: TransferState) -> TransferBody {
    let error_code = match state {
        TransferState::Aborted(AbortReason::Refused(code)) => Some(code.code().to_string()),
        TransferState::Aborted(AbortReason::Expired) => Some(ErrorCode::Expired.code().to_string()),
        _ => None,
    };
    TransferBody {
        transfer_id: Some(format_transfer_id(id)),
        transfer_state: Some(state.name()),
        error_code,
        error: None,
    }
}

/// An operation of a batch that failed: with its transfer's id when it has one.
fn failed_operation(id: Option<TransferId>, error: ApiError) -> TransferBody {
    TransferBody {
        transfer_id: id.map(format_transfer_id),
        transfer_state: None,
        error_code: None,
        error: Some(OperationError {
            code: error.code,
            message: error.message,
        }),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewParticipant {
    name: String,
    currency: String,
    ndc: String,
}

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
            &participant_body(&body.name, &body.currency, ndc, 0, 0),
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

fn participant_body(
    name: &str,
    currency: &str,
    ndc: Amount,
    position: Amount,
    reserved: Amount,
) -> Value {
    json!({
        "name": name,
        "currency": currency,
        "ndc": amount::format(ndc, currency),
        "position": amount::format(position, currency),
        "reserved": amount::format(reserved, currency),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewNdc {
    ndc: String,
}

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
        &participant_body(&name, &currency, ndc, position, reserved),
    ))
}

#[derive(Deserialize)]
struct Page {
    offset: Option<usize>,
    limit: Option<usize>,
}

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
                    Ok(Some(bytes)) => Ok(decode_archived::<Vec<Entry>>(&bytes)),
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
    let entries: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "transferId": format_transfer_id(e.transfer),
                "change": amount::format(e.change, &currency),
                "position": amount::format(e.position_after, &currency),
                "timestamp": format_time_ms(e.timestamp_ms),
            })
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &json!({ "name": name, "total": total, "offset": offset, "entries": entries }),
    ))
}

/// Every participant from the read model, with the sum of positions (zero whenever no transfer step
/// is in flight), the number of transfers in each state, and the read model's lag.
async fn list_participants(State(ledger): Ctx) -> Response {
    let model = ledger
        .model
        .read()
        .expect("the ledger model lock is never poisoned");
    let mut names: Vec<&Name> = model.participants.keys().collect();
    names.sort();
    let participants: Vec<Value> = names
        .iter()
        .map(|name| {
            let p = &model.participants[*name];
            participant_body(name, &p.currency, p.ndc, p.position, p.reserved)
        })
        .collect();
    let mut sums: HashMap<&str, Amount> = HashMap::new();
    for p in model.participants.values() {
        *sums.entry(&p.currency).or_default() += p.position;
    }
    let position_sums: HashMap<&str, String> = sums
        .iter()
        .map(|(currency, sum)| (*currency, amount::format(*sum, currency)))
        .collect();
    let lag = ledger.engine.projection_lag(APP_ID).unwrap_or(0);
    json(
        StatusCode::OK,
        &json!({
            "participants": participants,
            "positionSums": position_sums,
            "transfers": model.transfer_counts(),
            "lagRecords": lag,
        }),
    )
}

/// Prepares waiting for their reservations; each waiter is removed when the request is done with it,
/// answered or not.
struct Waiting<'a> {
    waiters: &'a Waiters,
    ids: Vec<TransferId>,
}

impl<'a> Waiting<'a> {
    /// Registers a waiter per id, before the prepares are submitted, so no answer can be missed.
    fn register(
        waiters: &'a Waiters,
        ids: Vec<TransferId>,
    ) -> (Self, Vec<tokio::sync::oneshot::Receiver<TransferState>>) {
        let mut map = waiters.lock().expect("the waiters lock is never poisoned");
        let receivers = ids
            .iter()
            .map(|id| {
                let (sender, receiver) = tokio::sync::oneshot::channel();
                map.entry(*id).or_default().push(sender);
                receiver
            })
            .collect();
        drop(map);
        (Self { waiters, ids }, receivers)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiters = self
            .waiters
            .lock()
            .expect("the waiters lock is never poisoned");
        for id in &self.ids {
            if let Some(list) = waiters.get_mut(id) {
                list.retain(|sender| !sender.is_closed());
                if list.is_empty() {
                    waiters.remove(id);
                }
            }
        }
    }
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
    Ok(json(status, &transfer_body(id, state)))
}

async fn prepare(
    State(ledger): Ctx,
    scope: Scope,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: Prepare = parse_body(&body)?;
    let spec = transfer_spec(&body)?;
    // A participant's key prepares only as the payer, and says so in FSPIOP-Source if it sends one.
    scope.permits(&spec.payer)?;
    if scope.party().is_some() && headers.contains_key("fspiop-source") {
        scope.permits(&source_of(&headers)?)?;
    }
    let id = spec.id;
    let (_waiting, mut reservations) = Waiting::register(&ledger.waiters, vec![id]);
    let reservation = reservations.pop().expect("one waiter per id");
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
            match tokio::time::timeout(RESERVATION_WAIT, reservation).await {
                Ok(Ok(state)) => settled(id, state),
                // Still on its way: the client asks again with GET, as FSPIOP clients do.
                _ => settled(id, TransferState::Received),
            }
        }
        Reply::Transfer(_, state) => settled(id, state),
        Reply::Refused(refusal) => Err(refusal_error(refusal)),
        other => Err(unexpected(&other)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Completion {
    transfer_state: String,
    fulfilment: Option<String>,
    completed_timestamp: Option<String>,
    /// Accepted as FSPIOP allows it; nothing here reads it.
    #[serde(rename = "extensionList", default)]
    _extension_list: Option<serde::de::IgnoredAny>,
}

fn source_of(headers: &HeaderMap) -> Result<Name, ApiError> {
    let source = headers
        .get("fspiop-source")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| validation("the FSPIOP-Source header names the FSP making the request"))?;
    check_name("FSPIOP-Source", source)?;
    Ok(source.into())
}

async fn complete(
    State(ledger): Ctx,
    scope: Scope,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: Completion = parse_body(&body)?;
    let id = parse_transfer_id(&id)?;
    let source = source_of(&headers)?;
    scope.permits(&source)?;
    if let Some(at) = &body.completed_timestamp {
        parse_time_ms("completedTimestamp", at)?;
    }
    let command = match body.transfer_state.as_str() {
        "COMMITTED" => {
            let fulfilment = body
                .fulfilment
                .as_deref()
                .ok_or_else(|| validation("a COMMITTED completion needs its fulfilment"))?;
            Command::Fulfil {
                id,
                source,
                fulfilment: parse_32_bytes("fulfilment", fulfilment)?,
            }
        }
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
        Reply::Transfer(_, state) => Ok(json(StatusCode::OK, &transfer_body(id, state))),
        Reply::Refused(refusal) => Err(refusal_error(refusal)),
        other => Err(unexpected(&other)),
    }
}

/// `PUT /transfers/{id}/error`: the payee reports an error, which aborts the transfer.
async fn error_callback(
    State(ledger): Ctx,
    scope: Scope,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: Value = parse_body(&body)?;
    let id = parse_transfer_id(&id)?;
    let source = source_of(&headers)?;
    scope.permits(&source)?;
    if !body["errorInformation"]["errorCode"].is_string() {
        return Err(validation(
            "the body must be {\"errorInformation\": {\"errorCode\", \"errorDescription\"}}",
        ));
    }
    finish(&ledger, id, Command::Reject { id, source }).await
}

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
    let found = match stored {
        Some(bytes) => Some(decode_archived::<Transfer>(&bytes)),
        None => ledger
            .engine
            .query_archive(
                partition,
                APP_ID,
                move |state: &LedgerState, archive| match state.ledger.open_transfer(id) {
                    Some(open) => Ok(Some(open.clone())),
                    None => (archive.get(&transfer_archive_key(id)))
                        .map(|archived| archived.map(|bytes| decode_archived(&bytes))),
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
        outcome: transfer_body(id, transfer.state),
        payer_fsp: &spec.payer,
        payee_fsp: &spec.payee,
        amount: json!({"currency": spec.currency, "amount": amount::format(spec.amount, &spec.currency)}),
        expiration: format_time_ms(spec.expiration_ms),
    };
    Ok(json(StatusCode::OK, &body))
}

/// A failure to read the archive's store (a damaged disk): the record is there but cannot be served.
/// `GET /transfers/{id}`: the transfer's state and what was prepared.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TransferView<'a> {
    #[serde(flatten)]
    outcome: TransferBody,
    payer_fsp: &'a str,
    payee_fsp: &'a str,
    amount: Value,
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
    waiters: Waiters,
    open_transfers_max: u64,
) -> Router {
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
    Router::new()
        .route(
            "/participants",
            post(create_participant).get(list_participants),
        )
        .route("/participants/{name}", get(get_participant))
        .route("/participants/{name}/ndc", put(set_ndc))
        .route("/participants/{name}/entries", get(get_entries))
        .route("/transfers", post(prepare))
        .route("/transfers/batch", post(batch::batch))
        .route("/transfers/{id}", put(complete).get(get_transfer))
        .route("/transfers/{id}/error", put(error_callback))
        .with_state(ledger)
}
