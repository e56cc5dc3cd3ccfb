//! Reading FSPIOP requests: names, currencies, transfer ids, amounts, conditions, times and bodies, each
//! refused with a 3100 whose message names the problem; the FSPIOP error as spate's error shape; and
//! what each check accepts, as the schema the API description gives its values.

use crate::amount;
use crate::domain::{ErrorCode, Refusal, TransferId, TransferSpec};
use axum::body::Bytes;
use axum::http::StatusCode;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use spate_server::ApiError;
use spate_server::api::{NOT_DOT_SEGMENTS, reachable_in_a_path};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

/// Longest FSP name (FSPIOP's FspId).
const NAME_BYTES_MAX: usize = 32;

/// The FSPIOP error as spate's error shape: the code is FSPIOP's, the status follows from it.
pub(super) fn refusal_error(refusal: Refusal) -> ApiError {
    let status = match refusal.code {
        ErrorCode::Validation
        | ErrorCode::Expired
        | ErrorCode::PayerNotFound
        | ErrorCode::PayeeNotFound => StatusCode::BAD_REQUEST,
        ErrorCode::ModifiedRequest | ErrorCode::ParticipantExists => StatusCode::CONFLICT,
        ErrorCode::TransferNotFound | ErrorCode::ParticipantNotFound => StatusCode::NOT_FOUND,
        ErrorCode::ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::PayerLiquidity => StatusCode::UNPROCESSABLE_ENTITY,
    };
    ApiError::new(status, refusal.code.code().to_string(), refusal.message)
}

/// Declares a string type of the API description (`ledger.NAME`) with the pattern of what a check here
/// accepts, for fields to name with `#[schema(value_type = ...)]`.
macro_rules! text_schema {
    ($(#[$doc:meta])* $name:ident, $description:expr, $pattern:expr) => {
        $(#[$doc])*
        pub(super) struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some($description))
                    .pattern(Some($pattern))
                    .into()
            }
        }

        impl ToSchema for $name {
            fn name() -> std::borrow::Cow<'static, str> {
                concat!("ledger.", stringify!($name)).into()
            }
        }
    };
}

text_schema!(
    /// An FSP's name as [`check_name`] accepts it.
    FspName,
    "An FSP's name (FSPIOP's FspId): 1 to 32 characters of A-Z, a-z, 0-9, '-', '_' or '.'.",
    format!("^[A-Za-z0-9._-]{{1,{NAME_BYTES_MAX}}}$")
);

text_schema!(
    /// A currency as [`check_currency`] accepts it.
    Currency,
    "An ISO 4217 currency code: three capital letters.",
    "^[A-Z]{3}$"
);

text_schema!(
    /// An amount as [`amount::parse`] accepts it.
    Decimal,
    "FSPIOP's Amount: a decimal such as \"100\" or \"12.5\", at most 18 digits before the point and \
     4 after it, without leading or trailing zeros, and no more decimals than the currency has (2 for \
     most).",
    amount::pattern()
);

text_schema!(
    /// A transfer id as [`parse_transfer_id`] accepts it.
    CorrelationId,
    "FSPIOP's CorrelationId, as a transferId: a UUID in its 8-4-4-4-12 form, such as \
     \"b51ec534-ee48-4575-b6a9-ead2955b8069\".",
    "^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"
);

text_schema!(
    /// A condition or fulfilment as [`parse_32_bytes`] accepts it.
    Base64Url32,
    "32 bytes in base64url without padding (43 characters).",
    "^[A-Za-z0-9_-]{43}$"
);

pub(super) fn validation(message: impl Into<String>) -> ApiError {
    refusal_error(Refusal {
        code: ErrorCode::Validation,
        message: message.into(),
    })
}

/// A JSON body under any content type: FSPIOP clients send `application/vnd.interoperability.*+json`.
/// What does not parse is a 3100 naming the problem.
pub(super) fn parse_body<'body, T: serde::Deserialize<'body>>(
    body: &'body Bytes,
) -> Result<T, ApiError> {
    spate_server::api::from_json_object(body)
        .map_err(|e| validation(format!("invalid JSON body: {e}")))
}

pub(super) fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    let valid = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    if name.is_empty()
        || name.len() > NAME_BYTES_MAX
        || !name.bytes().all(valid)
        || !reachable_in_a_path(name)
    {
        return Err(validation(format!(
            "{field} must be 1 to {NAME_BYTES_MAX} characters of A-Z, a-z, 0-9, '-', '_' or '.', {NOT_DOT_SEGMENTS}"
        )));
    }
    Ok(())
}

pub(super) fn check_currency(currency: &str) -> Result<(), ApiError> {
    if amount::valid_currency(currency) {
        Ok(())
    } else {
        Err(validation(format!(
            "currency {currency:?} is not three capital letters (ISO 4217)"
        )))
    }
}

/// FSPIOP's `transferId`: a UUID in its canonical 8-4-4-4-12 form.
pub(super) fn parse_transfer_id(text: &str) -> Result<TransferId, ApiError> {
    let bytes = text.as_bytes();
    let dashes_at = [8, 13, 18, 23];
    let shaped = bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| {
            if dashes_at.contains(&i) {
                *b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        });
    if !shaped {
        return Err(validation(format!(
            "transferId {:?} is not a UUID such as \"b51ec534-ee48-4575-b6a9-ead2955b8069\"",
            text.chars().take(40).collect::<String>()
        )));
    }
    Ok(bytes.iter().filter(|b| **b != b'-').fold(0, |id, b| {
        let digit = (*b as char).to_digit(16).expect("checked hex digits");
        (id << 4) | TransferId::from(digit)
    }))
}

pub(super) fn format_transfer_id(id: TransferId) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(36);
    for nibble in 0..32 {
        if matches!(nibble, 8 | 12 | 16 | 20) {
            text.push('-');
        }
        let digit = (id >> (4 * (31 - nibble))) & 0xf;
        text.push(char::from(DIGITS[digit as usize]));
    }
    text
}

/// A condition or fulfilment: base64url without padding of 32 bytes (43 characters).
pub(super) fn parse_32_bytes(field: &str, text: &str) -> Result<[u8; 32], ApiError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or_else(|| {
            validation(format!(
                "{field} must be 32 bytes in base64url without padding (43 characters)"
            ))
        })
}

pub(super) fn parse_time_ms(field: &str, text: &str) -> Result<u64, ApiError> {
    let parsed = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| {
            validation(format!(
                "{field} {text:?} is not an RFC 3339 date-time: {e}"
            ))
        })?;
    // Times are answered in UTC, and an offset can carry one past the last UTC can write.
    if parsed.checked_to_utc().is_none() {
        return Err(validation(format!(
            "{field} {text:?} is after 9999-12-31T23:59:59Z"
        )));
    }
    u64::try_from(parsed.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| validation(format!("{field} is before 1970")))
}

pub(super) fn format_time_ms(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// An amount in a currency.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ledger::Money)]
pub(super) struct Money {
    #[schema(value_type = Currency)]
    pub(super) currency: String,
    #[schema(value_type = Decimal)]
    pub(super) amount: String,
}

/// FSPIOP's prepare (`POST /transfers`): the payer asks to move `amount` to the payee once the payee
/// shows the fulfilment of `condition`, before `expiration`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schema(as = ledger::Prepare)]
pub(super) struct Prepare {
    /// New for each transfer; a prepare sent again with the same id and content is answered as the
    /// first was, and refused (3106) with other content.
    #[schema(value_type = CorrelationId)]
    transfer_id: String,
    /// The payer, whose net debit cap must cover the amount.
    #[schema(value_type = FspName)]
    payer_fsp: String,
    /// The payee, another FSP than the payer, in the same currency.
    #[schema(value_type = FspName)]
    payee_fsp: String,
    /// More than 0.
    #[serde(deserialize_with = "spate_server::api::json_object")]
    amount: Money,
    /// The SHA-256 of the fulfilment the payee will show.
    #[schema(value_type = Base64Url32)]
    condition: String,
    /// When the transfer expires if it is not fulfilled: an RFC 3339 date-time in the future.
    #[schema(format = DateTime)]
    expiration: String,
    /// Kept as part of what the prepare says; not read.
    ilp_packet: Option<String>,
    /// Kept as part of what the prepare says; not read.
    extension_list: Option<Value>,
}

pub(super) fn transfer_spec(body: &Prepare) -> Result<TransferSpec, ApiError> {
    let id = parse_transfer_id(&body.transfer_id)?;
    check_name("payerFsp", &body.payer_fsp)?;
    check_name("payeeFsp", &body.payee_fsp)?;
    if body.payer_fsp == body.payee_fsp {
        return Err(validation("payerFsp and payeeFsp must differ"));
    }
    check_currency(&body.amount.currency)?;
    let amount = amount::parse(&body.amount.amount, &body.amount.currency).map_err(validation)?;
    if amount <= 0 {
        return Err(validation("amount must be positive"));
    }
    let condition = parse_32_bytes("condition", &body.condition)?;
    let expiration_ms = parse_time_ms("expiration", &body.expiration)?;
    // Everything the request says, so a resend is told from a modified request: the hash of a JSON
    // array of these values, which journals, snapshots and the archive keep. Written straight from the
    // fields, not through a `json!` tree of their copies (a tenth of a batch's parse).
    let canonical = serde_json::to_vec(&(
        &body.transfer_id,
        &body.payer_fsp,
        &body.payee_fsp,
        &body.amount.currency,
        amount.to_string(),
        &body.condition,
        expiration_ms,
        &body.ilp_packet,
        &body.extension_list,
    ))
    .expect("JSON encodes");
    Ok(TransferSpec {
        id,
        payer: body.payer_fsp.as_str().into(),
        payee: body.payee_fsp.as_str().into(),
        currency: body.amount.currency.as_str().into(),
        amount,
        condition,
        expiration_ms,
        content_hash: xxhash_rust::xxh3::xxh3_64(&canonical),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The content hash is kept in journals, snapshots and the archive: a resend after an upgrade
    /// must hash as the first prepare did, when the array was built with `json!`.
    #[test]
    fn the_content_hash_is_that_of_the_json_array_of_the_prepare() {
        let bodies = [
            json!({"transferId": "0b3f8e7a-6a2c-4c1e-9d1b-2f6f3b1f9a10", "payerFsp": "dfsp1",
                "payeeFsp": "dfsp2", "amount": {"currency": "USD", "amount": "12.5"},
                "condition": "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU",
                "expiration": "2030-01-01T00:00:00.000Z"}),
            json!({"transferId": "0b3f8e7a-6a2c-4c1e-9d1b-2f6f3b1f9a11", "payerFsp": "fsp.a-1",
                "payeeFsp": "fsp_b", "amount": {"currency": "EUR", "amount": "7"},
                "condition": "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU",
                "expiration": "2030-01-01T00:00:00+02:00", "ilpPacket": "AYIB\"gQ\\",
                "extensionList": {"extension": [{"value": "\u{e9}\n", "key": "z"}, {"key": "a"}]}}),
        ];
        for body in bodies {
            let prepare: Prepare = serde_json::from_value(body.clone()).unwrap();
            let amount = amount::parse(&prepare.amount.amount, &prepare.amount.currency).unwrap();
            let expiration_ms = parse_time_ms("expiration", &prepare.expiration).unwrap();
            let as_built_before = serde_json::to_vec(&json!([
                prepare.transfer_id,
                prepare.payer_fsp,
                prepare.payee_fsp,
                prepare.amount.currency,
                amount.to_string(),
                prepare.condition,
                expiration_ms,
                prepare.ilp_packet,
                prepare.extension_list,
            ]))
            .unwrap();
            let spec = transfer_spec(&prepare).unwrap_or_else(|_| panic!("valid: {body}"));
            assert_eq!(
                spec.content_hash,
                xxhash_rust::xxh3::xxh3_64(&as_built_before),
                "{body}"
            );
        }
    }
}
