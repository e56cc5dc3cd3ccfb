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
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use spate_engine::EngineHandle;
use spate_server::api::{
    IdempotencyKey, JsonObject, NOT_DOT_SEGMENTS, json, reachable_in_a_path, reply_bytes,
};
use spate_server::openapi::AppRouter;
use spate_server::{ApiError, ApiJson};
use std::sync::{Arc, RwLock};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

/// Most entries one account query returns.
const PAGE_ENTRIES_MAX: usize = 10_000;

/// The tag for tally's routes in the API description.
const TAG: &str = "tally";

#[derive(Deserialize, ToSchema)]
#[schema(as = tally::EntryBody)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    /// Added to the balance; negative to take away.
    amount: i64,
    /// The caller's label for the entry, kept with it.
    tag: u64,
}

#[derive(Deserialize, ToSchema)]
#[schema(as = tally::TransferBody)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    /// The payer's account.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9._-]+$")]
    from: String,
    /// The payee's account, another than the payer's.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9._-]+$")]
    to: String,
    #[schema(minimum = 1)]
    amount: i64,
    tag: u64,
}

/// A balance after a write, in decimal (it may exceed 64 bits).
#[derive(Serialize, ToSchema)]
#[schema(as = tally::BalanceAnswer)]
struct BalanceAnswer {
    balance: String,
}

#[derive(Serialize, ToSchema)]
#[schema(as = tally::EntryAnswer)]
struct EntryAnswer {
    tag: u64,
    amount: i64,
}

#[derive(Serialize, ToSchema)]
#[schema(as = tally::AccountAnswer)]
struct AccountAnswer {
    account: String,
    /// In decimal (it may exceed 64 bits).
    balance: String,
    /// Entries the account has in all; `entries` is a page of them.
    entry_count: usize,
    entries: Vec<EntryAnswer>,
}

#[derive(Serialize, ToSchema)]
#[schema(as = tally::TotalsAnswer)]
struct TotalsAnswer {
    entries: u64,
    /// The sum of every balance, in decimal; 0 while no transfer is half done.
    balance_sum: String,
    /// Records the totals have not seen yet.
    lag_records: u64,
}

/// One page of an account, copied out of the partition by a query.
struct AccountPage {
    balance: i128,
    entry_count: usize,
    entries: Vec<(u64, i64)>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct Page {
    /// Entries to skip, oldest first.
    offset: Option<usize>,
    /// Entries to return, at most 10,000 (1,000 when absent).
    #[param(maximum = 10_000)]
    limit: Option<usize>,
}

#[derive(Clone)]
struct Tally {
    engine: EngineHandle,
    totals: Arc<RwLock<Totals>>,
}

fn check_account(field: &str, name: &str) -> Result<(), ApiError> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty()
        || name.len() > ACCOUNT_BYTES_MAX
        || !name.chars().all(valid_char)
        || !reachable_in_a_path(name)
    {
        return Err(ApiError::bad_request(format!(
            "{field} must be 1 to {ACCOUNT_BYTES_MAX} characters of A-Z, a-z, 0-9, '-', '_' or '.', {NOT_DOT_SEGMENTS}"
        )));
    }
    Ok(())
}

async fn submit(
    engine: &EngineHandle,
    key: &str,
    idempotency_key: &IdempotencyKey,
    command: Command,
) -> Result<Response, ApiError> {
    let id = idempotency_key.command_id(APP_NAME)?;
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
            &BalanceAnswer {
                balance: balance.to_string(),
            },
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

/// Adds an entry to an account (made on its first entry).
#[utoipa::path(
    post,
    path = "/tally/accounts/{name}/entries",
    tag = TAG,
    params(("name" = String, Path, description = "1 to 64 characters of A-Z, a-z, 0-9, '-', '_' or '.'"), IdempotencyKey),
    request_body = EntryBody,
    responses(
        (status = 201, description = "Durable; the account's balance after it.", body = BalanceAnswer),
        (status = 415, description = "The body's `Content-Type` is not `application/json`.", body = spate_server::api::ErrorBody),
    ),
)]
async fn add_entry(
    State(tally): State<Tally>,
    Path(name): Path<String>,
    idempotency_key: IdempotencyKey,
    ApiJson(JsonObject(body)): ApiJson<JsonObject<EntryBody>>,
) -> Result<Response, ApiError> {
    check_account("account", &name)?;
    let command = Command::Add {
        account: name.clone(),
        amount: body.amount,
        tag: body.tag,
    };
    submit(&tally.engine, &name, &idempotency_key, command).await
}

/// Moves an amount from one account to another, if the payer's balance covers it.
#[utoipa::path(
    post,
    path = "/tally/transfers",
    tag = TAG,
    params(IdempotencyKey),
    request_body = TransferBody,
    responses(
        (status = 201, description = "Durable; the payer's balance after it.", body = BalanceAnswer),
        (status = 409, description = "`insufficient_funds`: the payer's balance is below the amount.", body = spate_server::api::ErrorBody),
        (status = 415, description = "The body's `Content-Type` is not `application/json`.", body = spate_server::api::ErrorBody),
    ),
)]
async fn transfer(
    State(tally): State<Tally>,
    idempotency_key: IdempotencyKey,
    ApiJson(JsonObject(body)): ApiJson<JsonObject<TransferBody>>,
) -> Result<Response, ApiError> {
    check_account("from", &body.from)?;
    check_account("to", &body.to)?;
    if body.amount <= 0 {
        return Err(ApiError::bad_request("amount must be greater than 0"));
    }
    if body.from == body.to {
        return Err(ApiError::bad_request("from and to must differ"));
    }
    let command = Command::Transfer {
        from: body.from.clone(),
        to: body.to,
        amount: body.amount,
        tag: body.tag,
    };
    submit(&tally.engine, &body.from, &idempotency_key, command).await
}

/// An account's balance and a page of its entries, from the partition that owns it.
#[utoipa::path(
    get,
    path = "/tally/accounts/{name}",
    tag = TAG,
    params(("name" = String, Path, description = "The account."), Page),
    responses(
        (status = 200, description = "The account.", body = AccountAnswer),
        (status = 404, description = "No such account.", body = spate_server::api::ErrorBody),
    ),
)]
async fn get_account(
    State(tally): State<Tally>,
    Path(name): Path<String>,
    Query(page): Query<Page>,
) -> Result<Response, ApiError> {
    check_account("account", &name)?;
    let offset = page.offset.unwrap_or(0);
    let limit = page.limit.unwrap_or(1000);
    if limit > PAGE_ENTRIES_MAX {
        return Err(ApiError::bad_request(format!(
            "limit must be at most {PAGE_ENTRIES_MAX}"
        )));
    }
    let partition = tally.engine.partition_of(name.as_bytes());
    let lookup = name.clone();
    let found: Option<AccountPage> = (tally.engine)
        .query(partition, APP_ID, move |state: &TallyState| {
            state.account(&lookup).map(|Account { balance, entries }| {
                let page = entries.iter().skip(offset).take(limit).copied().collect();
                AccountPage {
                    balance: *balance,
                    entry_count: entries.len(),
                    entries: page,
                }
            })
        })
        .await?;
    let Some(found) = found else {
        return Err(ApiError::not_found(format!("no account {name}")));
    };
    let answer = AccountAnswer {
        account: name,
        balance: found.balance.to_string(),
        entry_count: found.entry_count,
        entries: (found.entries.into_iter())
            .map(|(tag, amount)| EntryAnswer { tag, amount })
            .collect(),
    };
    Ok(json(StatusCode::OK, &answer))
}

/// Entries and the sum of balances over every account, from the read model (it may lag).
#[utoipa::path(
    get,
    path = "/tally/totals",
    tag = TAG,
    responses((status = 200, description = "The totals.", body = TotalsAnswer)),
)]
async fn get_totals(State(tally): State<Tally>) -> Response {
    let totals = *tally
        .totals
        .read()
        .expect("the totals lock is never poisoned");
    let answer = TotalsAnswer {
        entries: totals.entries,
        balance_sum: totals.balance_sum.to_string(),
        lag_records: tally.engine.projection_lag(APP_ID).unwrap_or(0),
    };
    json(StatusCode::OK, &answer)
}

pub(crate) fn routes(engine: EngineHandle, totals: Arc<RwLock<Totals>>) -> AppRouter {
    AppRouter::new()
        .routes(routes!(add_entry))
        .routes(routes!(transfer))
        .routes(routes!(get_account))
        .routes(routes!(get_totals))
        .with_state(Tally { engine, totals })
}
