//! The chat page at `/`: one static HTML file (its CSS and JavaScript
//! inline) compiled into the binary, so there is no build step, no asset
//! directory and no CDN. It talks to `/v1/chat/completions` like any other
//! client (streaming SSE, a stop button that aborts the fetch) and sends the
//! API key typed into it, so it is served without one.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("page/index.html");

pub(crate) async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing but this page's own inline code runs, and it talks
            // only to this server.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        INDEX,
    )
        .into_response()
}
