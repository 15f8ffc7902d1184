//! The job ledger: `GET /v1/jobs` (viewer), `GET /v1/events` and `GET /v1/events/stream`
//! live in `events`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

spelled! {
    /// Where a job stands.
    pub enum JobState {
        Queued = "queued",
        Leased = "leased",
        Succeeded = "succeeded",
        /// Failed for good (a permanent failure).
        Failed = "failed",
        /// Out of attempts.
        Dead = "dead",
        /// A newer generation started first.
        Cancelled = "cancelled",
    }
}

impl JobState {
    /// Whether it ended without succeeding.
    pub fn failed(self) -> bool {
        matches!(self, JobState::Failed | JobState::Dead)
    }
}

/// One job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub id: i64,
    /// The job's key: the task and its target, `…@generation`.
    pub key: String,
    pub target_node: String,
    pub state: JobState,
    pub attempts: i64,
    pub max_attempts: i64,
    pub environment: Option<String>,
    pub generation: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Why a failed or dead job failed: its last attempt's report (null for other states).
    pub reason: Option<String>,
}

/// `GET /v1/jobs`: newest first, and the cursor (`before`) of the next page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobsPage {
    pub jobs: Vec<Job>,
    pub next: Option<i64>,
}
