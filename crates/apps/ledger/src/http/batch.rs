//! `POST /transfers/batch`: many prepares, fulfils and rejects in one request.

use super::parse::{
    Prepare, check_name, parse_32_bytes, parse_body, parse_transfer_id, refusal_error,
    transfer_spec, validation,
};
use super::{
    BatchResult, Ctx, Ledger, RESERVATION_WAIT, TAG, failed_operation, prepare_command,
    reservation_refusal, transfer_outcome, unexpected,
};
use crate::APP_ID;
use crate::domain::{Command, Owner, Refusal, Reply, TransferId, TransferState};
use crate::state::{decode, encode_into, owner_key};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use spate_engine::{PartitionId, Pending, Refused};
use spate_server::ApiError;
use spate_server::access::Scope;
use spate_server::api::{ErrorBody, JsonObject, json, reply_bytes};
use utoipa::ToSchema;

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
    Prepare(#[serde(deserialize_with = "spate_server::api::json_object")] Box<Prepare>),
    Fulfil(#[serde(deserialize_with = "spate_server::api::json_object")] BatchCompletion),
    Reject(#[serde(deserialize_with = "spate_server::api::json_object")] BatchCompletion),
}

/// Prepares, fulfils and rejects, applied in order per transfer.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ledger::Batch)]
struct Batch<'body> {
    /// 1 to 10,000 operations, each `{"prepare": <a body of POST /transfers>}`,
    /// `{"fulfil": {"transferId", "source", "fulfilment"}}` or `{"reject": {"transferId", "source"}}`,
    /// where `source` names the payee as `FSPIOP-Source` does for a single request. An operation that
    /// is none of these fails alone, in its result.
    // Kept raw, so each operation is parsed once and a bad one fails alone; borrowed from the body,
    // not copied operation by operation.
    #[serde(borrow)]
    #[schema(value_type = Vec<Value>, min_items = 1, max_items = 10_000)]
    operations: Vec<&'body serde_json::value::RawValue>,
}

/// One operation as a command, if `scope` lets the key act for its payer (a prepare) or its payee (a
/// fulfil or a reject).
fn batch_command(
    operation: &serde_json::value::RawValue,
    scope: &Scope,
) -> Result<(TransferId, Command), ApiError> {
    // From the `str`: it is valid UTF-8 already, which reading bytes would check again.
    let JsonObject(operation) = serde_json::from_str::<JsonObject<BatchOperation>>(operation.get())
        .map_err(|e| validation(format!("invalid operation: {e}")))?;
    Ok(match operation {
        BatchOperation::Prepare(prepare) => {
            let spec = transfer_spec(&prepare)?;
            scope.permits(&spec.payer)?;
            (spec.id, Command::Prepare(spec))
        }
        BatchOperation::Fulfil(completion) => {
            let id = parse_transfer_id(&completion.transfer_id)?;
            check_name("source", &completion.source)?;
            scope.permits(&completion.source)?;
            let fulfilment = completion
                .fulfilment
                .as_deref()
                .ok_or_else(|| validation("a fulfil needs its fulfilment"))?;
            let fulfilment = parse_32_bytes("fulfilment", fulfilment)?;
            let source = completion.source.into();
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
            scope.permits(&completion.source)?;
            (
                id,
                Command::Reject {
                    id,
                    source: completion.source.into(),
                },
            )
        }
    })
}

fn batch_result(id: TransferId, outcome: Result<TransferState, Refusal>) -> BatchResult {
    match outcome.and_then(|state| reservation_refusal(state).map_or(Ok(state), Err)) {
        Ok(state) => BatchResult::Done(transfer_outcome(id, state)),
        Err(refusal) => failed_operation(Some(id), refusal_error(refusal)),
    }
}

/// One result per operation, in the order of the operations.
#[derive(Serialize, ToSchema)]
#[schema(as = ledger::BatchResults)]
struct BatchResults {
    results: Vec<BatchResult>,
}

/// The operations of a batch that one partition owns, kept together so they travel as one command.
struct PartitionShare {
    partition: PartitionId,
    /// (position in the batch, transfer id) of each command, in batch order.
    slots: Vec<(usize, TransferId)>,
    commands: Vec<Command>,
}

/// What one operation of a batch takes encoded, about: a prepare with names of a few bytes. The
/// buffer of a share starts at this much per operation, so that it rarely grows.
const ENCODED_OPERATION_BYTES: usize = 160;

/// A share as the command its partition applies, encoded on the thread that parsed the batch.
struct EncodedShare {
    partition: PartitionId,
    slots: Vec<(usize, TransferId)>,
    command: Vec<u8>,
}

impl PartitionShare {
    fn encode(self) -> EncodedShare {
        let mut command = Vec::with_capacity(self.commands.len() * ENCODED_OPERATION_BYTES);
        encode_into(&Command::Batch(self.commands), &mut command);
        EncodedShare {
            partition: self.partition,
            slots: self.slots,
            command,
        }
    }
}

/// Request bodies from this size up are parsed, and their answers written, on tokio's blocking pool:
/// a batch of 8,000 operations holds a thread for milliseconds, and on a runtime worker that delays
/// every other request queued behind it (reads of old transfers waited 3 ms at the median behind the
/// batch load; BENCHMARKS.md, "ledger history"). Smaller ones stay on the worker, sparing two thread
/// hand-offs.
const HEAVY_BODY_BYTES: usize = 64 << 10;

/// Runs `work` on tokio's blocking pool if `heavy`, else here.
async fn run_heavy<T: Send + 'static>(heavy: bool, work: impl FnOnce() -> T + Send + 'static) -> T {
    if !heavy {
        return work();
    }
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// A batch parsed and split by partition, before anything is queued.
struct BatchPlan {
    /// One per operation; those that failed before reaching a partition are already filled in.
    results: Vec<Option<BatchResult>>,
    /// (position in the batch, transfer id) of each prepare queued.
    prepared: Vec<(usize, TransferId)>,
    shares: Vec<EncodedShare>,
}

fn plan_batch(ledger: &Ledger, body: &Bytes, scope: &Scope) -> Result<BatchPlan, ApiError> {
    let Batch { operations } = parse_body(body)?;
    if operations.is_empty() || operations.len() > BATCH_OPERATIONS_MAX {
        return Err(validation(format!(
            "a batch holds 1 to {BATCH_OPERATIONS_MAX} operations"
        )));
    }
    let mut results: Vec<Option<BatchResult>> = (0..operations.len()).map(|_| None).collect();
    // Parsed before the model is locked: the projection waits for that lock.
    let parsed: Vec<_> = operations
        .iter()
        .map(|op| batch_command(op, scope))
        .collect();
    let mut prepared: Vec<(usize, TransferId)> = Vec::new();
    let model = ledger
        .model
        .read()
        .expect("the ledger model lock is never poisoned");
    let mut shares: Vec<PartitionShare> = Vec::new();
    for (slot, parsed) in parsed.into_iter().enumerate() {
        let (id, command) = match parsed {
            Ok(parsed) => parsed,
            Err(error) => {
                results[slot] = Some(failed_operation(None, error));
                continue;
            }
        };
        let command = match command {
            Command::Prepare(spec) => {
                match prepare_command(&model, ledger.open_transfers_max, spec) {
                    Ok(command) => {
                        prepared.push((slot, id));
                        command
                    }
                    Err(error) => {
                        results[slot] = Some(failed_operation(Some(id), error));
                        continue;
                    }
                }
            }
            other => other,
        };
        let partition = ledger.engine.partition_of(&owner_key(&Owner::Transfer(id)));
        let share = match shares.iter().position(|s| s.partition == partition) {
            Some(index) => &mut shares[index],
            None => {
                shares.push(PartitionShare {
                    partition,
                    slots: Vec::new(),
                    commands: Vec::new(),
                });
                shares.last_mut().expect("just pushed")
            }
        };
        share.slots.push((slot, id));
        share.commands.push(command);
    }
    Ok(BatchPlan {
        results,
        prepared,
        shares: shares.into_iter().map(PartitionShare::encode).collect(),
    })
}

/// Many prepares, fulfils and rejects in one request, each applied as its single request would be,
/// in order per transfer; one result per operation, in order.
///
/// The answer comes once every prepare's reservation is settled, or after 10 seconds (those still
/// unsettled are RECEIVED). A result is a transfer's state, as the single request answers it, or the
/// error that request would have been answered, in FSPIOP's code.
// The operations each partition owns go to it as one command, so a batch costs a few journal
// records, not one per operation.
#[utoipa::path(
    post,
    path = "/transfers/batch",
    tag = TAG,
    request_body = Batch,
    responses(
        (status = 200, description = "One result per operation.", body = BatchResults),
        (status = 400, description = "`3100`: the body is not a batch of 1 to 10,000 operations.", body = ErrorBody),
    ),
)]
pub(super) async fn batch(
    State(ledger): Ctx,
    scope: Scope,
    body: Bytes,
) -> Result<Response, ApiError> {
    let heavy = body.len() >= HEAVY_BODY_BYTES;
    let planning = ledger.clone();
    let BatchPlan {
        mut results,
        prepared,
        shares,
    } = run_heavy(heavy, move || plan_batch(&planning, &body, &scope)).await?;
    let registration = ledger.waiters.register(results.len(), prepared);
    // Queue every share first, so the partitions work in parallel, then collect the answers.
    let queued: Vec<_> = shares
        .into_iter()
        .map(|share| {
            let queued = ledger
                .engine
                .enqueue(share.partition, APP_ID, None, share.command);
            (share.slots, queued)
        })
        .collect();
    let deadline = tokio::time::Instant::now() + RESERVATION_WAIT;
    // Prepares answered RECEIVED: their results wait for their reservations.
    let mut receiving: Vec<(usize, TransferId)> = Vec::new();
    for (slots, queued) in queued {
        let replies = match share_replies(queued, slots.len()).await {
            Ok(replies) => replies,
            Err(error) => {
                for (slot, id) in slots {
                    results[slot] = Some(failed_operation(Some(id), error.clone()));
                }
                continue;
            }
        };
        for ((slot, id), reply) in slots.into_iter().zip(replies) {
            let outcome = match reply {
                Reply::Transfer(_, TransferState::Received) => {
                    receiving.push((slot, id));
                    continue;
                }
                Reply::Transfer(_, state) => Ok(state),
                Reply::Refused(refusal) => Err(refusal),
                other => return Err(unexpected(&other)),
            };
            results[slot] = Some(batch_result(id, outcome));
        }
    }
    let waited: Vec<usize> = receiving.iter().map(|&(slot, _)| slot).collect();
    registration.wait_for(&waited, deadline).await;
    for (slot, id) in receiving {
        // Those still unsettled at the deadline are answered RECEIVED.
        let state = registration.state(slot).unwrap_or(TransferState::Received);
        results[slot] = Some(batch_result(id, Ok(state)));
    }
    let results: Vec<BatchResult> = results
        .into_iter()
        .map(|result| result.expect("every operation has a result"))
        .collect();
    Ok(run_heavy(heavy, move || {
        json(StatusCode::OK, &BatchResults { results })
    })
    .await)
}

/// The replies to one partition's share of a batch, one per command.
async fn share_replies(
    queued: Result<Pending, Refused>,
    expected: usize,
) -> Result<Vec<Reply>, ApiError> {
    let reply = match queued {
        Ok(pending) => pending.reply().await?,
        Err(refused) => return Err(refused.error.into()),
    };
    let bytes = reply_bytes(reply)?;
    match decode::<Reply>(&bytes) {
        Ok(Reply::Batch(replies)) if replies.len() == expected => Ok(replies),
        Ok(other) => Err(unexpected(&other)),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            e.to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_borrowed_from_the_body_as_sent_and_their_escapes_read_once_parsed() {
        let body = Bytes::from_static(
            br#"{"operations": [{"fulfil": {"transferId": "\u0061b", "source": "p\"q"}}, 7 , "x"]}"#,
        );
        let Batch { operations } = parse_body(&body).unwrap();
        let texts: Vec<&str> = operations.iter().map(|op| op.get()).collect();
        assert_eq!(
            texts,
            [
                r#"{"fulfil": {"transferId": "\u0061b", "source": "p\"q"}}"#,
                "7",
                r#""x""#
            ]
        );
        let JsonObject(operation) =
            serde_json::from_str::<JsonObject<BatchOperation>>(texts[0]).unwrap();
        let BatchOperation::Fulfil(completion) = operation else {
            panic!("a fulfil");
        };
        assert_eq!(
            (completion.transfer_id.as_str(), completion.source.as_str()),
            ("ab", "p\"q")
        );
        assert!(serde_json::from_str::<JsonObject<BatchOperation>>(texts[1]).is_err());
    }
}
