//! Who may call what: API keys with roles, read from the file `--auth` names.
//!
//! A client sends its key as `Authorization: Bearer KEY`. The file holds only each key's SHA-256 (keys
//! are 32 random bytes, made by `spate auth new-key`, so a fast hash is as strong as a slow one), a name
//! for logs, and its roles:
//!
//! | role | may call |
//! |---|---|
//! | `admin` | everything, including every `/admin/` route and each app's admin routes |
//! | `read` | every app's reads (GET and HEAD), `/metrics` and `/cluster` |
//! | `metrics` | `/metrics` and `/cluster` |
//! | `APP:read` | the app's reads |
//! | `APP:write` | the app's reads and writes, but not its admin routes |
//! | `APP:KIND:NAME` | the routes the app lets act for one party (`ledger:participant:dfsp1`, `payments:merchant:m_1`), only as that party; their handlers check it through [`Scope`] |
//!
//! A key may carry `requests_per_s`: past it (a second's worth may come at once), its requests are
//! answered 429 with `Retry-After`, and other keys are served as before.
//!
//! Every app route is authorized by a layer the server puts around each app's routes, so a route an
//! app adds is refused to anyone without a role for it; nothing is open by default but `/health` (for
//! load balancers), `/openapi.json`, the dashboard's static files (`/` and `/dashboard/`, which hold
//! no data: the page reads the rest with the visitor's key) and the cluster's internal routes (signed
//! by the nodes, see `cluster_auth`). A
//! refusal is 401 without a known key, 403 with a key whose roles do not reach the route and 429 over
//! its rate, in the common error shape (`api::shape_error` turns it into an app's own), and counted in
//! `spate_http_refused_total{reason}`.

use crate::api::ApiError;
use axum::extract::{FromRequestParts, MatchedPath, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::Either;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Ready;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Bytes of randomness in a key `spate auth new-key` makes.
pub const KEY_RANDOM_BYTES: usize = 32;
/// What every key starts with, so that one found in a log or a repository is recognised as a spate key.
pub const KEY_PREFIX: &str = "spate_";
/// The most roles one key may hold: a longer list is a mistake, not a policy.
const ROLES_PER_KEY_MAX: usize = 64;

/// How an app's routes are reached, for the layer that authorizes them.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteAccess {
    /// Routes (as registered, such as `/fraud/history/generate`) only admin keys may call, besides every
    /// route under `/admin/`.
    pub admin_routes: &'static [&'static str],
    /// The kind of party a key may be scoped to in this app (`participant`, `merchant`), if any.
    pub party_kind: Option<&'static str>,
    /// Routes a key scoped to one party may call. Their handlers take a [`Scope`] and refuse what is
    /// not that party's; every other route refuses such keys.
    pub party_routes: &'static [&'static str],
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    Admin,
    ReadAll,
    Metrics,
    Read(String),
    Write(String),
    Party { app: String, name: String },
}

impl Role {
    /// Parses a role of the file; `apps` are the apps this server runs, with the party kind each one
    /// allows.
    fn parse(text: &str, apps: &[(&str, Option<&str>)]) -> Result<Self, String> {
        let app_names = || {
            apps.iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let known_app = |app: &str| {
            apps.iter()
                .find(|(name, _)| *name == app)
                .map(|(_, kind)| *kind)
                .ok_or_else(|| {
                    format!(
                        "role {text:?} names app {app:?}, which this server does not run ({})",
                        app_names()
                    )
                })
        };
        match text.split(':').collect::<Vec<_>>().as_slice() {
            ["admin"] => Ok(Self::Admin),
            ["read"] => Ok(Self::ReadAll),
            ["metrics"] => Ok(Self::Metrics),
            [app, "read"] => known_app(app).map(|_| Self::Read(app.to_string())),
            [app, "write"] => known_app(app).map(|_| Self::Write(app.to_string())),
            [app, kind, name] if !name.is_empty() => match known_app(app)? {
                Some(allowed) if allowed == *kind => Ok(Self::Party {
                    app: app.to_string(),
                    name: name.to_string(),
                }),
                Some(allowed) => Err(format!(
                    "role {text:?}: a key of {app} may be scoped to a {allowed}, not a {kind}"
                )),
                None => Err(format!(
                    "role {text:?}: {app} has no party a key could be scoped to"
                )),
            },
            _ => Err(format!(
                "role {text:?} is not admin, read, metrics, APP:read, APP:write or APP:KIND:NAME"
            )),
        }
    }
}

/// One key of the file, as the server knows it.
#[derive(Debug)]
struct KeyHolder {
    name: String,
    roles: Vec<Role>,
    /// Its requests per second, if limited.
    rate: Option<RateLimit>,
}

/// A token bucket: up to a second's worth of requests at once, refilled continuously.
#[derive(Debug)]
struct RateLimit {
    requests_per_s: u32,
    /// (tokens left, when they were counted)
    bucket: std::sync::Mutex<(f64, std::time::Instant)>,
}

impl RateLimit {
    fn new(requests_per_s: u32) -> Self {
        assert!(requests_per_s > 0);
        let full = f64::from(requests_per_s);
        Self {
            requests_per_s,
            bucket: std::sync::Mutex::new((full, std::time::Instant::now())),
        }
    }

    /// Takes a token if one is left.
    fn take(&self) -> bool {
        let full = f64::from(self.requests_per_s);
        let mut bucket = self
            .bucket
            .lock()
            .expect("the bucket lock is never poisoned");
        let now = std::time::Instant::now();
        let refilled = bucket.0 + now.duration_since(bucket.1).as_secs_f64() * full;
        let tokens = refilled.min(full);
        if tokens < 1.0 {
            *bucket = (tokens, now);
            return false;
        }
        *bucket = (tokens - 1.0, now);
        true
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    #[serde(default)]
    key: Vec<KeyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    name: String,
    sha256: String,
    roles: Vec<String>,
    /// The most requests per second the key may make; more are answered 429 [default: no limit].
    requests_per_s: Option<u32>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabel {
    reason: &'static str,
}

/// The keys a server accepts, and its count of refusals.
#[derive(Clone)]
pub struct Access {
    keys: Arc<HashMap<[u8; 32], KeyHolder>>,
    refused: Family<RefusalLabel, Counter>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Access({} keys)", self.keys.len())
    }
}

impl Access {
    /// Reads the key file at `path`; `apps` are the apps this server runs, with the party kind each
    /// allows, against which every role is checked.
    pub fn read(path: &Path, apps: &[(&str, Option<&str>)]) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the key file {}: {e}", path.display()))?;
        Self::parse(&text, apps).map_err(|e| format!("the key file {}: {e}", path.display()))
    }

    fn parse(text: &str, apps: &[(&str, Option<&str>)]) -> Result<Self, String> {
        let file: KeyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.key.is_empty() {
            return Err("it holds no [[key]]: every request would be refused".into());
        }
        let mut keys = HashMap::with_capacity(file.key.len());
        for entry in file.key {
            let hash = parse_sha256(&entry.sha256).ok_or_else(|| {
                format!(
                    "key {:?}: sha256 must be 64 hex digits (the SHA-256 of the key)",
                    entry.name
                )
            })?;
            if entry.roles.is_empty() || entry.roles.len() > ROLES_PER_KEY_MAX {
                return Err(format!(
                    "key {:?}: it needs 1 to {ROLES_PER_KEY_MAX} roles",
                    entry.name
                ));
            }
            let roles = (entry.roles.iter())
                .map(|role| Role::parse(role, apps))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("key {:?}: {e}", entry.name))?;
            if entry.requests_per_s == Some(0) {
                return Err(format!(
                    "key {:?}: requests_per_s must be at least 1 (leave it out for no limit)",
                    entry.name
                ));
            }
            let holder = KeyHolder {
                name: entry.name,
                roles,
                rate: entry.requests_per_s.map(RateLimit::new),
            };
            if let Some(other) = keys.insert(hash, holder) {
                return Err(format!("key {:?} is listed twice", other.name));
            }
        }
        Ok(Self {
            keys: Arc::new(keys),
            refused: Family::default(),
        })
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.sub_registry_with_prefix("spate_http").register(
            "refused",
            "Requests refused by access control: no_key, unknown_key (401), forbidden (403, the \
             key's roles do not reach the route), out_of_scope (403, a party's key acting for \
             another party), rate_limited (429, over the key's requests_per_s)",
            self.refused.clone(),
        );
    }

    fn count(&self, reason: &'static str) {
        self.refused.get_or_create(&RefusalLabel { reason }).inc();
    }

    /// The holder of the request's key, if it is known and within its rate; else the refusal, counted.
    fn admit_key(&self, request: &Request) -> Result<&KeyHolder, Box<Response>> {
        let holder = self.holder(request).map_err(|reason| {
            self.count(reason);
            let message = if reason == "no_key" {
                "this server needs an API key: send Authorization: Bearer KEY"
            } else {
                "the API key is not known to this server"
            };
            Box::new(refusal(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                message.into(),
            ))
        })?;
        if let Some(rate) = &holder.rate
            && !rate.take()
        {
            self.count("rate_limited");
            let message = format!(
                "key {:?} may make {} requests per second",
                holder.name, rate.requests_per_s
            );
            let mut response = refusal(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message);
            (response.headers_mut()).insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Err(Box::new(response));
        }
        Ok(holder)
    }

    fn holder(&self, request: &Request) -> Result<&KeyHolder, &'static str> {
        let value = request
            .headers()
            .get(header::AUTHORIZATION)
            .ok_or("no_key")?;
        // The scheme's name is case-insensitive (RFC 9110).
        let key = (value.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, key)| key)
            .ok_or("unknown_key")?;
        let hash: [u8; 32] = Sha256::digest(key.trim().as_bytes()).into();
        self.keys.get(&hash).ok_or("unknown_key")
    }
}

/// Makes a new key: what the client sends, and its SHA-256 in hex for the key file.
pub fn new_key() -> (String, String) {
    let random: [u8; KEY_RANDOM_BYTES] = rand::random();
    let key = format!("{KEY_PREFIX}{}", hex::encode(random));
    let hash = hex::encode(Sha256::digest(key.as_bytes()));
    (key, hash)
}

/// Checks a role as `Access::read` would for a server running `apps`.
pub fn check_role(role: &str, apps: &[(&str, Option<&str>)]) -> Result<(), String> {
    Role::parse(role, apps).map(|_| ())
}

fn parse_sha256(text: &str) -> Option<[u8; 32]> {
    let mut hash = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut hash).ok()?;
    Some(hash)
}

/// Who a request may act for within its app: anyone, or only the party its key is scoped to.
#[derive(Debug, Clone)]
pub enum Scope {
    Whole,
    Party(PartyScope),
}

/// A key scoped to one party, with the counter its refusals go to.
#[derive(Debug, Clone)]
pub struct PartyScope {
    pub kind: &'static str,
    pub name: String,
    refused: Counter,
}

impl Scope {
    /// Whether the request may act for `party`; its 403 (counted) if not.
    pub fn permits(&self, party: &str) -> Result<(), ApiError> {
        match self {
            Scope::Whole => Ok(()),
            Scope::Party(scope) if scope.name == party => Ok(()),
            Scope::Party(scope) => {
                scope.refused.inc();
                Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "out_of_scope",
                    format!(
                        "this key acts only for {} {}, not for {party}",
                        scope.kind, scope.name
                    ),
                ))
            }
        }
    }

    /// Whether the request may act for one of `parties`; its 403 (counted) if not.
    pub fn permits_any(&self, parties: &[&str]) -> Result<(), ApiError> {
        match self {
            Scope::Party(scope) if !parties.contains(&scope.name.as_str()) => {
                self.permits(parties.first().copied().unwrap_or_default())
            }
            _ => Ok(()),
        }
    }

    /// The party the request is limited to, if any.
    pub fn party(&self) -> Option<&str> {
        match self {
            Scope::Whole => None,
            Scope::Party(scope) => Some(&scope.name),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Scope {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Scope>()
            .cloned()
            .unwrap_or(Scope::Whole))
    }
}

/// A refusal in the common error shape (`api::shape_error` puts it in an app's own, where it has one).
fn refusal(status: StatusCode, code: &'static str, message: String) -> Response {
    let mut response = ApiError::new(status, code, message).into_response();
    if status == StatusCode::UNAUTHORIZED {
        (response.headers_mut())
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// What a route needs of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Read,
    Write,
    Admin,
}

/// The state of one app's authorizing layer.
#[derive(Clone)]
pub struct AppGate {
    access: Access,
    app: &'static str,
    routes: RouteAccess,
}

impl AppGate {
    pub fn new(access: Access, app: &'static str, routes: RouteAccess) -> Self {
        Self {
            access,
            app,
            routes,
        }
    }
}

/// Admits a request to one of an app's routes if its key's roles reach it, with its [`Scope`].
impl Admit for AppGate {
    fn admit(&self, request: &mut Request) -> Result<(), Box<Response>> {
        // A layer on routes always runs after routing; the matched path is shared, not copied.
        let matched = request.extensions().get::<MatchedPath>().cloned();
        let route = matched.as_ref().map_or("", MatchedPath::as_str);
        let need = if route.starts_with("/admin/") || self.routes.admin_routes.contains(&route) {
            Need::Admin
        } else if request.method() == Method::GET || request.method() == Method::HEAD {
            Need::Read
        } else {
            Need::Write
        };
        let holder = self.access.admit_key(request)?;
        let mut scope = None;
        for role in &holder.roles {
            let granted = match role {
                Role::Admin => Some(Scope::Whole),
                Role::ReadAll if need == Need::Read => Some(Scope::Whole),
                Role::Read(app) if app == self.app && need == Need::Read => Some(Scope::Whole),
                Role::Write(app) if app == self.app && need != Need::Admin => Some(Scope::Whole),
                Role::Party { app, name }
                    if app == self.app
                        && need != Need::Admin
                        && self.routes.party_routes.contains(&route) =>
                {
                    Some(Scope::Party(PartyScope {
                        kind: self.routes.party_kind.unwrap_or("party"),
                        name: name.clone(),
                        refused: self
                            .access
                            .refused
                            .get_or_create(&RefusalLabel {
                                reason: "out_of_scope",
                            })
                            .clone(),
                    }))
                }
                _ => None,
            };
            // A whole grant beats a party's.
            match (&scope, granted) {
                (_, Some(Scope::Whole)) => {
                    scope = Some(Scope::Whole);
                    break;
                }
                (None, Some(party)) => scope = Some(party),
                _ => {}
            }
        }
        let Some(scope) = scope else {
            self.access.count("forbidden");
            let needed = match need {
                Need::Admin => "an admin key".to_string(),
                Need::Read => format!("a key that may read {}", self.app),
                Need::Write => format!("a key that may write to {}", self.app),
            };
            let message = format!(
                "{} {route} needs {needed}; key {:?} is not one",
                request.method(),
                holder.name
            );
            return Err(Box::new(refusal(
                StatusCode::FORBIDDEN,
                "forbidden",
                message,
            )));
        };
        request.extensions_mut().insert(scope);
        Ok(())
    }
}

/// Admits a request to what describes the server as a whole (`/metrics`, `/cluster`) with a key that
/// may read every app or the metrics.
impl Admit for Access {
    fn admit(&self, request: &mut Request) -> Result<(), Box<Response>> {
        let holder = self.admit_key(request)?;
        let allowed = (holder.roles.iter())
            .any(|role| matches!(role, Role::Admin | Role::ReadAll | Role::Metrics));
        if allowed {
            return Ok(());
        }
        self.count("forbidden");
        Err(Box::new(refusal(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "{} needs a key with the role metrics, read or admin; key {:?} has none",
                request.uri().path(),
                holder.name
            ),
        )))
    }
}

/// Decides whether a request may reach its route, before the route runs. It is synchronous (a key is
/// looked up in memory), so [`Gate`] needs no future of its own: a `from_fn` middleware would clone
/// the route and box two futures per request.
pub trait Admit: Clone + Send + Sync + 'static {
    /// Lets `request` through, adding what its handler needs to its extensions, or answers it.
    fn admit(&self, request: &mut Request) -> Result<(), Box<Response>>;
}

/// A layer (put on routes with `route_layer`, so that the matched route is known) that lets through
/// only the requests its [`Admit`] admits.
#[derive(Clone)]
pub struct Gate<A> {
    admit: A,
}

impl<A> Gate<A> {
    pub fn new(admit: A) -> Self {
        Self { admit }
    }
}

impl<A: Clone, S> tower::Layer<S> for Gate<A> {
    type Service = Gated<A, S>;

    fn layer(&self, inner: S) -> Gated<A, S> {
        Gated {
            admit: self.admit.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Gated<A, S> {
    admit: A,
    inner: S,
}

impl<A, S> tower::Service<Request> for Gated<A, S>
where
    A: Admit,
    S: tower::Service<Request, Response = Response, Error = std::convert::Infallible>,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Either<Ready<Result<Response, Self::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        match self.admit.admit(&mut request) {
            Ok(()) => Either::Right(self.inner.call(request)),
            Err(refused) => Either::Left(std::future::ready(Ok(*refused))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APPS: &[(&str, Option<&str>)] = &[("tally", None), ("ledger", Some("participant"))];

    fn file(roles: &str) -> String {
        let (_, hash) = new_key();
        format!("[[key]]\nname = \"k\"\nsha256 = \"{hash}\"\nroles = [{roles}]\n")
    }

    #[test]
    fn roles_are_checked_against_the_apps_the_server_runs() {
        assert!(
            Access::parse(
                &file("\"admin\", \"tally:write\", \"ledger:participant:dfsp1\""),
                APPS
            )
            .is_ok()
        );
        let refused = [
            ("\"tallly:write\"", "does not run"),
            ("\"tally:participant:x\"", "no party"),
            ("\"ledger:merchant:x\"", "not a merchant"),
            ("\"ledger:participant:\"", "is not admin"),
            ("\"root\"", "is not admin"),
            ("", "1 to 64 roles"),
            ("\"admin\"]\nrequests_per_s = 0\n#", "at least 1"),
        ];
        for (roles, expected) in refused {
            let error = Access::parse(&file(roles), APPS).unwrap_err();
            assert!(error.contains(expected), "{roles}: {error}");
        }
        assert!(Access::parse("", APPS).unwrap_err().contains("no [[key]]"));
        for hash in ["abc".to_string(), "+f".repeat(32), "g".repeat(64)] {
            let bad_hash =
                format!("[[key]]\nname = \"k\"\nsha256 = \"{hash}\"\nroles = [\"admin\"]\n");
            assert!(
                Access::parse(&bad_hash, APPS)
                    .unwrap_err()
                    .contains("64 hex digits"),
                "{hash}"
            );
        }
    }

    #[test]
    fn a_new_key_is_found_by_its_hash_only() {
        let (key, hash) = new_key();
        assert!(
            key.starts_with(KEY_PREFIX) && key.len() == KEY_PREFIX.len() + 2 * KEY_RANDOM_BYTES
        );
        assert!(!hash.contains(&key[KEY_PREFIX.len()..]));
        let text = format!("[[key]]\nname = \"ops\"\nsha256 = \"{hash}\"\nroles = [\"admin\"]\n");
        let access = Access::parse(&text, APPS).unwrap();
        let with = |value: &str| {
            Request::builder()
                .header(header::AUTHORIZATION, value)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        assert_eq!(
            access.holder(&with(&format!("Bearer {key}"))).unwrap().name,
            "ops"
        );
        assert_eq!(
            access.holder(&with(&format!("Bearer {hash}"))).unwrap_err(),
            "unknown_key"
        );
        assert_eq!(access.holder(&with(&key)).unwrap_err(), "unknown_key");
        let holder = |value: String| access.holder(&with(&value)).map(|h| h.name.clone());
        assert_eq!(holder(format!("bearer  {key}")).unwrap(), "ops");
        assert_eq!(holder(format!("Basic {key}")).unwrap_err(), "unknown_key");
        let none = Request::builder().body(axum::body::Body::empty()).unwrap();
        assert_eq!(access.holder(&none).unwrap_err(), "no_key");
    }
}
