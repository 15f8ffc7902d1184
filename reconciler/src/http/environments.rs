//! `GET /v1/environments/{name}`: one environment's deployment on the typed wire, with a long
//! poll.
//!
//! Why a resource of its own: `pl`'s followers (`wait`, `rollback`, `rollout`) watch one
//! environment; reading the whole list for each look made the daemon's work grow with every
//! environment of the fleet. `waitMs` with `If-None-Match` (the `ETag` of what the follower saw
//! last) answers as soon as the environment changes, or with `304` when the wait ends first:
//! one request per change instead of one every 100 ms.

use crate::http::server::{error, refusal};
use crate::hub::Hub;
use crate::ops::Ops;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use operator_proto::MAX_WAIT_MS;
use std::time::Duration;

/// How often a waiting request looks at its environment again when nothing woke it (running
/// counts come from heartbeats, which write no event).
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// The tag of what a follower saw: a hash of the JSON it was sent.
fn tag(body: &[u8]) -> String {
    use sha2::Digest;
    format!("\"{}\"", &hex::encode(sha2::Sha256::digest(body))[..32])
}

/// The environment's deployment (viewer, checked by the caller). With `waitMs` (at most
/// [`MAX_WAIT_MS`]) and `If-None-Match`, it waits while the deployment is what the tag says,
/// and answers `304 Not Modified` when the wait ends first.
pub async fn get((ops, hub): (&Ops, &Hub), headers: &HeaderMap, environment: &str, wait_ms: Option<u64>) -> Response {
    let seen = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
    let mut tip = hub.events_tip.subscribe();
    loop {
        let body = match ops.environment(environment).await {
            Ok(Some(d)) => serde_json::to_vec(&d).unwrap_or_default(),
            Ok(None) => {
                return error(
                    StatusCode::NOT_FOUND,
                    "environment-unknown",
                    format!("no deployment of environment {environment} (see `pl status`)"),
                );
            }
            Err(e) => return refusal(&e),
        };
        let etag = tag(&body);
        let unchanged = seen.as_deref() == Some(etag.as_str());
        if !unchanged || tokio::time::Instant::now() >= deadline {
            let mut response = if unchanged {
                StatusCode::NOT_MODIFIED.into_response()
            } else {
                (
                    [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
                    body,
                )
                    .into_response()
            };
            if let Ok(v) = HeaderValue::from_str(&etag) {
                response.headers_mut().insert(header::ETAG, v);
            }
            return response;
        }
        // An event (a job ended, a generation started) or the next look, whichever first.
        tokio::select! {
            _ = tip.changed() => {}
            _ = tokio::time::sleep(LOOK_EVERY) => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}
