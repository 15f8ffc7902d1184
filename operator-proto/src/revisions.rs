//! Judged commits: `GET /v1/revisions` (viewer), and the heads refused as history rewrites
//! (`GET /v1/rewrites`, `POST /v1/rewrites/approve`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

spelled! {
    /// What the reconciler judged of a commit.
    pub enum Verdict {
        Accepted = "accepted",
        Rejected = "rejected",
    }
}

/// Why a commit was rejected: a stable code and the reconciler's words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Reason {
    pub code: String,
    pub message: String,
}

/// One judged commit of a branch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    /// Its cursor: a page's `next` is the last one's.
    pub id: i64,
    pub branch: String,
    pub sha: String,
    pub verdict: Verdict,
    /// Who signed it, as trust named them (null when unsigned or not trusted).
    pub principals: Option<String>,
    /// Empty when accepted.
    pub reasons: Vec<Reason>,
    pub seen_at_ms: i64,
}

/// `GET /v1/revisions`: newest first, and the cursor (`before`) of the next page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RevisionsPage {
    pub revisions: Vec<Revision>,
    pub next: Option<i64>,
}

/// A head of the applied branch refused because it does not descend from the commit in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rewrite {
    pub branch: String,
    pub sha: String,
    /// The commit in force when it was refused.
    pub accepted_sha: String,
    pub seen_at_ms: i64,
    /// The admin token that approved it, once approved.
    pub approved_by: Option<String>,
    pub approved_at_ms: Option<i64>,
}

/// `GET /v1/rewrites`: newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Rewrites {
    pub rewrites: Vec<Rewrite>,
}

/// `POST /v1/rewrites/approve` (admin): approves one refused head.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveRewrite {
    pub branch: String,
    /// The full sha (40 hex digits) of the refused head.
    pub sha: String,
}

/// The approval's answer; `already` when it had been approved before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Approved {
    pub approved: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub already: bool,
}
