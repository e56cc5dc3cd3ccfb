//! `GET /statistics`: per-endpoint request count, mean and max latency, as the spec's `APIStats`.
//!
//! Recorded by a middleware on ski's routes with one set of atomics per endpoint, so recording takes
//! no lock. The spec's `mean` and `max` are integers; they are milliseconds (the course's unit), and
//! since most requests here take well under one, microseconds are given beside them.

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// An endpoint: its method, the route as mounted (axum's template) and its URL in the spec.
pub(crate) struct Endpoint {
    pub method: Method,
    pub route: &'static str,
    pub url: &'static str,
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
    pub fn report(&self) -> Value {
        let endpoint_stats: Vec<Value> = self
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
                Some(json!({
                    "URL": endpoint.url,
                    "operation": endpoint.method.as_str(),
                    "mean": (mean_us + 500) / 1000,
                    "max": (max_us + 500) / 1000,
                    "count": count,
                    "meanMicros": mean_us,
                    "maxMicros": max_us,
                }))
            })
            .collect();
        json!({ "endpointStats": endpoint_stats })
    }
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
            url: "/a/{id}",
        },
        Endpoint {
            method: Method::POST,
            route: "/a/{x}",
            url: "/a/{id}",
        },
    ];

    #[test]
    fn reports_count_mean_and_max_per_endpoint() {
        let stats = EndpointStats::new(&ENDPOINTS);
        assert_eq!(stats.report(), json!({"endpointStats": []}));
        stats.record(&Method::POST, "/a/{x}", 1_000);
        stats.record(&Method::POST, "/a/{x}", 3_500);
        stats.record(&Method::DELETE, "/a/{x}", 9_000_000);
        let report = stats.report();
        let rows = report["endpointStats"].as_array().unwrap();
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row["operation"], "POST");
        assert_eq!(row["URL"], "/a/{id}");
        assert_eq!(row["count"], 2);
        assert_eq!(row["meanMicros"], 2_250);
        assert_eq!(row["maxMicros"], 3_500);
        assert_eq!(row["mean"], 2);
        assert_eq!(row["max"], 4);
    }
}
