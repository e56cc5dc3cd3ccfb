//! What every app's handlers share: the error shape, JSON bodies with clear rejections, idempotency keys
//! and the mapping of engine outcomes to status codes.

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use spate_engine::{CommandId, EngineError, Reply};
use std::convert::Infallible;

/// The one error shape: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    /// The archive's store could not be read (see `spate_engine::ArchiveError`).
    pub fn archive(error: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "archive",
            error.to_string(),
        )
    }
}

/// The common error shape, as it is sent and documented.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// What went wrong, for a program: `bad_request`, `not_found`, `unauthenticated`, ...
    pub code: String,
    /// What went wrong, for a person: names the field, the limit or the state at fault.
    pub message: String,
}

/// The error shape of the paths whose spec asks for `{"message": ...}` (ski's).
#[derive(Serialize, utoipa::ToSchema)]
pub struct MessageBody {
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// The most of an error body [`ErrorAnswer::read`] reads: axum's and hyper's are one line, the apps'
/// a small JSON object.
const ERROR_BODY_BYTES_MAX: usize = 64 << 10;

/// An error answer taken apart, to be put in an app's error shape: what it says, and its bytes for a
/// caller that finds it in the right shape already.
struct ErrorAnswer {
    parts: axum::http::response::Parts,
    bytes: axum::body::Bytes,
    /// The `message` of a body in the one error shape, else its text, else (an empty body) the
    /// status's reason; a 405 names the method and what `Allow` allows.
    message: String,
}

impl ErrorAnswer {
    /// Reads the body of `response`, an error answer to a `method` request.
    async fn read(method: &axum::http::Method, response: Response) -> Self {
        debug_assert!(response.status().as_u16() >= 400, "not an error answer");
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, ERROR_BODY_BYTES_MAX)
            .await
            .unwrap_or_default();
        let status = parts.status;
        let in_error_shape = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|body| Some(body["error"]["message"].as_str()?.to_string()));
        let text = String::from_utf8_lossy(&bytes).trim().to_string();
        let message = match (in_error_shape, parts.headers.get(header::ALLOW)) {
            (Some(message), _) => message,
            (None, _) if status != StatusCode::METHOD_NOT_ALLOWED && !text.is_empty() => text,
            (None, _) if status != StatusCode::METHOD_NOT_ALLOWED => {
                status.canonical_reason().unwrap_or("error").to_lowercase()
            }
            (None, Some(allowed)) => format!(
                "{method} is not allowed on this path; allowed: {}",
                allowed.to_str().unwrap_or("?")
            ),
            (None, None) => format!("{method} is not allowed on this path"),
        };
        Self {
            parts,
            bytes,
            message,
        }
    }

    /// The answer as it was.
    fn unchanged(self) -> Response {
        Response::from_parts(self.parts, axum::body::Body::from(self.bytes))
    }

    /// The answer's status and headers (such as `Allow`) with `shaped`'s body and content type.
    fn reshaped(mut self, shaped: Response) -> Response {
        let (shaped_parts, body) = shaped.into_parts();
        self.parts.headers.remove(header::CONTENT_LENGTH);
        self.parts.headers.extend(shaped_parts.headers);
        Response::from_parts(self.parts, body)
    }
}

/// Puts every error answer that is not JSON yet in the one error shape: axum's own rejections (a bad
/// query value, a path that is not UTF-8, a body over the limit) are plain text, and a 405 has no body
/// at all. JSON answers are the apps' own and stay as they are. Under an app's
/// `AppModule::message_only_error_paths` (`message_only`), every error answer is `{"message": ...}`
/// instead. Called by `edge::Edge` for every answer from 400 up.
pub(crate) async fn shape_error(
    method: &axum::http::Method,
    message_only: bool,
    response: Response,
) -> Response {
    debug_assert!(response.status().as_u16() >= 400, "not an error answer");
    if message_only {
        return message_only_shape(method, response).await;
    }
    let is_json = (response.headers().get(header::CONTENT_TYPE))
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    if is_json {
        return response;
    }
    let answer = ErrorAnswer::read(method, response).await;
    let status = answer.parts.status;
    let reason = status.canonical_reason().unwrap_or("error");
    let code = reason.to_lowercase().replace([' ', '-'], "_");
    let shaped = ApiError::new(status, code, answer.message.clone()).into_response();
    answer.reshaped(shaped)
}

/// An error answer as `{"message": ...}`, unless it is in that shape already.
async fn message_only_shape(method: &axum::http::Method, response: Response) -> Response {
    let answer = ErrorAnswer::read(method, response).await;
    let in_shape = serde_json::from_slice::<serde_json::Value>(&answer.bytes)
        .is_ok_and(|body| body["message"].is_string());
    if in_shape {
        return answer.unchanged();
    }
    let status = answer.parts.status;
    let body = MessageBody {
        message: answer.message.clone(),
    };
    let shaped = (status, axum::Json(body)).into_response();
    answer.reshaped(shaped)
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        let code = match error {
            EngineError::Overloaded => "overloaded",
            EngineError::JournalFailed => "journal_failed",
            EngineError::ShuttingDown => "shutting_down",
            EngineError::NotOwner(_) => "partition_moving",
            EngineError::DiskFull { .. } => "disk_full",
            EngineError::UnknownApp(_) => return Self::not_found(error.to_string()),
        };
        Self::new(StatusCode::SERVICE_UNAVAILABLE, code, error.to_string())
    }
}

/// A `T` read from a JSON object only. serde's derived structs also read a JSON array of their fields
/// in order (`[5, 1]` as `{"amount": 5, "tag": 1}`, `[null, null]` as a capture of everything), which
/// is not the shape any API describes. Request bodies are read through it (`ApiJson<JsonObject<T>>`,
/// [`from_json_object`]) and struct fields inside them with `#[serde(deserialize_with =
/// "spate_server::api::json_object")]`.
pub struct JsonObject<T>(pub T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for JsonObject<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);

        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }

        let visitor = ObjectVisitor(std::marker::PhantomData);
        deserializer.deserialize_map(visitor).map(JsonObject)
    }
}

/// For `deserialize_with` on a field whose value is a struct: see [`JsonObject`].
pub fn json_object<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    <JsonObject<T> as serde::Deserialize>::deserialize(deserializer).map(|JsonObject(value)| value)
}

/// For `deserialize_with` on a field that is a list of structs: see [`JsonObject`].
pub fn json_objects<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    let objects = <Vec<JsonObject<T>> as serde::Deserialize>::deserialize(deserializer)?;
    // The same size and alignment: collected in place, without a second allocation.
    Ok(objects.into_iter().map(|JsonObject(value)| value).collect())
}

/// A `T` from a body that must be a JSON object: see [`JsonObject`].
pub fn from_json_object<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> serde_json::Result<T> {
    serde_json::from_slice(bytes).map(|JsonObject(value)| value)
}

/// A JSON body whose rejection is an [`ApiError`] naming what is wrong (field, type, line and column);
/// `ApiJson<JsonObject<T>>` for a body that must be an object (see [`JsonObject`]).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !says_plain_json(request.headers()) {
            // Any other content type, JSON or not, gets axum's own check and answer.
            return match axum::Json::<T>::from_request(request, state).await {
                Ok(axum::Json(value)) => Ok(Self(value)),
                Err(rejection) => Err(json_rejection(rejection)),
            };
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| json_rejection(rejection.into()))?;
        // Parsed without tracking where it is first: axum's parse records every key it passes (an
        // allocation each), which only the message of an error needs; the same bytes go through it then
        // (a refused body is parsed twice, at most `REQUEST_BYTES_MAX` of it).
        if let Ok(value) = serde_json::from_slice(&bytes) {
            return Ok(Self(value));
        }
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

/// `Content-Type: application/json` as clients send it (alone, or with UTF-8 named): a subset of what
/// axum's `Json` takes for JSON, which accepts any parameters (any charset) and also
/// `application/*+json`.
fn says_plain_json(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json;charset=utf-8",
    ]
    .iter()
    .any(|plain| value.as_bytes().eq_ignore_ascii_case(plain.as_bytes()))
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let status = rejection.status();
    let message = match &rejection {
        JsonRejection::JsonDataError(e) => format!(
            "invalid JSON body: {}",
            std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
        ),
        JsonRejection::JsonSyntaxError(e) => format!(
            "malformed JSON: {}",
            std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
        ),
        other => other.body_text(),
    };
    let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
        "payload_too_large"
    } else {
        "bad_request"
    };
    ApiError::new(status, code, message)
}

/// Whether a name an app will put in a URL path can be found there: `.` and `..` are path segments
/// that clients remove before sending (`/leaderboards/./reset` arrives as `/leaderboards/reset`), so a
/// board, account or participant of either name could be made and never reached.
pub fn reachable_in_a_path(name: &str) -> bool {
    name != "." && name != ".."
}

/// What a refused name is told when `.` is among its characters.
pub const NOT_DOT_SEGMENTS: &str = "and not '.' or '..' (a URL path cannot name them)";

/// Longest accepted `Idempotency-Key`.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;

/// The `Idempotency-Key` header: the description of an operation that honours it
/// (`params(IdempotencyKey)`) and the extractor its handler reads it with. It takes that one header,
/// where a `HeaderMap` extractor would copy them all (two allocations per request).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKey {
    /// 1 to 255 bytes. A request repeated with the same key and body gets the first one's answer and
    /// changes nothing; the same key with another body is refused with 422.
    #[param(rename = "Idempotency-Key", min_length = 1, max_length = 255, value_type = Option<String>)]
    pub idempotency_key: Option<HeaderValue>,
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Infallible> {
        Ok(Self {
            idempotency_key: parts.headers.get("idempotency-key").cloned(),
        })
    }
}

impl IdempotencyKey {
    /// The command id of the key, scoped to `app` so two apps' keys never meet; `None` without a key.
    pub fn command_id(&self, app: &str) -> Result<Option<CommandId>, ApiError> {
        let Some(value) = &self.idempotency_key else {
            return Ok(None);
        };
        let key = value.as_bytes();
        if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
            return Err(ApiError::bad_request(format!(
                "Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes"
            )));
        }
        // The hash of `app`, a zero byte, then the key, fed in pieces rather than copied together (ids
        // are kept in journals and snapshots, so these bytes never change).
        let mut scoped = xxhash_rust::xxh3::Xxh3Default::new();
        scoped.update(app.as_bytes());
        scoped.update(&[0]);
        scoped.update(key);
        Ok(Some(scoped.digest128()))
    }
}

/// The reply bytes of an applied or deduplicated command; the other outcomes as errors.
pub fn reply_bytes(reply: Reply) -> Result<Vec<u8>, ApiError> {
    match reply {
        Reply::Applied(bytes) | Reply::Duplicate(bytes) => Ok(bytes),
        Reply::InFlight => Err(ApiError::new(
            StatusCode::CONFLICT,
            "in_flight",
            "a request with this Idempotency-Key is still being made durable; retry shortly",
        )),
        Reply::Conflict => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request body",
        )),
    }
}

/// A JSON response with a status.
pub fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

/// Sends `payload` to every partition of `app` once per `interval` while `active()` says there is
/// something to do (for commands that carry the time to apply, such as expiry ticks): an idle app writes
/// nothing. A full queue skips a round; the next one does the same work.
pub fn spawn_ticks(
    engine: spate_engine::EngineHandle,
    app: spate_engine::AppId,
    interval: std::time::Duration,
    payload: Vec<u8>,
    active: impl Fn() -> bool + Send + 'static,
) {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(interval);
        loop {
            interval.tick().await;
            if !active() {
                continue;
            }
            for partition in 0..engine.partition_count() {
                let _ = engine.enqueue(partition, app, None, payload.clone());
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &'static str) -> IdempotencyKey {
        IdempotencyKey {
            idempotency_key: Some(HeaderValue::from_static(value)),
        }
    }

    #[test]
    fn a_command_id_hashes_the_app_a_zero_byte_and_the_key() {
        // Ids are kept in journals and snapshots: these bytes must never change.
        assert_eq!(
            key("order-17").command_id("tally").unwrap(),
            Some(xxhash_rust::xxh3::xxh3_128(b"tally\0order-17"))
        );
        let longest = "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX);
        let scoped = [b"payments\0".as_slice(), longest.as_bytes()].concat();
        let value = HeaderValue::from_str(&longest).unwrap();
        let id = IdempotencyKey {
            idempotency_key: Some(value),
        }
        .command_id("payments");
        assert_eq!(id.unwrap(), Some(xxhash_rust::xxh3::xxh3_128(&scoped)));
        assert_ne!(
            key("a").command_id("tally").unwrap(),
            key("a").command_id("ski").unwrap()
        );
    }

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Entry {
        amount: i64,
    }

    async fn parse(content_type: &str, body: &'static str) -> Result<Entry, ApiError> {
        let request = Request::builder()
            .header(header::CONTENT_TYPE, content_type)
            .body(axum::body::Body::from(body))
            .unwrap();
        ApiJson::<Entry>::from_request(request, &())
            .await
            .map(|ApiJson(entry)| entry)
    }

    #[tokio::test]
    async fn a_json_body_parses_alike_whatever_json_content_type_and_an_error_names_its_field() {
        for content_type in [
            "application/json",
            "Application/JSON; charset=UTF-8",
            "application/json;charset=utf-8",
            "application/json; charset=latin1",
            "application/problem+json",
        ] {
            assert_eq!(
                parse(content_type, r#"{"amount": 5}"#).await,
                Ok(Entry { amount: 5 })
            );
            let refused = parse(content_type, r#"{"amount": "five"}"#)
                .await
                .unwrap_err();
            assert_eq!(
                refused.status,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{content_type}"
            );
            assert!(
                refused
                    .message
                    .starts_with("invalid JSON body: amount: invalid type"),
                "{}",
                refused.message
            );
            for malformed in [r#"{"amount": 5"#, r#"{"amount": 5}x"#] {
                let malformed = parse(content_type, malformed).await.unwrap_err();
                assert_eq!(malformed.status, StatusCode::BAD_REQUEST, "{content_type}");
                assert!(
                    malformed.message.starts_with("malformed JSON"),
                    "{}",
                    malformed.message
                );
            }
        }
        let not_json = parse("text/plain", r#"{"amount": 5}"#).await.unwrap_err();
        assert_eq!(not_json.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }

    #[test]
    fn no_key_is_no_id_and_a_key_too_long_is_refused() {
        let none = IdempotencyKey {
            idempotency_key: None,
        };
        assert_eq!(none.command_id("tally").unwrap(), None);
        for refused in [
            HeaderValue::from_str(&"k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1)).unwrap(),
            HeaderValue::from_static(""),
        ] {
            let refused = IdempotencyKey {
                idempotency_key: Some(refused),
            }
            .command_id("tally")
            .unwrap_err();
            assert_eq!(refused.status, StatusCode::BAD_REQUEST);
            assert!(
                refused.message.contains("Idempotency-Key"),
                "{}",
                refused.message
            );
        }
    }
}
