//! Trust: which commits may be applied. SSH commit signatures verified in process (never by
//! shelling out to `git` or `ssh-keygen`) against an allowed-signers file, and a signing policy
//! with path rules. Both files come from outside the state repository.

pub mod allowed_signers;
pub mod images;
pub mod policy;
pub mod verify;

use crate::source::{SourceError, StateRepo, TreeEntry, walk_tree_diff};
use allowed_signers::AllowedSigner;
use gix::ObjectId;
use gix::objs::tree::EntryKind;
use policy::{Mode, Policy};
use verify::{Refusal, Signer, check_paths, verify_signature};

/// The verdict on one commit.
#[derive(Clone, Debug)]
pub struct CommitVerdict {
    pub commit: ObjectId,
    pub result: Result<Signer, Refusal>,
}

/// Most commits one range may list.
pub const MAX_RANGE: usize = 100_000;

fn git(what: impl Into<String>) -> impl FnOnce(gix::Error) -> SourceError {
    let what = what.into();
    move |source| SourceError::Git { what, source }
}

impl StateRepo {
    /// A commit's committer time, in seconds since the epoch.
    pub fn commit_time(&self, id: ObjectId) -> Result<i64, SourceError> {
        let repo = self.thread_repo().ok_or_else(|| SourceError::NotARepository {
            path: self.root().to_owned(),
        })?;
        let commit = repo.find_commit(id).map_err(git(format!("commit {id}")))?;
        Ok(commit.committer().map_err(git(format!("committer of {id}")))?.seconds())
    }

    /// The first-parent chain from `to` back to the first commit reachable from `from`
    /// (excluded), oldest first: the commits `to` adds. `None` for `from` lists `to` alone.
    /// `from` need not be on the chain (a merge brought it in, or the branch was rebased).
    pub fn first_parent_range(&self, from: Option<ObjectId>, to: ObjectId) -> Result<Vec<ObjectId>, SourceError> {
        let repo = self.thread_repo().ok_or_else(|| SourceError::NotARepository {
            path: self.root().to_owned(),
        })?;
        let Some(from) = from else { return Ok(vec![to]) };
        let walk = repo
            .rev_walk([to])
            .first_parent_only()
            .with_hidden([from])
            .all()
            .map_err(|e| SourceError::Range {
                message: format!("walking {from}..{to}: {e}"),
            })?;
        let mut out = Vec::new();
        for info in walk {
            let info = info.map_err(|e| SourceError::Range {
                message: format!("walking {from}..{to}: {e}"),
            })?;
            if out.len() >= MAX_RANGE {
                return Err(SourceError::Range {
                    message: format!("more than {MAX_RANGE} commits"),
                });
            }
            out.push(info.id);
        }
        out.reverse();
        Ok(out)
    }

    /// True when `ancestor` is `descendant` or one of its ancestors.
    pub fn is_ancestor(&self, ancestor: ObjectId, descendant: ObjectId) -> Result<bool, SourceError> {
        Ok(ancestor == descendant || self.merge_base(ancestor, descendant)? == Some(ancestor))
    }

    /// Paths under the state tree that differ between two commits (`None`: the empty tree).
    pub fn changed_paths(&self, from: Option<ObjectId>, to: ObjectId) -> Result<Vec<String>, SourceError> {
        let repo = self.thread_repo().ok_or_else(|| SourceError::NotARepository {
            path: self.root().to_owned(),
        })?;
        let tree_of = |id: ObjectId| self.state_tree_of(&repo, id);
        let a = match from {
            Some(f) => tree_of(f)?,
            None => None,
        };
        let b = tree_of(to)?;
        let mut out = Vec::new();
        walk_changes(&repo, a.as_ref(), b.as_ref(), &mut out)?;
        Ok(out)
    }

    /// Verifies one commit's signature; path rules apply to what changed since `since`
    /// (default: the first parent). With `seen_at`, the key must also have been valid then.
    pub fn verify_commit(
        &self,
        id: ObjectId,
        signers: &[AllowedSigner],
        rules: &[policy::Rule],
        since: Option<ObjectId>,
        seen_at: Option<i64>,
    ) -> Result<CommitVerdict, SourceError> {
        let repo = self.thread_repo().ok_or_else(|| SourceError::NotARepository {
            path: self.root().to_owned(),
        })?;
        let commit = repo.find_commit(id).map_err(git(format!("commit {id}")))?;
        let signature = commit.signature().map_err(git(format!("signature of {id}")))?;
        let Some((sig, signed)) = signature else {
            return Ok(CommitVerdict {
                commit: id,
                result: Err(Refusal::Unsigned),
            });
        };
        let time = commit.committer().map_err(git(format!("committer of {id}")))?.seconds();
        let mut result = verify_signature(sig.as_ref(), signed.to_bstring().as_ref(), time, seen_at, signers);
        if let (Ok(signer), false) = (&result, rules.is_empty()) {
            let base = match since {
                Some(s) => Some(s),
                None => commit.parent_ids().next().map(|p| p.detach()),
            };
            let changed = self.changed_paths(base, id)?;
            if let Err(r) = check_paths(signer, changed.iter().map(String::as_str), rules) {
                result = Err(r);
            }
        }
        Ok(CommitVerdict { commit: id, result })
    }

    /// Verifies a range as a policy says: `head` mode verifies the last commit (path rules
    /// over everything since `from`), `strict` mode every first-parent commit. Without a
    /// policy, every commit is verified without path rules.
    pub fn verify_range(
        &self,
        from: Option<ObjectId>,
        to: ObjectId,
        signers: &[AllowedSigner],
        policy: Option<&Policy>,
        seen_at: Option<i64>,
    ) -> Result<Vec<CommitVerdict>, SourceError> {
        match policy {
            Some(p) if p.mode == Mode::Head => Ok(vec![self.verify_commit(to, signers, &p.rules, from, seen_at)?]),
            _ => {
                let rules = policy.map(|p| p.rules.as_slice()).unwrap_or_default();
                self.first_parent_range(from, to)?
                    .into_iter()
                    .map(|c| self.verify_commit(c, signers, rules, None, seen_at))
                    .collect()
            }
        }
    }
}

/// Every path (files, links, submodules; hidden ones too: a policy guards the whole tree) that
/// differs between two trees.
fn walk_changes(
    repo: &gix::Repository,
    a: Option<&gix::Tree<'_>>,
    b: Option<&gix::Tree<'_>>,
    out: &mut Vec<String>,
) -> Result<(), SourceError> {
    walk_tree_diff(repo, a, b, "", true, &mut |path, _, x, y| {
        let is_leaf = |e: Option<&TreeEntry>| matches!(e, Some((k, _)) if *k != EntryKind::Tree);
        if is_leaf(x) || is_leaf(y) {
            out.push(path.to_owned());
        }
        Ok(())
    })
}
