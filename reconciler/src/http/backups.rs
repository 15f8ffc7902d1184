//! `GET /v1/backups?environment=E[&volume=V][&limit=N]` (viewer): an environment's ended
//! backups and restore drills, newest first, as their agents reported them, and when each
//! volume's restore was last proven. `POST /v1/backups/run` (operator): queues a backup of a
//! volume now (or, with `"verify": true`, a restore drill of its newest snapshot) and answers
//! its job key (`202`); the caller follows it in the listing, where its row appears once the
//! node reported how it ended. `POST
//! /v1/restores` (admin): queues a restore of a snapshot into the volume's next generation
//! (`202` with the job and the generation); the caller follows the volume's generation and the
//! environment's rollout onto it.

use crate::http::server::{authorize, internal, small_request};
use crate::store::backups::{BackupRefusal, BackupRow};
use crate::store::{Ledger, now_ms};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Rows a listing answers unless asked for fewer.
pub const DEFAULT_LISTED: i64 = 50;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupsQuery {
    pub environment: String,
    pub volume: Option<String>,
    pub limit: Option<i64>,
}

fn view(r: &BackupRow) -> serde_json::Value {
    json!({
        "environment": r.environment,
        "volume": r.volume,
        "generation": r.generation,
        "node": r.node,
        "job": r.job_key,
        "finishedAtMs": r.finished_at,
        "status": r.status,
        "snapshot": r.snapshot,
        "bytes": r.bytes,
        "dataAdded": r.data_added,
        "reason": r.reason,
    })
}

fn refused(status: StatusCode, code: &str, message: String) -> Response {
    (status, axum::Json(json!({"code": code, "message": message}))).into_response()
}

pub async fn list(
    ledger: &Ledger,
    tokens: &crate::auth::Tokens,
    headers: &axum::http::HeaderMap,
    q: BackupsQuery,
) -> Response {
    if let Some(r) = authorize(tokens, headers, crate::config::Role::Viewer) {
        return r;
    }
    let limit = q.limit.unwrap_or(DEFAULT_LISTED);
    if !(1..=crate::store::backups::MAX_LISTED).contains(&limit) {
        return refused(
            StatusCode::BAD_REQUEST,
            "malformed-request",
            format!("limit must be 1 to {}", crate::store::backups::MAX_LISTED),
        );
    }
    let proven = match ledger.proven(&q.environment).await {
        Ok(p) => p,
        Err(e) => return internal(e),
    };
    let proven: Vec<serde_json::Value> = proven
        .into_iter()
        .filter(|(v, _, _)| q.volume.as_ref().is_none_or(|want| want == v))
        .map(|(volume, at, snapshot)| json!({"volume": volume, "atMs": at, "snapshot": snapshot}))
        .collect();
    match ledger.backups(&q.environment, q.volume.as_deref(), limit).await {
        Ok(rows) => {
            axum::Json(json!({"backups": rows.iter().map(view).collect::<Vec<_>>(), "proven": proven})).into_response()
        }
        Err(e) => internal(e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Run {
    environment: String,
    volume: String,
    /// A restore drill of the newest snapshot rather than a backup.
    #[serde(default)]
    verify: bool,
}

pub async fn run(
    ledger: &Ledger,
    hub: &crate::hub::Hub,
    tokens: &crate::auth::Tokens,
    headers: &axum::http::HeaderMap,
    body: axum::body::Body,
) -> Response {
    let (who, req) = match small_request::<Run>(
        tokens,
        headers,
        crate::config::Role::Operator,
        body,
        1024,
        "{\"environment\": …, \"volume\": …, \"verify\"?: true}",
    )
    .await
    {
        Ok(r) => r,
        Err(r) => return r,
    };
    let (env, volume) = (&req.environment, &req.volume);
    let asked = if req.verify {
        ledger.verify_now(env, volume, now_ms()).await
    } else {
        ledger.backup_now(env, volume, now_ms()).await
    };
    match asked {
        Ok(Ok(key)) => {
            tracing::info!(by = %who, environment = %env, volume = %volume, job = %key, verify = req.verify, "backup asked for");
            hub.jobs.notify_waiters();
            (StatusCode::ACCEPTED, axum::Json(json!({"job": key}))).into_response()
        }
        Ok(Err(BackupRefusal::NoPlan)) if req.verify => refused(
            StatusCode::NOT_FOUND,
            "verify-not-planned",
            format!(
                "no live deployment of {env} verifies the backups of a volume {volume} (a volume's `backup.verify`)"
            ),
        ),
        Ok(Err(BackupRefusal::NoSnapshot)) if req.verify => refused(
            StatusCode::NOT_FOUND,
            "snapshot-unknown",
            format!("no succeeded backup of {env}/{volume} to verify yet"),
        ),
        Ok(Err(why)) => refusal(env, volume, why),
        Err(e) => internal(e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Restore {
    environment: String,
    volume: String,
    snapshot: Option<String>,
}

pub async fn restore(
    ledger: &Ledger,
    hub: &crate::hub::Hub,
    tokens: &crate::auth::Tokens,
    headers: &axum::http::HeaderMap,
    body: axum::body::Body,
) -> Response {
    let (who, req) = match small_request::<Restore>(
        tokens,
        headers,
        crate::config::Role::Admin,
        body,
        1024,
        "{\"environment\": …, \"volume\": …, \"snapshot\"?: …}",
    )
    .await
    {
        Ok(r) => r,
        Err(r) => return r,
    };
    let (env, volume) = (&req.environment, &req.volume);
    match ledger.restore_now(env, volume, req.snapshot.as_deref(), now_ms()).await {
        Ok(Ok(r)) => {
            tracing::info!(by = %who, environment = %env, volume = %volume, job = %r.job, to = r.to, snapshot = %r.snapshot, "restore asked for");
            hub.jobs.notify_waiters();
            let body = json!({"job": r.job, "generation": r.to, "snapshot": r.snapshot, "node": r.node});
            (StatusCode::ACCEPTED, axum::Json(body)).into_response()
        }
        Ok(Err(why)) => refusal(env, volume, why),
        Err(e) => internal(e),
    }
}

fn refusal(env: &str, volume: &str, why: BackupRefusal) -> Response {
    match why {
        BackupRefusal::NoPlan => refused(
            StatusCode::NOT_FOUND,
            "backup-not-planned",
            format!(
                "no live deployment of {env} backs up a volume {volume} (a volume's `backup` and the environment's `backups`)"
            ),
        ),
        BackupRefusal::NotPlaced => refused(
            StatusCode::CONFLICT,
            "volume-not-placed",
            format!("{env}'s volume {volume} was not made on any node yet"),
        ),
        BackupRefusal::Going(key) => refused(
            StatusCode::CONFLICT,
            "backup-going",
            format!("{env}/{volume} has one going: {key}"),
        ),
        BackupRefusal::Dump => refused(
            StatusCode::CONFLICT,
            "restore-of-a-dump",
            format!(
                "{env}/{volume}'s backups are its command's output (a dump to load into the running role), not its files, and its `backup` names no `restore` command to load one: add one (`restore: [pg_restore, --clean, --if-exists, -d, app]`)"
            ),
        ),
        BackupRefusal::Moving(to) => refused(
            StatusCode::CONFLICT,
            "volume-moving",
            format!("{env}/{volume} is moving to {to}: ask again once the move ended (`pl volumes`)"),
        ),
        BackupRefusal::NoSnapshot => refused(
            StatusCode::NOT_FOUND,
            "snapshot-unknown",
            format!(
                "no succeeded backup of {env}/{volume} saved that snapshot (or there is none to restore, or the id is not 8-64 lowercase hex digits): `pl backups {env} {volume}` lists the snapshots that can be restored"
            ),
        ),
    }
}
