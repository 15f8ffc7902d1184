//! `POST /v1/images/gc` (admin): the control plane's image store collected. Blobs that no
//! accepted revision (any, not only the newest), environment's spec, previous release (a
//! rollback's target) or retired generation names, directly or through a manifest, and that are older than the grace, go;
//! `delete: false` (the default) lists them and removes nothing.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What is asked: a dry run unless `delete`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CollectImages {
    #[serde(default)]
    pub delete: bool,
}

/// The blobs nothing references, and whether they were removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagesCollected {
    /// Whether the listed blobs were removed (false: a dry run).
    pub deleted: bool,
    /// By digest.
    pub blobs: Vec<UnreferencedBlob>,
    /// Their bytes in all.
    pub bytes: u64,
    /// Unreferenced blobs younger than the grace, kept (a push comes before its commit).
    pub young: u32,
    /// What the store holds after the collection, and its quota.
    pub held_bytes: u64,
    pub quota_bytes: u64,
}

/// One blob nothing references.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnreferencedBlob {
    pub digest: String,
    pub bytes: u64,
    /// Since it was written.
    pub age_seconds: u64,
}
