//! `GET /v1/volumes` (viewer): every volume with its node, generation, retention, what its
//! agent last measured and its last move. `POST /v1/volumes/remove` (admin): removes a
//! released volume now, answering only once its node removed it (or with why not). `POST
//! /v1/volumes/move` (admin): asks for a volume to move to another node (`store::moves`),
//! answering `202` once it is queued or why not before anything changed; the caller follows
//! the volume's row (`movingTo`, then `movedUpAtMs`).

use crate::http::server::{authorize, internal, small_request};
use crate::store::kept::{KeptRefusal, KeptRow};
use crate::store::moves::MoveRefusal;
use crate::store::volumes::{VolumeRefusal, VolumeRow};
use crate::store::{Ledger, now_ms};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::time::Duration;

/// How long a removal waits for the node.
pub const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

fn view(r: &VolumeRow, kept: &[KeptRow]) -> serde_json::Value {
    let kept: Vec<serde_json::Value> = kept
        .iter()
        .filter(|k| k.environment == r.environment && k.volume == r.volume)
        .map(|k| json!({"generation": k.generation, "node": k.node, "keptAtMs": k.kept_at}))
        .collect();
    let state = match r.released_at {
        None => "in-use",
        Some(_) => "retained",
    };
    json!({
        "environment": r.environment,
        "volume": r.volume,
        "role": r.role,
        "node": r.node,
        "generation": r.generation,
        "state": state,
        "sizeBytes": r.size_bytes,
        "usedBytes": r.bytes,
        "measuredAtMs": (r.measured_at > 0).then_some(r.measured_at),
        "createdAtMs": r.created_at,
        "releasedAtMs": r.released_at,
        "removeAfterMs": r.released_at.map(|t| t + r.retain_days * 86_400_000),
        "movingTo": r.moving_to,
        "moveAskedAtMs": r.move_asked_at,
        "movedFrom": r.moved_from,
        "movedUpAtMs": r.moved_up_at,
        "moveFailure": r.move_failure,
        "kept": kept,
    })
}

pub async fn list(ledger: &Ledger, tokens: &crate::auth::Tokens, headers: &axum::http::HeaderMap) -> Response {
    if let Some(r) = authorize(tokens, headers, crate::config::Role::Viewer) {
        return r;
    }
    let (rows, kept) = match (ledger.volumes().await, ledger.kept_generations().await) {
        (Ok(r), Ok(k)) => (r, k),
        (Err(e), _) | (_, Err(e)) => return internal(e),
    };
    axum::Json(json!({"volumes": rows.iter().map(|r| view(r, &kept)).collect::<Vec<_>>()})).into_response()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Remove {
    environment: String,
    volume: String,
    /// One kept generation rather than the whole released volume.
    generation: Option<i64>,
}

fn refused(status: StatusCode, code: &str, message: String) -> Response {
    (status, axum::Json(json!({"code": code, "message": message}))).into_response()
}

pub async fn remove(
    ledger: &Ledger,
    hub: &crate::hub::Hub,
    tokens: &crate::auth::Tokens,
    headers: &axum::http::HeaderMap,
    body: axum::body::Body,
) -> Response {
    let (who, req) = match small_request::<Remove>(
        tokens,
        headers,
        crate::config::Role::Admin,
        body,
        1024,
        "{\"environment\": …, \"volume\": …, \"generation\"?: …}",
    )
    .await
    {
        Ok(r) => r,
        Err(r) => return r,
    };
    if let Some(generation) = req.generation {
        return remove_kept(ledger, hub, &who, &req.environment, &req.volume, generation).await;
    }
    let row = match ledger.expire_volume(&req.environment, &req.volume, now_ms()).await {
        Err(e) => return internal(e),
        Ok(Err(VolumeRefusal::Unknown)) => {
            return refused(
                StatusCode::NOT_FOUND,
                "volume-unknown",
                format!("no volume {} in {}", req.volume, req.environment),
            );
        }
        Ok(Err(VolumeRefusal::InUse)) => {
            return refused(
                StatusCode::CONFLICT,
                "volume-in-use",
                format!(
                    "{} runs and mounts {}: a volume is removed only after its environment is torn down",
                    req.environment, req.volume
                ),
            );
        }
        Ok(Ok(row)) => row,
    };
    tracing::warn!(environment = %row.environment, volume = %row.volume, token = %who, "volume removal asked");
    let Some(task) = row.removal() else {
        return internal("a volume row whose names do not parse");
    };
    let detail = match removed_on_node(ledger, hub, task, &row.node).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    match ledger.forget_volume(&row, now_ms()).await {
        Ok(_) => axum::Json(json!({"removed": true, "node": row.node, "detail": detail})).into_response(),
        Err(e) => internal(e),
    }
}

/// Queues a removal on `node` and waits (at most [`REMOVE_TIMEOUT`]) until the node did it:
/// the job's detail, or the answer that says why not. Success only once the node removed it:
/// the answer is what the host did.
async fn removed_on_node(
    ledger: &Ledger,
    hub: &crate::hub::Hub,
    task: state_schema::task::Task,
    node: &str,
) -> Result<Option<String>, Response> {
    let keys = ledger
        .enqueue_tasks(&[(task, node.to_owned())], now_ms())
        .await
        .map_err(internal)?;
    hub.jobs.notify_waiters();
    let deadline = tokio::time::Instant::now() + REMOVE_TIMEOUT;
    loop {
        match ledger.job_outcomes(&keys).await.map_err(internal)?.into_iter().next() {
            Some(o) if o.state == "succeeded" => return Ok(o.detail),
            Some(o) if matches!(o.state.as_str(), "failed" | "dead" | "cancelled") => {
                return Err(refused(
                    StatusCode::BAD_GATEWAY,
                    "volume-remove-failed",
                    format!("node {node}: {}", o.detail.unwrap_or(o.state)),
                ));
            }
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(refused(
                StatusCode::GATEWAY_TIMEOUT,
                "volume-remove-pending",
                format!(
                    "node {node} has not removed it within {} s; the removal stays queued",
                    REMOVE_TIMEOUT.as_secs()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Move {
    environment: String,
    volume: String,
    to: String,
}

pub async fn move_volume(
    ledger: &Ledger,
    hub: &crate::hub::Hub,
    tokens: &crate::auth::Tokens,
    headers: &axum::http::HeaderMap,
    body: axum::body::Body,
    branch: &str,
) -> Response {
    let (who, req) = match small_request::<Move>(
        tokens,
        headers,
        crate::config::Role::Admin,
        body,
        1024,
        "{\"environment\": …, \"volume\": …, \"to\": …}",
    )
    .await
    {
        Ok(r) => r,
        Err(r) => return r,
    };
    let now = now_ms();
    let fleet = match ledger.applied_pools(branch).await {
        Ok(pools) => match ledger.fleet_view(&pools, now).await {
            Ok(f) => f,
            Err(e) => return internal(e),
        },
        Err(e) => return internal(e),
    };
    let (env, volume, to) = (&req.environment, &req.volume, &req.to);
    let why = match ledger.move_volume(env, volume, to, &fleet, now).await {
        Err(e) => return internal(e),
        Ok(Ok(m)) => {
            tracing::warn!(by = %who, environment = %env, volume = %volume, from = %m.from, to = %m.to, job = %m.job, "volume move asked");
            hub.jobs.notify_waiters();
            let body = json!({"job": m.job, "role": m.role, "from": m.from, "to": m.to, "askedAtMs": m.asked_at});
            return (StatusCode::ACCEPTED, axum::Json(body)).into_response();
        }
        Ok(Err(why)) => why,
    };
    let (status, message) = match &why {
        MoveRefusal::Unknown => (StatusCode::NOT_FOUND, format!("no volume {volume} in {env}")),
        MoveRefusal::Released => (
            StatusCode::CONFLICT,
            format!("{env} was torn down: its volume {volume} is kept where it is until its retention ends"),
        ),
        MoveRefusal::Moving(what) => (
            StatusCode::CONFLICT,
            format!("{env}/{volume} has a move or a backup under way ({what}): follow it with `pl volumes`"),
        ),
        MoveRefusal::AlreadyThere => (StatusCode::CONFLICT, format!("{env}/{volume} is on {to} already")),
        MoveRefusal::NoBackup => (
            StatusCode::CONFLICT,
            format!(
                "no finished rollout of {env} backs up {volume}: a move carries the data through the volume's backup repository, so give the volume a `backup` and the environment `backups` (a repository both nodes reach)"
            ),
        ),
        MoveRefusal::SharedRole(other) => (
            StatusCode::CONFLICT,
            format!(
                "{volume}'s role also mounts {other}: a role's volumes live on one node, and a move takes one volume"
            ),
        ),
        MoveRefusal::SourceSilent(node) => (
            StatusCode::CONFLICT,
            format!(
                "{node}, which holds {env}/{volume}, has not been heard from lately: nothing could stop and save it (restore a backup with `pl restore` once it is back)"
            ),
        ),
        MoveRefusal::Unplaceable(reason) => (
            StatusCode::CONFLICT,
            format!(
                "{env}'s role would not run on {to} ({reason}): it must be active in Git, in the environment's pool, heard from lately and have room for the role"
            ),
        ),
    };
    refused(status, why.code(), message)
}

/// Removes a kept generation of a volume (one a restore or a move left behind) from its node,
/// answering once the node did.
async fn remove_kept(
    ledger: &Ledger,
    hub: &crate::hub::Hub,
    who: &str,
    environment: &str,
    volume: &str,
    generation: i64,
) -> Response {
    let row = match ledger.kept_generation(environment, volume, generation).await {
        Err(e) => return internal(e),
        Ok(Err(KeptRefusal::Unknown)) => {
            return refused(
                StatusCode::NOT_FOUND,
                "volume-generation-unknown",
                format!("{environment}/{volume} keeps no generation {generation} (`pl volumes` lists the kept ones)"),
            );
        }
        Ok(Err(KeptRefusal::Current)) => {
            return refused(
                StatusCode::CONFLICT,
                "volume-generation-current",
                format!(
                    "generation {generation} is {environment}/{volume}'s current one, which its role mounts: remove the volume once its environment is torn down"
                ),
            );
        }
        Ok(Ok(row)) => row,
    };
    tracing::warn!(environment = %environment, volume = %volume, generation, node = %row.node, token = %who, "kept generation removal asked");
    let Some(task) = row.removal() else {
        return internal("a kept generation whose names do not parse");
    };
    let detail = match removed_on_node(ledger, hub, task, &row.node).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    match ledger.forget_generation(&row, now_ms()).await {
        Ok(_) => axum::Json(json!({"removed": true, "node": row.node, "generation": generation, "detail": detail}))
            .into_response(),
        Err(e) => internal(e),
    }
}
