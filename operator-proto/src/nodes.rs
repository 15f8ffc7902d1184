//! Nodes: `GET /v1/nodes` (viewer), `POST /v1/nodes/{node}/token` (operator) and
//! `POST /v1/nodes/{node}/mesh-key` (operator).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

spelled! {
    /// A node's lifecycle, from what Git says and when its agent was last seen.
    pub enum NodeState {
        /// Declared; no agent enrolled yet.
        NotEnrolled = "not-enrolled",
        Active = "active",
        /// Not seen for a while; its replicas stay placed.
        Unhealthy = "unhealthy",
        /// Not seen for longer: its replicas are placed elsewhere.
        Lost = "lost",
        Draining = "draining",
        Retired = "retired",
    }
}

/// One declared node: what Git declares and what the control plane has seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub name: String,
    pub pool: String,
    pub state: NodeState,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub last_seen_ms: Option<i64>,
    pub agent_version: Option<String>,
    /// The agent protocol its last heartbeat spoke (`0`: an agent from before agents said
    /// it); absent when it never beat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_protocol: Option<u32>,
    /// Its agent speaks an older protocol than this control plane: it is sent the tasks that
    /// protocol knows (an environment's set-up as three jobs, say) until it is upgraded.
    #[serde(default)]
    pub older_agent: bool,
    /// Replicas placed on the node by the current deployments (what was asked).
    pub instances: usize,
    /// Replicas the node's agent last reported running and healthy (what is true there).
    pub running: usize,
    /// CPU (millis) and memory (bytes) those replicas reserve.
    pub reserved_cpu_millis: u64,
    pub reserved_memory_bytes: u64,
    /// What the agent says it can run (`docker`, `ingress`, …).
    pub capabilities: Vec<String>,
    /// The CA (SHA-256 fingerprint, hex) of the node's newest valid certificate.
    pub certificate_ca: Option<String>,
    /// The node's mesh as its agent said it (absent before it joined one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<NodeMesh>,
}

/// A node's mesh: the generation decided and the one applied, and each peer's last handshake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeMesh {
    pub generation: i64,
    pub applied: i64,
    pub links: Vec<MeshLink>,
    /// Peers whose links were judged down.
    pub down: Vec<String>,
}

/// One link of a node's mesh, as its agent reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshLink {
    /// The peer.
    pub node: String,
    /// Unix seconds of the last handshake; absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handshake: Option<u64>,
}

/// `GET /v1/nodes`: declared nodes by name, a page at a time (`after` a name, at most `limit`),
/// and the cursor of the next page when there may be more.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Nodes {
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub next: Option<String>,
}

/// `POST /v1/nodes/{node}/token` (operator): a one-time enrolment token (shown once; the
/// daemon keeps only its hash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeToken {
    pub node: String,
    pub token: String,
    pub expires_at_ms: i64,
}

/// `POST /v1/nodes/{node}/mesh-key` (operator): the node's new key epoch; the node makes the
/// pair itself when its next mesh carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshKeyAsked {
    pub node: String,
    pub key_epoch: i64,
}
