//! The daemon itself: `GET /v1/status` (viewer), `GET /readyz` (anyone), and the answer of
//! `POST /v1/reconcile` and of a push webhook.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `GET /v1/status`: where the daemon and its branch stand, read live.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// This control plane's id, which every object it makes on the hosts names (pin it with
    /// `[control] id` to keep it through a rebuilt ledger).
    #[serde(default)]
    pub control_plane: String,
    pub mesh: MeshSummary,
    /// Whether this daemon reconciles (a standby answers too).
    pub leader: bool,
    pub last_pass_ms_ago: i64,
    pub branch: String,
    /// The commit in force: the newest accepted (null before any).
    pub in_force: Option<String>,
    /// The newest commit judged, accepted or not.
    pub last_judged: Option<String>,
    pub counts: Counts,
    /// The service level objectives over the last day, as the ledger's counts measure them.
    #[serde(default)]
    pub slos: Vec<Slo>,
}

/// One service level objective over the last day.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Slo {
    /// `deployment-success`, `commit-to-live`, `lease-freshness` or `route-publication`.
    pub name: String,
    /// What it promises, in words (`95% of deployments that end succeed`).
    pub objective: String,
    /// The share it promises (0.95).
    pub target: f64,
    /// The share measured (none: nothing to measure yet).
    pub measured: Option<f64>,
    /// What the share is of (`40 deployments ended`).
    pub over: String,
    pub state: SloState,
}

/// Whether an objective holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SloState {
    Met,
    /// Below its target: its error budget burns.
    Burning,
    /// Nothing measured in the window.
    MissingData,
}

impl SloState {
    pub fn as_str(self) -> &'static str {
        match self {
            SloState::Met => "met",
            SloState::Burning => "burning",
            SloState::MissingData => "missing data",
        }
    }
}

/// The mesh between nodes as agents report their links.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshSummary {
    /// Links reported, over every node.
    pub links: usize,
    /// Links judged down (no handshake within WireGuard's session limit), however many.
    #[serde(default)]
    pub down_total: usize,
    /// Those links, by node, at most 1,000 of them (a cut fleet of 10,000 nodes could have
    /// millions).
    pub down: Vec<LinkDown>,
}

/// A mesh link judged down: from `node` to `peer`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LinkDown {
    pub node: String,
    pub peer: String,
}

/// Counts by state, as the ledger holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Jobs by state (`queued`, `leased`, `succeeded`, `failed`, `dead`, `cancelled`).
    pub jobs: BTreeMap<String, i64>,
    /// Deployments by status (`in-progress`, `done`, `failed`).
    pub deployments: BTreeMap<String, i64>,
    /// Judged commits by verdict (`accepted`, `rejected`).
    pub revisions: BTreeMap<String, i64>,
    /// Age of the oldest job that is due and waiting, in milliseconds.
    pub queue_age_ms: i64,
    /// The newest event's cursor.
    pub last_event: i64,
    /// When these were read (Unix ms).
    pub at_ms: i64,
}

/// `GET /readyz`: `200` when the ledger answers and the loop ticked within 30 s, `503` else.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ready {
    pub ledger: bool,
    pub loop_ticked_ms_ago: i64,
    pub leader: bool,
}

/// `POST /v1/reconcile` (`202`): a pass asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileAsked {
    /// Whether this daemon reconciles; a standby's leader keeps its own schedule.
    pub leader: bool,
    /// Passes run before the ask: a caller waits for more than this.
    pub passes_before: u64,
}

/// A push webhook's answer (`202`): a fetch asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookAccepted {
    pub accepted: bool,
}
