//! What every routed request passes on its way in and out, as one layer around each route: headers over
//! the limit and a body declared over [`REQUEST_BYTES_MAX`] are refused before the route sees them, the
//! answer's latency and status are counted, and an error answer is put in its app's error shape
//! (`api::shape_error`).
//!
//! One hand-written service rather than three `axum::middleware::from_fn` layers: each of those clones
//! the route's boxed service and boxes a future and a `Next` on every request, which cost about 4.5 µs
//! of a leaderboard update's 22 (BENCHMARKS.md, "Hot path, first pass"). This one calls the route at
//! once and boxes one future.

use crate::REQUEST_BYTES_MAX;
use crate::api::{self, ApiError};
use crate::observe::{HttpMetrics, LatencySeries};
use axum::extract::{MatchedPath, Request};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

/// Puts [`Edge`] around each route (`Router::layer`, so that the matched route is known).
#[derive(Clone)]
pub(crate) struct EdgeLayer {
    shared: Arc<Shared>,
}

struct Shared {
    metrics: HttpMetrics,
    /// `ConnectionLimits::header_bytes_limit`.
    header_bytes_max: usize,
    /// Path prefixes whose error answers are `{"message": ...}` (`AppModule::message_only_error_paths`).
    message_only_paths: Vec<&'static str>,
}

impl EdgeLayer {
    pub(crate) fn new(
        metrics: HttpMetrics,
        header_bytes_max: usize,
        message_only_paths: Vec<&'static str>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                metrics,
                header_bytes_max,
                message_only_paths,
            }),
        }
    }
}

impl<S> tower::Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge {
            inner,
            shared: self.shared.clone(),
            latency: Arc::default(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Edge<S> {
    inner: S,
    shared: Arc<Shared>,
    /// The latency series of the first answer this edge gave: an `Edge` wraps one route's method (a
    /// GET route also answers HEAD) or a fallback, which answers any method.
    latency: Arc<OnceLock<LatencySeries>>,
}

impl<S> tower::Service<Request> for Edge<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let started = Instant::now();
        let shared = self.shared.clone();
        let latency = self.latency.clone();
        let method = request.method().clone();
        let route = request.extensions().get::<MatchedPath>().cloned();
        let path = request.uri().path();
        let message_only = (shared.message_only_paths.iter()).any(|p| path.starts_with(p));
        // The route was polled ready by this service's `poll_ready`: it is called here, and only its
        // future moves into ours.
        let refusal =
            headers_over(&request, shared.header_bytes_max).or_else(|| oversized(&request));
        let answer = match refusal {
            Some(refusal) => Err(refusal),
            None => Ok(self.inner.call(request)),
        };
        Box::pin(async move {
            let response = match answer {
                Ok(future) => future.await?,
                Err(refusal) => refusal.into_response(),
            };
            let route = route.as_ref().map_or("unmatched", |r| r.as_str());
            let status = response.status();
            (shared.metrics).observe(&latency, &method, route, status, started.elapsed());
            if status.as_u16() < 400 {
                return Ok(response);
            }
            Ok(api::shape_error(&method, message_only, response).await)
        })
    }
}

/// A request whose line and headers are over `header_bytes_max` bytes, counted as sent (method, target,
/// version, each `name: value` and line end). hyper bounds them only by its read buffer, which it
/// checks between reads, so that headers that arrive in a few large reads can pass the limit nearly
/// twice over: they are refused here, with 431 in the path's error shape.
fn headers_over(request: &Request, header_bytes_max: usize) -> Option<ApiError> {
    const LINE_END: usize = 2;
    let target = request
        .uri()
        .path_and_query()
        .map_or(1, |p| p.as_str().len());
    let line = request.method().as_str().len() + 1 + target + " HTTP/1.1".len() + LINE_END;
    let fields: usize = (request.headers().iter())
        .map(|(name, value)| name.as_str().len() + ": ".len() + value.len() + LINE_END)
        .sum();
    let sent = line + fields + LINE_END;
    (sent > header_bytes_max).then(|| {
        ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!(
                "the request line and headers take {sent} bytes, over the limit of {header_bytes_max}"
            ),
        )
    })
}

/// A request whose `Content-Length` is over [`REQUEST_BYTES_MAX`] is refused before its body is read,
/// so the client gets its 413 at once instead of after sending megabytes (bodies without a length are
/// still cut at the limit by `DefaultBodyLimit`). Requests between nodes carry batches of client
/// requests, under a limit of their own.
fn oversized(request: &Request) -> Option<ApiError> {
    let declared = (request.headers().get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())?;
    let internal = request.uri().path().starts_with("/internal/");
    (declared > REQUEST_BYTES_MAX as u64 && !internal).then(|| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("a request body of {declared} bytes is over the limit of {REQUEST_BYTES_MAX}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with_header(value_bytes: usize) -> Request {
        Request::builder()
            .uri("/health?x=1")
            .header("x-large", "a".repeat(value_bytes))
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn headers_are_counted_as_sent_and_refused_past_the_limit() {
        // "GET /health?x=1 HTTP/1.1\r\n" is 26 bytes, "x-large: " 9 and each line end 2: 39 with
        // the blank line, besides the value.
        assert!(headers_over(&request_with_header(61), 100).is_none());
        let refusal = headers_over(&request_with_header(62), 100).expect("one byte over");
        assert_eq!(refusal.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }
}
