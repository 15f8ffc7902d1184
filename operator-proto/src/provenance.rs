//! `GET /v1/environments/{name}/provenance` (viewer): for each replica an agent reports
//! running, the chain from what runs back to who allowed it: the image the container was made
//! from, who signed that image as the node verified it before the pull, the commit whose
//! generation put it there and who signed that commit. Every link is the ledger's: the node's
//! last report (its heartbeat) and the revision that made the generation.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One environment's running replicas, each with its provenance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    pub environment: String,
    /// By node, role and instance.
    pub replicas: Vec<ReplicaProvenance>,
}

/// A running replica's provenance. Absent fields are links nobody recorded: an image no rule
/// asked to be signed has no signer; a container made before agents reported images has no
/// image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaProvenance {
    pub node: String,
    pub role: String,
    pub instance: u32,
    pub generation: u64,
    pub healthy: bool,
    /// The image the container runs, by digest, as the node reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Who signed it: the allowed-signers principal and key the node verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_signer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_fingerprint: Option<String>,
    /// When the node verified it, before the pull (Unix ms, the node's clock). An SSH
    /// signature carries no time of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_verified_at_ms: Option<i64>,
    /// The commit whose accepted revision made this generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Who signed that commit (principals) and with which key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_signer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_fingerprint: Option<String>,
    /// When the control plane first saw the commit (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_seen_at_ms: Option<i64>,
}
