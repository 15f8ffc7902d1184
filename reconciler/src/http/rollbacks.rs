//! `POST /v1/rollbacks` (operator): `{"environment": E}` asks for E's rollback to its previous
//! release (`202` with the generations: from, to, and the rollback's own), which holds E there
//! until an accepted commit changes it; `{"environment": E, "release": true}` ends the hold
//! (`202`; the next pass plans E from Git). Refusals are `409` with a stable code
//! (`no-previous-release`, `rollback-held`, `environment-torn-down`, `not-held`) or `404`
//! (`unknown-environment`). The caller follows the deployment in `/v1/deployments`.
//!
//! `POST /v1/rollouts` (operator): `{"environment": E, "action": "promote"}` makes E's canary
//! go on past its pause (`202` with the generation and the step that runs now; `409`
//! `not-in-progress` or `not-paused`); `{"environment": E, "action": "abort"}` stops E's
//! rollout in progress and takes the previous release back, held as a rollback (`202` as
//! above; `409` `not-in-progress`, or a rollback's refusals).

use crate::http::server::{internal, small_request};
use crate::store::rollbacks::Refusal;
use crate::store::rollouts::PromoteRefusal;
use crate::store::{Ledger, now_ms};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use state_schema::generations::RollbackRefusal;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Ask {
    environment: String,
    #[serde(default)]
    release: bool,
}

fn refused(env: &str, why: &Refusal) -> Response {
    let (status, message) = match why {
        Refusal::UnknownEnvironment => (StatusCode::NOT_FOUND, format!("no deployment of {env}")),
        Refusal::NotHeld => (StatusCode::CONFLICT, format!("no rollback holds {env}")),
        Refusal::MovedOn => (StatusCode::CONFLICT, format!("{env} moved on to another generation")),
        Refusal::NotInProgress => (
            StatusCode::CONFLICT,
            format!("no rollout of {env} is in progress: nothing to abort (`pl rollback {env}` goes back a release)"),
        ),
        Refusal::Rollback(RollbackRefusal::NoPrevious) => (
            StatusCode::CONFLICT,
            format!(
                "{env} has no previous release to go back to (no finished generation with another release before this one)"
            ),
        ),
        Refusal::Rollback(RollbackRefusal::AlreadyHeld) => (
            StatusCode::CONFLICT,
            format!("a rollback holds {env} already; release it first (`pl rollback --release {env}`)"),
        ),
        Refusal::Rollback(RollbackRefusal::TornDown) => (
            StatusCode::CONFLICT,
            format!("{env} is torn down: nothing to roll back"),
        ),
    };
    (status, axum::Json(json!({"code": why.code(), "message": message}))).into_response()
}

pub async fn ask(
    ledger: &Ledger,
    hub: &crate::hub::Hub,
    tokens: &crate::auth::Tokens,
    headers: &axum::http::HeaderMap,
    body: axum::body::Body,
) -> Response {
    let (who, req) = match small_request::<Ask>(
        tokens,
        headers,
        crate::config::Role::Operator,
        body,
        1024,
        "{\"environment\": …, \"release\"?: true}",
    )
    .await
    {
        Ok(r) => r,
        Err(r) => return r,
    };
    let env = &req.environment;
    if req.release {
        return match ledger.release_rollback(env, &who, now_ms()).await {
            Ok(Ok(hold)) => {
                tracing::info!(by = %who, environment = %env, generation = hold.generation, "rollback hold released");
                hub.wrote.notify_waiters();
                hub.hint.notify_one();
                (
                    StatusCode::ACCEPTED,
                    axum::Json(json!({"environment": env, "released": true})),
                )
                    .into_response()
            }
            Ok(Err(why)) => refused(env, &why),
            Err(e) => internal(e),
        };
    }
    match ledger.ask_rollback(env, &who, now_ms()).await {
        Ok(Ok(a)) => {
            tracing::info!(by = %who, environment = %env, from = a.from, to = a.to, generation = a.generation, "rollback asked for");
            hub.wrote.notify_waiters();
            hub.hint.notify_one();
            let body = json!({"environment": env, "from": a.from, "to": a.to, "generation": a.generation});
            (StatusCode::ACCEPTED, axum::Json(body)).into_response()
        }
        Ok(Err(why)) => refused(env, &why),
        Err(e) => internal(e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
enum RolloutAction {
    Promote,
    Abort,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RolloutAsk {
    environment: String,
    action: RolloutAction,
}

/// `POST /v1/rollouts`: a canary promoted or a rollout aborted.
pub async fn rollout(
    ledger: &Ledger,
    hub: &crate::hub::Hub,
    tokens: &crate::auth::Tokens,
    headers: &axum::http::HeaderMap,
    body: axum::body::Body,
) -> Response {
    let (who, req) = match small_request::<RolloutAsk>(
        tokens,
        headers,
        crate::config::Role::Operator,
        body,
        1024,
        "{\"environment\": …, \"action\": \"promote\" | \"abort\"}",
    )
    .await
    {
        Ok(r) => r,
        Err(r) => return r,
    };
    let env = &req.environment;
    match req.action {
        RolloutAction::Promote => match ledger.promote(env, &who, now_ms()).await {
            Ok(Ok(p)) => {
                tracing::info!(by = %who, environment = %env, generation = p.generation, step = p.step, "canary promoted");
                hub.jobs.notify_waiters();
                hub.hint.notify_one();
                let body = json!({"environment": env, "generation": p.generation, "step": p.step});
                (StatusCode::ACCEPTED, axum::Json(body)).into_response()
            }
            Ok(Err(why)) => {
                let (status, message) = match why {
                    PromoteRefusal::UnknownEnvironment => (StatusCode::NOT_FOUND, format!("no deployment of {env}")),
                    PromoteRefusal::NotInProgress => (
                        StatusCode::CONFLICT,
                        format!("no rollout of {env} is in progress: nothing to promote"),
                    ),
                    PromoteRefusal::NotPaused => (
                        StatusCode::CONFLICT,
                        format!(
                            "{env}'s rollout is running a step, not pausing; promote when `pl status` shows its canary paused"
                        ),
                    ),
                };
                (status, axum::Json(json!({"code": why.code(), "message": message}))).into_response()
            }
            Err(e) => internal(e),
        },
        RolloutAction::Abort => match ledger.abort_rollout(env, &who, now_ms()).await {
            Ok(Ok(a)) => {
                tracing::info!(by = %who, environment = %env, from = a.from, to = a.to, generation = a.generation, "rollout aborted");
                hub.wrote.notify_waiters();
                hub.hint.notify_one();
                let body = json!({"environment": env, "from": a.from, "to": a.to, "generation": a.generation});
                (StatusCode::ACCEPTED, axum::Json(body)).into_response()
            }
            Ok(Err(why)) => refused(env, &why),
            Err(e) => internal(e),
        },
    }
}
