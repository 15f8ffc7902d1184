//! What an operator may do from the web view: roll back or release a hold, promote or abort a
//! canary, back a volume up now, reconcile now. Each is a confirmation page (a GET that changes
//! nothing) and a POST that carries the session's CSRF token, from the view's own origin, by a
//! session whose token's role allows it (operator or admin, as the API's routes); a viewer sees
//! no buttons and is refused anyway. Each calls the same use case as the API, which records an
//! event naming the token (a reconcile, which writes nothing else, is recorded here).

use super::guard::{bad_csrf, csrf_ok, same_origin};
use super::render::{Screen, Viewer, page};
use super::{App, Signed, failed, page_response, refusal_page, tip};
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use operator_proto::backups::RunBackup;
use operator_proto::rollbacks::{RollbackAsk, RolloutAction, RolloutAsk};
use serde::Deserialize;

/// The actions the view offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Rollback,
    Release,
    Promote,
    Abort,
    Backup,
    Reconcile,
}

impl Action {
    pub fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "rollback" => Action::Rollback,
            "release" => Action::Release,
            "promote" => Action::Promote,
            "abort" => Action::Abort,
            "backup" => Action::Backup,
            "reconcile" => Action::Reconcile,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Rollback => "rollback",
            Action::Release => "release",
            Action::Promote => "promote",
            Action::Abort => "abort",
            Action::Backup => "backup",
            Action::Reconcile => "reconcile",
        }
    }

    /// The button's words.
    pub fn label(self) -> &'static str {
        match self {
            Action::Rollback => "Roll back",
            Action::Release => "Release the hold",
            Action::Promote => "Promote the canary",
            Action::Abort => "Abort the rollout",
            Action::Backup => "Back up now",
            Action::Reconcile => "Reconcile now",
        }
    }

    /// What confirming does, in words.
    fn consequence(self, environment: &str, volume: &str) -> String {
        match self {
            Action::Rollback => format!(
                "Environment {environment} goes back to its previous release at once, and stays there (held, differing from Git) until the hold is released."
            ),
            Action::Release => {
                format!("Environment {environment} follows Git again: the next pass plans it from the commit in force.")
            }
            Action::Promote => format!("The canary of {environment} goes on to its next step now."),
            Action::Abort => format!("The rollout of {environment} stops and its previous release serves again."),
            Action::Backup => format!("A backup of volume {volume} of {environment} is queued now."),
            Action::Reconcile => "The control plane fetches Git and runs a pass now.".to_owned(),
        }
    }
}

/// An action's button: a link to its confirmation (buttons only for those who may act).
pub fn button(viewer: &Viewer, action: Action, environment: &str, volume: Option<&str>) -> Markup {
    if !viewer.acts() {
        return html! {};
    }
    let mut href = format!("/ui/confirm/{}?environment={}", action.as_str(), enc(environment));
    if let Some(v) = volume {
        href.push_str(&format!("&volume={}", enc(v)));
    }
    html! { a class="action" href=(href) { (action.label()) } }
}

/// A value in a URL's query or path.
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Deserialize)]
pub struct Target {
    #[serde(default)]
    environment: String,
    #[serde(default)]
    volume: String,
}

/// The action named, when the session's role may take it (operator or admin).
fn allowed(who: &Signed, name: &str) -> Result<Action, Box<Response>> {
    let Some(action) = Action::parse(name) else {
        return Err(Box::new(refusal_page(
            StatusCode::NOT_FOUND,
            "unknown-action",
            "no such action",
            Some(&who.viewer),
        )));
    };
    if !who.viewer.acts() {
        tracing::warn!(token = %who.viewer.name, action = action.as_str(), "web view: action refused for the role");
        return Err(Box::new(refusal_page(
            StatusCode::FORBIDDEN,
            "insufficient-role",
            "the token's role does not allow this",
            Some(&who.viewer),
        )));
    }
    Ok(action)
}

/// The confirmation page: what the action will do, and one button that posts it.
pub async fn confirm(State(ui): App, who: Signed, Path(action): Path<String>, Query(t): Query<Target>) -> Response {
    let action = match allowed(&who, &action) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let back = if t.environment.is_empty() {
        "/ui/".to_owned()
    } else {
        format!("/ui/environments/{}", enc(&t.environment))
    };
    let main = html! {
        h1 { (action.label()) "?" }
        p { (action.consequence(&t.environment, &t.volume)) }
        p { "It is recorded as an event naming " strong { (who.viewer.name) } "." }
        form method="post" action=(format!("/ui/actions/{}", action.as_str())) class="confirm" {
            input type="hidden" name="csrf" value=(who.viewer.csrf);
            input type="hidden" name="environment" value=(t.environment);
            input type="hidden" name="volume" value=(t.volume);
            button type="submit" id="confirm" { "Yes, " (action.label().to_lowercase()) }
            " "
            a href=(back) { "Cancel" }
        }
    };
    page_response(page(action.label(), Screen::Other, Some(&who.viewer), tip(&ui), main))
}

#[derive(Deserialize)]
pub struct Posted {
    csrf: String,
    #[serde(default)]
    environment: String,
    #[serde(default)]
    volume: String,
}

/// A confirmed action: checked (origin, CSRF, role) before anything is read, then the use case.
pub async fn act(
    State(ui): App,
    who: Signed,
    headers: HeaderMap,
    Path(action): Path<String>,
    Form(f): Form<Posted>,
) -> Response {
    if !same_origin(&headers) {
        return refusal_page(
            StatusCode::FORBIDDEN,
            "cross-site-request",
            "actions post only from the view itself",
            Some(&who.viewer),
        );
    }
    if !csrf_ok(&who, &f.csrf) {
        return bad_csrf(&who);
    }
    let action = match allowed(&who, &action) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let name = who.viewer.name.as_str();
    let done = run(&ui, name, action, &f).await;
    tracing::info!(token = %name, action = action.as_str(), environment = %f.environment, ok = done.is_ok(), "web view: action");
    match done {
        Ok(()) if f.environment.is_empty() => Redirect::to("/ui/").into_response(),
        Ok(()) => Redirect::to(&format!("/ui/environments/{}", enc(&f.environment))).into_response(),
        Err(e) => refused(&e, &who, &f.environment),
    }
}

/// The use case an action calls, as the API's route for it would.
async fn run(ui: &super::Ui, name: &str, action: Action, f: &Posted) -> crate::ops::Answer<()> {
    let environment = f.environment.clone();
    match action {
        Action::Rollback | Action::Release => {
            let release = action == Action::Release;
            let ask = RollbackAsk { environment, release };
            ui.ops.rollback(name, ask).await.map(|_| ())
        }
        Action::Promote | Action::Abort => {
            let action = if action == Action::Promote {
                RolloutAction::Promote
            } else {
                RolloutAction::Abort
            };
            ui.ops
                .rollout(name, RolloutAsk { environment, action })
                .await
                .map(|_| ())
        }
        Action::Backup => {
            let volume = f.volume.clone();
            let ask = RunBackup {
                environment,
                volume,
                verify: false,
            };
            ui.ops.run_backup(name, ask).await.map(|_| ())
        }
        Action::Reconcile => {
            ui.ops.reconcile_now();
            ui.ops
                .record_asked(
                    name,
                    "reconcile-asked",
                    "control-plane",
                    "a reconcile asked from the web view",
                )
                .await
        }
    }
}

/// A use case's refusal as a page naming the viewer, with the way back.
fn refused(e: &crate::ops::OpError, who: &Signed, env: &str) -> Response {
    let mut r = failed(e);
    if e.kind == crate::ops::Kind::Unavailable {
        return r;
    }
    let main = html! {
        h1 { "Refused" }
        p class="refusal" role="alert" { strong { (e.code) } ": " (e.message) }
        p { a href=(format!("/ui/environments/{}", enc(env))) { "Back to " (env) } }
    };
    *r.body_mut() = axum::body::Body::from(page("Refused", Screen::Other, Some(&who.viewer), 0, main).into_string());
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_in_links() {
        assert_eq!(enc("web-prod"), "web-prod");
        assert_eq!(enc("a b&c=\"<"), "a%20b%26c%3D%22%3C");
        for a in ["rollback", "release", "promote", "abort", "backup", "reconcile"] {
            assert_eq!(Action::parse(a).map(Action::as_str), Some(a));
        }
        assert_eq!(Action::parse("javascript:alert(1)"), None);
    }
}
