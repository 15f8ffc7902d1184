//! The operator API over TLS: status, revisions, deployments, jobs, events (JSON pages and a
//! Server-Sent Events stream that resumes from a cursor), `reconcile --now`, push webhooks,
//! and the unauthenticated probes `/healthz`, `/readyz` and `/metrics`.
//!
//! Every `/v1` route checks its bearer token and role first: a refused request reads and
//! writes nothing. Webhooks are checked with their forge's own signature instead.

use crate::auth::{Denied, Forge, verify_webhook};
use crate::config::Role;
use crate::daemon::{DURATION_BUCKETS, Shared, now_ms};
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

/// The largest request body accepted (webhooks are the only bodies).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The most rows one page returns.
pub const MAX_PAGE: u32 = 1000;

type App = State<Arc<Shared>>;

fn refuse(d: Denied) -> Response {
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
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    s.tokens.authorize(header, needs).err().map(refuse)
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

async fn metrics(State(s): App) -> Response {
    let counts = match s.ledger.counts(now_ms()).await {
        Ok(c) => c,
        Err(e) => return internal(e),
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

#[derive(Deserialize)]
struct ListQuery {
    branch: Option<String>,
    state: Option<String>,
    environment: Option<String>,
    limit: Option<u32>,
}

async fn revisions(State(s): App, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
        return r;
    }
    match s
        .ledger
        .revisions(q.branch.as_deref(), q.limit.unwrap_or(50).min(MAX_PAGE))
        .await
    {
        Ok(rows) => axum::Json(json!({ "revisions": rows })).into_response(),
        Err(e) => internal(e),
    }
}

async fn deployments(State(s): App, headers: HeaderMap) -> Response {
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
        return r;
    }
    match s.ledger.deployments().await {
        Ok(rows) => axum::Json(json!({ "deployments": rows })).into_response(),
        Err(e) => internal(e),
    }
}

async fn jobs(State(s): App, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
        return r;
    }
    match s
        .ledger
        .jobs(
            q.state.as_deref(),
            q.environment.as_deref(),
            q.limit.unwrap_or(100).min(MAX_PAGE),
        )
        .await
    {
        Ok(rows) => axum::Json(json!({ "jobs": rows })).into_response(),
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

fn event_json(e: &crate::ledger::Event) -> serde_json::Value {
    json!({"id": e.id, "atMs": e.at_ms, "kind": e.kind, "subject": e.subject, "detail": e.detail})
}

/// Server-Sent Events from a cursor (`?after=N`, or the `Last-Event-ID` a reconnecting client
/// sends). Each event's `id` is its cursor, so a client resumes exactly where it stopped.
async fn stream(State(s): App, headers: HeaderMap, Query(q): Query<EventsQuery>) -> Response {
    if let Some(r) = authorize(&s, &headers, Role::Viewer) {
        return r;
    }
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok());
    let cursor = resume.or(q.after).unwrap_or(0);
    let state = (s, cursor, std::collections::VecDeque::<crate::ledger::Event>::new());
    let events = futures_util::stream::unfold(state, |(s, mut cursor, mut buf)| async move {
        loop {
            if let Some(e) = buf.pop_front() {
                cursor = e.id;
                let ev = SseEvent::default()
                    .id(e.id.to_string())
                    .event(e.kind.clone())
                    .data(event_json(&e).to_string());
                return Some((Ok::<_, std::convert::Infallible>(ev), (s, cursor, buf)));
            }
            match s.ledger.events_after(cursor, 500).await {
                Ok(rows) if !rows.is_empty() => buf.extend(rows),
                _ => {
                    // Another daemon (the leader) may write too: poll as well as wait.
                    tokio::select! {
                        _ = s.wrote.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    }
                }
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

async fn webhook(State(s): App, Path(forge): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
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
    if let Err(d) = verify_webhook(forge, secret, value, &body) {
        tracing::warn!(forge = ?forge, code = d.code(), "webhook refused");
        return refuse(d);
    }
    tracing::info!(forge = ?forge, "webhook: fetching now");
    s.fetch_hint.notify_one();
    s.hint.notify_one();
    (StatusCode::ACCEPTED, axum::Json(json!({"accepted": true}))).into_response()
}

/// Loads the API's TLS certificate chain and key (PEM).
pub fn tls_config(cert: &std::path::Path, key: &std::path::Path) -> Result<rustls::ServerConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| e.to_string())
}

/// Serves the API over TLS on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: rustls::ServerConfig,
    app: Router,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(t)) => t,
                _ => {
                    tracing::debug!(%peer, "TLS handshake failed");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
        });
    }
}
