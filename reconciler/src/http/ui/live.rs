//! The view's live updates: a Server-Sent Events stream of event ids after a cursor, for a
//! signed-in session. The page's script fetches the page again on each (it never reads an
//! event's text). Streams are limited per session and in total, last at most
//! [`STREAM_LIFETIME`] (the browser reconnects with `Last-Event-ID`, and is checked again),
//! and are produced only as the connection takes them: a slow reader holds one page of ids,
//! never a growing buffer.

use super::{App, Signed};
use crate::http::server::too_many;
use axum::extract::Query;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::time::Duration;

/// How long one stream lasts before the browser must reconnect (and its session is checked again).
pub const STREAM_LIFETIME: Duration = Duration::from_secs(300);

#[derive(Deserialize)]
pub struct LiveQuery {
    after: Option<i64>,
}

pub async fn stream(State(ui): App, who: Signed, headers: HeaderMap, Query(q): Query<LiveQuery>) -> Response {
    let Some(slot) = ui.streams.acquire(&who.session) else {
        return too_many(
            "too-many-streams",
            "this session (or the daemon) has as many live pages open as it may; close one",
        );
    };
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok());
    let cursor = resume.or(q.after).unwrap_or_else(|| *ui.hub.events_tip.borrow());
    let tip = ui.hub.events_tip.subscribe();
    let ends = tokio::time::Instant::now() + STREAM_LIFETIME;
    let state = (cursor, tip, slot);
    let ids = futures_util::stream::unfold(state, move |(cursor, mut tip, slot)| async move {
        loop {
            let newest = *tip.borrow_and_update();
            if newest > cursor {
                // One message per wake: the page refetches itself, so ids in between need
                // no message of their own.
                let ev = SseEvent::default().id(newest.to_string()).data(newest.to_string());
                return Some((Ok::<_, std::convert::Infallible>(ev), (newest, tip, slot)));
            }
            tokio::select! {
                r = tip.changed() => if r.is_err() { return None },
                _ = tokio::time::sleep_until(ends) => return None,
            }
        }
    });
    Sse::new(ids)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
