//! The listener's connections, each bounded so that a client that misbehaves costs only itself: at most
//! [`ConnectionLimits::connections_max`] open at once (the next wait in the kernel's accept queue, so
//! the process never runs out of file descriptors for its journal and stores), request headers read
//! within a deadline (slowloris, an HTTP/0.9 line, a connection left idle between requests), headers
//! of bounded size, and a request body that may not stall for longer than a deadline (a
//! `Content-Length` larger than what is sent).
//!
//! A response to a request whose body was left unread (a refusal before the handler, a handler that
//! reads no body) says `Connection: close`: hyper then closes the connection rather than wait for the
//! rest of that body, and the header tells the client not to send its next request on it, where it
//! would meet the close instead of an answer.
//!
//! HTTP/1.1 only, as every client of these APIs speaks it, in the clear or over TLS (`crate::tls`).

use crate::REQUEST_BYTES_MAX;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::{Layer as _, ServiceExt as _};

#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections served at once.
    pub connections_max: usize,
    /// How long a request's line and headers may take to arrive, from when the connection is ready for
    /// them: the first request's, and each next one's on a connection kept alive (so also how long an
    /// idle connection stays open).
    pub header_read_timeout_ms: u64,
    /// The longest a request's body may stop arriving before the request fails.
    pub body_read_timeout_ms: u64,
    /// The most bytes of a request's line and headers.
    pub header_bytes_max: usize,
}

impl ConnectionLimits {
    /// The most bytes of a request's line and headers, as enforced: `header_bytes_max`, but not under
    /// hyper's floor for its read buffer.
    pub fn header_bytes_limit(&self) -> usize {
        self.header_bytes_max.max(HEADER_BYTES_MIN)
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            connections_max: 4096,
            header_read_timeout_ms: 30_000,
            body_read_timeout_ms: 30_000,
            header_bytes_max: 64 << 10,
        }
    }
}

/// hyper's floor for its read buffer, which bounds the headers.
const HEADER_BYTES_MIN: usize = 8192;

/// How long the accept loop waits after `accept` fails (out of file descriptors, say) before trying
/// again, instead of spinning.
const ACCEPT_RETRY_MS: u64 = 50;

/// How long a shutdown waits for requests in progress once it stops accepting.
const DRAIN_TIMEOUT_MS: u64 = 30_000;

/// File descriptors kept for everything but client connections: journal segments, snapshots, the
/// stores' tables, connections to other nodes and to Kafka.
const FILES_RESERVED: u64 = 1024;

/// Raises the soft limit on open files to the hard one, and returns how many connections fit under
/// it beside [`FILES_RESERVED`], at most `wanted`.
fn connections_within_file_limit(wanted: usize) -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return wanted;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    let room = usize::try_from(limit.rlim_cur.saturating_sub(FILES_RESERVED)).unwrap_or(usize::MAX);
    if room < wanted {
        tracing::warn!(
            open_files_max = limit.rlim_cur,
            connections_max = room.max(1),
            wanted,
            "the open-file limit leaves room for fewer connections than configured"
        );
    }
    wanted.min(room).max(1)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CutLabel {
    reason: &'static str,
}

#[derive(Clone)]
pub struct ConnectionMetrics {
    open: Gauge,
    cut: Family<CutLabel, Counter>,
}

impl ConnectionMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            open: Gauge::default(),
            cut: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("spate_http");
        r.register("connections", "Connections open now", metrics.open.clone());
        r.register(
            "connections_cut",
            "Connections or requests cut by a limit: header_timeout (slow or idle), body_timeout, \
             malformed (including headers over the limit), tls_handshake (failed or too slow)",
            metrics.cut.clone(),
        );
        metrics
    }

    fn count_cut(&self, reason: &'static str) {
        self.cut.get_or_create(&CutLabel { reason }).inc();
    }
}

/// Serves `router` on `listener` within `limits`, over TLS with `tls`, until `shutdown` completes,
/// then lets requests in progress finish (for up to [`DRAIN_TIMEOUT_MS`]).
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    shutdown: impl Future<Output = ()>,
) {
    assert!(limits.connections_max > 0, "at least one connection");
    let connections_max = connections_within_file_limit(limits.connections_max);
    let permits = Arc::new(Semaphore::new(connections_max));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms))
        .max_buf_size(limits.header_bytes_limit());
    let body_read_timeout = Duration::from_millis(limits.body_read_timeout_ms);
    // A TLS handshake is held to the same deadline as the headers that follow it.
    let handshake_timeout = Duration::from_millis(limits.header_read_timeout_ms);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // One handle per connection, cloned per request: no counter that every core's requests
        // would share on their path.
        let body_metrics = Arc::new(metrics.clone());
        // HTTP/1.1 serves a connection's requests one at a time, so one flag per connection is enough.
        let body_left_unread = Arc::new(AtomicBool::new(false));
        let body_left_unread_by_handler = body_left_unread.clone();
        // The body limit goes around the whole router, not around each route (`Router::layer`),
        // where it would cost every request another boxed clone of the route and a boxed future.
        // Routes that set a limit of their own still do: theirs is set after this one.
        let service = DefaultBodyLimit::max(REQUEST_BYTES_MAX)
            .layer(router.clone())
            .map_request(move |request: Request<Incoming>| {
                let metrics = body_metrics.clone();
                let unread = body_left_unread_by_handler.clone();
                request
                    .map(|body| Body::new(PacedBody::new(body, body_read_timeout, metrics, unread)))
            })
            .map_response(move |mut response: axum::response::Response| {
                if body_left_unread.swap(false, Ordering::Relaxed) {
                    (response.headers_mut()).insert(
                        hyper::header::CONNECTION,
                        hyper::header::HeaderValue::from_static("close"),
                    );
                }
                response
            });
        let service = TowerToHyperService::new(service);
        let (builder, watcher, tls) = (builder.clone(), graceful.watcher(), tls.clone());
        let metrics = metrics.clone();
        metrics.open.inc();
        tokio::spawn(async move {
            let served = match tls {
                None => {
                    let connection = builder.serve_connection(TokioIo::new(stream), service);
                    watcher.watch(connection).await
                }
                Some(tls) => {
                    match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let connection =
                                builder.serve_connection(TokioIo::new(stream), service);
                            watcher.watch(connection).await
                        }
                        Ok(Err(error)) => {
                            metrics.count_cut("tls_handshake");
                            tracing::debug!(%error, "TLS handshake failed");
                            Ok(())
                        }
                        Err(_) => {
                            metrics.count_cut("tls_handshake");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(error) = served {
                if error.is_timeout() {
                    metrics.count_cut("header_timeout");
                } else if error.is_parse() || error.is_parse_too_large() {
                    metrics.count_cut("malformed");
                }
                tracing::debug!(%error, "connection ended");
            }
            metrics.open.dec();
            drop(permit);
        });
    }
    drop(listener);
    let drained =
        tokio::time::timeout(Duration::from_millis(DRAIN_TIMEOUT_MS), graceful.shutdown());
    if drained.await.is_err() {
        tracing::warn!(
            timeout_ms = DRAIN_TIMEOUT_MS,
            "requests still in progress at shutdown were cut"
        );
    }
}

/// A request body that fails once no byte of it has arrived for its timeout, so a handler waiting for
/// it answers instead of holding its connection for ever.
struct PacedBody {
    inner: Incoming,
    timeout: Duration,
    /// Armed when the handler starts waiting for more of the body; disarmed when some arrives.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    metrics: Arc<ConnectionMetrics>,
    /// Whether the handler has read the whole body.
    ended: bool,
    /// Set when the body is dropped before its end: the connection's next request cannot follow it.
    left_unread: Arc<AtomicBool>,
}

impl PacedBody {
    fn new(
        inner: Incoming,
        timeout: Duration,
        metrics: Arc<ConnectionMetrics>,
        left_unread: Arc<AtomicBool>,
    ) -> Self {
        Self {
            inner,
            timeout,
            deadline: None,
            metrics,
            ended: false,
            left_unread,
        }
    }
}

impl Drop for PacedBody {
    fn drop(&mut self) {
        if !self.ended && !hyper::body::Body::is_end_stream(&self.inner) {
            self.left_unread.store(true, Ordering::Relaxed);
        }
    }
}

impl hyper::body::Body for PacedBody {
    type Data = hyper::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.deadline = None;
            this.ended = frame.is_none();
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let timeout = this.timeout;
        let deadline = (this.deadline).get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if deadline.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.metrics.count_cut("body_timeout");
        let stalled = std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the request body stopped arriving for {} ms",
                timeout.as_millis()
            ),
        );
        Poll::Ready(Some(Err(stalled.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_limit_under_hypers_floor_is_raised_to_it() {
        let limits = |header_bytes_max| ConnectionLimits {
            header_bytes_max,
            ..ConnectionLimits::default()
        };
        assert_eq!(limits(0).header_bytes_limit(), HEADER_BYTES_MIN);
        assert_eq!(limits(1000).header_bytes_limit(), HEADER_BYTES_MIN);
        assert_eq!(limits(16 << 10).header_bytes_limit(), 16 << 10);
    }
}
