//! Rollbacks and rollouts: `POST /v1/rollbacks` and `POST /v1/rollouts` (operator).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/rollbacks`: `{"environment": E}` goes back to E's previous release and holds it
/// there; `{"environment": E, "release": true}` ends the hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackAsk {
    pub environment: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release: bool,
}

/// A rollback (or an abort) asked for (`202`): the generation rolled back, the one whose
/// release runs again, and the rollback's own. The caller follows the environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RolledBack {
    pub environment: String,
    pub from: u64,
    pub to: u64,
    pub generation: u64,
}

/// A hold ended (`202`): the next pass plans the environment from Git.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HoldReleased {
    pub environment: String,
    pub released: bool,
}

/// `POST /v1/rollbacks`' answer: a rollback, or a hold released.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum RollbackAnswer {
    RolledBack(RolledBack),
    Released(HoldReleased),
}

spelled! {
    /// What `POST /v1/rollouts` does to a rollout in progress.
    pub enum RolloutAction {
        /// The canary goes on past its pause.
        Promote = "promote",
        /// The rollout stops and the previous release comes back, held as a rollback.
        Abort = "abort",
    }
}

/// `POST /v1/rollouts`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutAsk {
    pub environment: String,
    pub action: RolloutAction,
}

/// A canary promoted (`202`): the generation, and the step that runs now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Promoted {
    pub environment: String,
    pub generation: u64,
    pub step: u64,
}

/// `POST /v1/rollouts`' answer: a promotion, or an abort (a rollback).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum RolloutAnswer {
    Promoted(Promoted),
    Aborted(RolledBack),
}
