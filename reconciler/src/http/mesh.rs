//! The mesh's operator route: `POST /v1/nodes/{node}/mesh-key` (operator) asks a node for a
//! new WireGuard key pair. The control plane only raises the node's key epoch: the node makes
//! the pair itself (its private key never leaves it) when its next mesh carries the new epoch,
//! and its next heartbeat brings the public key, which every peer's mesh then names.

use crate::auth::Tokens;
use crate::config::Role;
use crate::http::server::{authorized, internal, refuse};
use crate::hub::Hub;
use crate::store::{Ledger, now_ms};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

pub async fn rotate_key(ledger: &Ledger, hub: &Hub, tokens: &Tokens, headers: &HeaderMap, node: &str) -> Response {
    let by = match authorized(tokens, headers, Role::Operator) {
        Ok(n) => n.to_owned(),
        Err(d) => return refuse(d),
    };
    if node.is_empty() || node.len() > 63 || !node.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"code": "malformed-request", "message": "a node name is letters, digits and dashes"})),
        )
            .into_response();
    }
    match ledger.rotate_mesh_key(node, &by, now_ms()).await {
        Ok(Some(epoch)) => {
            tracing::info!(node = %node, by = %by, epoch, "mesh key rotation asked");
            // Decided now: the node's next mesh carries the epoch.
            hub.hint.notify_one();
            axum::Json(json!({"node": node, "keyEpoch": epoch})).into_response()
        }
        Ok(None) => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({
                "code": "mesh-not-joined",
                "message": format!("{node} has no mesh key: it is not a node, or its agent has not joined the mesh"),
            })),
        )
            .into_response(),
        Err(e) => internal(e),
    }
}
