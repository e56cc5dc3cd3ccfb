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

use crate::api::{ApiError, json};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use spate_engine::cluster::{
    self, ClusterStatus, Command, Directory, MESSAGE_BYTES_MAX, ReadSender, Remote, ReplySender,
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
    directory: Arc<dyn Directory>,
    client: HttpClient,
    commands: Vec<mpsc::Sender<(Command, ReplySender)>>,
    messages: Vec<mpsc::Sender<Vec<u8>>>,
    /// Where reads for other nodes run (the engine may ask from a thread outside the runtime).
    runtime: tokio::runtime::Handle,
}

impl HttpRemote {
    /// Starts one command lane and one message lane per partition (tasks on the current runtime).
    pub fn start(directory: Arc<dyn Directory>, partitions: u16) -> Arc<Self> {
        let client: HttpClient = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http();
        let mut commands = Vec::new();
        let mut messages = Vec::new();
        for partition in 0..partitions {
            let (command_tx, command_rx) = mpsc::channel(LANE_COMMANDS_MAX);
            let (message_tx, message_rx) = mpsc::channel(LANE_MESSAGES_MAX);
            tokio::spawn(forward_commands(
                partition,
                command_rx,
                client.clone(),
                directory.clone(),
            ));
            tokio::spawn(deliver_messages(
                partition,
                message_rx,
                client.clone(),
                directory.clone(),
            ));
            commands.push(command_tx);
            messages.push(message_tx);
        }
        Arc::new(Self {
            directory,
            client,
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
        let (client, directory) = (self.client.clone(), self.directory.clone());
        self.runtime.spawn(async move {
            let mut body = Vec::with_capacity(1 + query.len());
            body.put_u8(app);
            body.extend_from_slice(&query);
            let answer = post_to_owner(&client, directory.as_ref(), partition, "reads", body)
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

async fn post_to_owner(
    client: &HttpClient,
    directory: &dyn Directory,
    partition: PartitionId,
    what: &str,
    body: Vec<u8>,
) -> Result<Bytes, String> {
    let address = directory
        .owner_address(partition)
        .ok_or_else(|| format!("no node owns partition {partition}"))?;
    let request = hyper::Request::post(format!(
        "http://{address}/internal/v1/partitions/{partition}/{what}"
    ))
    .header(FORWARDED_HEADER, "1")
    .body(Full::new(Bytes::from(body)))
    .map_err(|e| e.to_string())?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
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
            Err(format!("{address} answered {status}"))
        }
    };
    tokio::time::timeout(FORWARD_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("{address} did not answer within {FORWARD_TIMEOUT:?}"))?
}

/// One partition's lane: sends the queued commands in order, a batch per request, one request at a time.
async fn forward_commands(
    partition: PartitionId,
    mut queued: mpsc::Receiver<(Command, ReplySender)>,
    client: HttpClient,
    directory: Arc<dyn Directory>,
) {
    let mut batch = Vec::new();
    while queued.recv_many(&mut batch, BATCH_COMMANDS_MAX).await > 0 {
        let (commands, replies): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
        let body = cluster::encode_commands(&commands);
        let answered = post_to_owner(&client, directory.as_ref(), partition, "commands", body)
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

/// One partition's lane of follow-ups and acknowledgements: whatever is queued goes in one request.
async fn deliver_messages(
    partition: PartitionId,
    mut queued: mpsc::Receiver<Vec<u8>>,
    client: HttpClient,
    directory: Arc<dyn Directory>,
) {
    let mut batch = Vec::new();
    while queued.recv_many(&mut batch, BATCH_COMMANDS_MAX).await > 0 {
        let mut body = Vec::new();
        body.put_u32(batch.len() as u32);
        for message in batch.drain(..) {
            body.put_bytes(&message);
        }
        if let Err(error) =
            post_to_owner(&client, directory.as_ref(), partition, "messages", body).await
        {
            tracing::debug!(partition, %error, "delivering messages failed; the engine resends");
        }
    }
}

/// The routes of a cluster node: what other nodes call, and `/cluster`.
pub fn routes(engine: EngineHandle, directory: Arc<dyn Directory>) -> Router {
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
        .route(
            "/cluster",
            get(move || {
                let directory = directory.clone();
                async move { json(StatusCode::OK, &status_json(&directory.status())) }
            }),
        )
}

fn status_json(status: &ClusterStatus) -> serde_json::Value {
    let nodes: Vec<_> = status
        .nodes
        .iter()
        .map(|node| {
            serde_json::json!({
                "node_id": node.node_id,
                "address": node.address,
                "partitions": node.partitions,
            })
        })
        .collect();
    let owned: usize = status.nodes.iter().map(|n| n.partitions.len()).sum();
    serde_json::json!({
        "node_id": status.node_id,
        "partitions": status.partitions,
        "partitions_unowned": usize::from(status.partitions).saturating_sub(owned),
        "nodes": nodes,
    })
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
    if body.len() > MESSAGE_BYTES_MAX {
        return Err(ApiError::bad_request(
            "forwarded commands over the size limit",
        ));
    }
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
    if body.len() > MESSAGE_BYTES_MAX {
        return Err(ApiError::bad_request("a read over the size limit"));
    }
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
    let Some(address) = remote.directory.owner_address(partition) else {
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
    match tokio::time::timeout(FORWARD_TIMEOUT, remote.client.request(forwarded)).await {
        Ok(Ok(answer)) => answer.map(axum::body::Body::new).into_response(),
        _ => response,
    }
}
