//! Judging a commit of a tracked branch: is it signed as the policy demands, and is its
//! desired state valid? The verdict, with every reason, is what the ledger records.

use crate::load::load;
use crate::source::{Commit, Rev, SourceError, StateRepo};
use crate::trust::allowed_signers::AllowedSigner;
use crate::trust::policy::Policy;
use serde::Serialize;
use state_schema::state::Loaded;

/// One reason a commit was rejected: a stable code and a message with no secret in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reason {
    pub code: String,
    pub message: String,
}

/// The verdict on one commit.
#[derive(Clone, Debug)]
pub struct Judgement {
    pub sha: String,
    pub principals: Option<String>,
    pub fingerprint: Option<String>,
    /// Empty when the commit is accepted.
    pub reasons: Vec<Reason>,
    /// The desired state, when it loaded (valid or not).
    pub state: Loaded,
    /// The committer's time: when the branch was last pushed to, for a preview's lifetime.
    pub committed_at_ms: i64,
}

impl Judgement {
    pub fn accepted(&self) -> bool {
        self.reasons.is_empty()
    }
}

/// Judges `commit`: the signature (with the policy's path rules over what changed since
/// `last_accepted`, or since the first parent) and then the whole desired state. Every reason
/// is reported, not the first.
pub fn judge(
    repo: &StateRepo,
    commit: &Commit,
    signers: &[AllowedSigner],
    policy: Option<&Policy>,
    last_accepted: Option<gix::ObjectId>,
) -> Result<Judgement, SourceError> {
    let mut reasons = Vec::new();
    let (mut principals, mut fingerprint) = (None, None);
    let verdicts = match policy {
        Some(p) if p.mode == crate::trust::policy::Mode::Strict && last_accepted.is_some() => {
            repo.verify_range(last_accepted, commit.id, signers, Some(p))?
        }
        Some(p) => vec![repo.verify_commit(commit.id, signers, &p.rules, last_accepted)?],
        None => vec![repo.verify_commit(commit.id, signers, &[], None)?],
    };
    for v in &verdicts {
        match &v.result {
            Ok(s) if v.commit == commit.id => {
                principals = Some(s.principal());
                fingerprint = Some(s.fingerprint.clone());
            }
            Ok(_) => {}
            Err(r) => reasons.push(Reason {
                code: r.code().to_owned(),
                message: format!("{}: {}", v.commit, r.message()),
            }),
        }
    }
    let state = load(repo, &Rev::Commit(commit.clone()))?;
    reasons.extend(state.diagnostics.iter().map(|d| Reason {
        code: d.code.as_str().to_owned(),
        message: d.to_string(),
    }));
    Ok(Judgement {
        committed_at_ms: repo.commit_time(commit.id)?.saturating_mul(1000),
        sha: commit.id.to_string(),
        principals,
        fingerprint,
        reasons,
        state,
    })
}
