//! The HTTP server: mounts each enabled app's routes next to `/health` and `/metrics`, maps engine
//! outcomes to HTTP, and shuts down in order (stop accepting, drain, final snapshot, sync).

pub mod access;
pub mod api;
mod cluster;
pub mod cluster_auth;
pub mod connections;
mod dashboard;
mod edge;
mod observe;
pub mod openapi;
pub mod tls;

use axum::Router;
use prometheus_client::registry::Registry;
use spate_engine::cluster::{Directory, Membership};
use spate_engine::{AppSpec, Engine, EngineConfig, EngineHandle, LogStore};
use std::net::SocketAddr;
use std::sync::Arc;

pub use api::{ApiError, ApiJson};

/// Requests larger than this are refused with 413 before any parsing.
pub const REQUEST_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Builds an app's routes once the engine runs; it may register metrics and start listeners of its own
/// (it runs inside the async runtime). An error stops the server before it accepts anything.
pub type RoutesBuilder =
    Box<dyn FnOnce(EngineHandle, &mut Registry) -> Result<openapi::AppRouter, String> + Send>;

/// How an app plugs in: its engine spec and, once the engine runs, its routes.
pub struct AppModule {
    pub spec: AppSpec,
    pub routes: RoutesBuilder,
    /// Which of its routes need an admin key, and which a key scoped to one party may call.
    pub access: access::RouteAccess,
    /// Path prefixes under which every error answer is `{"message": ...}` (the ski spec's shape)
    /// rather than the common one, whoever made it: the app's handlers, axum, the server's limits,
    /// access control, the fallback of an unknown path.
    pub message_only_error_paths: &'static [&'static str],
}

pub struct ServerConfig {
    pub listen: SocketAddr,
    pub connections: connections::ConnectionLimits,
    /// The API keys file (`--auth`); without it, anyone who reaches the port may call anything.
    pub auth_file: Option<std::path::PathBuf>,
    /// The certificate chain and private key files (PEM) to serve HTTPS with, instead of HTTP.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    pub engine: EngineConfig,
    /// Where the partitions' logs live; `None` for the embedded journal in the data directory.
    pub logs: Option<Arc<dyn LogStore>>,
    /// Set for a node of a cluster (which needs `logs`, a log every node can reach).
    pub cluster: Option<ClusterSetup>,
    /// For a single node on a shared log (`logs` without `cluster`): what, once the engine runs, starts
    /// again the partitions whose log failed.
    pub watch_logs: Option<JoinCluster>,
}

/// What makes a server one node of a cluster.
pub struct ClusterSetup {
    /// Who owns which partition, for forwarding.
    pub directory: Arc<dyn Directory>,
    /// What every node of the cluster signs its requests to the others with.
    pub secret: cluster_auth::ClusterSecret,
    /// Joins the cluster once the engine runs and the node listens; from then on the membership starts
    /// and stops partitions on the engine.
    pub join: JoinCluster,
}

/// Joins a cluster with a running engine; see [`ClusterSetup::join`].
pub type JoinCluster = Box<dyn FnOnce(EngineHandle) -> Result<Box<dyn Membership>, String> + Send>;

/// Starts the engine and serves until SIGTERM or Ctrl-C, then shuts down cleanly.
pub async fn serve(config: ServerConfig, modules: Vec<AppModule>) -> Result<(), String> {
    // Files an operator names are checked before anything starts.
    let tls = match &config.tls {
        Some((cert, key)) => Some(tls::acceptor(cert, key)?),
        None => None,
    };
    let mut registry = Registry::default();
    let access = match &config.auth_file {
        None => None,
        Some(path) => {
            let apps: Vec<_> = (modules.iter())
                .map(|m| (m.spec.name, m.access.party_kind))
                .collect();
            let access = access::Access::read(path, &apps)?;
            access.register(&mut registry);
            Some(access)
        }
    };
    let message_only_error_paths: Vec<&'static str> = (modules.iter())
        .flat_map(|m| m.message_only_error_paths.iter().copied())
        .collect();
    let gates: Vec<_> = (modules.iter())
        .map(|m| (access.clone()).map(|access| access::AppGate::new(access, m.spec.name, m.access)))
        .collect();
    let (specs, route_builders): (Vec<_>, Vec<_>) =
        modules.into_iter().map(|m| (m.spec, m.routes)).unzip();
    let app_names: Vec<&str> = specs.iter().map(|s| s.name).collect();
    tracing::info!(data_dir = %config.engine.data_dir.display(), partitions = config.engine.partitions, apps = ?app_names, "starting engine");
    let partitions = config.engine.partitions;
    let (started, cluster) = match (config.logs, config.cluster) {
        (Some(logs), Some(setup)) => {
            let remote = cluster::HttpRemote::start(
                setup.directory.clone(),
                setup.secret.clone(),
                partitions,
            );
            let started =
                Engine::start_node(logs, remote.clone(), config.engine, specs, &mut registry);
            (started, Some((setup, remote)))
        }
        (Some(logs), None) => (
            Engine::start_on(logs, config.engine, specs, &mut registry),
            None,
        ),
        (None, None) => (Engine::start(config.engine, specs, &mut registry), None),
        (None, Some(_)) => return Err("a cluster node needs a log every node can reach".into()),
    };
    let engine = started.map_err(|e| e.to_string())?;
    let handle = engine.handle();
    let http_metrics = observe::HttpMetrics::register(&mut registry);
    let connection_metrics = connections::ConnectionMetrics::register(&mut registry);
    let mut app_routes = Router::new();
    let mut descriptions = Vec::new();
    for (build, gate) in route_builders.into_iter().zip(gates) {
        match build(handle.clone(), &mut registry) {
            Ok(routes) => {
                let (routes, description) = routes.split_for_parts();
                descriptions.push(description);
                let routes = match gate {
                    // Every route of the app, whatever it added, is behind its gate.
                    Some(gate) => routes.route_layer(access::Gate::new(gate)),
                    None => routes,
                };
                app_routes = app_routes.merge(routes);
            }
            Err(error) => {
                let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
                return Err(error);
            }
        }
    }
    let auth = access.is_some();
    let (own_routes, own_description) =
        observe::routes(handle.clone(), Arc::new(registry), access.clone()).split_for_parts();
    descriptions.push(own_description);
    let (dashboard_routes, dashboard_description) = dashboard::routes().split_for_parts();
    descriptions.push(dashboard_description);
    let mut router = own_routes.merge(dashboard_routes).merge(app_routes);
    if let Some((setup, remote)) = &cluster {
        let (status_route, status_description) = observe::for_observers(
            cluster::status_route(setup.directory.clone()),
            access.clone(),
        )
        .split_for_parts();
        descriptions.push(status_description);
        router = router
            .layer(axum::middleware::from_fn_with_state(
                remote.clone(),
                cluster::forward_reads,
            ))
            .merge(cluster::internal_routes(
                handle.clone(),
                setup.secret.clone(),
            ))
            .merge(status_route);
    }
    let description = openapi::document(descriptions, &message_only_error_paths, auth);
    router = router.merge(openapi::route(&description));
    let router = router
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(edge::EdgeLayer::new(
            http_metrics,
            config.connections.header_bytes_limit(),
            message_only_error_paths,
        ));

    let listener =
        listen(config.listen).map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    // Tests and scripts wait for this line to know the port (the listen address may end in :0).
    println!("spate listening on {scheme}://{local}");
    tracing::info!(%local, "listening");
    // A node takes partitions only once it can answer the requests other nodes forward to it.
    let join = match (cluster, config.watch_logs) {
        (Some((setup, _)), _) => Some(setup.join),
        (None, watch) => watch,
    };
    let membership = match join {
        Some(join) => {
            let joined = tokio::task::spawn_blocking(move || join(handle))
                .await
                .map_err(|e| e.to_string())?;
            match joined {
                Ok(membership) => Some(membership),
                Err(error) => {
                    let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
                    return Err(error);
                }
            }
        }
        None => None,
    };
    connections::serve(
        listener,
        tls,
        router,
        config.connections,
        connection_metrics,
        shutdown_signal(),
    )
    .await;
    if let Some(membership) = membership {
        tracing::info!("leaving the cluster: handing partitions over");
        tokio::task::spawn_blocking(move || membership.leave())
            .await
            .map_err(|e| e.to_string())?;
    }
    tracing::info!("stopped accepting; draining partitions and writing final snapshots");
    let stopped = tokio::task::spawn_blocking(move || engine.shutdown())
        .await
        .map_err(|e| e.to_string())?;
    stopped?;
    tracing::info!("shut down cleanly");
    Ok(())
}

/// Makes every file and directory the process creates from here on (journals, snapshots, stores,
/// checkpoints, keys) its user's only, 0600 and 0700, whatever the umask it was started with: sealed
/// or not, a data directory is nobody else's business (PCI DSS asks for least access). Call it before
/// the apps are built, as they make their keys and stores. A data directory made earlier with wider
/// access keeps it, with a warning.
pub fn keep_new_files_private(data_dir: &std::path::Path) {
    // SAFETY: umask only sets the process's file mode creation mask; it cannot fail.
    unsafe { libc::umask(0o077) };
    use std::os::unix::fs::PermissionsExt;
    if let Ok(metadata) = std::fs::metadata(data_dir) {
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                data_dir = %data_dir.display(),
                mode = format!("{mode:03o}"),
                "the data directory is open to other users; chmod 700 it"
            );
        }
    }
}

/// Connections the kernel queues before `accept`. Clients open their connections together (the ski
/// case study's 168 threads do): with a short queue, a connection that does not fit loses its SYN and
/// waits the kernel's 1 s retransmission timeout. The kernel caps it at `net.core.somaxconn`.
const ACCEPT_BACKLOG: u32 = 4096;

fn listen(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(ACCEPT_BACKLOG)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
