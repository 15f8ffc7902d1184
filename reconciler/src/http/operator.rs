//! The operator API over TLS: one thin handler per route, each taking its caller (the bearer
//! token's role, checked from the request's head before anything is read), its parameters or
//! its small JSON body, calling the use case in `ops` and writing its typed answer. Events come
//! as JSON pages and as a Server-Sent Events stream that resumes from a cursor; push webhooks
//! are checked with their forge's own signature instead of a token.
//!
//! Every `/v1` route checks its token and role first: a refused request reads and writes
//! nothing.

use crate::auth::Tokens;
use crate::auth::{Denied, Forge, verify_webhook};
use crate::config::Config;
use crate::http::metrics::openapi;
use crate::http::server::MAX_BODY_BYTES;
use crate::http::server::{
    Admins, Ask, Caller, HasTokens, Operators, Params, Viewers, answer, read_body, refuse, reply, too_many,
};
use crate::http::streams::StreamSlots;
use crate::hub::Hub;
use crate::ops::Ops;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use operator_proto::backups::{BackupsQuery, Restore, RunBackup};
use operator_proto::events::Event;
use operator_proto::images::CollectImages;
use operator_proto::revisions::ApproveRewrite;
use operator_proto::rollbacks::{RollbackAsk, RolloutAsk};
use operator_proto::status::WebhookAccepted;
use operator_proto::ui::{SignInLink, SignedOut};
use operator_proto::volumes::{MoveVolume, RemoveVolume};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

/// The most rows one page returns.
pub const MAX_PAGE: u32 = operator_proto::MAX_PAGE;

/// The operator API's own state.
pub struct Operator {
    pub config: Arc<Config>,
    pub ops: Arc<Ops>,
    pub hub: Arc<Hub>,
    pub tokens: Arc<Tokens>,
    pub webhook_secrets: WebhookSecrets,
    /// Open event streams, by token and in total.
    pub streams: Arc<StreamSlots>,
}

impl Operator {
    /// Reads the webhook secrets (a missing file stops the start).
    pub fn new(config: Arc<Config>, ops: Arc<Ops>, hub: Arc<Hub>, tokens: Arc<Tokens>) -> Result<Operator, String> {
        Ok(Operator {
            webhook_secrets: WebhookSecrets::load(&config.webhooks)?,
            streams: StreamSlots::new(config.api.max_streams, config.api.max_streams_per_token),
            config,
            ops,
            hub,
            tokens,
        })
    }
}

/// Where [`Caller`] finds the tokens.
impl HasTokens for Arc<Operator> {
    fn tokens(&self) -> &Tokens {
        &self.tokens
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

/// What every handler shares.
type App = State<Arc<Operator>>;

/// The operator API's own routes; the composition root merges enrolment's and `pl logs`'.
pub fn router(state: Arc<Operator>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/status", get(status))
        .route("/v1/revisions", get(revisions))
        .route("/v1/deployments", get(deployments))
        .route("/v1/environments/{name}", get(environment))
        .route("/v1/environments/{name}/provenance", get(provenance))
        .route("/v1/jobs", get(jobs))
        .route("/v1/events", get(events))
        .route("/v1/events/stream", get(stream))
        .route("/v1/reconcile", post(reconcile))
        .route("/v1/rewrites", get(rewrites))
        .route("/v1/nodes", get(nodes))
        .route("/v1/nodes/{node}/token", post(node_token))
        .route("/v1/nodes/{node}/mesh-key", post(rotate_mesh_key))
        .route("/v1/certificates", get(certificates))
        .route("/v1/domains", get(domains))
        .route("/v1/volumes", get(volumes))
        .route("/v1/backups", get(backups))
        .route("/v1/backups/run", post(run_backup))
        .route("/v1/restores", post(restore))
        .route("/v1/volumes/remove", post(remove_volume))
        .route("/v1/volumes/move", post(move_volume))
        .route("/v1/rollbacks", post(rollback))
        .route("/v1/rollouts", post(rollout))
        .route("/v1/outbox", get(outbox))
        .route("/v1/fleet", get(fleet))
        .route("/v1/images/gc", post(collect_images))
        .route("/v1/rewrites/approve", post(approve_rewrite))
        .route("/v1/ui/sign-in-link", post(sign_in_link))
        .route("/v1/ui/sign-out-everywhere", post(sign_out_everywhere))
        .route("/v1/webhooks/{forge}", post(webhook))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
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

const OK: StatusCode = StatusCode::OK;

async fn readyz(State(s): App) -> Response {
    crate::http::metrics::readyz(&s.ops, &s.hub).await
}

/// Unauthenticated: the values of the last pass, so a scrape costs no query.
async fn metrics(State(s): App) -> Response {
    crate::http::metrics::metrics(&s.ops, &s.hub).await
}
const ASKED: StatusCode = StatusCode::ACCEPTED;

async fn status(State(s): App, _: Caller<Viewers>) -> Response {
    reply(OK, s.ops.status().await)
}

async fn revisions(State(s): App, _: Caller<Viewers>, Params(q): Params<ListQuery>) -> Response {
    reply(OK, s.ops.revisions(q.branch.as_deref(), q.before, limit(&q, 50)).await)
}

async fn deployments(State(s): App, _: Caller<Viewers>, Params(q): Params<ListQuery>) -> Response {
    reply(OK, s.ops.deployments(q.after.as_deref(), limit(&q, 100)).await)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WaitQuery {
    wait_ms: Option<u64>,
}

async fn environment(
    State(s): App,
    _: Caller<Viewers>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Params(q): Params<WaitQuery>,
) -> Response {
    crate::http::environments::get((&s.ops, &s.hub), &headers, &name, q.wait_ms).await
}

/// Each running replica's image, its signer as the node verified, and the signed commit that
/// put it there.
async fn provenance(State(s): App, _: Caller<Viewers>, Path(name): Path<String>) -> Response {
    reply(OK, s.ops.provenance(&name).await)
}

async fn jobs(State(s): App, _: Caller<Viewers>, Params(q): Params<ListQuery>) -> Response {
    let n = limit(&q, 100);
    reply(
        OK,
        s.ops
            .jobs(q.state.as_deref(), q.environment.as_deref(), q.before, n)
            .await,
    )
}

/// Every declared node: pool, lifecycle state, capacity, last heartbeat, agent version,
/// replicas placed, and its mesh as its agent said it.
async fn nodes(State(s): App, _: Caller<Viewers>, Params(q): Params<ListQuery>) -> Response {
    reply(OK, s.ops.nodes(q.after.as_deref(), limit(&q, 500)).await)
}

async fn node_token(State(s): App, who: Caller<Operators>, Path(node): Path<String>) -> Response {
    reply(OK, s.ops.node_token(&who.name, &node).await)
}

async fn rotate_mesh_key(State(s): App, who: Caller<Operators>, Path(node): Path<String>) -> Response {
    reply(OK, s.ops.rotate_mesh_key(&who.name, &node).await)
}

async fn domains(State(s): App, _: Caller<Viewers>) -> Response {
    reply(OK, s.ops.domains().await)
}

async fn volumes(State(s): App, _: Caller<Viewers>) -> Response {
    reply(OK, s.ops.volumes().await)
}

async fn backups(State(s): App, _: Caller<Viewers>, Params(q): Params<BackupsQuery>) -> Response {
    reply(OK, s.ops.backups(q).await)
}

async fn run_backup(State(s): App, who: Caller<Operators>, Ask(ask): Ask<RunBackup>) -> Response {
    reply(ASKED, s.ops.run_backup(&who.name, ask).await)
}

async fn restore(State(s): App, who: Caller<Admins>, Ask(ask): Ask<Restore>) -> Response {
    reply(ASKED, s.ops.restore(&who.name, ask).await)
}

async fn remove_volume(State(s): App, who: Caller<Admins>, Ask(ask): Ask<RemoveVolume>) -> Response {
    reply(OK, s.ops.remove_volume(&who.name, ask).await)
}

async fn move_volume(State(s): App, who: Caller<Admins>, Ask(ask): Ask<MoveVolume>) -> Response {
    reply(ASKED, s.ops.move_volume(&who.name, ask).await)
}

/// The image store's unreferenced blobs, listed (and removed when asked).
async fn collect_images(State(s): App, who: Caller<Admins>, Ask(ask): Ask<CollectImages>) -> Response {
    reply(OK, s.ops.collect_images(&who.name, ask).await)
}

async fn rollback(State(s): App, who: Caller<Operators>, Ask(ask): Ask<RollbackAsk>) -> Response {
    reply(ASKED, s.ops.rollback(&who.name, ask).await)
}

async fn rollout(State(s): App, who: Caller<Operators>, Ask(ask): Ask<RolloutAsk>) -> Response {
    reply(ASKED, s.ops.rollout(&who.name, ask).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutboxQuery {
    state: Option<String>,
    limit: Option<i64>,
}

/// `GET /v1/outbox?state=pending|delivered|dead&limit=N`: outgoing notifications, newest
/// first; `dead` ones are the dead letters, with their last error.
async fn outbox(State(s): App, _: Caller<Viewers>, Params(q): Params<OutboxQuery>) -> Response {
    reply(OK, s.ops.outbox(q.state.as_deref(), q.limit.unwrap_or(100)).await)
}

/// The certificates the control plane issued, by hostname: state, validity, renewal and
/// failures (never a key, nor the chain).
async fn certificates(State(s): App, _: Caller<Viewers>) -> Response {
    reply(OK, s.ops.certificates().await)
}

/// The live fleet as re-placement sees it now: what `pl plan --fleet` decides on.
async fn fleet(State(s): App, _: Caller<Viewers>, Params(q): Params<FleetQuery>) -> Response {
    match (q.limit, q.cursor.as_deref()) {
        (None, None) => reply(OK, s.ops.fleet().await),
        (limit, cursor) => reply(OK, s.ops.fleet_page(cursor, limit.unwrap_or(FLEET_PAGE)).await),
    }
}

/// `GET /v1/fleet`: the whole snapshot, or with `limit` (and then `cursor`, the page before's
/// `next`) one page of it (`ops::fleet_pages`).
#[derive(Deserialize)]
struct FleetQuery {
    limit: Option<u32>,
    cursor: Option<String>,
}

/// Running deployments a page of `/v1/fleet` holds when `cursor` comes without `limit`.
const FLEET_PAGE: u32 = 200;

/// Heads of the applied branch refused as rewrites, newest first.
async fn rewrites(State(s): App, _: Caller<Viewers>, Params(q): Params<ListQuery>) -> Response {
    reply(OK, s.ops.rewrites(limit(&q, 50)).await)
}

/// Approves one refused rewrite (admin): recorded as an event naming the token.
async fn approve_rewrite(State(s): App, who: Caller<Admins>, Ask(ask): Ask<ApproveRewrite>) -> Response {
    reply(OK, s.ops.approve_rewrite(&who.name, ask).await)
}

/// The caller's token, by hash (a session names it so).
fn caller_hash(s: &Operator, headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))?;
    s.tokens.identify(bearer).map(|(hash, _, _)| hash)
}

/// A one-time link that signs a browser in to the web view as the caller's token (`pl ui`).
async fn sign_in_link(State(s): App, who: Caller<Viewers>, headers: HeaderMap) -> Response {
    let Some(hash) = caller_hash(&s, &headers) else {
        return refuse(Denied::BadToken);
    };
    reply(
        OK,
        s.ops
            .sign_in_link(&hash, &who.name)
            .await
            .map(|(code, expires)| SignInLink {
                path: format!("/ui/sign-in/link?code={}", code.as_str()),
                expires_at_ms: expires,
            }),
    )
}

/// Ends every web view session of the caller's token.
async fn sign_out_everywhere(State(s): App, _: Caller<Viewers>, headers: HeaderMap) -> Response {
    let Some(hash) = caller_hash(&s, &headers) else {
        return refuse(Denied::BadToken);
    };
    reply(
        OK,
        s.ops
            .sign_out_everywhere(&hash)
            .await
            .map(|sessions| SignedOut { sessions }),
    )
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EventsQuery {
    after: Option<i64>,
    limit: Option<u32>,
    /// Wait up to this long (at most `MAX_WAIT_MS`) for an event after the cursor.
    wait_ms: Option<u64>,
}

/// Events after a cursor; with `waitMs`, an empty page waits for the next event (a follower's
/// long poll: `pl up` and `pl wait` wake on any change of the fleet this way).
async fn events(State(s): App, _: Caller<Viewers>, Params(q): Params<EventsQuery>) -> Response {
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let after = q.after.unwrap_or(0);
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(0).min(operator_proto::MAX_WAIT_MS));
    let deadline = tokio::time::Instant::now() + wait;
    let mut tip = s.hub.events_tip.subscribe();
    loop {
        let page = s.ops.events(after, limit).await;
        let empty = page.as_ref().is_ok_and(|p| p.events.is_empty());
        if !empty || tokio::time::Instant::now() >= deadline {
            return reply(OK, page);
        }
        // The daemon's one watcher of the newest event (`streams::watch_events`, which sees
        // another daemon's writes too) wakes every waiter; none reads the ledger meanwhile.
        tokio::select! {
            _ = tip.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// Server-Sent Events from a cursor (`?after=N`, or the `Last-Event-ID` a reconnecting client
/// sends). Each event's `id` is its cursor, so a client resumes exactly where it stopped.
/// A stream reads the ledger only when the event watcher says there is something past its
/// cursor; streams are limited per token and in total (`429 too-many-streams`).
async fn stream(State(s): App, who: Caller<Viewers>, headers: HeaderMap, Params(q): Params<EventsQuery>) -> Response {
    let Some(slot) = s.streams.acquire(&who.name) else {
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
    let state = (s, cursor, std::collections::VecDeque::<Event>::new(), tip, slot);
    let events = futures_util::stream::unfold(state, |(s, mut cursor, mut buf, mut tip, slot)| async move {
        loop {
            if let Some(e) = buf.pop_front() {
                cursor = e.id;
                let ev = SseEvent::default()
                    .id(e.id.to_string())
                    .event(e.kind.clone())
                    .data(serde_json::to_string(&e).unwrap_or_default());
                return Some((Ok::<_, std::convert::Infallible>(ev), (s, cursor, buf, tip, slot)));
            }
            if *tip.borrow_and_update() > cursor
                && let Ok(page) = s.ops.events(cursor, 500).await
                && !page.events.is_empty()
            {
                buf.extend(page.events);
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

async fn reconcile(State(s): App, _: Caller<Operators>) -> Response {
    answer(ASKED, &s.ops.reconcile_now())
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
    answer(ASKED, &WebhookAccepted { accepted: true })
}
