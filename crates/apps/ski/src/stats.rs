//! `GET /statistics`: per-endpoint request count, mean and max latency, as the spec's `APIStats`.
//!
//! Recorded by a middleware on ski's routes with one set of atomics per endpoint, so recording takes
//! no lock. The spec's `mean` and `max` are integers; they are milliseconds (the course's unit), and
//! since most requests here take well under one, microseconds are given beside them.

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use utoipa::ToSchema;

/// An endpoint: its method and its route, as mounted and as the spec writes it.
pub(crate) struct Endpoint {
    pub method: Method,
    pub route: &'static str,
}

#[derive(Default)]
struct Counters {
    count: AtomicU64,
    total_us: AtomicU64,
    max_us: AtomicU64,
}

pub(crate) struct EndpointStats {
    endpoints: &'static [Endpoint],
    counters: Vec<Counters>,
}

impl EndpointStats {
    pub fn new(endpoints: &'static [Endpoint]) -> Arc<Self> {
        Arc::new(Self {
            endpoints,
            counters: endpoints.iter().map(|_| Counters::default()).collect(),
        })
    }

    fn record(&self, method: &Method, route: &str, elapsed_us: u64) {
        let Some(index) = self
            .endpoints
            .iter()
            .position(|e| e.method == method && e.route == route)
        else {
            return;
        };
        let counters = &self.counters[index];
        counters.count.fetch_add(1, Ordering::Relaxed);
        counters.total_us.fetch_add(elapsed_us, Ordering::Relaxed);
        counters.max_us.fetch_max(elapsed_us, Ordering::Relaxed);
    }

    /// The spec's `APIStats`: endpoints that served at least one request.
    pub fn report(&self) -> ApiStats {
        let endpoint_stats = self
            .endpoints
            .iter()
            .zip(&self.counters)
            .filter_map(|(endpoint, counters)| {
                let count = counters.count.load(Ordering::Relaxed);
                if count == 0 {
                    return None;
                }
                let mean_us = counters.total_us.load(Ordering::Relaxed) / count;
                let max_us = counters.max_us.load(Ordering::Relaxed);
                Some(EndpointReport {
                    url: endpoint.route,
                    operation: endpoint.method.as_str(),
                    mean_ms: (mean_us + 500) / 1000,
                    max_ms: (max_us + 500) / 1000,
                    count,
                    mean_us,
                    max_us,
                })
            })
            .collect();
        ApiStats { endpoint_stats }
    }
}

/// Request counts and latencies per endpoint.
#[derive(Serialize, ToSchema)]
#[schema(as = APIStats)]
pub(crate) struct ApiStats {
    #[serde(rename = "endpointStats")]
    #[schema(inline)]
    endpoint_stats: Vec<EndpointReport>,
}

#[derive(Serialize, ToSchema)]
struct EndpointReport {
    /// The endpoint's path template.
    #[serde(rename = "URL")]
    #[schema(example = "/resorts")]
    url: &'static str,
    /// The method.
    #[schema(example = "GET")]
    operation: &'static str,
    /// Mean latency in ms, rounded.
    #[serde(rename = "mean")]
    mean_ms: u64,
    /// Highest latency in ms, rounded.
    #[serde(rename = "max")]
    max_ms: u64,
    /// Requests served.
    count: u64,
    /// Mean latency in microseconds.
    #[serde(rename = "meanMicros")]
    mean_us: u64,
    /// Highest latency in microseconds.
    #[serde(rename = "maxMicros")]
    max_us: u64,
}

pub(crate) async fn record(
    State(stats): State<Arc<EndpointStats>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = next.run(request).await;
    if let Some(route) = route {
        let elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        stats.record(&method, route.as_str(), elapsed_us);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    static ENDPOINTS: [Endpoint; 2] = [
        Endpoint {
            method: Method::GET,
            route: "/a/{x}",
        },
        Endpoint {
            method: Method::POST,
            route: "/a/{x}",
        },
    ];

    #[test]
    fn reports_count_mean_and_max_per_endpoint() {
        let stats = EndpointStats::new(&ENDPOINTS);
        let report = || serde_json::to_value(stats.report()).unwrap();
        assert_eq!(report(), serde_json::json!({"endpointStats": []}));
        stats.record(&Method::POST, "/a/{x}", 1_000);
        stats.record(&Method::POST, "/a/{x}", 3_500);
        stats.record(&Method::DELETE, "/a/{x}", 9_000_000);
        let report = report();
        let rows = report["endpointStats"].as_array().unwrap();
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row["operation"], "POST");
        assert_eq!(row["URL"], "/a/{x}");
        assert_eq!(row["count"], 2);
        assert_eq!(row["meanMicros"], 2_250);
        assert_eq!(row["maxMicros"], 3_500);
        assert_eq!(row["mean"], 2);
        assert_eq!(row["max"], 4);
    }
}
