//! The dashboard: one page, its stylesheet and its script, compiled into the binary (no build
//! step, nothing fetched from elsewhere) and served without a token; the page asks for one
//! and sends it with every call to the JSON API. A strict Content-Security-Policy allows only
//! these files, so the token the page holds is out of reach of any injected script or style.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const PAGE: &str = include_str!("dashboard/index.html");
const STYLE: &str = include_str!("dashboard/dashboard.css");
const SCRIPT: &str = include_str!("dashboard/dashboard.js");

/// Only this origin's files and API; no inline script or style, no framing, no plugins.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'";

/// `/`, `/dashboard.css` and `/dashboard.js`, for any router state.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset(PAGE, "text/html; charset=utf-8") }),
        )
        .route(
            "/dashboard.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
        .route(
            "/dashboard.js",
            get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
        )
}

/// A file with the headers every dashboard answer carries: the policy, no sniffing, no
/// caching (a new binary's page is never mixed with an old script), no referrer.
fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        body,
    )
        .into_response()
}
