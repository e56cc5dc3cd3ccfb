//! `/health`, `/metrics` and per-route request metrics.

use crate::openapi::AppRouter;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use spate_engine::EngineHandle;
use std::sync::{Arc, OnceLock};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    method: &'static str,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    route: String,
    status: u16,
}

#[derive(Clone)]
pub struct HttpMetrics {
    latency: Family<RouteLabel, Histogram, fn() -> Histogram>,
    errors: Family<ErrorLabel, Counter>,
}

fn latency_histogram() -> Histogram {
    // 20 us .. ~5 s
    Histogram::new(exponential_buckets(0.000_02, 2.0, 18))
}

impl HttpMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            latency: Family::new_with_constructor(latency_histogram),
            errors: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("spate_http");
        r.register(
            "request_seconds",
            "Request latency by route",
            metrics.latency.clone(),
        );
        r.register(
            "errors",
            "Responses with status >= 400 by route and status",
            metrics.errors.clone(),
        );
        metrics
    }
}

impl HttpMetrics {
    /// Counts an answer to a `method` request on `route` (axum's matched template, or "unmatched").
    /// `cached` holds the series of the first answer its edge gave: an edge is mostly asked with one
    /// method, and finding the series by label would build the label's `String` on every request.
    pub(crate) fn observe(
        &self,
        cached: &OnceLock<LatencySeries>,
        method: &axum::http::Method,
        route: &str,
        status: StatusCode,
        elapsed: std::time::Duration,
    ) {
        if status.as_u16() >= 400 {
            (self.errors)
                .get_or_create(&ErrorLabel {
                    route: route.to_string(),
                    status: status.as_u16(),
                })
                .inc();
        }
        let method = method_label(method);
        let seconds = elapsed.as_secs_f64();
        match cached.get() {
            Some(series) if series.label.method == method && series.label.route == route => {
                series.latency.observe(seconds);
            }
            _ => {
                let label = RouteLabel {
                    method,
                    route: route.to_string(),
                };
                let latency = self.latency.get_or_create(&label).clone();
                latency.observe(seconds);
                // The first series a route answered stays its cached one.
                let _ = cached.set(LatencySeries { label, latency });
            }
        }
    }
}

/// One route's latency series and its label (see [`HttpMetrics::observe`]).
pub(crate) struct LatencySeries {
    label: RouteLabel,
    latency: Histogram,
}

/// A label for `method` from a fixed set: a client may send any token as a method, and each new
/// label value would be a new series in `/metrics` for as long as the server runs. Routes are bounded
/// already: axum's matched route templates, or "unmatched".
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    const KNOWN: [(Method, &str); 7] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::PATCH, "PATCH"),
        (Method::DELETE, "DELETE"),
        (Method::OPTIONS, "OPTIONS"),
    ];
    KNOWN
        .iter()
        .find(|(known, _)| known == method)
        .map_or("other", |(_, label)| label)
}

/// What `/health` answers.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct HealthBody {
    /// `ok`; `read_only` when the disk is under its reserve (writes refused, reads served); `damaged`
    /// when the scrub found a store damaged; `failing` when a partition or a read model stopped.
    status: &'static str,
    partitions: u16,
    failed_partitions: Vec<u16>,
    /// Read models (by app) that stopped applying: their answers are as old as the last record they
    /// applied.
    stopped_read_models: Vec<&'static str>,
    /// Requests waiting in each partition's queue.
    queue_depth: Vec<usize>,
    disk: DiskBody,
    damaged_stores: Vec<DamagedStoreBody>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct DiskBody {
    free_bytes: u64,
    reserve_bytes: u64,
    writes_refused: bool,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct DamagedStoreBody {
    store: String,
    keyspace: String,
    error: String,
}

/// Whether the server serves: 200 while every partition and read model runs and no store is damaged,
/// else 503 with the same body saying why.
#[utoipa::path(
    get,
    path = "/health",
    tag = "server",
    responses(
        (status = 200, description = "Serving.", body = HealthBody),
        (status = 503, description = "A partition or a read model stopped, or a store is damaged.", body = HealthBody),
    ),
)]
async fn health(State(engine): State<EngineHandle>) -> (StatusCode, axum::Json<HealthBody>) {
    let health = engine.health();
    let damaged = !health.damaged_stores.is_empty();
    let running = health.failed_partitions.is_empty() && health.stopped_read_models.is_empty();
    let healthy = running && !damaged;
    // A disk under its reserve refuses writes but serves reads: still up, and says so.
    // A damaged store serves what it can, but needs an operator: not healthy.
    let status = match (running, damaged) {
        (false, _) => "failing",
        (true, true) => "damaged",
        (true, false) if health.disk.writes_refused => "read_only",
        (true, false) => "ok",
    };
    let body = HealthBody {
        status,
        partitions: health.partitions,
        failed_partitions: health.failed_partitions,
        stopped_read_models: health.stopped_read_models,
        queue_depth: health.queue_depth,
        disk: DiskBody {
            free_bytes: health.disk.free_bytes,
            reserve_bytes: health.disk.reserve_bytes,
            writes_refused: health.disk.writes_refused,
        },
        damaged_stores: (health.damaged_stores.into_iter())
            .map(|damage| DamagedStoreBody {
                store: damage.store,
                keyspace: damage.keyspace,
                error: damage.error,
            })
            .collect(),
    };
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body))
}

/// `/health`, open to all (load balancers probe it), and `/metrics`, behind `access` when there is one.
pub fn routes(
    engine: EngineHandle,
    registry: Arc<Registry>,
    access: Option<crate::access::Access>,
) -> AppRouter {
    let metrics = for_observers(
        OpenApiRouter::new()
            .routes(routes!(metrics))
            .with_state(registry),
        access,
    );
    OpenApiRouter::new()
        .routes(routes!(health))
        .with_state(engine)
        .merge(metrics)
}

/// `routes` behind `access`, for keys that may observe the server (see `Access`'s `access::Admit`).
pub fn for_observers(routes: AppRouter, access: Option<crate::access::Access>) -> AppRouter {
    match access {
        Some(access) => routes.route_layer(crate::access::Gate::new(access)),
        None => routes,
    }
}

/// Every metric, in Prometheus' text format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "server",
    responses((status = 200, description = "Every metric (Prometheus text format 0.0.4).", content_type = "text/plain", body = String)),
)]
async fn metrics(State(registry): State<Arc<Registry>>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
