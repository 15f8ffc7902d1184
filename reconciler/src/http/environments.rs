//! Deployments on the typed wire (`operator_proto`): `GET /v1/deployments` (a page) and `GET
//! /v1/environments/{name}` (one environment, with a long poll), mapped from the store's rows
//! here and nowhere else.
//!
//! Why a resource of its own: `pl`'s followers (`wait`, `up`, `rollback`, `rollout`) watch
//! one environment or a few; reading the whole list for each look made the daemon's work grow
//! with every environment of the fleet. `waitMs` with `If-None-Match` (the `ETag` of what the
//! follower saw last) answers as soon as the environment changes, or with `304` when the wait
//! ends first: one request per change instead of one every 100 ms.

use crate::http::server::{authorize, internal};
use crate::store::views::DeploymentRow;
use crate::store::{Ledger, now_ms};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use operator_proto::{Action, Canary, Deployment, DeploymentStatus, ErrorBody, Hold, MAX_WAIT_MS, Waiting};
use std::time::Duration;

/// How often a waiting request looks at its environment again when nothing woke it (running
/// counts come from heartbeats, which write no event).
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// A store row on the wire; an action or status the wire does not know is the ledger's
/// corruption, said as such.
pub fn deployment(r: DeploymentRow) -> Result<Deployment, String> {
    let action = match r.action.as_str() {
        "rollout" => Action::Rollout,
        "teardown" => Action::Teardown,
        other => return Err(format!("a deployment row's action is {other:?}")),
    };
    let status = match r.status.as_str() {
        "in-progress" => DeploymentStatus::InProgress,
        "done" => DeploymentStatus::Done,
        "failed" => DeploymentStatus::Failed,
        other => return Err(format!("a deployment row's status is {other:?}")),
    };
    Ok(Deployment {
        environment: r.environment,
        branch: r.branch,
        generation: r.generation,
        action,
        status,
        step: r.step,
        updated_at_ms: r.updated_at_ms,
        asked: Some(r.asked),
        replicas: r.replicas,
        running: r.running,
        stale: r.stale,
        previous_generation: r.previous_generation,
        waiting: r
            .waiting
            .into_iter()
            .map(|w| Waiting {
                role: w.role.to_string(),
                index: w.index,
                reason: w.reason,
            })
            .collect(),
        hold: r.hold.map(|h| Hold {
            by: h.by,
            at_ms: h.at_ms,
            from: h.from,
            to: h.to,
            generation: h.generation,
            git_hash: h.git_hash,
            released: h.released,
        }),
        canary: r.canary.map(|c| Canary {
            weight: c.weight,
            waits_for_promote: c.waits_for_promote,
            next_at_ms: c.next_at_ms,
        }),
    })
}

/// The tag of what a follower saw: a hash of the JSON it was sent.
fn tag(body: &[u8]) -> String {
    use sha2::Digest;
    format!("\"{}\"", &hex::encode(sha2::Sha256::digest(body))[..32])
}

/// One environment's deployment now, as JSON, or why not.
async fn current(ledger: &Ledger, environment: &str) -> Result<Option<Vec<u8>>, String> {
    let Some(row) = ledger
        .deployment(environment, now_ms())
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let wire = deployment(row)?;
    serde_json::to_vec(&wire).map(Some).map_err(|e| e.to_string())
}

fn unknown(environment: &str) -> Response {
    let body = ErrorBody {
        code: "environment-unknown".into(),
        message: format!("no deployment of environment {environment} (see `pl status`)"),
    };
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

/// `GET /v1/environments/{name}` (viewer): the environment's deployment. With `waitMs` (at most
/// [`MAX_WAIT_MS`]) and `If-None-Match`, it waits while the deployment is what the tag says,
/// and answers `304 Not Modified` when the wait ends first.
pub async fn get(
    (ledger, tokens, hub): (&Ledger, &crate::auth::Tokens, &crate::hub::Hub),
    headers: &HeaderMap,
    environment: &str,
    wait_ms: Option<u64>,
) -> Response {
    if let Some(r) = authorize(tokens, headers, crate::config::Role::Viewer) {
        return r;
    }
    let seen = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
    let mut tip = hub.events_tip.subscribe();
    loop {
        let body = match current(ledger, environment).await {
            Ok(Some(b)) => b,
            Ok(None) => return unknown(environment),
            Err(e) => return internal(e),
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

/// `GET /v1/deployments` (viewer): a page of deployments by environment name.
pub async fn page(
    (ledger, tokens): (&Ledger, &crate::auth::Tokens),
    headers: &HeaderMap,
    after: Option<&str>,
    limit: u32,
) -> Response {
    if let Some(r) = authorize(tokens, headers, crate::config::Role::Viewer) {
        return r;
    }
    let rows = match ledger.deployments(after, limit, now_ms()).await {
        Ok(rows) => rows,
        Err(e) => return internal(e),
    };
    let full = rows.len() == limit as usize;
    let deployments = match rows.into_iter().map(deployment).collect::<Result<Vec<_>, _>>() {
        Ok(d) => d,
        Err(e) => return internal(e),
    };
    let next = full
        .then(|| deployments.last().map(|d| d.environment.clone()))
        .flatten();
    axum::Json(operator_proto::DeploymentsPage { deployments, next }).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rollbacks::Hold as RowHold;
    use crate::store::views::CanaryView;

    fn row() -> DeploymentRow {
        DeploymentRow {
            environment: "api-production".into(),
            branch: "main".into(),
            generation: 4,
            action: "rollout".into(),
            status: "in-progress".into(),
            step: 3,
            updated_at_ms: 1_796_000_000_000,
            asked: 3,
            replicas: 2,
            running: 1,
            stale: 1,
            previous_generation: 3,
            waiting: vec![state_schema::placement::Waiting {
                role: state_schema::values::Name::new("web").expect("name"),
                index: 2,
                reason: "no-capacity".into(),
            }],
            hold: Some(RowHold {
                by: "ops".into(),
                at_ms: 1_796_000_000_001,
                from: 4,
                to: 3,
                generation: 5,
                git_hash: "abc".into(),
                released: false,
            }),
            canary: Some(CanaryView {
                weight: 10,
                waits_for_promote: true,
                next_at_ms: None,
            }),
        }
    }

    #[test]
    fn the_typed_wire_is_the_documented_json_field_for_field() {
        // The store's row was the wire before the types moved to `operator_proto`: the same
        // bytes, in the same order, with and without the optional parts.
        let mut r = row();
        for _ in 0..2 {
            let before = serde_json::to_string(&r).expect("row json");
            let typed = serde_json::to_string(&deployment(r.clone()).expect("typed")).expect("typed json");
            assert_eq!(typed, before);
            // And back: what `pl` reads is what was sent.
            let back: Deployment = serde_json::from_str(&typed).expect("reads back");
            assert_eq!(back, deployment(r.clone()).expect("typed"));
            (r.hold, r.canary, r.waiting) = (None, None, Vec::new());
        }
    }

    #[test]
    fn an_unknown_status_is_the_ledger_s_corruption_not_a_guess() {
        let mut r = row();
        r.status = "paused".into();
        assert!(deployment(r).is_err_and(|e| e.contains("paused")));
    }
}
