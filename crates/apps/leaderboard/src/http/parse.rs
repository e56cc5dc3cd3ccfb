//! Reading requests: names, scores, operators, query parameters and JSON bodies, each with a 400 whose
//! message names what is wrong; and the API description's schemas of what they accept, built from the
//! same limits.

use crate::board::{Operator, Order, TiePolicy};
use crate::command::NAME_BYTES_MAX;
use serde::Deserialize;
use spate_server::ApiError;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{RefOr, Required};

/// The characters of a name besides ASCII letters and digits, as [`valid_name`] takes them ('-' last,
/// so that it is literal in the description's pattern).
const NAME_PUNCTUATION: &str = "._:@-";

/// The case study's name of [`Operator::Set`].
const SET_ALIAS: &str = "replace";

/// What a decimal score looks like as text.
const SCORE_TEXT_PATTERN: &str = "^-?[0-9]+$";

pub(super) fn valid_name(name: &str) -> bool {
    // Spelled out rather than looked up in NAME_PUNCTUATION: this runs on every byte of every name.
    let valid = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@');
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(valid)
        && spate_server::api::reachable_in_a_path(name)
}

pub(super) fn name_error(field: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{field} must be 1 to {NAME_BYTES_MAX} characters of A-Z, a-z, 0-9, '-', '_', '.', ':' or '@', {}",
        spate_server::api::NOT_DOT_SEGMENTS
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
    let name = if name == SET_ALIAS { "set" } else { name };
    Operator::parse(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{field} must be one of {} (or the case study's {SET_ALIAS:?})",
            Operator::NAMES.join(", ")
        ))
    })
}

/// The whole number of query parameter `name`, given as `text`: `default` when absent, up to `max`.
pub(super) fn param_number<T>(
    name: &str,
    text: Option<&str>,
    default: T,
    max: T,
) -> Result<T, ApiError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let Some(text) = text else {
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

/// The season number of the query parameter `season`, given as `text`.
pub(super) fn param_season(text: Option<&str>) -> Result<Option<u32>, ApiError> {
    text.map(|text| match text.parse::<u32>() {
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
    spate_server::api::from_json_object(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

impl utoipa::PartialSchema for Score {
    fn schema() -> RefOr<Schema> {
        // serde_json hands over integers that fit 64 bits (signed or not) as integers, larger ones as
        // floats, which are refused.
        let integer = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(i64::MIN))
            .maximum(Some(u64::MAX));
        OneOfBuilder::new()
            .description(Some(
                "A whole number: a JSON integer of up to 64 bits, or any signed 128-bit value as a decimal string.",
            ))
            .item(integer)
            .item(score_text_schema())
            .into()
    }
}

impl utoipa::ToSchema for Score {
    fn name() -> std::borrow::Cow<'static, str> {
        "LeaderboardScore".into()
    }
}

/// The description of a board's or a member's name, as [`valid_name`] takes it.
pub(super) fn name_schema() -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(NAME_BYTES_MAX))
        .pattern(Some(format!("^[A-Za-z0-9{NAME_PUNCTUATION}]+$")))
        .into()
}

/// The description of a path or query parameter that is a name. The structs of such parameters
/// implement `IntoParams` with it: derived, their schema would be a copy of [`name_schema`] in literals
/// (the derive's `schema_with` drops the parameter's description and `required`).
pub(super) fn name_param(
    name: &str,
    parameter_in: ParameterIn,
    description: &str,
    required: bool,
) -> Parameter {
    let required = if required {
        Required::True
    } else {
        Required::False
    };
    ParameterBuilder::new()
        .name(name)
        .parameter_in(parameter_in)
        .required(required)
        .description(Some(description))
        .schema(Some(name_schema()))
        .build()
}

/// The description of a score as text, as [`parse_score_text`] takes it (within 128 bits).
pub(super) fn score_text_schema() -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(SCORE_TEXT_PATTERN))
        .into()
}

fn names_schema<'a>(names: impl IntoIterator<Item = &'a str>) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(names))
        .into()
}

/// `schema`, or `null`: what serde reads into an `Option` field.
fn or_null(schema: RefOr<Schema>) -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .item(schema)
        .into()
}

pub(super) fn order_schema() -> RefOr<Schema> {
    names_schema(Order::NAMES.iter().copied())
}

pub(super) fn ties_schema() -> RefOr<Schema> {
    names_schema(TiePolicy::NAMES.iter().copied())
}

pub(super) fn operator_schema() -> RefOr<Schema> {
    names_schema(Operator::NAMES.iter().copied())
}

/// An optional name in a body.
pub(super) fn optional_name_schema() -> RefOr<Schema> {
    or_null(name_schema())
}

pub(super) fn optional_order_schema() -> RefOr<Schema> {
    or_null(order_schema())
}

pub(super) fn optional_ties_schema() -> RefOr<Schema> {
    or_null(ties_schema())
}

/// An optional operator in a body, as [`parse_operator`] takes it: ours, or the case study's name of
/// one.
pub(super) fn optional_operator_schema() -> RefOr<Schema> {
    or_null(names_schema(
        Operator::NAMES.iter().copied().chain([SET_ALIAS]),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_described_name_characters_are_the_valid_ones() {
        for byte in 0..=u8::MAX {
            let c = char::from(byte);
            let described = c.is_ascii_alphanumeric() || NAME_PUNCTUATION.contains(c);
            assert_eq!(valid_name(&format!("a{c}")), described, "{c:?}");
        }
    }

    #[test]
    fn dot_segments_are_not_names() {
        for name in [".", ".."] {
            assert!(!valid_name(name), "{name:?}");
        }
        for name in ["...", ".a", "a.", "a..b"] {
            assert!(valid_name(name), "{name:?}");
        }
    }
}
