//! The agents' side of the image store: `GET /v1/agent/images/{manifests,blobs}/{digest}` over
//! a node's mutual-TLS connection, for the engine its agent serves them to. A node is served
//! only the images of its own work: a manifest that a job it holds or is about to lease names
//! (`ops::images::node_may_fetch`), then what that manifest references (`images::grants`);
//! anything else is refused with `image-not-placed`, whether or not the store holds it.

use crate::http::peer::Peers;
use crate::http::registry::{bad_digest, oci_error, serve_blob, serve_manifest};
use crate::http::server::PeerCert;
use crate::images::grants::Grants;
use crate::images::store::Store;
use crate::store::Ledger;
use axum::Router;
use axum::extract::{Extension, Path, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use axum::routing::get;
use registry::oci::Digest;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The agents' side of the store.
pub struct AgentImages {
    store: Arc<Store>,
    peers: Arc<Peers>,
    ledger: Arc<Ledger>,
    grants: Mutex<Grants>,
}

/// The routes (none without a store).
pub fn agent_router(store: Option<&Arc<Store>>, peers: Arc<Peers>, ledger: Arc<Ledger>) -> Router {
    let Some(store) = store else { return Router::new() };
    let state = Arc::new(AgentImages {
        store: Arc::clone(store),
        peers,
        ledger,
        grants: Mutex::default(),
    });
    Router::new()
        .route("/v1/agent/images/manifests/{digest}", get(agent_manifest))
        .route("/v1/agent/images/blobs/{digest}", get(agent_blob))
        .with_state(state)
}

impl AgentImages {
    fn granted(&self, node: &str, d: &Digest) -> bool {
        self.grants.lock().is_ok_and(|g| g.allows(node, d, Instant::now()))
    }

    fn grant(&self, node: &str, digests: Vec<Digest>) {
        if let Ok(mut g) = self.grants.lock() {
            g.grant(node, digests, Instant::now());
        }
    }
}

fn not_placed(node: &str, d: &Digest) -> Response {
    oci_error(
        StatusCode::FORBIDDEN,
        "DENIED",
        "image-not-placed",
        format!("no work of node {node} names {d}: a node fetches only the images of its own jobs"),
    )
}

/// The calling node (its certificate checked) and the digest it asks for, or the refusal.
async fn caller_and_digest(
    s: &AgentImages,
    peer: Option<PeerCert>,
    digest: &str,
) -> Result<(String, Digest), Response> {
    let node = s.peers.caller(peer).await?;
    let d = Digest::parse(digest).ok_or_else(|| bad_digest(digest))?;
    Ok((node, d))
}

async fn agent_manifest(
    State(s): State<Arc<AgentImages>>,
    Extension(peer): Extension<Option<PeerCert>>,
    method: Method,
    Path(digest): Path<String>,
) -> Response {
    let (node, d) = match caller_and_digest(&s, peer, &digest).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    if !s.granted(&node, &d) {
        match crate::ops::images::node_may_fetch(&s.ledger, &node, &d).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(node = %node, digest = %d, "image fetch refused: no work of the node names it");
                return not_placed(&node, &d);
            }
            Err(e) => {
                return oci_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "UNAVAILABLE",
                    "ledger-unavailable",
                    e.to_string(),
                );
            }
        }
    }
    // What the manifest reaches (an index's manifests, an image's config and layers) may be
    // fetched next; the manifest itself again, for the engine's retries.
    let (store, manifest) = (Arc::clone(&s.store), d.clone());
    let mut reach = tokio::task::spawn_blocking(move || store.references(&manifest))
        .await
        .unwrap_or_default();
    reach.push(d.clone());
    s.grant(&node, reach);
    serve_manifest(&s.store, &d, method == Method::HEAD).await
}

async fn agent_blob(
    State(s): State<Arc<AgentImages>>,
    Extension(peer): Extension<Option<PeerCert>>,
    method: Method,
    Path(digest): Path<String>,
) -> Response {
    let (node, d) = match caller_and_digest(&s, peer, &digest).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    if !s.granted(&node, &d) {
        tracing::warn!(node = %node, digest = %d, "image fetch refused: no manifest of the node's work reaches it");
        return not_placed(&node, &d);
    }
    serve_blob(&s.store, &d, None, method == Method::HEAD).await
}
