//! The view's stylesheet and script, embedded in the binary (no build step, no network):
//! served with their type and a short cache.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("assets/ui.css");
const JS: &str = include_str!("assets/ui.js");

pub async fn serve(Path(file): Path<String>) -> Response {
    let (kind, body) = match file.as_str() {
        "ui.css" => ("text/css; charset=utf-8", CSS),
        "ui.js" => ("text/javascript; charset=utf-8", JS),
        _ => return (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    };
    (
        [(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "max-age=300")],
        body,
    )
        .into_response()
}
