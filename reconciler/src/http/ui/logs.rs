//! A role's live log tail in the view (operators and admins: logs are the application's data,
//! as for `pl logs`): a page whose script reads the relay's text as it comes and appends it as
//! text, and that stream itself (`…/lines`), which without the script is the last lines as
//! plain text. Lines pass through as `pl logs` relays them: never stored, never parsed as HTML.

use super::actions::enc;
use super::render::{Screen, page};
use super::{App, Signed, page_response, refusal_page, tip};
use crate::http::logs::relay;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::html;
use serde::Deserialize;

/// Lines a tail starts with.
const TAIL: u32 = 200;

fn refused(who: &Signed) -> Option<Response> {
    (!who.viewer.acts()).then(|| {
        refusal_page(
            StatusCode::FORBIDDEN,
            "insufficient-role",
            "logs are the application's data: an operator's token reads them",
            Some(&who.viewer),
        )
    })
}

/// The tail's page.
pub async fn page_of(State(ui): App, who: Signed, Path((env, role)): Path<(String, String)>) -> Response {
    if let Some(r) = refused(&who) {
        return r;
    }
    let src = format!("/ui/environments/{}/logs/{}/lines", enc(&env), enc(&role));
    let main = html! {
        h1 { "Logs of " (role) " in " (env) }
        p {
            "The last " (TAIL) " lines of each replica, then new ones as they come (without JavaScript: "
            a href=(src) { "the last lines as text" } "). Nothing is stored."
        }
        pre id="log" class="log" data-log-src=(format!("{src}?follow=true")) tabindex="0" aria-live="off" {}
        p { a href=(format!("/ui/environments/{}", enc(&env))) { "Back to " (env) } }
    };
    page_response(page(
        &format!("Logs of {role}"),
        Screen::Other,
        Some(&who.viewer),
        tip(&ui),
        main,
    ))
}

#[derive(Deserialize)]
pub struct Follow {
    #[serde(default)]
    follow: bool,
}

/// The lines, streamed as the relay gives them.
pub async fn lines(
    State(ui): App,
    who: Signed,
    Path((env, role)): Path<(String, String)>,
    Query(f): Query<Follow>,
) -> Response {
    if let Some(r) = refused(&who) {
        return r;
    }
    let Some(readers) = &ui.logs else {
        return refusal_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "logs-unavailable",
            "this daemon relays no logs",
            Some(&who.viewer),
        );
    };
    relay(readers, &env, &role, Some(TAIL), f.follow).await
}
