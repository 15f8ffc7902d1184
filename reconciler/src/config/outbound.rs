//! Where the daemon reports to: forges' commit statuses (`[[forges]]`) and signed webhooks
//! (`[[hooks]]`), with the events a hook may ask for.

use serde::Deserialize;
use std::path::PathBuf;

/// `[forge]`: where each accepted commit's deployment statuses go (`notify.rs`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForgeConfig {
    /// `github`, `gitlab`, `gitea` or `forgejo`.
    pub kind: String,
    /// The API's base URL (`https://api.github.com`, `https://gitlab.com/api/v4`,
    /// `https://codeberg.org/api/v1`).
    pub api: String,
    /// `owner/name` (GitLab: the project's path or id).
    pub repository: String,
    /// A file (0600) holding the token that may post statuses; read when a status is sent, never
    /// logged.
    pub token_file: PathBuf,
    /// Statuses are named `<context>/<environment>`.
    #[serde(default = "default_context")]
    pub context: String,
    /// A link each status carries (a dashboard, say).
    #[serde(default)]
    pub target_url: Option<String>,
}

fn default_context() -> String {
    "pushleft".into()
}

/// `[[hooks]]`: a receiver of events, signed with HMAC-SHA256 (`notify.rs`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    pub url: String,
    /// A file (0600) holding the signing secret.
    pub secret_file: PathBuf,
    /// The event kinds it receives (`HOOK_EVENTS`); default: rollouts done and
    /// failed, and rollbacks.
    #[serde(default = "default_hook_events")]
    pub events: Vec<String>,
}

fn default_hook_events() -> Vec<String> {
    [
        "deployment-rollout-done",
        "deployment-failed",
        "deployment-rollback",
        "rollback-automatic",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The events a webhook receiver may ask for.
pub const HOOK_EVENTS: &[&str] = &[
    "deployment-rollout",
    "deployment-rollout-done",
    "deployment-failed",
    "deployment-rollback",
    "rollback-automatic",
    "rollback-released",
    "watch-passed",
    "watch-failed",
    "canary-step",
    "canary-promoted",
    "canary-gates",
    "node-lost",
    "node-back",
    "drift-repaired",
    "revision-accepted",
    "revision-rejected",
];

/// The most webhook receivers a control plane posts to.
pub const MAX_HOOKS: usize = 16;
