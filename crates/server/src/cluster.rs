//! A node of a cluster over HTTP: forwarding to the owner of a partition, and the routes other nodes
//! and operators call.
//!
//! - Commands for a partition another node applies go to that node in order, one request per batch,
//!   through one lane per partition (`forward_commands`), and are queued there with
//!   `EngineHandle::enqueue_here`, so a command travels at most once.
//! - Follow-ups and acknowledgements go the same way, best effort (`deliver_messages`): the engine
//!   resends what is lost.
//! - A read (`GET`) whose partition lives elsewhere is retried on the owner as a whole (`forward_reads`):
//!   reads change nothing, so running one again there is safe. A read that spans partitions asks each
//!   partition's owner for its part instead (`EngineHandle::read`, `take_read`), since no one node may
//!   own them all.
//! - `GET /cluster` shows the members and the partitions each applies.

use crate::api::ApiError;
use crate::cluster_auth::{ClusterSecret, SIGNATURE_HEADER};
use crate::openapi::AppRouter;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use spate_engine::cluster::{
    self, ClusterStatus, Command, Directory, ReadSender, Remote, ReplySender,
};
use spate_engine::wire::{Put, Reader};
use spate_engine::{AppId, EngineError, EngineHandle, PartitionId, Reply};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Marks a request one node sent another, so that it is never sent on again.
const FORWARDED_HEADER: &str = "x-spate-forwarded";

/// Commands waiting per partition lane on this node before forwarding refuses more (503).
const LANE_COMMANDS_MAX: usize = 65_536;
/// Commands in one forwarded request.
const BATCH_COMMANDS_MAX: usize = 4096;
/// Bytes of commands or messages in one request to another node (one command alone may be up to the
/// server's request limit, which fits).
const BATCH_BYTES_MAX: usize = 8 * 1024 * 1024;
/// The largest body the internal routes take: a full batch, with room for its framing.
pub const INTERNAL_BODY_BYTES_MAX: usize = 2 * BATCH_BYTES_MAX;
const _: () = assert!(crate::REQUEST_BYTES_MAX + 64 <= BATCH_BYTES_MAX);
/// Internal messages waiting per partition lane; more are dropped (the engine resends follow-ups).
const LANE_MESSAGES_MAX: usize = 65_536;
/// How long a forwarded request may take before its commands are answered "retry" (they may or may not
/// have been applied: a client retries with its idempotency key).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

tokio::task_local! {
    /// Set by the engine (through `Remote::query_refused`) while a read request runs: the partition it
    /// found applied elsewhere.
    static REFUSED_PARTITION: Cell<Option<PartitionId>>;
}

/// The engine's [`Remote`] over HTTP.
pub struct HttpRemote {
    nodes: OtherNodes,
    commands: Vec<mpsc::Sender<(Command, ReplySender)>>,
    messages: Vec<mpsc::Sender<Vec<u8>>>,
    /// Where reads for other nodes run (the engine may ask from a thread outside the runtime).
    runtime: tokio::runtime::Handle,
}

impl HttpRemote {
    /// Starts one command lane and one message lane per partition (tasks on the current runtime).
    /// Requests to other nodes are signed with `secret`.
    pub fn start(
        directory: Arc<dyn Directory>,
        secret: ClusterSecret,
        partitions: u16,
    ) -> Arc<Self> {
        // Idle connections are dropped well before the other node's header read timeout (30 s by
        // default) closes them, so a request never goes out on one being closed.
        let client: HttpClient = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(10))
            .build_http();
        let nodes = OtherNodes {
            client,
            directory,
            secret: Arc::new(secret),
        };
        let mut commands = Vec::new();
        let mut messages = Vec::new();
        for partition in 0..partitions {
            let (command_tx, command_rx) = mpsc::channel(LANE_COMMANDS_MAX);
            let (message_tx, message_rx) = mpsc::channel(LANE_MESSAGES_MAX);
            tokio::spawn(forward_commands(partition, command_rx, nodes.clone()));
            tokio::spawn(deliver_messages(partition, message_rx, nodes.clone()));
            commands.push(command_tx);
            messages.push(message_tx);
        }
        Arc::new(Self {
            nodes,
            commands,
            messages,
            runtime: tokio::runtime::Handle::current(),
        })
    }
}

impl Remote for HttpRemote {
    fn forward(&self, partition: PartitionId, command: Command, reply_to: ReplySender) {
        if let Err(refused) = self.commands[usize::from(partition)].try_send((command, reply_to)) {
            let (_, reply_to) = refused.into_inner();
            let _ = reply_to.send(Err(EngineError::Overloaded));
        }
    }

    fn deliver(&self, partition: PartitionId, message: Vec<u8>) {
        let _ = self.messages[usize::from(partition)].try_send(message);
    }

    fn read(&self, partition: PartitionId, app: AppId, query: Vec<u8>, reply_to: ReadSender) {
        let nodes = self.nodes.clone();
        self.runtime.spawn(async move {
            let mut body = Vec::with_capacity(1 + query.len());
            body.put_u8(app);
            body.extend_from_slice(&query);
            let answer = nodes
                .post_to_owner(partition, "reads", body)
                .await
                .and_then(|bytes| cluster::decode_outcomes(&bytes).map_err(|e| e.to_string()));
            let _ = reply_to.send(match answer {
                Ok(mut outcomes) if outcomes.len() == 1 => match outcomes.remove(0) {
                    Ok(Reply::Applied(bytes)) => Ok(bytes),
                    Ok(other) => {
                        tracing::debug!(partition, ?other, "a read answered like a command");
                        Err(EngineError::NotOwner(partition))
                    }
                    Err(error) => Err(error),
                },
                failed => {
                    tracing::debug!(partition, ?failed, "a read on another node failed");
                    Err(EngineError::NotOwner(partition))
                }
            });
        });
    }

    fn query_refused(&self, partition: PartitionId) {
        let _ = REFUSED_PARTITION.try_with(|refused| refused.set(Some(partition)));
    }
}

/// How this node reaches the owners of partitions it does not apply.
#[derive(Clone)]
struct OtherNodes {
    client: HttpClient,
    directory: Arc<dyn Directory>,
    secret: Arc<ClusterSecret>,
}

impl OtherNodes {
    /// Posts `body` to the internal route `what` of `partition`'s owner, signed; its answer if 200.
    async fn post_to_owner(
        &self,
        partition: PartitionId,
        what: &str,
        body: Vec<u8>,
    ) -> Result<Bytes, String> {
        let address = self
            .directory
            .owner_address(partition)
            .ok_or_else(|| format!("no node owns partition {partition}"))?;
        let path = format!("/internal/v1/partitions/{partition}/{what}");
        let signature = self.secret.sign("POST", &path, &body);
        let request = hyper::Request::post(format!("http://{address}{path}"))
            .header(FORWARDED_HEADER, "1")
            .header(SIGNATURE_HEADER, signature)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if status == StatusCode::OK {
                Ok(body)
            } else {
                Err(format!(
                    "{address} answered {status}: {}",
                    String::from_utf8_lossy(&body)
                ))
            }
        };
        tokio::time::timeout(FORWARD_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("{address} did not answer within {FORWARD_TIMEOUT:?}"))?
    }
}

/// How many of `items`, from the first, fit in one request of at most `bytes_max` bytes; at least
/// one, so that a lane always moves (a single item is never larger than what a client may send).
fn leading_within<T>(items: &[T], bytes_of: impl Fn(&T) -> usize, bytes_max: usize) -> usize {
    let mut total = 0;
    let fitting = items
        .iter()
        .take_while(|item| {
            total += bytes_of(item);
            total <= bytes_max
        })
        .count();
    fitting.max(1).min(items.len())
}

/// One partition's lane: sends the queued commands in order, a batch per request, one request at a time.
async fn forward_commands(
    partition: PartitionId,
    mut queued: mpsc::Receiver<(Command, ReplySender)>,
    nodes: OtherNodes,
) {
    let mut queue = Vec::new();
    while queued.recv_many(&mut queue, BATCH_COMMANDS_MAX).await > 0 {
        while !queue.is_empty() {
            let count = leading_within(
                &queue,
                |(command, _)| encoded_command_bytes(command),
                BATCH_BYTES_MAX,
            );
            let (commands, replies): (Vec<_>, Vec<_>) = queue.drain(..count).unzip();
            let body = cluster::encode_commands(&commands);
            let answered = nodes
                .post_to_owner(partition, "commands", body)
                .await
                .and_then(|bytes| cluster::decode_outcomes(&bytes).map_err(|e| e.to_string()));
            match answered {
                Ok(outcomes) if outcomes.len() == replies.len() => {
                    for (reply_to, outcome) in replies.into_iter().zip(outcomes) {
                        let _ = reply_to.send(outcome);
                    }
                }
                failed => {
                    tracing::debug!(partition, ?failed, "forwarding commands failed");
                    for reply_to in replies {
                        let _ = reply_to.send(Err(EngineError::NotOwner(partition)));
                    }
                }
            }
        }
    }
}

/// A command's size in [`cluster::encode_commands`], at most.
fn encoded_command_bytes(command: &Command) -> usize {
    command.payload.len() + 32
}

/// One partition's lane of follow-ups and acknowledgements: what is queued goes in as few requests as fit.
async fn deliver_messages(
    partition: PartitionId,
    mut queued: mpsc::Receiver<Vec<u8>>,
    nodes: OtherNodes,
) {
    let mut queue = Vec::new();
    while queued.recv_many(&mut queue, BATCH_COMMANDS_MAX).await > 0 {
        while !queue.is_empty() {
            let count = leading_within(&queue, |message| message.len() + 4, BATCH_BYTES_MAX);
            let mut body = Vec::new();
            body.put_u32(count as u32);
            for message in queue.drain(..count) {
                body.put_bytes(&message);
            }
            if let Err(error) = nodes.post_to_owner(partition, "messages", body).await {
                tracing::debug!(partition, %error, "delivering messages failed; the engine resends");
            }
        }
    }
}

/// Refuses a request to an internal route that its cluster's secret did not sign (401, naming why).
async fn require_signature(
    State(secret): State<Arc<ClusterSecret>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, INTERNAL_BODY_BYTES_MAX).await else {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("a request between nodes is limited to {INTERNAL_BODY_BYTES_MAX} bytes"),
        )
        .into_response();
    };
    let header = parts
        .headers
        .get(SIGNATURE_HEADER)
        .and_then(|value| value.to_str().ok());
    if let Err(reason) = secret.verify(header, parts.method.as_str(), parts.uri.path(), &body) {
        return ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", reason).into_response();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(body)))
        .await
}

/// The routes other nodes of the cluster call, signed with `secret`.
pub fn internal_routes(engine: EngineHandle, secret: ClusterSecret) -> Router {
    Router::new()
        .route(
            "/internal/v1/partitions/{partition}/commands",
            post(take_commands),
        )
        .route(
            "/internal/v1/partitions/{partition}/messages",
            post(take_messages),
        )
        .route("/internal/v1/partitions/{partition}/reads", post(take_read))
        .with_state(engine)
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::new(secret),
            require_signature,
        ))
        // Inside the server's limit for client requests, which a batch of forwarded ones exceeds.
        .layer(DefaultBodyLimit::max(INTERNAL_BODY_BYTES_MAX))
}

/// `/cluster`: the nodes and the partitions each applies, for operators.
/// What `/cluster` answers: the members as this node sees them.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct ClusterStatusBody {
    /// The node answering.
    node_id: u32,
    partitions: u16,
    /// Partitions no member owns right now (being taken over).
    partitions_unowned: usize,
    nodes: Vec<NodeStatusBody>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct NodeStatusBody {
    node_id: u32,
    /// Where the node serves HTTP.
    address: String,
    /// The partitions the node owns.
    partitions: Vec<u16>,
}

/// The cluster's members and who owns which partition.
#[utoipa::path(
    get,
    path = "/cluster",
    tag = "server",
    responses((status = 200, description = "The members as this node sees them.", body = ClusterStatusBody)),
)]
async fn cluster_status(
    State(directory): State<Arc<dyn Directory>>,
) -> axum::Json<ClusterStatusBody> {
    axum::Json(status_body(directory.status()))
}

pub fn status_route(directory: Arc<dyn Directory>) -> AppRouter {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(cluster_status))
        .with_state(directory)
}

fn status_body(status: ClusterStatus) -> ClusterStatusBody {
    let owned: usize = status.nodes.iter().map(|n| n.partitions.len()).sum();
    ClusterStatusBody {
        node_id: status.node_id,
        partitions: status.partitions,
        partitions_unowned: usize::from(status.partitions).saturating_sub(owned),
        nodes: (status.nodes.into_iter())
            .map(|node| NodeStatusBody {
                node_id: node.node_id,
                address: node.address,
                partitions: node.partitions,
            })
            .collect(),
    }
}

fn checked_partition(engine: &EngineHandle, partition: u32) -> Result<PartitionId, ApiError> {
    match PartitionId::try_from(partition) {
        Ok(partition) if partition < engine.partition_count() => Ok(partition),
        _ => Err(ApiError::bad_request(format!(
            "partition {partition} is out of range (the cluster has {})",
            engine.partition_count()
        ))),
    }
}

async fn take_commands(
    State(engine): State<EngineHandle>,
    Path(partition): Path<u32>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let partition = checked_partition(&engine, partition)?;
    let commands = cluster::decode_commands(&body)
        .map_err(|e| ApiError::bad_request(format!("bad forwarded commands: {e}")))?;
    // Queued in order before any is awaited: the owner applies them in the order they were sent.
    let queued: Vec<_> = commands
        .into_iter()
        .map(|c| engine.enqueue_here(partition, c.app, c.command_id, c.payload))
        .collect();
    let mut outcomes = Vec::with_capacity(queued.len());
    for pending in queued {
        outcomes.push(match pending {
            Ok(pending) => pending.reply().await,
            Err(refused) => Err(refused.error),
        });
    }
    Ok(cluster::encode_outcomes(&outcomes).into_response())
}

/// Answers another node's read of a partition applied here (its body: the app's id, then its query).
async fn take_read(
    State(engine): State<EngineHandle>,
    Path(partition): Path<u32>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let partition = checked_partition(&engine, partition)?;
    let Some((&app, query)) = body.split_first() else {
        return Err(ApiError::bad_request("a read names no app"));
    };
    let answer = engine
        .read_here(partition, app, query.to_vec())
        .await
        .map(Reply::Applied);
    Ok(cluster::encode_outcomes(&[answer]).into_response())
}

async fn take_messages(
    State(engine): State<EngineHandle>,
    Path(partition): Path<u32>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let partition = checked_partition(&engine, partition)?;
    let mut reader = Reader::new(&body);
    let count = reader
        .u32()
        .map_err(|e| ApiError::bad_request(format!("bad internal messages: {e}")))?;
    for _ in 0..count {
        let message = reader
            .bytes()
            .map_err(|e| ApiError::bad_request(format!("bad internal messages: {e}")))?;
        engine
            .deliver(partition, message)
            .map_err(ApiError::bad_request)?;
    }
    Ok(StatusCode::OK)
}

/// Runs a read; if a partition it needed lives on another node, answers with that node's response.
pub async fn forward_reads(
    State(remote): State<Arc<HttpRemote>>,
    request: Request,
    next: Next,
) -> Response {
    let is_read = request.method() == Method::GET || request.method() == Method::HEAD;
    if !is_read || request.headers().contains_key(FORWARDED_HEADER) {
        return next.run(request).await;
    }
    let method = request.method().clone();
    let uri = request.uri().clone();
    let headers = request.headers().clone();
    let (response, refused) = REFUSED_PARTITION
        .scope(Cell::new(None), async {
            let response = next.run(request).await;
            (response, REFUSED_PARTITION.with(Cell::get))
        })
        .await;
    let Some(partition) = refused else {
        return response;
    };
    let Some(address) = remote.nodes.directory.owner_address(partition) else {
        return response;
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut forwarded = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{address}{path}"));
    for (name, value) in &headers {
        if name != axum::http::header::HOST {
            forwarded = forwarded.header(name, value);
        }
    }
    let Ok(forwarded) = forwarded
        .header(FORWARDED_HEADER, HeaderValue::from_static("1"))
        .body(Full::new(Bytes::new()))
    else {
        return response;
    };
    match tokio::time::timeout(FORWARD_TIMEOUT, remote.nodes.client.request(forwarded)).await {
        Ok(Ok(answer)) => answer.map(axum::body::Body::new).into_response(),
        _ => response,
    }
}

#[cfg(test)]
mod tests {
    use super::leading_within;

    #[test]
    fn a_batch_takes_what_fits_in_order_and_never_stalls_on_a_large_item() {
        let sizes = [3, 4, 2, 9, 1];
        let within = |items: &[usize], max| leading_within(items, |&n| n, max);
        assert_eq!(within(&sizes, 9), 3, "3 + 4 + 2 fit, the 9 does not");
        assert_eq!(within(&sizes, 100), 5);
        assert_eq!(
            within(&sizes[3..], 5),
            1,
            "an item over the limit goes alone"
        );
        assert_eq!(within(&sizes[..1], 1), 1);
        assert_eq!(within(&[], 10), 0);
    }
}
