//! Backups: `GET /v1/backups` (viewer), `POST /v1/backups/run` (operator: a backup or a
//! restore drill now) and `POST /v1/restores` (admin).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

spelled! {
    /// How a backup (or a restore drill, or a move's save) ended.
    pub enum BackupStatus {
        Succeeded = "succeeded",
        Failed = "failed",
        /// A restore drill: the snapshot restored and the verify command passed.
        Verified = "verified",
        /// A restore drill that failed.
        VerifyFailed = "verify-failed",
        /// A volume move's save: a snapshot that carried the data to another node.
        Moved = "moved",
        /// A volume move's save that failed (the volume stayed where it was).
        MoveFailed = "move-failed",
    }
}

/// `GET /v1/backups?environment=E[&volume=V][&limit=N]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BackupsQuery {
    pub environment: String,
    pub volume: Option<String>,
    /// At most this many, newest first (1 to 1,000; 50 when absent).
    pub limit: Option<i64>,
}

/// One ended backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    pub environment: String,
    pub volume: String,
    /// The volume's generation it saved.
    pub generation: i64,
    pub node: String,
    pub job: String,
    pub finished_at_ms: i64,
    pub status: BackupStatus,
    pub snapshot: Option<String>,
    pub bytes: Option<i64>,
    pub data_added: Option<i64>,
    /// Why it failed (empty for a success).
    pub reason: String,
}

/// The newest snapshot of a volume a restore drill proved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Proven {
    pub volume: String,
    pub at_ms: i64,
    pub snapshot: Option<String>,
}

/// `GET /v1/backups`: newest first, and each volume's newest proven snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Backups {
    pub backups: Vec<Backup>,
    pub proven: Vec<Proven>,
}

/// `POST /v1/backups/run` (operator).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunBackup {
    pub environment: String,
    pub volume: String,
    /// A restore drill of the newest snapshot rather than a backup.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify: bool,
}

/// A backup or drill asked for (`202`): its job, which `pl backups` follows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobAsked {
    pub job: String,
}

/// `POST /v1/restores` (admin): a snapshot (the newest when absent) restored as a new
/// generation of the volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Restore {
    pub environment: String,
    pub volume: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// A restore asked for (`202`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Restoring {
    pub job: String,
    /// The volume generation it makes.
    pub generation: u64,
    pub snapshot: String,
    pub node: String,
}
