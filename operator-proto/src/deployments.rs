//! Deployments: each environment's current generation and what its agents report of it
//! (`GET /v1/deployments`, `GET /v1/environments/{name}`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a generation of an environment does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Rollout,
    Teardown,
}

/// Where a generation's steps stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DeploymentStatus {
    InProgress,
    Done,
    Failed,
}

impl DeploymentStatus {
    /// As the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentStatus::InProgress => "in-progress",
            DeploymentStatus::Done => "done",
            DeploymentStatus::Failed => "failed",
        }
    }
}

/// One environment's current generation and what its nodes' agents report of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deployment {
    pub environment: String,
    pub branch: String,
    pub generation: i64,
    pub action: Action,
    pub status: DeploymentStatus,
    pub step: i64,
    pub updated_at_ms: i64,
    /// Replicas Git asks for (every long-running role's `replicas`; none once torn down).
    /// Absent from daemons that predate it (then: as placed).
    #[serde(default)]
    pub asked: Option<usize>,
    /// Replicas this generation places.
    pub replicas: usize,
    /// Of those, how many their nodes' agents last reported running and healthy at this
    /// generation, where they were placed: what is true on the hosts, not what was asked.
    pub running: usize,
    /// Replicas of the environment agents report running that this generation does not place
    /// there (another generation, a replica scaled or moved away): still to go.
    pub stale: usize,
    /// The generation that served before this one (what `pl rollback` goes back to); 0 for none.
    #[serde(default)]
    pub previous_generation: i64,
    /// Replicas (and release roles) no node had room for, each with its reason.
    #[serde(default)]
    pub waiting: Vec<Waiting>,
    /// A rollback's hold: while there is one, the environment differs from Git.
    #[serde(default)]
    pub hold: Option<Hold>,
    /// A canary under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
}

impl Deployment {
    /// Replicas Git asks for.
    pub fn asked(&self) -> usize {
        self.asked.unwrap_or(self.replicas)
    }
}

/// A replica (or release role) no node had room for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Waiting {
    pub role: String,
    pub index: u32,
    /// `no-capacity`, `no-eligible-node`, `volume-pinned` or `volume-moving`.
    pub reason: String,
}

/// A rollback's hold on an environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    /// The operator token's name that asked (`watch` for a release's failed watch).
    pub by: String,
    pub at_ms: i64,
    /// The generation rolled back.
    pub from: u64,
    /// The generation whose release runs again.
    pub to: u64,
    /// The rollback's own generation.
    pub generation: u64,
    /// The spec hash Git wanted when the hold began.
    pub git_hash: String,
    /// Released by an operator: the next pass plans the environment from Git again.
    #[serde(default)]
    pub released: bool,
}

/// Where a canary stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    /// The share of requests the new release has, in percent (0: no weighted step done yet).
    pub weight: u8,
    pub waits_for_promote: bool,
    /// When the next step is due, while it waits out a pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_at_ms: Option<i64>,
}

/// `GET /v1/deployments`: a page of deployments by environment name, and the cursor of the
/// next page (`after`), or null at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeploymentsPage {
    pub deployments: Vec<Deployment>,
    pub next: Option<String>,
}

/// The most `GET /v1/environments/{name}` waits for a change (`waitMs`).
pub const MAX_WAIT_MS: u64 = 30_000;
