//! Volumes: `GET /v1/volumes` (viewer), `POST /v1/volumes/remove` and `POST /v1/volumes/move`
//! (admin).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

spelled! {
    /// Whether a volume's environment still mounts it.
    pub enum VolumeState {
        InUse = "in-use",
        /// Its environment was torn down: kept until its retention ends.
        Retained = "retained",
    }
}

/// One volume where it lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub environment: String,
    pub volume: String,
    pub role: String,
    pub node: String,
    pub generation: i64,
    pub state: VolumeState,
    pub size_bytes: Option<i64>,
    /// As the node's agent last measured it.
    pub used_bytes: Option<i64>,
    pub measured_at_ms: Option<i64>,
    pub created_at_ms: i64,
    pub released_at_ms: Option<i64>,
    /// When a retained volume goes.
    pub remove_after_ms: Option<i64>,
    /// While a move is under way: the node it goes to.
    pub moving_to: Option<String>,
    pub move_asked_at_ms: Option<i64>,
    /// The node the last move left.
    pub moved_from: Option<String>,
    /// When the last move's role was healthy on the new node.
    pub moved_up_at_ms: Option<i64>,
    /// Why the last move failed.
    pub move_failure: Option<String>,
    /// Older generations kept on their nodes.
    pub kept: Vec<Kept>,
}

/// An older generation of a volume, kept on its node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    pub generation: i64,
    pub node: String,
    pub kept_at_ms: i64,
}

/// `GET /v1/volumes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Volumes {
    pub volumes: Vec<Volume>,
}

/// `POST /v1/volumes/remove` (admin): a retained volume, or one kept generation of one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RemoveVolume {
    pub environment: String,
    pub volume: String,
    /// One kept generation rather than the whole released volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// A removal done on the node (`200`, after the node said so).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeRemoved {
    pub removed: bool,
    pub node: String,
    /// The kept generation removed (absent for a whole volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// What the node's agent said.
    pub detail: Option<String>,
}

/// `POST /v1/volumes/move` (admin): moves a volume (and its role) to another node, through
/// its backup repository.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveVolume {
    pub environment: String,
    pub volume: String,
    pub to: String,
}

/// A move asked for (`202`): the first step's job; `pl volumes` follows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMoving {
    pub job: String,
    pub role: String,
    pub from: String,
    pub to: String,
    pub asked_at_ms: i64,
}
