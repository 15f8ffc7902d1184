//! A revert written as Git would write `git revert`, through gix and `ssh-key` alone (no `git`
//! program): the files one commit changed are put back as its parent had them, on top of the
//! branch head, in a new commit signed like `git commit -S` with `gpg.format=ssh` (an `SshSig`
//! in the `git` namespace). It goes on a branch of its own: the user's work tree, index and
//! current branch are left alone, and pushing (or merging) the branch is the change.
//!
//! A file a later commit changed too (an image line reverted in a project file whose replicas
//! changed since, say) gets the reverse of the reverted commit's line changes where each
//! changed block, with a line of context each side, is found exactly once; anything else is a
//! conflict, refused with its paths, and nothing is written.

use gix::ObjectId;
use gix::objs::tree::{EntryKind, EntryMode};
use gix::refs::transaction::PreviousValue;
use ssh_key::PrivateKey;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum RevertError {
    #[error("the repository at {path}: {what}: {detail}")]
    Git { path: String, what: String, detail: String },
    #[error("commit {0} has no parent to go back to")]
    NoParent(ObjectId),
    #[error("later commits changed what {commit} changed too: {}", paths.join(", "))]
    Conflict { commit: ObjectId, paths: Vec<String> },
    #[error("the branch {0} exists already")]
    BranchExists(String),
    #[error(transparent)]
    Commit(#[from] crate::commit::CommitError),
}

/// The revert to write.
pub struct Revert<'a> {
    /// The commit the revert goes on (the branch head it was decided against).
    pub head: ObjectId,
    /// The commit reverted.
    pub reverted: ObjectId,
    /// The new branch's short name (`pl-rollback/api-production`).
    pub branch: &'a str,
    pub message: &'a str,
}

fn git(path: &Path, what: impl Into<String>) -> impl FnOnce(gix::Error) -> RevertError {
    let (path, what) = (path.display().to_string(), what.into());
    move |e| RevertError::Git {
        path,
        what,
        detail: e.to_string(),
    }
}

/// Every file of tree `id`, by its `/`-separated path: its mode and blob.
fn files(
    repo: &gix::Repository,
    id: ObjectId,
    prefix: &str,
    out: &mut BTreeMap<String, (EntryMode, ObjectId)>,
) -> Result<(), RevertError> {
    let here = repo.path().to_owned();
    let tree = repo
        .find_tree(id)
        .map_err(|e| git(&here, format!("read tree {id}"))(gix::Error::from_error(e)))?;
    for entry in tree.iter() {
        let entry = entry.map_err(|e| git(&here, format!("an entry of tree {id}"))(gix::Error::from_error(e)))?;
        let path = format!("{prefix}{}", entry.filename());
        match entry.mode().kind() {
            EntryKind::Tree => files(repo, entry.oid().to_owned(), &format!("{path}/"), out)?,
            _ => {
                out.insert(path, (entry.mode(), entry.oid().to_owned()));
            }
        }
    }
    Ok(())
}

/// Writes `r` in the repository at `dir`, signed with `key`, by the author git's configuration
/// names; returns the new commit. Refused before anything is written when a later commit
/// changed the same files, or the branch exists.
pub fn write(dir: &Path, r: &Revert<'_>, key: &PrivateKey) -> Result<ObjectId, RevertError> {
    let repo = gix::discover(dir).map_err(|e| git(dir, "open")(gix::Error::from_error(e)))?;
    let at = repo.path().to_owned();
    let fail = |what: String| git(&at, what);
    let commit_of = |id: ObjectId| -> Result<(ObjectId, Option<ObjectId>), RevertError> {
        let c = repo
            .find_commit(id)
            .map_err(|e| fail(format!("read commit {id}"))(gix::Error::from_error(e)))?;
        let tree = c
            .tree_id()
            .map_err(|e| fail(format!("the tree of {id}"))(gix::Error::from_error(e)))?
            .detach();
        Ok((tree, c.parent_ids().next().map(|p| p.detach())))
    };
    let (head_tree, _) = commit_of(r.head)?;
    let (changed_tree, parent) = commit_of(r.reverted)?;
    let parent = parent.ok_or(RevertError::NoParent(r.reverted))?;
    let (parent_tree, _) = commit_of(parent)?;
    let (mut before, mut after, mut now) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    files(&repo, parent_tree, "", &mut before)?;
    files(&repo, changed_tree, "", &mut after)?;
    files(&repo, head_tree, "", &mut now)?;
    let mut paths: Vec<&String> = before.keys().chain(after.keys()).collect();
    paths.sort();
    paths.dedup();
    let changed: Vec<&String> = paths.into_iter().filter(|p| before.get(*p) != after.get(*p)).collect();
    // A file changed since: the reverse patch applied to what it is now, when it applies.
    let mut merged: BTreeMap<String, ObjectId> = BTreeMap::new();
    let mut conflicts: Vec<String> = Vec::new();
    for p in changed.iter().filter(|p| now.get(**p) != after.get(**p)) {
        let text = |entry: Option<&(EntryMode, ObjectId)>| -> Option<String> {
            let (_, oid) = entry?;
            let blob = repo.find_blob(*oid).ok()?;
            String::from_utf8(blob.data.clone()).ok()
        };
        let applied = match (text(before.get(*p)), text(after.get(*p)), text(now.get(*p))) {
            (Some(b), Some(a), Some(n)) => unpatch(&b, &a, &n),
            _ => None,
        };
        match applied {
            Some(t) => {
                let oid = repo
                    .write_blob(t.as_bytes())
                    .map_err(|e| fail(format!("write {p}"))(gix::Error::from_error(e)))?
                    .detach();
                merged.insert((*p).clone(), oid);
            }
            None => conflicts.push((*p).clone()),
        }
    }
    if !conflicts.is_empty() {
        return Err(RevertError::Conflict {
            commit: r.reverted,
            paths: conflicts,
        });
    }
    let reference = format!("refs/heads/{}", r.branch);
    if repo
        .try_find_reference(reference.as_str())
        .map_err(|e| fail("read references".into())(gix::Error::from_error(e)))?
        .is_some()
    {
        return Err(RevertError::BranchExists(r.branch.to_owned()));
    }
    let mut editor = repo
        .edit_tree(head_tree)
        .map_err(|e| fail("start a tree".into())(gix::Error::from_error(e)))?;
    for p in changed {
        if let (Some(oid), Some((mode, _))) = (merged.get(p), now.get(p)) {
            editor
                .upsert(p.as_str(), mode.kind(), *oid)
                .map_err(|e| fail(format!("place {p}"))(gix::Error::from_error(e)))?;
            continue;
        }
        match before.get(p) {
            Some((mode, oid)) => editor
                .upsert(p.as_str(), mode.kind(), *oid)
                .map_err(|e| fail(format!("place {p}"))(gix::Error::from_error(e)))?,
            None => editor
                .remove(p.as_str())
                .map_err(|e| fail(format!("remove {p}"))(gix::Error::from_error(e)))?,
        };
    }
    let tree = editor
        .write()
        .map_err(|e| fail("write the tree".into())(gix::Error::from_error(e)))?
        .detach();
    let id = crate::commit::signed(&repo, tree, r.head, r.message, key)?;
    repo.reference(
        reference.as_str(),
        id,
        PreviousValue::MustNotExist,
        "pl rollback --commit",
    )
    .map_err(|e| fail(format!("create {reference}"))(gix::Error::from_error(e)))?;
    Ok(id)
}

/// `now` with the change from `before` to `after` undone, line by line: each block `after`
/// changed, with a line of context each side, must be in `now` exactly once; `None` otherwise.
fn unpatch(before: &str, after: &str, now: &str) -> Option<String> {
    let old: Vec<&str> = after.split_inclusive('\n').collect();
    let new: Vec<&str> = before.split_inclusive('\n').collect();
    let ops = similar::capture_diff_slices(similar::Algorithm::Myers, &old, &new);
    let mut current: Vec<String> = now.split_inclusive('\n').map(str::to_owned).collect();
    for op in &ops {
        if matches!(op, similar::DiffOp::Equal { .. }) {
            continue;
        }
        let (o, n) = (op.old_range(), op.new_range());
        let lo = o.start.saturating_sub(1);
        let hi = (o.end + 1).min(old.len());
        let find: Vec<&str> = old[lo..hi].to_vec();
        let mut put: Vec<String> = old[lo..o.start].iter().map(|s| (*s).to_owned()).collect();
        put.extend(new[n.clone()].iter().map(|s| (*s).to_owned()));
        put.extend(old[o.end..hi].iter().map(|s| (*s).to_owned()));
        if find.is_empty() {
            return None;
        }
        let at: Vec<usize> = (0..=current.len().saturating_sub(find.len()))
            .filter(|&i| {
                current.len() >= find.len() && current[i..i + find.len()].iter().zip(&find).all(|(a, b)| a == b)
            })
            .collect();
        let [i] = at.as_slice() else {
            return None;
        };
        current.splice(*i..*i + find.len(), put);
    }
    Some(current.concat())
}

#[cfg(test)]
mod tests {
    use super::unpatch;

    #[test]
    fn a_change_is_undone_where_it_is_found_once_and_later_changes_stay() {
        let before = "image: a\nport: 8080\nreplicas: 2\n";
        let after = "image: b\nport: 8080\nreplicas: 2\n";
        let now = "image: b\nport: 8080\nreplicas: 3\n";
        assert_eq!(
            unpatch(before, after, now).as_deref(),
            Some("image: a\nport: 8080\nreplicas: 3\n")
        );
        // The changed line changed again since: a conflict.
        assert_eq!(unpatch(before, after, "image: c\nport: 8080\nreplicas: 3\n"), None);
        // A block found twice: a conflict, not a guess.
        let twice = "x\nimage: b\nport: 8080\nx\nimage: b\nport: 8080\n";
        assert_eq!(
            unpatch("x\nimage: a\nport: 8080\n", "x\nimage: b\nport: 8080\n", twice),
            None
        );
    }
}
