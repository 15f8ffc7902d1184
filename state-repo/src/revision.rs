//! Judging a commit of a tracked branch: is it signed as the policy demands, and is its
//! desired state valid? The verdict, with every reason, is what the ledger records.
//!
//! Trust comes first: a commit whose signature or path rules refuse it is recorded without its
//! tree being read or parsed, so an unsigned push costs a signature check, not a load.

use crate::load::load;
use crate::source::{Commit, Rev, SourceError, StateRepo};
use crate::trust::CommitVerdict;
use crate::trust::allowed_signers::AllowedSigner;
use crate::trust::policy::Policy;
use crate::trust::verify::{Signer, check_bots, check_environments};
use serde::Serialize;
use state_schema::desired::affected_environments;
use state_schema::parse::Located;
use state_schema::state::{Loaded, State};

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
    /// The desired state, when it was loaded (valid or not). Empty for a commit that trust
    /// refused: its tree is never read.
    pub state: Loaded,
    /// The committer's time: when the branch was last pushed to, for a preview's lifetime.
    pub committed_at_ms: i64,
}

impl Judgement {
    pub fn accepted(&self) -> bool {
        self.reasons.is_empty()
    }

    /// The images on registry `host` its state names (Projects' and Environments' own), each
    /// once, sorted: for the control plane's image store, what it keeps while this revision is
    /// accepted.
    pub fn images_on(&self, host: &str) -> Vec<String> {
        use state_schema::model::{Kind, Spec};
        let state = &self.state.state;
        let mut out: Vec<String> = state
            .of_kind(Kind::Project)
            .chain(state.of_kind(Kind::Environment))
            .filter_map(|l| match &l.object.spec {
                Spec::Project(p) => Some(p.image.as_str().to_owned()),
                Spec::Environment(e) => e.image.as_ref().map(|i| i.as_str().to_owned()),
                _ => None,
            })
            .filter(|i| i.split_once('/').is_some_and(|(h, _)| h == host))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// A preview branch: its name, and the applied branch's accepted `Repository` document, under
/// which its environments are derived (never the branch's own).
#[derive(Clone, Copy, Debug)]
pub struct Preview<'a> {
    pub branch: &'a str,
    pub repository: Option<&'a Located>,
}

/// What a commit is judged against.
#[derive(Clone, Copy, Debug)]
pub struct Trust<'a> {
    pub signers: &'a [AllowedSigner],
    pub policy: Option<&'a Policy>,
    /// The daemon's clock when it first saw the commit: keys must be valid then as well as at
    /// the committer date. `None` keeps git's rule (the committer date alone).
    pub seen_at: Option<i64>,
    pub preview: Option<Preview<'a>>,
}

fn refusal_reason(v: &CommitVerdict, r: &crate::trust::verify::Refusal) -> Reason {
    Reason {
        code: r.code().to_owned(),
        message: format!("{}: {}", v.commit, r.message()),
    }
}

/// Judges `commit` against `base` (the last accepted commit, or where a rewritten branch
/// forked from it): the signatures (every first-parent commit since `base` in strict mode, with
/// path rules), then, only if trust holds, the desired state, then the policy's environment
/// rules over what the change does. Every reason is reported, not the first.
pub fn judge(
    repo: &StateRepo,
    commit: &Commit,
    base: Option<gix::ObjectId>,
    trust: &Trust<'_>,
) -> Result<Judgement, SourceError> {
    // Without a policy the head alone must be signed, as in `head` mode.
    let verdicts = match trust.policy {
        Some(p) => repo.verify_range(base, commit.id, trust.signers, Some(p), trust.seen_at)?,
        None => vec![repo.verify_commit(commit.id, trust.signers, &[], None, trust.seen_at)?],
    };
    let mut reasons: Vec<Reason> = verdicts
        .iter()
        .filter_map(|v| v.result.as_ref().err().map(|r| refusal_reason(v, r)))
        .collect();
    let head_signer = verdicts
        .iter()
        .find(|v| v.commit == commit.id)
        .and_then(|v| v.result.as_ref().ok());
    let mut j = Judgement {
        committed_at_ms: repo.commit_time(commit.id)?.saturating_mul(1000),
        sha: commit.id.to_string(),
        principals: head_signer.map(Signer::principal),
        fingerprint: head_signer.map(|s| s.fingerprint.clone()),
        reasons: Vec::new(),
        state: Loaded::default(),
    };
    if !reasons.is_empty() {
        j.reasons = reasons;
        return Ok(j);
    }
    let state = load_for_judging(repo, &Rev::Commit(commit.clone()), trust)?;
    reasons.extend(state.diagnostics.iter().map(|d| Reason {
        code: d.code.as_str().to_owned(),
        message: d.to_string(),
    }));
    if reasons.is_empty()
        && let Some(policy) = trust.policy.filter(|p| p.has_environment_rules())
    {
        reasons.extend(environment_rules(repo, base, &verdicts, &state.state, policy, trust)?);
    }
    j.reasons = reasons;
    j.state = state;
    Ok(j)
}

/// Loads a side; a preview branch's state takes the applied branch's `Repository`.
fn load_for_judging(repo: &StateRepo, rev: &Rev, trust: &Trust<'_>) -> Result<Loaded, SourceError> {
    let mut loaded = load(repo, rev)?;
    if let Some(p) = trust.preview {
        loaded.state = std::mem::take(&mut loaded.state).with_repository(p.repository.cloned());
    }
    Ok(loaded)
}

/// The environment rules over what each signed change does: in `head` mode the head's signer
/// answers for everything since `base`; in `strict` mode each commit's signer answers for its
/// own change (so an unprivileged commit cannot hide behind a privileged head).
fn environment_rules(
    repo: &StateRepo,
    base: Option<gix::ObjectId>,
    verdicts: &[CommitVerdict],
    head: &State,
    policy: &Policy,
    trust: &Trust<'_>,
) -> Result<Vec<Reason>, SourceError> {
    let side = |id: Option<gix::ObjectId>| -> Result<State, SourceError> {
        match id {
            Some(id) => Ok(load_for_judging(
                repo,
                &Rev::Commit(Commit {
                    spec: id.to_string(),
                    id,
                }),
                trust,
            )?
            .state),
            None => Ok(State::default()),
        }
    };
    let preview = trust.preview.map(|p| p.branch);
    let mut before = side(base)?;
    let mut reasons = Vec::new();
    let last = verdicts.len().saturating_sub(1);
    for (i, v) in verdicts.iter().enumerate() {
        let Ok(signer) = &v.result else { continue };
        let after_owned;
        let after = if i == last {
            head
        } else {
            after_owned = side(Some(v.commit))?;
            &after_owned
        };
        let affected = affected_environments(&before, after, preview);
        if let Err(r) = check_environments(signer, &affected, &policy.rules) {
            reasons.push(refusal_reason(v, &r));
        }
        if let Err(r) = check_bots(signer, &before, after, &policy.bots) {
            reasons.push(refusal_reason(v, &r));
        }
        if i != last {
            before = after.clone();
        }
    }
    Ok(reasons)
}
