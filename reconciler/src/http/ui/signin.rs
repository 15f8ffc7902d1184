//! Signing in to the web view: a token pasted once (rate limited by address and in total), or
//! a one-time link `pl ui` prints, becomes a session cookie (HttpOnly, Secure, SameSite=Strict,
//! `__Host-`); signing out ends the session on the server. A sign-in form's POST must come
//! from the view's own origin (the browser says so in `Origin` or `Sec-Fetch-Site`), so no
//! other site can sign a browser in as someone else.

use super::guard::{bad_csrf, csrf_ok, same_origin};
use super::render::{Screen, page};
use super::{App, COOKIE, Signed, failed, page_response, refusal_page};
use crate::http::server::Peer;
use axum::Form;
use axum::extract::Query;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// Sign-in attempts one address may make per window.
pub const ATTEMPTS_PER_ADDRESS: u32 = 10;
/// Sign-in attempts all addresses together may make per window.
pub const ATTEMPTS_IN_TOTAL: u32 = 100;
/// The window the counts are over.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered at once; past that the window starts over for all.
const ADDRESSES: usize = 10_000;

/// One window's counts: when it began, attempts in all, attempts by address.
type Window = (Instant, u32, HashMap<IpAddr, u32>);

/// Fixed-window counts of sign-in attempts (tokens pasted and links used).
#[derive(Default)]
pub struct Limiter {
    counts: Mutex<Option<Window>>,
}

impl Limiter {
    /// Counts an attempt from `ip`; `false` when it is one too many.
    pub fn allow(&self, ip: IpAddr, now: Instant) -> bool {
        let Ok(mut guard) = self.counts.lock() else {
            return false;
        };
        let (start, total, per) = guard.get_or_insert_with(|| (now, 0, HashMap::new()));
        if now.duration_since(*start) >= WINDOW || per.len() >= ADDRESSES {
            *start = now;
            *total = 0;
            per.clear();
        }
        let mine = per.entry(ip).or_insert(0);
        if *mine >= ATTEMPTS_PER_ADDRESS || *total >= ATTEMPTS_IN_TOTAL {
            return false;
        }
        *mine += 1;
        *total += 1;
        true
    }
}

/// The sign-in page.
pub async fn form() -> Response {
    sign_in_page(StatusCode::OK, None)
}

fn sign_in_page(status: StatusCode, problem: Option<&str>) -> Response {
    let main = html! {
        h1 { "Sign in" }
        p { "Paste an operator API token (" code { "plt_…" } "). It becomes a session in this browser; the token itself is not kept here." }
        p { "On the control plane's machine, " code { "pl ui" } " prints a one-time sign-in link instead." }
        @if let Some(p) = problem {
            p class="refusal" role="alert" { (p) }
        }
        form method="post" action="/ui/sign-in" class="sign-in" {
            label for="token" { "Token" }
            input id="token" name="token" type="password" autocomplete="off" required autofocus;
            button type="submit" { "Sign in" }
        }
    };
    (status, page_response(page("Sign in", Screen::Other, None, 0, main))).into_response()
}

#[derive(Deserialize)]
pub struct TokenForm {
    token: String,
}

/// A pasted token: a session when it is one of the configured tokens.
pub async fn submit(State(ui): App, Peer(peer): Peer, headers: HeaderMap, Form(f): Form<TokenForm>) -> Response {
    if !same_origin(&headers) {
        return refusal_page(
            StatusCode::FORBIDDEN,
            "cross-site-request",
            "this form posts only from the view itself",
            None,
        );
    }
    if !ui.limiter.allow(peer.ip(), Instant::now()) {
        tracing::warn!(%peer, "web view: too many sign-in attempts");
        return sign_in_page(
            StatusCode::TOO_MANY_REQUESTS,
            Some("Too many sign-in attempts; wait a minute and try again."),
        );
    }
    let token = Zeroizing::new(f.token);
    let Some((hash, _, name)) = ui.tokens.identify(&token) else {
        tracing::info!(%peer, "web view: unknown token refused");
        return sign_in_page(
            StatusCode::UNAUTHORIZED,
            Some("That token is not one of this control plane's tokens."),
        );
    };
    let name = name.to_owned();
    opened(ui.ops.open_session(&hash, &name, "token").await)
}

/// The session's cookie, and on to the overview.
fn opened(r: crate::ops::Answer<crate::ops::sessions::Opened>) -> Response {
    match r {
        Ok(o) => {
            let max_age = (o.expires_at_ms - crate::ops::now_ms()).max(0) / 1000;
            let cookie = Zeroizing::new(format!(
                "{COOKIE}={}; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age={max_age}",
                o.id.as_str()
            ));
            let mut r = Redirect::to("/ui/").into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(e) => failed(&e),
    }
}

#[derive(Deserialize)]
pub struct LinkQuery {
    code: String,
}

/// A one-time link: signs in once, within minutes of being made; the address bar keeps no
/// code (the answer redirects).
pub async fn link(State(ui): App, Peer(peer): Peer, Query(q): Query<LinkQuery>) -> Response {
    if !ui.limiter.allow(peer.ip(), Instant::now()) {
        return sign_in_page(
            StatusCode::TOO_MANY_REQUESTS,
            Some("Too many sign-in attempts; wait a minute and try again."),
        );
    }
    let code = Zeroizing::new(q.code);
    let code = code.trim();
    if code.len() != 64 || !code.bytes().all(|b| b.is_ascii_hexdigit()) {
        return sign_in_page(
            StatusCode::BAD_REQUEST,
            Some("That sign-in link is not one pl ui prints."),
        );
    }
    match ui.ops.use_link(code).await {
        Ok(Some((hash, name))) => {
            if ui.tokens.by_hash(&hash).is_none() {
                return sign_in_page(
                    StatusCode::UNAUTHORIZED,
                    Some("The token that made this link is no longer configured."),
                );
            }
            opened(ui.ops.open_session(&hash, &name, "one-time link").await)
        }
        Ok(None) => sign_in_page(
            StatusCode::UNAUTHORIZED,
            Some("That sign-in link was used already or has expired; run pl ui for a new one."),
        ),
        Err(e) => failed(&e),
    }
}

#[derive(Deserialize)]
pub struct CsrfForm {
    csrf: String,
}

/// Ends the session on the server and forgets the cookie.
pub async fn sign_out(State(ui): App, who: Signed, Form(f): Form<CsrfForm>) -> Response {
    if !csrf_ok(&who, &f.csrf) {
        return bad_csrf(&who);
    }
    if let Err(e) = ui.ops.sign_out(&who.session).await {
        return failed(&e);
    }
    let mut r = Redirect::to("/ui/sign-in").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("__Host-pl-session=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    r
}

use axum::extract::State;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_are_limited_by_address_and_in_total() {
        let l = Limiter::default();
        let t = Instant::now();
        let a: IpAddr = [127, 0, 0, 1].into();
        for _ in 0..ATTEMPTS_PER_ADDRESS {
            assert!(l.allow(a, t));
        }
        assert!(!l.allow(a, t), "the address's limit");
        assert!(l.allow(a, t + WINDOW), "a new window");
        let l = Limiter::default();
        let mut allowed = 0;
        for i in 0..=255u8 {
            if l.allow([10, 0, 0, i].into(), t) {
                allowed += 1;
            }
        }
        assert_eq!(allowed, ATTEMPTS_IN_TOTAL, "the total's limit");
    }
}
