//! The operator API over TLS: status, revisions, deployments, jobs, events (JSON pages and a
//! Server-Sent Events stream that resumes from a cursor), `reconcile --now`, push webhooks,
//! and the unauthenticated probes `/healthz`, `/readyz` and `/metrics`.
//!
//! Every `/v1` route checks its bearer token and role first: a refused request reads and
//! writes nothing. Webhooks are checked with their forge's own signature instead.

use crate::auth::Tokens;
use crate::auth::{Denied, Forge, verify_webhook};
use crate::config::Config;
use crate::config::Role;
use crate::http::server::MAX_BODY_BYTES;
use crate::http::server::{authorize, authorized, internal, read_body, refuse, too_many};
use crate::http::streams::StreamSlots;
use crate::hub::{DURATION_BUCKETS, Hub};
use crate::store::{Ledger, now_ms};
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use zeroize::Zeroizing;

/// The most rows one page returns.
pub const MAX_PAGE: u32 = 1000;

/// The operator API's own state.
pub struct Operator {
    pub config: Arc<Config>,
    pub ledger: Arc<Ledger>,
    pub hub: Arc<Hub>,
    pub tokens: Arc<Tokens>,
    pub webhook_secrets: WebhookSecrets,
    /// Open event streams, by token and in total.
    pub streams: Arc<StreamSlots>,
}

impl Operator {
    /// Reads the webhook secrets (a missing file stops the start).
    pub fn new(
        config: Arc<Config>,
        ledger: Arc<Ledger>,
        hub: Arc<Hub>,
        tokens: Arc<Tokens>,
    ) -> Result<Operator, String> {
        Ok(Operator {
            webhook_secrets: WebhookSecrets::load(&config.webhooks)?,
            streams: StreamSlots::new(config.api.max_streams, config.api.max_streams_per_token),
            config,
            ledger,
            hub,
            tokens,
        })
    }
}

/// The shared secrets of the configured webhooks; `None` for a forge not configured.
#[derive(Default)]
pub struct WebhookSecrets {
    pub github: Option<Zeroizing<Vec<u8>>>,
    pub gitea: Option<Zeroizing<Vec<u8>>>,
    pub gitlab: Option<Zeroizing<Vec<u8>>>,
}

impl WebhookSecrets {
    fn load(c: &crate::config::WebhookConfig) -> Result<WebhookSecrets, String> {
        let read = |p: &Option<PathBuf>| -> Result<Option<Zeroizing<Vec<u8>>>, String> {
            let Some(p) = p else { return Ok(None) };
            let text = Zeroizing::new(crate::config::read_small(p).map_err(|e| format!("{}: {e}", p.display()))?);
            let secret = text.trim_end().as_bytes().to_vec();
            if secret.is_empty() {
                return Err(format!("{}: the webhook secret is empty", p.display()));
            }
            Ok(Some(Zeroizing::new(secret)))
        };
        Ok(WebhookSecrets {
            github: read(&c.github_secret_file)?,
            gitea: read(&c.gitea_secret_file)?,
            gitlab: read(&c.gitlab_token_file)?,
        })
    }
}

/// What every part of the daemon shares.
type App = State<Arc<Operator>>;

/// The operator API's own routes; the composition root merges enrolment's and `pl logs`'.
pub fn router(state: Arc<Operator>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status))
        .route("/v1/revisions", get(revisions))
        .route("/v1/deployments", get(deployments))
        .route("/v1/environments/{name}", get(environment))
        .route("/v1/jobs", get(jobs))
        .route("/v1/events", get(events))
        .route("/v1/events/stream", get(stream))
        .route("/v1/reconcile", post(reconcile))
        .route("/v1/rewrites", get(rewrites))
        .route("/v1/nodes", get(nodes))
        .route("/v1/nodes/{node}/mesh-key", post(rotate_mesh_key))
        .route("/v1/certificates", get(certificates))
        .route("/v1/domains", get(domains))
        .route("/v1/volumes", get(volumes))
        .route("/v1/backups", get(backups))
        .route("/v1/backups/run", post(run_backup))
        .route("/v1/restores", post(restore_volume))
        .route("/v1/volumes/remove", post(remove_volume))
        .route("/v1/volumes/move", post(move_volume))
        .route("/v1/rollbacks", post(rollback))
        .route("/v1/rollouts", post(rollout))
        .route("/v1/outbox", get(outbox))
        .route("/v1/fleet", get(fleet))
        .route("/v1/rewrites/approve", post(approve_rewrite))
        .route("/v1/webhooks/{forge}", post(webhook))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn readyz(State(s): App) -> Response {
    let ledger = s.ledger.ping().await.is_ok();
    let age = now_ms() - s.hub.last_tick_ms.load(Ordering::Relaxed);
    let ticked = age <= 30_000;
    let body = json!({"ledger": ledger, "loopTickedMsAgo": age, "leader": s.hub.leader.load(Ordering::Relaxed)});
    let code = if ledger && ticked {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body)).into_response()
}

/// The counts of the last pass (see [`Hub::refresh_counts`]); read once at start when no
/// pass has run yet.
async fn cached_counts(s: &Operator) -> Option<crate::store::views::Counts> {
    if let Some(c) = s.hub.counts.lock().ok().and_then(|c| c.clone()) {
        return Some(c);
    }
    s.hub.refresh_counts(&s.ledger, false).await;
    s.hub.counts.lock().ok().and_then(|c| c.clone())
}

/// Unauthenticated, so it serves the values of the last pass: a scrape (or a flood of them)
/// costs no query.
async fn metrics(State(s): App) -> Response {
    let Some(counts) = cached_counts(&s).await else {
        return internal("no counts yet");
    };
    let m = &s.hub.metrics;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP pushleft_reconcile_duration_seconds Time one reconcile pass took."
    );
    let _ = writeln!(out, "# TYPE pushleft_reconcile_duration_seconds histogram");
    for (i, b) in DURATION_BUCKETS.iter().enumerate() {
        let _ = writeln!(
            out,
            "pushleft_reconcile_duration_seconds_bucket{{le=\"{b}\"}} {}",
            m.buckets[i].load(Ordering::Relaxed)
        );
    }
    let ticks = m.ticks.load(Ordering::Relaxed);
    let _ = writeln!(out, "pushleft_reconcile_duration_seconds_bucket{{le=\"+Inf\"}} {ticks}");
    let sum = m.duration_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
    let _ = writeln!(out, "pushleft_reconcile_duration_seconds_sum {sum}");
    let _ = writeln!(out, "pushleft_reconcile_duration_seconds_count {ticks}");
    let _ = writeln!(
        out,
        "# HELP pushleft_reconcile_errors_total Passes that failed and were retried."
    );
    let _ = writeln!(out, "# TYPE pushleft_reconcile_errors_total counter");
    let _ = writeln!(
        out,
        "pushleft_reconcile_errors_total {}",
        m.tick_errors.load(Ordering::Relaxed)
    );
    let _ = writeln!(out, "# HELP pushleft_revisions_total Judged commits by verdict.");
    let _ = writeln!(out, "# TYPE pushleft_revisions_total counter");
    for v in ["accepted", "rejected"] {
        let n = counts.revisions.get(v).copied().unwrap_or(0);
        let _ = writeln!(out, "pushleft_revisions_total{{verdict=\"{v}\"}} {n}");
    }
    let _ = writeln!(out, "# HELP pushleft_jobs Jobs by state.");
    let _ = writeln!(out, "# TYPE pushleft_jobs gauge");
    for st in crate::store::rows::JobState::ALL.map(crate::store::rows::JobState::as_str) {
        let n = counts.jobs.get(st).copied().unwrap_or(0);
        let _ = writeln!(out, "pushleft_jobs{{state=\"{st}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP pushleft_queue_age_seconds Age of the oldest due job still queued."
    );
    let _ = writeln!(out, "# TYPE pushleft_queue_age_seconds gauge");
    let _ = writeln!(
        out,
        "pushleft_queue_age_seconds {}",
        counts.queue_age_ms as f64 / 1000.0
    );
    let certificates = s.hub.certificates.lock().map(|c| c.clone()).unwrap_or_default();
    if !certificates.is_empty() {
        let _ = writeln!(
            out,
            "# HELP pushleft_certificate_expiry_timestamp_seconds When each hostname's issued certificate expires (0: none issued yet)."
        );
        let _ = writeln!(out, "# TYPE pushleft_certificate_expiry_timestamp_seconds gauge");
        for (host, not_after, _) in &certificates {
            let _ = writeln!(
                out,
                "pushleft_certificate_expiry_timestamp_seconds{{hostname=\"{host}\"}} {}",
                not_after / 1000
            );
        }
        let _ = writeln!(
            out,
            "# HELP pushleft_certificate_failures Failed issuances of each hostname's certificate in a row."
        );
        let _ = writeln!(out, "# TYPE pushleft_certificate_failures gauge");
        for (host, _, failures) in &certificates {
            let _ = writeln!(out, "pushleft_certificate_failures{{hostname=\"{host}\"}} {failures}");
        }
    }
    let backups = s.hub.backups.lock().map(|b| b.clone()).unwrap_or_default();
    if !backups.is_empty() {
        let _ = writeln!(
            out,
            "# HELP pushleft_backup_last_success_age_seconds Seconds since each volume's newest successful backup ended (+Inf: none succeeded yet)."
        );
        let _ = writeln!(out, "# TYPE pushleft_backup_last_success_age_seconds gauge");
        let now = now_ms();
        for b in &backups {
            let age = b
                .last_success_at
                .map_or("+Inf".to_owned(), |at| format!("{}", (now - at).max(0) as f64 / 1000.0));
            let _ = writeln!(
                out,
                "pushleft_backup_last_success_age_seconds{{environment=\"{}\",volume=\"{}\"}} {age}",
                b.environment, b.volume
            );
        }
        let _ = writeln!(
            out,
            "# HELP pushleft_backup_failures Failed backups of each volume since its newest success."
        );
        let _ = writeln!(out, "# TYPE pushleft_backup_failures gauge");
        for b in &backups {
            let _ = writeln!(
                out,
                "pushleft_backup_failures{{environment=\"{}\",volume=\"{}\"}} {}",
                b.environment, b.volume, b.failures_since
            );
        }
    }
    let links = s.hub.mesh_links.lock().map(|l| l.clone()).unwrap_or_default();
    if !links.is_empty() {
        let _ = writeln!(
            out,
            "# HELP pushleft_mesh_link_up Whether each mesh link (node to peer) handshook within WireGuard's session limit (1), or has not yet or no longer (0)."
        );
        let _ = writeln!(out, "# TYPE pushleft_mesh_link_up gauge");
        for (node, peer, state) in &links {
            let _ = writeln!(
                out,
                "pushleft_mesh_link_up{{node=\"{node}\",peer=\"{peer}\"}} {}",
                u8::from(*state == "up")
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP pushleft_leader Whether this daemon reconciles (1) or stands by (0)."
    );
    let _ = writeln!(out, "# TYPE pushleft_leader gauge");
    let _ = writeln!(
        out,
        "pushleft_leader {}",
        u8::from(s.hub.leader.load(Ordering::Relaxed))
    );
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

async fn status(State(s): App, headers: HeaderMap) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Viewer) {
        return r;
    }
    // An authenticated status is read live: an operator waiting on a rollout wants now.
    let counts = match s.ledger.counts(now_ms()).await {
        Ok(c) => c,
        Err(e) => return internal(e),
    };
    let branch = &s.config.source.branch;
    let (accepted, judged) = match (s.ledger.last_accepted(branch).await, s.ledger.last_judged(branch).await) {
        (Ok(a), Ok(j)) => (a, j),
        (Err(e), _) | (_, Err(e)) => return internal(e),
    };
    // The mesh: how many links agents report, and each judged down (`reconcile::mesh_health`).
    let meshes = match s.ledger.meshes().await {
        Ok(m) => m,
        Err(e) => return internal(e),
    };
    let links: usize = meshes
        .values()
        .map(|m| serde_json::from_str::<Vec<serde_json::Value>>(&m.links).map_or(0, |l| l.len()))
        .sum();
    let down: Vec<serde_json::Value> = meshes
        .values()
        .flat_map(|m| {
            serde_json::from_str::<Vec<String>>(&m.down)
                .unwrap_or_default()
                .into_iter()
                .map(|peer| json!({"node": m.node, "peer": peer}))
        })
        .collect();
    axum::Json(json!({
        "mesh": {"links": links, "down": down},
        "leader": s.hub.leader.load(Ordering::Relaxed),
        "lastPassMsAgo": now_ms() - s.hub.last_tick_ms.load(Ordering::Relaxed),
        "branch": branch,
        "inForce": accepted,
        "lastJudged": judged,
        "counts": counts,
    }))
    .into_response()
}

/// Every list is a page: `limit` rows at most (1,000), and `next` is the cursor of the next
/// page (`before` for lists newest first, `after` for deployments by name), or null at the end.
#[derive(Deserialize)]
struct ListQuery {
    branch: Option<String>,
    state: Option<String>,
    environment: Option<String>,
    before: Option<i64>,
    after: Option<String>,
    limit: Option<u32>,
}

fn limit(q: &ListQuery, default: u32) -> u32 {
    q.limit.unwrap_or(default).clamp(1, MAX_PAGE)
}

/// A page of rows under `key`, with the cursor of the next page when this one is full.
fn page<T: serde::Serialize, C: serde::Serialize>(
    key: &str,
    rows: &[T],
    limit: u32,
    next: impl Fn(&T) -> C,
) -> Response {
    let next = (rows.len() == limit as usize).then(|| rows.last().map(&next)).flatten();
    axum::Json(json!({ key: rows, "next": next })).into_response()
}

async fn revisions(State(s): App, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Viewer) {
        return r;
    }
    let n = limit(&q, 50);
    match s.ledger.revisions(q.branch.as_deref(), q.before, n).await {
        Ok(rows) => page("revisions", &rows, n, |r| r.id),
        Err(e) => internal(e),
    }
}

async fn deployments(State(s): App, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    let n = limit(&q, 100);
    crate::http::environments::page((&s.ledger, &s.tokens), &headers, q.after.as_deref(), n).await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WaitQuery {
    wait_ms: Option<u64>,
}

async fn environment(
    State(s): App,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Response {
    crate::http::environments::get((&s.ledger, &s.tokens, &s.hub), &headers, &name, q.wait_ms).await
}

async fn jobs(State(s): App, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Viewer) {
        return r;
    }
    let n = limit(&q, 100);
    match s
        .ledger
        .jobs(q.state.as_deref(), q.environment.as_deref(), q.before, n)
        .await
    {
        Ok(rows) => page("jobs", &rows, n, |j| j.id),
        Err(e) => internal(e),
    }
}

/// Every declared node: pool, lifecycle state, capacity, last heartbeat, agent version,
/// replicas placed.
async fn nodes(State(s): App, headers: HeaderMap) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Viewer) {
        return r;
    }
    let rows = match s.ledger.nodes(&s.config.source.branch, now_ms()).await {
        Ok(rows) => rows,
        Err(e) => return internal(e),
    };
    // Each node's mesh as its agent said it: the generation decided and the one applied, and
    // each peer's last handshake (what is true on the node, not what was asked).
    let meshes = match s.ledger.meshes().await {
        Ok(m) => m,
        Err(e) => return internal(e),
    };
    let nodes: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            if let (Some(m), Some(o)) = (meshes.get(&r.name), v.as_object_mut()) {
                let links: serde_json::Value = serde_json::from_str(&m.links).unwrap_or_else(|_| json!([]));
                let down: serde_json::Value = serde_json::from_str(&m.down).unwrap_or_else(|_| json!([]));
                o.insert(
                    "mesh".into(),
                    json!({"generation": m.generation, "applied": m.applied, "links": links, "down": down}),
                );
            }
            v
        })
        .collect();
    axum::Json(json!({ "nodes": nodes })).into_response()
}

/// A new mesh key pair for a node (`http::mesh`).
async fn rotate_mesh_key(
    State(s): App,
    headers: HeaderMap,
    axum::extract::Path(node): axum::extract::Path<String>,
) -> Response {
    crate::http::mesh::rotate_key(&s.ledger, &s.hub, &s.tokens, &headers, &node).await
}

/// Custom domains (`http::domains`).
async fn domains(State(s): App, headers: HeaderMap) -> Response {
    crate::http::domains::list(&s.ledger, &s.tokens, &headers).await
}

async fn volumes(State(s): App, headers: HeaderMap) -> Response {
    crate::http::volumes::list(&s.ledger, &s.tokens, &headers).await
}

async fn backups(State(s): App, headers: HeaderMap, Query(q): Query<crate::http::backups::BackupsQuery>) -> Response {
    crate::http::backups::list(&s.ledger, &s.tokens, &headers, q).await
}

async fn run_backup(State(s): App, headers: HeaderMap, body: axum::body::Body) -> Response {
    crate::http::backups::run(&s.ledger, &s.hub, &s.tokens, &headers, body).await
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct OutboxQuery {
    state: Option<String>,
    limit: Option<i64>,
}

/// `GET /v1/outbox?state=pending|delivered|dead&limit=N` (viewer): outgoing notifications,
/// newest first; `dead` ones are the dead letters, with their last error.
async fn outbox(State(s): App, headers: HeaderMap, Query(q): Query<OutboxQuery>) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Viewer) {
        return r;
    }
    if q.state
        .as_deref()
        .is_some_and(|st| !["pending", "delivered", "dead"].contains(&st))
    {
        let body = json!({"code": "malformed-request", "message": "state is pending, delivered or dead"});
        return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    }
    match s.ledger.outbox(q.state.as_deref(), q.limit.unwrap_or(100)).await {
        Ok(rows) => axum::Json(serde_json::json!({"outbox": rows})).into_response(),
        Err(e) => internal(e),
    }
}

async fn rollback(State(s): App, headers: HeaderMap, body: axum::body::Body) -> Response {
    crate::http::rollbacks::ask(&s.ledger, &s.hub, &s.tokens, &headers, body).await
}

async fn rollout(State(s): App, headers: HeaderMap, body: axum::body::Body) -> Response {
    crate::http::rollbacks::rollout(&s.ledger, &s.hub, &s.tokens, &headers, body).await
}

async fn restore_volume(State(s): App, headers: HeaderMap, body: axum::body::Body) -> Response {
    crate::http::backups::restore(&s.ledger, &s.hub, &s.tokens, &headers, body).await
}

async fn remove_volume(State(s): App, headers: HeaderMap, body: axum::body::Body) -> Response {
    crate::http::volumes::remove(&s.ledger, &s.hub, &s.tokens, &headers, body).await
}

async fn move_volume(State(s): App, headers: HeaderMap, body: axum::body::Body) -> Response {
    let branch = &s.config.source.branch;
    crate::http::volumes::move_volume(&s.ledger, &s.hub, &s.tokens, &headers, body, branch).await
}

/// The certificates the control plane issued, by hostname: state, validity, renewal and
/// failures (never a key, nor the chain). States: `valid`, `renewal-failing` (valid, its
/// renewal failing), `expired`, `pending` (none issued yet), `failing` (none issued, and
/// failing).
async fn certificates(State(s): App, headers: HeaderMap) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Viewer) {
        return r;
    }
    let now = now_ms();
    match s.ledger.certificates().await {
        Ok(rows) => {
            let list: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| {
                    let state = match (r.chain.is_some(), r.failures > 0) {
                        (true, _) if now > r.not_after => "expired",
                        (true, false) => "valid",
                        (true, true) => "renewal-failing",
                        (false, false) => "pending",
                        (false, true) => "failing",
                    };
                    json!({
                        "hostname": r.hostname,
                        "issuer": r.issuer,
                        "state": state,
                        "notBeforeMs": r.not_before,
                        "notAfterMs": r.not_after,
                        "renewAfterMs": r.renew_after,
                        "issued": r.issued,
                        "failures": r.failures,
                        "retryAtMs": r.retry_at,
                        "lastError": r.last_error,
                    })
                })
                .collect();
            axum::Json(json!({ "certificates": list })).into_response()
        }
        Err(e) => internal(e),
    }
}

/// The most running deployments `/v1/fleet` answers with: at about 3 KiB of JSON each, 32 MiB,
/// half of what `pl` reads.
pub const MAX_FLEET_DEPLOYMENTS: usize = 10_000;

/// The live fleet as re-placement sees it now (`state_schema::replacement::Snapshot`): what
/// `pl plan --fleet` decides the same re-placements on.
async fn fleet(State(s): App, headers: HeaderMap) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Viewer) {
        return r;
    }
    match s.ledger.fleet_snapshot(now_ms()).await {
        Ok(snapshot) if snapshot.running.len() > MAX_FLEET_DEPLOYMENTS => (
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            axum::Json(json!({
                "code": "fleet-too-large",
                "message": format!(
                    "{} running deployments; /v1/fleet answers with at most {MAX_FLEET_DEPLOYMENTS}",
                    snapshot.running.len()
                ),
            })),
        )
            .into_response(),
        Ok(snapshot) => axum::Json(snapshot).into_response(),
        Err(e) => internal(e),
    }
}

/// Heads of the applied branch refused as rewrites, newest first.
async fn rewrites(State(s): App, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Viewer) {
        return r;
    }
    match s.ledger.rewrites(limit(&q, 50)).await {
        Ok(rows) => axum::Json(json!({ "rewrites": rows })).into_response(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveRewrite {
    branch: String,
    sha: String,
}

/// Approves one refused rewrite (admin): recorded as an event naming the token.
async fn approve_rewrite(State(s): App, headers: HeaderMap, body: axum::body::Body) -> Response {
    let name = match authorized(&s.tokens, &headers, Role::Admin) {
        Ok(n) => n.to_owned(),
        Err(d) => return refuse(d),
    };
    let body = match read_body(body, 4096).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let Ok(req) = serde_json::from_slice::<ApproveRewrite>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"code": "malformed-request", "message": "expected {\"branch\": …, \"sha\": …}"})),
        )
            .into_response();
    };
    match s.ledger.approve_rewrite(&req.branch, &req.sha, &name, now_ms()).await {
        Ok(crate::store::rewrites::Approval::Approved) => {
            tracing::warn!(branch = %req.branch, sha = %req.sha, token = %name, "history rewrite approved");
            s.hub.hint.notify_one();
            (StatusCode::OK, axum::Json(json!({"approved": true}))).into_response()
        }
        Ok(crate::store::rewrites::Approval::AlreadyApproved) => {
            (StatusCode::OK, axum::Json(json!({"approved": true, "already": true}))).into_response()
        }
        Ok(crate::store::rewrites::Approval::NotPending) => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"code": "rewrite-not-pending", "message": "that head of that branch was not refused as a rewrite"})),
        )
            .into_response(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize)]
struct EventsQuery {
    after: Option<i64>,
    limit: Option<u32>,
}

async fn events(State(s): App, headers: HeaderMap, Query(q): Query<EventsQuery>) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Viewer) {
        return r;
    }
    let after = q.after.unwrap_or(0);
    match s.ledger.events_after(after, q.limit.unwrap_or(100).min(MAX_PAGE)).await {
        Ok(rows) => {
            let next = rows.last().map_or(after, |e| e.id);
            let rows: Vec<_> = rows.iter().map(event_json).collect();
            axum::Json(json!({ "events": rows, "next": next })).into_response()
        }
        Err(e) => internal(e),
    }
}

fn event_json(e: &crate::store::Event) -> serde_json::Value {
    json!({"id": e.id, "atMs": e.at_ms, "kind": e.kind, "subject": e.subject, "detail": e.detail})
}

/// Server-Sent Events from a cursor (`?after=N`, or the `Last-Event-ID` a reconnecting client
/// sends). Each event's `id` is its cursor, so a client resumes exactly where it stopped.
/// A stream reads the ledger only when the event watcher says there is something past its
/// cursor; streams are limited per token and in total (`429 too-many-streams`).
async fn stream(State(s): App, headers: HeaderMap, Query(q): Query<EventsQuery>) -> Response {
    let token = match authorized(&s.tokens, &headers, Role::Viewer) {
        Ok(name) => name.to_owned(),
        Err(d) => return refuse(d),
    };
    let Some(slot) = s.streams.acquire(&token) else {
        return too_many(
            "too-many-streams",
            "this token (or the daemon) has as many event streams open as it may; close one",
        );
    };
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok());
    let cursor = resume.or(q.after).unwrap_or(0);
    let tip = s.hub.events_tip.subscribe();
    let state = (
        s,
        cursor,
        std::collections::VecDeque::<crate::store::Event>::new(),
        tip,
        slot,
    );
    let events = futures_util::stream::unfold(state, |(s, mut cursor, mut buf, mut tip, slot)| async move {
        loop {
            if let Some(e) = buf.pop_front() {
                cursor = e.id;
                let ev = SseEvent::default()
                    .id(e.id.to_string())
                    .event(e.kind.clone())
                    .data(event_json(&e).to_string());
                return Some((Ok::<_, std::convert::Infallible>(ev), (s, cursor, buf, tip, slot)));
            }
            if *tip.borrow_and_update() > cursor
                && let Ok(rows) = s.ledger.events_after(cursor, 500).await
                && !rows.is_empty()
            {
                buf.extend(rows);
                continue;
            }
            // Nothing past the cursor: wait for the watcher (a closed channel ends the stream).
            if tip.changed().await.is_err() {
                return None;
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

async fn reconcile(State(s): App, headers: HeaderMap) -> Response {
    if let Some(r) = authorize(&s.tokens, &headers, Role::Operator) {
        return r;
    }
    let before = s.hub.passes.load(Ordering::Relaxed);
    s.hub.fetch_hint.notify_one();
    s.hub.hint.notify_one();
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"leader": s.hub.leader.load(Ordering::Relaxed), "passesBefore": before})),
    )
        .into_response()
}

/// A push webhook. An unknown or unconfigured forge, or a request without its signature
/// header, is answered before a byte of the body is read.
async fn webhook(State(s): App, Path(forge): Path<String>, headers: HeaderMap, body: axum::body::Body) -> Response {
    let w = &s.webhook_secrets;
    let (forge, secret, header) = match forge.as_str() {
        "github" => (Forge::GitHub, &w.github, "x-hub-signature-256"),
        "gitea" => (Forge::Gitea, &w.gitea, "x-gitea-signature"),
        "gitlab" => (Forge::GitLab, &w.gitlab, "x-gitlab-token"),
        _ => return refuse(Denied::WebhookNotConfigured),
    };
    let Some(secret) = secret else {
        return refuse(Denied::WebhookNotConfigured);
    };
    let value = headers.get(header).and_then(|v| v.to_str().ok());
    if value.is_none() {
        return refuse(Denied::BadSignature);
    }
    let body = match read_body(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    if let Err(d) = verify_webhook(forge, secret, value, &body) {
        tracing::warn!(forge = ?forge, code = d.code(), "webhook refused");
        return refuse(d);
    }
    tracing::info!(forge = ?forge, "webhook: fetching now");
    s.hub.fetch_hint.notify_one();
    s.hub.hint.notify_one();
    (StatusCode::ACCEPTED, axum::Json(json!({"accepted": true}))).into_response()
}
