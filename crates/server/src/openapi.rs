//! `GET /openapi.json`: one OpenAPI 3.1 document of every route the server answers, built at start-up
//! from the code that answers them.
//!
//! Each app builds its routes with an [`AppRouter`] (utoipa-axum), whose `routes!` mounts a handler
//! together with its `#[utoipa::path]`: a route is described where it is served, and its request and
//! answer bodies are the types the handler reads and writes (`ToSchema`). What every route shares is
//! added here rather than repeated on each operation: the errors the server answers whatever the route
//! (a malformed request, a body over the limit or of the wrong type, an unavailable partition,
//! `--auth`'s refusals), each in the error shape of its path.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, Ref, ResponseBuilder,
};

/// The routes of an app, with their descriptions.
pub type AppRouter<S = ()> = utoipa_axum::router::OpenApiRouter<S>;

/// Paths answered to anyone, with or without `--auth`, besides the dashboard's static files
/// ([`crate::dashboard::PATHS`]).
const OPEN_PATHS: [&str; 2] = ["/health", "/openapi.json"];

/// The name of the security scheme of `--auth`'s API keys.
const API_KEY_SCHEME: &str = "api_key";

/// The whole document: the server's own routes and every app's, with the errors every route may
/// answer; `message_only_paths` are the path prefixes whose errors are `{"message"}`, and `auth` says
/// whether keys are required.
pub fn document(
    parts: impl IntoIterator<Item = OpenApi>,
    message_only_paths: &[&str],
    auth: bool,
) -> OpenApi {
    let mut components = ComponentsBuilder::new()
        .schema_from::<crate::api::ErrorBody>()
        .schema_from::<crate::api::ErrorDetail>()
        .schema_from::<crate::api::MessageBody>();
    if auth {
        components = components.security_scheme(
            API_KEY_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key made by `spate auth new-key`."))
                    .build(),
            ),
        );
    }
    let mut document = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("spate")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Every HTTP API of a spate server: the apps it runs and the server's own routes.",
                ))
                .build(),
        )
        .components(Some(components.build()))
        .build();
    for part in parts {
        assert_no_schema_named_twice(&document, &part);
        document.merge(part);
    }
    document.merge(own_route().into_openapi());
    for (path, item) in document.paths.paths.iter_mut() {
        let message_only = message_only_paths.iter().any(|p| path.starts_with(p));
        let open = (OPEN_PATHS.iter().chain(&crate::dashboard::PATHS)).any(|open| open == path);
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
            &mut item.head,
        ];
        for operation in operations.into_iter().flatten() {
            add_common_errors(operation, message_only, auth && !open);
        }
    }
    document
}

/// Two different schemas of one name would be merged silently into the first (two apps each with an
/// `EntryAnswer`, say), describing one app's answers with the other's: each app names its own apart
/// (`ledger.EntryAnswer`). The same type reached from two apps (the error shape) is one schema.
fn assert_no_schema_named_twice(document: &OpenApi, part: &OpenApi) {
    let (Some(have), Some(adding)) = (&document.components, &part.components) else {
        return;
    };
    for (name, schema) in &adding.schemas {
        if let Some(existing) = have.schemas.get(name) {
            assert!(
                existing == schema,
                "two different schemas are named {name:?} in the API description"
            );
        }
    }
}

/// Adds to `operation` each error the server may answer on any route that it does not describe
/// itself. (415 is not one: only the routes that read their body with `ApiJson` answer it, and they
/// describe it.)
fn add_common_errors(operation: &mut Operation, message_only: bool, needs_key: bool) {
    let mut errors = vec![
        (
            StatusCode::BAD_REQUEST,
            "A path value, query value or header is malformed.",
        ),
        (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "`headers_too_large`: the request line and headers are over the server's limit (`--header-bytes-max`); with no body when they are refused while still arriving.",
        ),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "A store on disk could not be read.",
        ),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "The partition cannot take the request now (overloaded, moving, disk full, shutting down); retry after `Retry-After`.",
        ),
    ];
    let idempotent = (operation.parameters.iter().flatten()).any(|p| p.name == "Idempotency-Key");
    if idempotent {
        errors.extend([
            (StatusCode::CONFLICT, "A request with this `Idempotency-Key` is still being made durable; retry shortly."),
            (StatusCode::UNPROCESSABLE_ENTITY, "The `Idempotency-Key` was used with another body, or the body's JSON does not have the fields and types described."),
        ]);
    }
    if operation.request_body.is_some() {
        errors.extend([
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                "The body is over the size limit.",
            ),
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                "The body's JSON does not have the fields and types described.",
            ),
        ]);
    }
    if needs_key {
        errors.extend([
            (StatusCode::UNAUTHORIZED, "No API key, or an unknown one."),
            (
                StatusCode::FORBIDDEN,
                "The key's roles do not reach this route or this party.",
            ),
            (
                StatusCode::TOO_MANY_REQUESTS,
                "The key is over its rate; retry after `Retry-After`.",
            ),
        ]);
        operation.security = Some(vec![SecurityRequirement::new::<_, _, &str>(
            API_KEY_SCHEME,
            [],
        )]);
    }
    let shape = if message_only {
        "MessageBody"
    } else {
        "ErrorBody"
    };
    for (status, description) in errors {
        let code = status.as_str().to_string();
        operation
            .responses
            .responses
            .entry(code)
            .or_insert_with(|| {
                ResponseBuilder::new()
                    .description(description)
                    .content(
                        "application/json",
                        ContentBuilder::new()
                            .schema(Some(Ref::from_schema_name(shape)))
                            .build(),
                    )
                    .build()
                    .into()
            });
    }
}

/// The document, serialized once.
#[derive(Clone)]
struct DocumentJson(Bytes);

/// This document, as JSON.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "server",
    responses((status = 200, description = "This document (OpenAPI 3.1).", content_type = "application/json", body = Object)),
)]
async fn serve_document(State(document): State<DocumentJson>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document.0).into_response()
}

fn own_route() -> utoipa_axum::router::OpenApiRouter<DocumentJson> {
    utoipa_axum::router::OpenApiRouter::new().routes(utoipa_axum::routes!(serve_document))
}

/// Serves `document` at `/openapi.json`, to anyone: it describes the API, not its data.
pub fn route(document: &OpenApi) -> Router {
    let json = document
        .to_json()
        .expect("a document built from types serializes");
    let (router, _) = own_route().split_for_parts();
    router.with_state(DocumentJson(Bytes::from(json)))
}
