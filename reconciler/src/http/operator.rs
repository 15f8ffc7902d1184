//! The operator API over TLS: status, revisions, deployments, jobs, events (JSON pages and a
//! Server-Sent Events stream that resumes from a cursor), `reconcile --now`, push webhooks,
//! and the unauthenticated probes `/healthz`, `/readyz` and `/metrics`.
//!
//! Every `/v1` route checks its bearer token and role first: a refused request reads and
//! writes nothing. Webhooks are checked with their forge's own signature instead.

use crate::auth::{Denied, Forge, verify_webhook};
use crate::config::Role;
use crate::reconcile::{DURATION_BUCKETS, Shared, now_ms};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The largest request body accepted (webhooks are the only large bodies).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The most rows one page returns.
pub const MAX_PAGE: u32 = 1000;
/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's headers (and to start the next request on
/// a kept-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

type App = State<Arc<Shared>>;

pub(crate) fn refuse(d: Denied) -> Response {
    let status = match d {
        Denied::BadToken | Denied::BadSignature => StatusCode::UNAUTHORIZED,
        Denied::InsufficientRole => StatusCode::FORBIDDEN,
        Denied::WebhookNotConfigured => StatusCode::NOT_FOUND,
    };
    (status, axum::Json(json!({"code": d.code(), "message": d.message()}))).into_response()
}

fn internal(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "request failed");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({"code": "ledger-unavailable", "message": "the ledger did not answer; try again"})),
    )
        .into_response()
}

/// The refusal to send, if the request's token may not do what `needs` asks.
fn authorize(s: &Shared, headers: &HeaderMap, needs: Role) -> Option<Response> {
    authorized(s, headers, needs).err().map(refuse)
}

/// The name of the request's token, when it may do what `needs` asks.
pub(crate) fn authorized<'s>(s: &'s Shared, headers: &HeaderMap, needs: Role) -> Result<&'s str, Denied> {
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    s.tokens.authorize(header, needs)
}

pub(crate) fn too_many(code: &str, message: &str) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        axum::Json(json!({"code": code, "message": message})),
    )
        .into_response()
}

/// Why a request body was not read.
pub(crate) enum BodyError {
    TooLarge(usize),
    Timeout,
}

impl IntoResponse for BodyError {
    fn into_response(self) -> Response {
        match self {
            BodyError::TooLarge(limit) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                axum::Json(
                    json!({"code": "body-too-large", "message": format!("the body is larger than {limit} bytes")}),
                ),
            )
                .into_response(),
            BodyError::Timeout => (
                StatusCode::REQUEST_TIMEOUT,
                axum::Json(json!({"code": "body-timeout", "message": "the body did not arrive in time"})),
            )
                .into_response(),
        }
    }
}

/// Reads a request body up to `limit` bytes within [`BODY_TIMEOUT`].
pub(crate) async fn read_body(body: axum::body::Body, limit: usize) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(BodyError::TooLarge(limit)),
        Err(_) => Err(BodyError::Timeout),
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status))
        .route("/v1/revisions", get(revisions))
        .route("/v1/deployments", get(deployments))
        .route("/v1/jobs", get(jobs))
        .route("/v1/events", get(events))
        .route("/v1/events/stream", get(stream))
        .route("/v1/reconcile", post(reconcile))
        .route("/v1/rewrites", get(rewrites))
        .route("/v1/nodes", get(nodes))
        .route("/v1/logs", get(crate::http::logs::logs))
        .route("/v1/rewrites/approve", post(approve_rewrite))
        .route("/v1/nodes/{node}/token", post(crate::http::enrolment::token))
        .route("/v1/enroll", post(crate::http::enrolment::enroll))
        .route("/v1/ca", get(crate::http::enrolment::ca))
        .route("/v1/webhooks/{forge}", post(webhook))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(shared)
}

async fn readyz(State(s): App) -> Response {
    let ledger = s.ledger.ping().await.is_ok();
    let age = now_ms() - s.last_tick_ms.load(Ordering::Relaxed);
    let ticked = age <= 30_000;
    let body = json!({"ledger": ledger, "loopTickedMsAgo": age, "leader": s.leader.load(Ordering::Relaxed)});
    let code = if ledger && ticked {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body)).into_response()
}

/// The counts of the last pass (see [`Shared::refresh_counts`]); read once at start when no
/// pass has run yet.
async fn cached_counts(s: &Shared) -> Option<crate::store::views::Counts> {
    if let Some(c) = s.counts.lock().ok().and_then(|c| c.clone()) {
        return Some(c);
    }
    s.refresh_counts(false).await;
    s.counts.lock().ok().and_then(|c| c.clone())
}

/// Unauthenticated, so it serves the values of the last pass: a scrape (or a flood of them)
/// costs no query.
async fn metrics(State(s): App) -> Response {
    let Some(counts) = cached_counts(&s).await else {
        return internal("no counts yet");
    };
    let m = &s.metrics;
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
    for st in ["queued", "leased", "succeeded", "failed", "dead", "cancelled"] {
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
    let _ = writeln!(
        out,
        "# HELP pushleft_leader Whether this daemon reconciles (1) or stands by (0)."
    );
    let _ = writeln!(out, "# TYPE pushleft_leader gauge");
    let _ = writeln!(out, "pushleft_leader {}", u8::from(s.leader.load(Ordering::Relaxed)));
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

async fn status(State(s): App, headers: HeaderMap) -> Response {
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
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
    axum::Json(json!({
        "leader": s.leader.load(Ordering::Relaxed),
        "lastPassMsAgo": now_ms() - s.last_tick_ms.load(Ordering::Relaxed),
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
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
        return r;
    }
    let n = limit(&q, 50);
    match s.ledger.revisions(q.branch.as_deref(), q.before, n).await {
        Ok(rows) => page("revisions", &rows, n, |r| r.id),
        Err(e) => internal(e),
    }
}

async fn deployments(State(s): App, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
        return r;
    }
    let n = limit(&q, 100);
    match s.ledger.deployments(q.after.as_deref(), n, now_ms()).await {
        Ok(rows) => page("deployments", &rows, n, |d| d.environment.clone()),
        Err(e) => internal(e),
    }
}

async fn jobs(State(s): App, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
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
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
        return r;
    }
    match s.ledger.nodes(&s.config.source.branch, now_ms()).await {
        Ok(rows) => axum::Json(json!({ "nodes": rows })).into_response(),
        Err(e) => internal(e),
    }
}

/// Heads of the applied branch refused as rewrites, newest first.
async fn rewrites(State(s): App, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
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
    let name = match authorized(&s, &headers, Role::Admin) {
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
            s.hint.notify_one();
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
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
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
    let token = match authorized(&s, &headers, Role::Viewer) {
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
    let tip = s.events_tip.subscribe();
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
    if let Some(r) = authorize(&s, &headers, Role::Operator) {
        return r;
    }
    let before = s.passes.load(Ordering::Relaxed);
    s.fetch_hint.notify_one();
    s.hint.notify_one();
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"leader": s.leader.load(Ordering::Relaxed), "passesBefore": before})),
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
    s.fetch_hint.notify_one();
    s.hint.notify_one();
    (StatusCode::ACCEPTED, axum::Json(json!({"accepted": true}))).into_response()
}

/// The fingerprint (SHA-256 of the DER, hex) of the client certificate a connection presented.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCert(pub String);

/// Loads the API's TLS certificate chain and key (PEM).
pub fn tls_config(cert: &std::path::Path, key: &std::path::Path) -> Result<rustls::ServerConfig, String> {
    tls_config_with(cert, key, &[])
}

/// The agent API's TLS: a client certificate signed by the control CA (`client_ca`) is
/// required to finish the handshake.
pub fn tls_config_with(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_cas: &[&std::path::Path],
) -> Result<rustls::ServerConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if client_cas.is_empty() {
        builder.with_no_client_auth()
    } else {
        {
            let mut roots = rustls::RootCertStore::empty();
            for ca in client_cas {
                for c in CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))? {
                    roots
                        .add(c.map_err(|e| format!("{}: {e}", ca.display()))?)
                        .map_err(|e| format!("{}: {e}", ca.display()))?;
                }
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| e.to_string())?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder.with_single_cert(certs, key).map_err(|e| e.to_string())
}

/// Serves the API over TLS on `listener` until `shutdown` turns true, at most
/// `max_connections` at once: past that a new connection is closed as soon as it is
/// accepted, so held-open sockets cannot exhaust the daemon's file descriptors. Each
/// connection gets [`HANDSHAKE_TIMEOUT`] for TLS and [`HEADER_TIMEOUT`] for each request's
/// headers.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: rustls::ServerConfig,
    app: Router,
    max_connections: usize,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off a little; connections in progress finish
                    // or time out and free descriptors.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, "connection limit reached; closing");
            drop(tcp);
            continue;
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(t)) => t,
                _ => {
                    tracing::debug!(%peer, "TLS handshake failed or timed out");
                    return;
                }
            };
            // The client certificate (the agent API requires one): its SHA-256, for handlers to
            // look the node up by.
            let peer_cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| PeerCert(agent_proto::cert_fingerprint(c.as_ref())));
            let app = app.layer(axum::Extension(peer_cert));
            let service = hyper_util::service::TowerToHyperService::new(app);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(64 * 1024)
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
        });
    }
}
