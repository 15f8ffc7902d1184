//! The web view under `/ui/`, served on the operator API's TLS listener by every replica (a
//! follower reads the same ledger): server-rendered HTML (maud), its CSS and one small script
//! embedded in the binary, every page complete without JavaScript. The script only swaps a
//! page's `<main>` for a fresh copy when the event stream (`/ui/live`) says something
//! happened. Sign-in turns a pasted token or a one-time link into a session cookie
//! (`signin.rs`); every state-changing request is a POST with the session's CSRF token
//! (`actions.rs`). Screens read through `ops` only, as the operator API does.
//!
//! Architecture invariant: the web view reaches the store only through `ops`
//! (`tests/layers.rs`), and writes no value unescaped (maud; `tests/ui.rs` checks the headers
//! and a hostile value).

mod actions;
mod assets;
mod charts;
mod guard;
mod lists;
mod live;
mod logs;
mod pages;
mod releases;
mod render;
mod signin;

use crate::auth::Tokens;
use crate::http::streams::StreamSlots;
use crate::hub::Hub;
use crate::ops::sessions::digest;
use crate::ops::{OpError, Ops};
use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{Markup, html};
use render::{Screen, Viewer};
use std::sync::Arc;

/// The session cookie. `__Host-`: the browser keeps it only from a secure origin, for the
/// whole host, never a parent domain.
pub const COOKIE: &str = "__Host-pl-session";
/// The most a web view form may send.
pub const MAX_FORM_BYTES: usize = 8 * 1024;
/// Open live streams per session: a browser's open pages of the view, over one HTTP/2
/// connection.
pub const STREAMS_PER_SESSION: usize = 8;

/// The web view's own state.
pub struct Ui {
    pub ops: Arc<Ops>,
    pub hub: Arc<Hub>,
    pub tokens: Arc<Tokens>,
    /// Live streams, by session and in total.
    pub streams: Arc<StreamSlots>,
    /// Sign-in attempts, by address and in total.
    pub limiter: signin::Limiter,
    /// `pl logs`' relay, for the log tail (`None`: no tail).
    pub logs: Option<Arc<crate::http::logs::Readers>>,
}

impl Ui {
    pub fn new(
        ops: Arc<Ops>,
        hub: Arc<Hub>,
        tokens: Arc<Tokens>,
        max_streams: usize,
        logs: Option<Arc<crate::http::logs::Readers>>,
    ) -> Arc<Ui> {
        Arc::new(Ui {
            ops,
            hub,
            tokens,
            streams: StreamSlots::new(max_streams, STREAMS_PER_SESSION),
            limiter: signin::Limiter::default(),
            logs,
        })
    }
}

type App = axum::extract::State<Arc<Ui>>;

/// The web view's routes; the composition root merges them into the operator API's.
pub fn router(state: Arc<Ui>) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(pages::overview))
        .route("/ui/environments/{name}", get(pages::environment))
        .route("/ui/environments/{name}/logs/{role}", get(logs::page_of))
        .route("/ui/environments/{name}/logs/{role}/lines", get(logs::lines))
        .route("/ui/revisions", get(lists::revisions))
        .route("/ui/plan", get(lists::plan))
        .route("/ui/nodes", get(lists::nodes))
        .route("/ui/events", get(lists::events))
        .route("/ui/releases", get(releases::page_of))
        .route("/ui/live", get(live::stream))
        .route("/ui/sign-in", get(signin::form).post(signin::submit))
        .route("/ui/sign-in/link", get(signin::link))
        .route("/ui/sign-out", post(signin::sign_out))
        .route("/ui/confirm/{action}", get(actions::confirm))
        .route("/ui/actions/{action}", post(actions::act))
        .route("/ui/assets/{file}", get(assets::serve))
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(axum::middleware::map_response(harden))
        .with_state(state)
}

/// Every answer of the view: no script but our own file, no frame, no sniffing, no referrer,
/// no cache of a page that shows the fleet.
async fn harden(mut r: Response) -> Response {
    let h = r.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, k: header::HeaderName, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(
        h,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(h, header::X_FRAME_OPTIONS, "DENY");
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::REFERRER_POLICY, "no-referrer");
    set(
        h,
        header::HeaderName::from_static("cross-origin-opener-policy"),
        "same-origin",
    );
    set(
        h,
        header::HeaderName::from_static("cross-origin-resource-policy"),
        "same-origin",
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        set(h, header::CACHE_CONTROL, "no-store");
    }
    r
}

/// The session's CSRF token: derived from its id, so nothing more is stored and a copy of the
/// ledger yields none.
fn csrf_of(session_id: &str) -> String {
    digest(&format!("pushleft-ui-csrf:{session_id}"))
}

/// The session id the request's cookie carries.
fn session_id(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A signed-in viewer, from the session cookie, whose token is still configured. Without one,
/// a page answers with the sign-in page's address.
pub struct Signed {
    pub viewer: Viewer,
    pub session: String,
}

impl FromRequestParts<Arc<Ui>> for Signed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, ui: &Arc<Ui>) -> Result<Signed, Response> {
        let to_sign_in = || Redirect::to("/ui/sign-in").into_response();
        let Some(id) = session_id(parts) else {
            return Err(to_sign_in());
        };
        let session = match ui.ops.session(&id).await {
            Ok(Some(s)) => s,
            Ok(None) => return Err(to_sign_in()),
            Err(e) => return Err(failed(&e)),
        };
        // The token must still be configured, with the role it has now.
        let Some((role, name)) = ui.tokens.by_hash(&session.token_hash) else {
            return Err(to_sign_in());
        };
        Ok(Signed {
            viewer: Viewer {
                name: name.to_owned(),
                role,
                csrf: csrf_of(&id),
            },
            session: id,
        })
    }
}

/// A page that says why something was refused, with the code.
fn refusal_page(status: StatusCode, code: &str, message: &str, viewer: Option<&Viewer>) -> Response {
    let main = html! {
        h1 { "Refused" }
        p class="refusal" { strong { (code) } ": " (message) }
        p { a href="/ui/" { "Back to the overview" } }
    };
    (
        status,
        page_response(render::page("Refused", Screen::Other, viewer, 0, main)),
    )
        .into_response()
}

/// A use case's refusal as a page, with the status the API would answer.
fn failed(e: &OpError) -> Response {
    refusal_page(crate::http::server::status_of(e.kind), e.code, &e.message, None)
}

/// HTML with its type.
fn page_response(m: Markup) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], m.into_string()).into_response()
}

/// The newest event id now: where a page's live stream starts.
fn tip(ui: &Ui) -> i64 {
    *ui.hub.events_tip.borrow()
}
