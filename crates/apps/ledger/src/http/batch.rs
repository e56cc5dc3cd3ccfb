//! `POST /transfers/batch`: many prepares, fulfils and rejects in one request.

use super::parse::{
    Prepare, check_name, format_transfer_id, parse_32_bytes, parse_body, parse_transfer_id,
    transfer_spec, validation,
};
use super::{Ctx, RESERVATION_WAIT, Waiting, reservation_refusal, transfer_body, unexpected};
use crate::APP_ID;
use crate::domain::{Command, Owner, Refusal, Reply, TransferId, TransferState};
use crate::state::{decode, encode, owner_key};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};
use spate_server::ApiError;
use spate_server::api::{json, reply_bytes};

/// Most operations in one batch request.
pub const BATCH_OPERATIONS_MAX: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BatchCompletion {
    transfer_id: String,
    /// The FSP on whose behalf (the payee), as FSPIOP-Source is for a single request.
    source: String,
    fulfilment: Option<String>,
}

/// One operation of a batch: `{"prepare": {FSPIOP prepare}}`, `{"fulfil": {"transferId", "source",
/// "fulfilment"}}` or `{"reject": {"transferId", "source"}}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
enum BatchOperation {
    Prepare(Box<Prepare>),
    Fulfil(BatchCompletion),
    Reject(BatchCompletion),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    /// Kept raw, so each operation is parsed once and a bad one fails alone.
    operations: Vec<Box<serde_json::value::RawValue>>,
}

fn batch_command(
    operation: &serde_json::value::RawValue,
) -> Result<(TransferId, Command), ApiError> {
    let operation: BatchOperation = serde_json::from_str(operation.get())
        .map_err(|e| validation(format!("invalid operation: {e}")))?;
    Ok(match operation {
        BatchOperation::Prepare(prepare) => {
            let spec = transfer_spec(&prepare)?;
            (spec.id, Command::Prepare(spec))
        }
        BatchOperation::Fulfil(completion) => {
            let id = parse_transfer_id(&completion.transfer_id)?;
            check_name("source", &completion.source)?;
            let fulfilment = completion
                .fulfilment
                .as_deref()
                .ok_or_else(|| validation("a fulfil needs its fulfilment"))?;
            let fulfilment = parse_32_bytes("fulfilment", fulfilment)?;
            let source = completion.source;
            (
                id,
                Command::Fulfil {
                    id,
                    source,
                    fulfilment,
                },
            )
        }
        BatchOperation::Reject(completion) => {
            let id = parse_transfer_id(&completion.transfer_id)?;
            check_name("source", &completion.source)?;
            (
                id,
                Command::Reject {
                    id,
                    source: completion.source,
                },
            )
        }
    })
}

fn batch_result(id: TransferId, outcome: Result<TransferState, Refusal>) -> Value {
    match outcome.and_then(|state| reservation_refusal(state).map_or(Ok(state), Err)) {
        Ok(state) => transfer_body(id, state),
        Err(refusal) => json!({
            "transferId": format_transfer_id(id),
            "error": {"code": refusal.code.code().to_string(), "message": refusal.message},
        }),
    }
}

/// `POST /transfers/batch`: many prepares, fulfils and rejects in one request, each applied as the
/// single request would be, in order per transfer; one result per operation, in order. The answer
/// comes once every prepare's reservation is settled.
pub(super) async fn batch(State(ledger): Ctx, body: Bytes) -> Result<Response, ApiError> {
    let Batch { operations } = parse_body(&body)?;
    if operations.is_empty() || operations.len() > BATCH_OPERATIONS_MAX {
        return Err(validation(format!(
            "a batch holds 1 to {BATCH_OPERATIONS_MAX} operations"
        )));
    }
    let parsed: Vec<Result<(TransferId, Command), ApiError>> = operations
        .iter()
        .map(|operation| batch_command(operation))
        .collect();
    let prepared: Vec<TransferId> = parsed
        .iter()
        .filter_map(|p| match p {
            Ok((id, Command::Prepare(_))) => Some(*id),
            _ => None,
        })
        .collect();
    let (_waiting, reservations) = Waiting::register(&ledger.waiters, prepared);
    let mut reservations = reservations.into_iter();
    // Queue everything first, so the operations share group commits, then collect the answers.
    let mut pending = Vec::with_capacity(parsed.len());
    for item in parsed {
        pending.push(item.map(|(id, command)| {
            let partition = ledger.engine.partition_of(&owner_key(&Owner::Transfer(id)));
            let queued = ledger
                .engine
                .enqueue(partition, APP_ID, None, encode(&command));
            let reservation = matches!(command, Command::Prepare(_))
                .then(|| reservations.next().expect("one waiter per prepare"));
            (id, queued, reservation)
        }));
    }
    let deadline = tokio::time::Instant::now() + RESERVATION_WAIT;
    let mut results = Vec::with_capacity(pending.len());
    for item in pending {
        let (id, queued, reservation) = match item {
            Ok(item) => item,
            Err(error) => {
                results.push(json!({"error": {"code": error.code, "message": error.message}}));
                continue;
            }
        };
        let reply = match queued {
            Ok(pending) => match pending.reply().await {
                Ok(reply) => reply_bytes(reply).and_then(|bytes| {
                    decode::<Reply>(&bytes).map_err(|e| {
                        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
                    })
                }),
                Err(error) => Err(error.into()),
            },
            Err(refused) => Err(refused.error.into()),
        };
        let outcome = match reply {
            Ok(Reply::Transfer(_, TransferState::Received)) => {
                let reservation = reservation.expect("only prepares answer RECEIVED");
                match tokio::time::timeout_at(deadline, reservation).await {
                    Ok(Ok(state)) => Ok(state),
                    _ => Ok(TransferState::Received),
                }
            }
            Ok(Reply::Transfer(_, state)) => Ok(state),
            Ok(Reply::Refused(refusal)) => Err(refusal),
            Ok(other) => return Err(unexpected(&other)),
            Err(error) => {
                results.push(json!({
                    "transferId": format_transfer_id(id),
                    "error": {"code": error.code, "message": error.message},
                }));
                continue;
            }
        };
        results.push(batch_result(id, outcome));
    }
    Ok(json(StatusCode::OK, &json!({ "results": results })))
}
