//! `pl logs`: a role's container logs, fetched from the nodes that run it when asked. Agents
//! only connect out, so the control plane relays: `GET /v1/logs` opens one request per node
//! that runs the role, each node's agent picks its own up by long polling
//! (`/v1/agent/logs/wait`) and posts the lines back in bounded pieces (`/v1/agent/logs/{id}`),
//! and the reader's response streams them as they come. Nothing is stored: lines pass through
//! this process's memory only, and a request no agent picks up in [`PICKUP_TIMEOUT`] ends with
//! a line that says which node did not answer.
//!
//! Architecture invariant: log lines are never written to the ledger, an event or our own
//! log; a reader needs the operator role (logs are the application's data).

use crate::auth::Tokens;
use crate::http::peer::Peers;
use crate::http::server::{
    Caller, HasTokens, Operators, Params, PeerCert, internal, json, read_body, refused, too_many,
};
use crate::store::Ledger;
use agent_proto::{
    LogRequest, LogRequests, LogWait, MAX_LOG_CHUNK_BYTES, MAX_LOG_STREAMS_PER_NODE, MAX_LOG_TAIL_LINES,
    MAX_LOG_WAIT_MS, Refusal,
};
use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Most log streams open at once on this daemon.
pub const MAX_LOG_STREAMS: usize = 64;
/// How long a node's agent has to pick a request up.
pub const PICKUP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a picked stream may stay silent (a following agent asks every 5 s) before it is
/// taken for gone with its agent.
pub const SILENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a piece may wait for a slow reader before the stream is dropped.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines a request asks each container for when the reader says nothing.
const DEFAULT_TAIL: u32 = 100;

struct Open {
    node: String,
    request: LogRequest,
    picked: bool,
    /// When its agent last posted (or it was opened).
    heard: std::time::Instant,
    tx: mpsc::Sender<Bytes>,
}

/// `pl logs`' reader side, on the operator API.
pub struct Readers {
    pub tokens: Arc<Tokens>,
    pub ledger: Arc<Ledger>,
    pub logs: Arc<LogHub>,
}

/// Where [`Caller`] finds the tokens.
impl HasTokens for Arc<Readers> {
    fn tokens(&self) -> &Tokens {
        &self.tokens
    }
}

/// `pl logs`' agent side, on the agent API.
pub struct Writers {
    pub peers: Arc<Peers>,
    pub logs: Arc<LogHub>,
}

/// `GET /v1/logs`, for the operator API.
pub fn reader_router(state: Arc<Readers>) -> axum::Router {
    axum::Router::new()
        .route("/v1/logs", axum::routing::get(logs))
        .with_state(state)
}

/// `/v1/agent/logs/…`, for the agent API.
pub fn agent_router(state: Arc<Writers>) -> axum::Router {
    axum::Router::new()
        .route("/v1/agent/logs/wait", axum::routing::post(wait))
        .route("/v1/agent/logs/{id}", axum::routing::post(chunk))
        .with_state(state)
}

/// The open log streams, by request id.
#[derive(Default)]
pub struct LogHub {
    open: Mutex<HashMap<String, Open>>,
    wake: tokio::sync::Notify,
}

impl LogHub {
    /// One request per node, all feeding `tx`; their ids. `None` when that would pass a limit.
    fn open(&self, nodes: &BTreeSet<String>, template: &LogRequest, tx: &mpsc::Sender<Bytes>) -> Option<Vec<String>> {
        let mut open = self.open.lock().ok()?;
        // Streams whose reader left and whose agent never said so again count for nothing.
        open.retain(|_, o| !o.tx.is_closed());
        if open.len() + nodes.len() > MAX_LOG_STREAMS
            || nodes
                .iter()
                .any(|n| open.values().filter(|o| &o.node == n).count() >= MAX_LOG_STREAMS_PER_NODE)
        {
            return None;
        }
        let mut ids = Vec::new();
        for node in nodes {
            let id = random_id()?;
            let mut request = template.clone();
            request.id = id.clone();
            open.insert(
                id.clone(),
                Open {
                    node: node.clone(),
                    request,
                    picked: false,
                    heard: std::time::Instant::now(),
                    tx: tx.clone(),
                },
            );
            ids.push(id);
        }
        drop(open);
        self.wake.notify_waiters();
        Some(ids)
    }

    /// The requests for `node` no agent has picked up yet, now picked.
    fn pick(&self, node: &str) -> Vec<LogRequest> {
        let Ok(mut open) = self.open.lock() else {
            return Vec::new();
        };
        open.values_mut()
            .filter(|o| o.node == node && !o.picked && !o.tx.is_closed())
            .map(|o| {
                o.picked = true;
                o.request.clone()
            })
            .collect()
    }

    /// The stream `id` of `node`, if it is open; its agent was heard now.
    fn sender(&self, node: &str, id: &str) -> Option<mpsc::Sender<Bytes>> {
        let mut open = self.open.lock().ok()?;
        let o = open.get_mut(id).filter(|o| o.node == node)?;
        o.heard = std::time::Instant::now();
        Some(o.tx.clone())
    }

    fn close(&self, id: &str) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(id);
        }
    }

    /// Ends the requests of `ids` that no agent picked up within `pickup`, or whose agent has
    /// been silent for `silent` since; each with its node and whether it was picked up. The
    /// streams of `ids` still open are counted in the second value.
    fn expire(
        &self,
        ids: &[String],
        pickup: Duration,
        silent: Duration,
    ) -> (Vec<(String, bool, mpsc::Sender<Bytes>)>, usize) {
        let Ok(mut open) = self.open.lock() else {
            return (Vec::new(), 0);
        };
        let mut gone = Vec::new();
        for id in ids {
            let stale = open.get(id).is_some_and(|o| {
                let quiet = o.heard.elapsed();
                (!o.picked && quiet >= pickup) || (o.picked && quiet >= silent)
            });
            if stale && let Some(o) = open.remove(id) {
                gone.push((o.node, o.picked, o.tx));
            }
        }
        let left = ids.iter().filter(|id| open.contains_key(*id)).count();
        (gone, left)
    }
}

/// An unguessable id: a node learns only its own requests', and posts only to those.
fn random_id() -> Option<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).ok()?;
    Some(hex::encode(b))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    environment: String,
    role: String,
    tail: Option<u32>,
    follow: Option<bool>,
}

use crate::http::server::error as refusal;

/// `GET /v1/logs?environment=E&role=R[&tail=N][&follow=true]`: the role's lines from every node
/// that runs it, each line prefixed by its replica (`web/0 g3 | …`), as `text/plain`.
pub(crate) async fn logs(
    State(s): State<Arc<Readers>>,
    _: Caller<Operators>,
    Params(q): Params<LogsQuery>,
) -> Response {
    relay(&s, &q.environment, &q.role, q.tail, q.follow.unwrap_or(false)).await
}

/// The role's lines from every node that runs it, streamed as `text/plain` as they come: what
/// `pl logs` reads, and the web view's log tail. The caller has checked the reader's role.
pub async fn relay(s: &Arc<Readers>, environment: &str, role: &str, tail: Option<u32>, follow: bool) -> Response {
    let q = LogsQuery {
        environment: environment.to_owned(),
        role: role.to_owned(),
        tail,
        follow: Some(follow),
    };
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.len() <= 63
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if !name_ok(&q.environment) || !name_ok(&q.role) {
        return refusal(
            StatusCode::BAD_REQUEST,
            "log-target-invalid",
            "environment and role are names (a-z, 0-9, -)",
        );
    }
    let specs = match s.ledger.nodes().running_specs().await {
        Ok(s) => s,
        Err(e) => return internal(e),
    };
    let Some(spec) = specs.iter().find(|d| d.environment.as_str() == q.environment) else {
        return refusal(
            StatusCode::NOT_FOUND,
            "environment-not-running",
            format!("no environment {} runs (see `pl status`)", q.environment),
        );
    };
    let role = q.role.as_str();
    let nodes = nodes_of(spec, role);
    if nodes.is_empty() {
        return refusal(
            StatusCode::NOT_FOUND,
            "role-not-placed",
            format!(
                "no replica or run of role {role} of {} is placed on a node",
                q.environment
            ),
        );
    }
    let template = LogRequest {
        id: String::new(),
        environment: q.environment.clone(),
        role: q.role.clone(),
        tail: q.tail.unwrap_or(DEFAULT_TAIL).min(MAX_LOG_TAIL_LINES),
        follow: q.follow.unwrap_or(false),
    };
    let (tx, mut rx) = mpsc::channel::<Bytes>(64);
    let Some(ids) = s.logs.open(&nodes, &template, &tx) else {
        return too_many(
            "too-many-log-streams",
            "as many log streams are open as may be; close one",
        );
    };
    drop(tx);
    tokio::spawn(watch_streams(Arc::clone(s), ids));
    let body =
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(Ok::<_, std::convert::Infallible>)));
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (axum::http::header::CACHE_CONTROL, "no-store"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// The nodes a role's replicas or runs are placed on.
fn nodes_of(spec: &state_schema::deployment::DeploymentSpec, role: &str) -> BTreeSet<String> {
    spec.instances
        .iter()
        .filter(|i| i.role.as_str() == role)
        .map(|i| i.node.to_string())
        .chain(
            spec.release
                .iter()
                .chain(&spec.cron)
                .filter(|(r, _)| r.as_str() == role)
                .map(|(_, n)| n.to_string()),
        )
        .collect()
}

/// A watch over one reader's streams until they end: one no agent picks up, or whose agent
/// falls silent (it died mid-stream), ends with a line that says which node.
async fn watch_streams(s: Arc<Readers>, ids: Vec<String>) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (gone, left) = s.logs.expire(&ids, PICKUP_TIMEOUT, SILENT_TIMEOUT);
        for (node, picked, tx) in gone {
            let line = if picked {
                format!(
                    "pushleft: node {node} stopped sending for {} s: its agent may have stopped (`pl nodes`)\n",
                    SILENT_TIMEOUT.as_secs()
                )
            } else {
                format!(
                    "pushleft: node {node} did not pick the request up within {} s: is its agent running? (`pl nodes`)\n",
                    PICKUP_TIMEOUT.as_secs()
                )
            };
            let _ = tx.send(Bytes::from(line)).await;
        }
        if left == 0 {
            return;
        }
    }
}

/// `POST /v1/agent/logs/wait`: this node's log requests, waiting up to `waitMs` for one.
pub async fn wait(
    State(s): State<Arc<Writers>>,
    Extension(peer): Extension<Option<PeerCert>>,
    body: axum::body::Body,
) -> Response {
    let node = match s.peers.caller(peer).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let w: LogWait = match json(body).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(w.wait_ms.min(MAX_LOG_WAIT_MS));
    loop {
        // Registered before looking, so a request opened in between still wakes this wait.
        let woken = s.logs.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let requests = s.logs.pick(&node);
        if !requests.is_empty() {
            return axum::Json(LogRequests { requests }).into_response();
        }
        tokio::select! {
            _ = woken => {}
            _ = tokio::time::sleep_until(deadline) => {
                return axum::Json(LogRequests { requests: Vec::new() }).into_response();
            }
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkQuery {
    done: Option<bool>,
}

/// `POST /v1/agent/logs/{id}[?done=true]`: a piece of the stream `id` (raw lines, at most
/// [`MAX_LOG_CHUNK_BYTES`]; empty to ask whether the reader is still there). `410
/// log-stream-gone` tells the agent to stop.
pub async fn chunk(
    State(s): State<Arc<Writers>>,
    Extension(peer): Extension<Option<PeerCert>>,
    Path(id): Path<String>,
    Query(q): Query<ChunkQuery>,
    body: axum::body::Body,
) -> Response {
    let node = match s.peers.caller(peer).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let bytes = match read_body(body, MAX_LOG_CHUNK_BYTES).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    // Another node's stream, or one that ended, is the same answer: nothing to write to.
    let Some(tx) = s.logs.sender(&node, &id) else {
        return refused(Refusal::LogStreamGone, "no such log stream is open for this node");
    };
    let sent = bytes.is_empty() || matches!(tokio::time::timeout(SEND_TIMEOUT, tx.send(bytes)).await, Ok(Ok(())));
    if !sent || tx.is_closed() {
        s.logs.close(&id);
        return refused(Refusal::LogStreamGone, "the reader has left");
    }
    if q.done == Some(true) {
        s.logs.close(&id);
    }
    axum::Json(agent_proto::ChunkTaken {}).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> LogRequest {
        LogRequest {
            id: String::new(),
            environment: "api-production".into(),
            role: "web".into(),
            tail: 10,
            follow: false,
        }
    }

    #[test]
    fn a_node_sees_and_writes_only_its_own_streams() {
        let hub = LogHub::default();
        let (tx, _rx) = mpsc::channel(4);
        let nodes = BTreeSet::from(["n1".to_owned(), "n2".to_owned()]);
        let ids = hub.open(&nodes, &request(), &tx).expect("opened");
        assert_eq!(ids.len(), 2);
        let picked = hub.pick("n1");
        assert_eq!(picked.len(), 1);
        assert!(hub.pick("n1").is_empty(), "picked once");
        assert!(hub.pick("n3").is_empty());
        let mine = &picked[0].id;
        assert!(hub.sender("n1", mine).is_some());
        assert!(hub.sender("n2", mine).is_none(), "another node's stream");
        // n2 never picked its request up: it expires, and says so; n1's stays (heard now).
        let (gone, left) = hub.expire(&ids, Duration::ZERO, Duration::from_secs(30));
        assert_eq!(
            gone.iter().map(|g| (g.0.as_str(), g.1)).collect::<Vec<_>>(),
            [("n2", false)]
        );
        assert_eq!(left, 1);
        assert!(hub.sender("n1", mine).is_some());
        // n1 falls silent past the bound: its stream ends too.
        let (gone, left) = hub.expire(&ids, Duration::ZERO, Duration::ZERO);
        assert_eq!(
            gone.iter().map(|g| (g.0.as_str(), g.1)).collect::<Vec<_>>(),
            [("n1", true)]
        );
        assert_eq!(left, 0);
    }

    #[test]
    fn streams_per_node_are_bounded() {
        let hub = LogHub::default();
        let (tx, _rx) = mpsc::channel(4);
        let nodes = BTreeSet::from(["n1".to_owned()]);
        for _ in 0..MAX_LOG_STREAMS_PER_NODE {
            assert!(hub.open(&nodes, &request(), &tx).is_some());
        }
        assert!(hub.open(&nodes, &request(), &tx).is_none());
        // Their reader left: they no longer count.
        let (tx2, _rx2) = mpsc::channel(4);
        drop(_rx);
        assert!(hub.open(&nodes, &request(), &tx2).is_some());
    }
}
