//! tally's HTTP routes.
//!
//! - `POST /tally/accounts/{name}/entries` `{"amount": i64, "tag": u64}` → 201 `{"balance": "..."}`
//! - `POST /tally/transfers` `{"from", "to", "amount" > 0, "tag"}` → 201, or 409 `insufficient_funds`
//! - `GET /tally/accounts/{name}?offset=&limit=` → the balance and a page of entries (owning partition)
//! - `GET /tally/totals` → entries and balance sum over all accounts (projection, may lag)
//!
//! POSTs honour an `Idempotency-Key` header.

use crate::command::{ACCOUNT_BYTES_MAX, Command, Outcome};
use crate::state::{Account, TallyState, Totals};
use crate::{APP_ID, APP_NAME};
use axum::Router;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;
use spate_engine::EngineHandle;
use spate_server::api::{command_id, json, reply_bytes};
use spate_server::{ApiError, ApiJson};
use std::sync::{Arc, RwLock};

/// Most entries one account query returns.
const PAGE_ENTRIES_MAX: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    amount: i64,
    tag: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    from: String,
    to: String,
    amount: i64,
    tag: u64,
}

/// One page of an account, copied out of the partition by a query.
struct AccountPage {
    balance: i128,
    entry_count: usize,
    entries: Vec<(u64, i64)>,
}

#[derive(Deserialize)]
struct Page {
    offset: Option<usize>,
    limit: Option<usize>,
}

fn check_account(field: &str, name: &str) -> Result<(), ApiError> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > ACCOUNT_BYTES_MAX || !name.chars().all(valid_char) {
        return Err(ApiError::bad_request(format!(
            "{field} must be 1 to {ACCOUNT_BYTES_MAX} characters of A-Z, a-z, 0-9, '-', '_' or '.'"
        )));
    }
    Ok(())
}

async fn submit(
    engine: &EngineHandle,
    key: &str,
    headers: &HeaderMap,
    command: Command,
) -> Result<Response, ApiError> {
    let id = command_id(headers, APP_NAME)?;
    let partition = engine.partition_of(key.as_bytes());
    let reply = engine
        .submit(partition, APP_ID, id, command.encode())
        .await?;
    let bytes = reply_bytes(reply)?;
    let outcome = Outcome::decode(&bytes)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    Ok(match outcome {
        Outcome::Applied { balance } => json(
            StatusCode::CREATED,
            &serde_json::json!({ "balance": balance.to_string() }),
        ),
        Outcome::InsufficientFunds { balance } => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "insufficient_funds",
                format!("the payer's balance {balance} is below the amount"),
            ));
        }
        Outcome::Rejected { reason } => return Err(ApiError::bad_request(reason)),
    })
}

pub(crate) fn routes(engine: EngineHandle, totals: Arc<RwLock<Totals>>) -> Router {
    let add_engine = engine.clone();
    let transfer_engine = engine.clone();
    let totals_engine = engine.clone();
    Router::new()
        .route(
            "/tally/accounts/{name}/entries",
            post(move |Path(name): Path<String>, headers: HeaderMap, ApiJson(body): ApiJson<EntryBody>| async move {
                check_account("account", &name)?;
                let command = Command::Add { account: name.clone(), amount: body.amount, tag: body.tag };
                submit(&add_engine, &name, &headers, command).await
            }),
        )
        .route(
            "/tally/transfers",
            post(move |headers: HeaderMap, ApiJson(body): ApiJson<TransferBody>| async move {
                check_account("from", &body.from)?;
                check_account("to", &body.to)?;
                if body.amount <= 0 {
                    return Err(ApiError::bad_request("amount must be greater than 0"));
                }
                if body.from == body.to {
                    return Err(ApiError::bad_request("from and to must differ"));
                }
                let command = Command::Transfer { from: body.from.clone(), to: body.to, amount: body.amount, tag: body.tag };
                submit(&transfer_engine, &body.from, &headers, command).await
            }),
        )
        .route(
            "/tally/accounts/{name}",
            get(move |Path(name): Path<String>, Query(page): Query<Page>| async move {
                check_account("account", &name)?;
                let offset = page.offset.unwrap_or(0);
                let limit = page.limit.unwrap_or(1000);
                if limit > PAGE_ENTRIES_MAX {
                    return Err(ApiError::bad_request(format!("limit must be at most {PAGE_ENTRIES_MAX}")));
                }
                let partition = engine.partition_of(name.as_bytes());
                let lookup = name.clone();
                let found: Option<AccountPage> = engine
                    .query(partition, APP_ID, move |state: &TallyState| {
                        state.account(&lookup).map(|Account { balance, entries }| {
                            let page = entries.iter().skip(offset).take(limit).copied().collect();
                            AccountPage { balance: *balance, entry_count: entries.len(), entries: page }
                        })
                    })
                    .await?;
                let Some(AccountPage { balance, entry_count, entries: page }) = found else {
                    return Err(ApiError::not_found(format!("no account {name}")));
                };
                let entries: Vec<_> = page.iter().map(|(tag, amount)| serde_json::json!({"tag": tag, "amount": amount})).collect();
                Ok(json(
                    StatusCode::OK,
                    &serde_json::json!({ "account": name, "balance": balance.to_string(), "entry_count": entry_count, "entries": entries }),
                ))
            }),
        )
        .route(
            "/tally/totals",
            get(move || async move {
                let totals = *totals.read().expect("the totals lock is never poisoned");
                let lag = totals_engine.projection_lag(APP_ID).unwrap_or(0);
                json(StatusCode::OK, &serde_json::json!({ "entries": totals.entries, "balance_sum": totals.balance_sum.to_string(), "lag_records": lag }))
            }),
        )
}
