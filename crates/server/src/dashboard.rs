//! The live dashboard at `/`: three static files compiled into the binary. The page reads only what
//! machines read too (`/metrics`, `/health`, `/openapi.json`, the apps' JSON endpoints) with the
//! visitor's key, so the files themselves hold no data and are open to anyone who reaches the port.
//! The Content-Security-Policy lets the page run only its own script, and talk only to its origin.

use crate::ApiError;
use crate::openapi::AppRouter;
use axum::extract::Path;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Where the page and its files are served (see the `utoipa::path`s below).
pub(crate) const PATHS: [&str; 2] = ["/", "/dashboard/{file}"];

const INDEX_HTML: &str = include_str!("../dashboard/index.html");
const APP_JS: &str = include_str!("../dashboard/app.js");
const STYLE_CSS: &str = include_str!("../dashboard/style.css");

/// Scripts, styles and requests from this origin only; no inline script, no frames, no forms sent
/// anywhere. The one image is the empty icon (`data:,`), so that browsers do not ask for a
/// `/favicon.ico` the server does not have.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

pub fn routes() -> AppRouter {
    OpenApiRouter::new()
        .routes(routes!(index))
        .routes(routes!(asset))
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 4] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        // A new binary serves new files: the browser asks again rather than keep an old script.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, body).into_response()
}

/// The live dashboard (HTML): throughput, latency, queues, group commits, pauses, read model lag and
/// errors over the last minutes, and a panel per app.
#[utoipa::path(
    get,
    path = "/",
    tag = "server",
    responses((status = 200, description = "The page.", content_type = "text/html", body = String)),
)]
async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX_HTML)
}

/// The dashboard's script (`app.js`) and style sheet (`style.css`).
#[utoipa::path(
    get,
    path = "/dashboard/{file}",
    tag = "server",
    params(("file" = String, Path, description = "`app.js` or `style.css`.", pattern = "^(app\\.js|style\\.css)$")),
    responses(
        (status = 200, description = "The file.", content((String = "text/javascript"), (String = "text/css"))),
        (status = 404, description = "`not_found`: no such file.", body = crate::api::ErrorBody),
    ),
)]
async fn asset(Path(file_name): Path<String>) -> Response {
    match file_name.as_str() {
        "app.js" => file("text/javascript; charset=utf-8", APP_JS),
        "style.css" => file("text/css; charset=utf-8", STYLE_CSS),
        _ => ApiError::not_found("the dashboard has app.js and style.css").into_response(),
    }
}
