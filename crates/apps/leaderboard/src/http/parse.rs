//! Reading requests: names, scores, operators, query parameters and JSON bodies, each with a 400 whose
//! message names what is wrong.

use crate::board::Operator;
use crate::command::NAME_BYTES_MAX;
use serde::Deserialize;
use spate_server::ApiError;
use std::collections::HashMap;

pub(super) fn valid_name(name: &str) -> bool {
    let valid = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@');
    !name.is_empty() && name.len() <= NAME_BYTES_MAX && name.bytes().all(valid)
}

pub(super) fn name_error(field: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{field} must be 1 to {NAME_BYTES_MAX} characters of A-Z, a-z, 0-9, '-', '_', '.', ':' or '@'"
    ))
}

pub(super) fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(name_error(field))
    }
}

pub(super) fn parse_score_text(field: &str, text: &str) -> Result<i128, ApiError> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ApiError::bad_request(format!(
            "{field} must be a decimal integer, got {:?}",
            truncate(text)
        )));
    }
    text.parse::<i128>().map_err(|_| {
        ApiError::bad_request(format!(
            "{field} is beyond the signed 128-bit range ({} to {})",
            i128::MIN,
            i128::MAX
        ))
    })
}

pub(super) fn truncate(text: &str) -> &str {
    match text.char_indices().nth(48) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

pub(super) fn parse_operator(field: &str, name: &str) -> Result<Operator, ApiError> {
    // The case study's modes name two of ours.
    let name = match name {
        "replace" => "set",
        other => other,
    };
    Operator::parse(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{field} must be one of {} (or the case study's \"replace\")",
            Operator::NAMES.join(", ")
        ))
    })
}

pub(super) fn param_number<T>(
    params: &HashMap<String, String>,
    name: &str,
    default: T,
    max: T,
) -> Result<T, ApiError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let Some(text) = params.get(name) else {
        return Ok(default);
    };
    match text.parse::<T>() {
        Ok(value) if value <= max => Ok(value),
        _ => Err(ApiError::bad_request(format!(
            "{name} must be a whole number up to {max}, got {:?}",
            truncate(text)
        ))),
    }
}

pub(super) fn param_season(params: &HashMap<String, String>) -> Result<Option<u32>, ApiError> {
    params
        .get("season")
        .map(|text| match text.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(ApiError::bad_request(format!(
                "season must be a season number from 1, got {:?}",
                truncate(text)
            ))),
        })
        .transpose()
}

/// A score as JSON carries it: an integer, or a decimal string for values beyond what JSON numbers carry
/// exactly. Deserializing checks the 128-bit range, so a bad score fails with the field's position.
#[derive(Debug, Clone, Copy)]
pub(super) struct Score(pub(super) i128);

impl<'de> Deserialize<'de> for Score {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Score;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an integer score (send values beyond 64 bits as a decimal string)")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Score, E> {
                Ok(Score(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Score, E> {
                Ok(Score(v.into()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Score, E> {
                parse_score_text("score", v)
                    .map(Score)
                    .map_err(|e| E::custom(e.message))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A JSON body parsed in place. Every malformed body is a 400 (the issue asks 400 for a score beyond
/// 128 bits, and one status for every body error is simpler for clients than 400 and 422 by cause).
pub(super) fn parse_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}
