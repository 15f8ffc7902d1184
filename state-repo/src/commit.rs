//! A signed commit of changed files on top of a commit, written through gix and `ssh-key`
//! alone (no `git` program), signed like `git commit -S` with `gpg.format=ssh`; and a branch
//! pointed at it. `pl rollback --commit`'s revert and `pl image update` write with it; the
//! work tree, the index and the branch checked out are never touched unless asked for.

use gix::ObjectId;
use gix::objs::tree::EntryKind;
use gix::refs::transaction::PreviousValue;
use ssh_key::{HashAlg, LineEnding, PrivateKey, SshSig};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("the repository at {path}: {what}: {detail}")]
    Git { path: String, what: String, detail: String },
    #[error("git's configuration names no {0} (`git config user.name` / `user.email`)")]
    NoIdentity(&'static str),
    #[error("signing the commit: {0}")]
    Sign(#[from] ssh_key::Error),
}

fn git(repo: &gix::Repository, what: impl Into<String>) -> impl FnOnce(gix::Error) -> CommitError {
    let (path, what) = (repo.path().display().to_string(), what.into());
    move |e| CommitError::Git {
        path,
        what,
        detail: e.to_string(),
    }
}

/// The commit of `tree` on `parent`, by the author git's configuration names, signed with
/// `key` (an SSH signature in its `gpgsig` header), written.
pub(crate) fn signed(
    repo: &gix::Repository,
    tree: ObjectId,
    parent: ObjectId,
    message: &str,
    key: &PrivateKey,
) -> Result<ObjectId, CommitError> {
    let config = repo.config_snapshot();
    let name = config.string("user.name").ok_or(CommitError::NoIdentity("user.name"))?;
    let email = config
        .string("user.email")
        .ok_or(CommitError::NoIdentity("user.email"))?;
    let who = gix::actor::Signature {
        name: name.to_vec().into(),
        email: email.to_vec().into(),
        time: gix::date::Time::now_utc(),
    };
    let mut commit = gix::objs::Commit {
        tree,
        parents: vec![parent].into(),
        author: who.clone(),
        committer: who,
        encoding: None,
        message: message.into(),
        extra_headers: Vec::new(),
    };
    let mut payload = Vec::new();
    gix::objs::WriteTo::write_to(&commit, &mut payload)
        .map_err(|e| git(repo, "serialize the commit")(gix::Error::from_error(e)))?;
    let signature = SshSig::sign(key, "git", HashAlg::Sha512, &payload)?.to_pem(LineEnding::LF)?;
    commit
        .extra_headers
        .push(("gpgsig".into(), signature.trim_end().into()));
    Ok(repo
        .write_object(&commit)
        .map_err(|e| git(repo, "write the commit")(gix::Error::from_error(e)))?
        .detach())
}

/// Where a branch stood before [`commit_on_branch`] moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Anywhere, or nowhere yet (a branch of the writer's own, moved each time).
    Any,
    /// Exactly at this commit: a branch others write too (the applied branch) only moves
    /// forward from where it was decided against.
    At(ObjectId),
}

/// `files` over `parent`'s tree, as a signed commit that `branch` then points at; unless the
/// branch's tip already is that change on that parent (written before, nothing new): then
/// nothing is written. Returns the branch's tip and whether it was written now.
pub fn commit_on_branch(
    dir: &Path,
    branch: &str,
    parent: ObjectId,
    files: &[(String, Vec<u8>)],
    message: &str,
    key: &PrivateKey,
    expect: Expect,
) -> Result<(ObjectId, bool), CommitError> {
    let repo = open(dir)?;
    let tree = tree_with(&repo, parent, files)?;
    let reference = format!("refs/heads/{branch}");
    let tip = repo
        .try_find_reference(reference.as_str())
        .map_err(|e| git(&repo, "read references")(gix::Error::from_error(e)))?
        .and_then(|r| r.target().try_id().map(|id| id.to_owned()));
    if let Some(tip) = tip
        && let Ok(c) = repo.find_commit(tip)
        && c.parent_ids().map(|p| p.detach()).eq([parent])
        && c.tree_id().is_ok_and(|t| t.detach() == tree)
    {
        return Ok((tip, false));
    }
    let id = signed(&repo, tree, parent, message, key)?;
    let previous = match expect {
        Expect::Any => PreviousValue::Any,
        Expect::At(at) => PreviousValue::MustExistAndMatch(gix::refs::Target::Object(at)),
    };
    repo.reference(reference.as_str(), id, previous, "pushleft: signed update")
        .map_err(|e| git(&repo, format!("point {reference}"))(gix::Error::from_error(e)))?;
    Ok((id, true))
}

fn open(dir: &Path) -> Result<gix::Repository, CommitError> {
    gix::discover(dir).map_err(|e| CommitError::Git {
        path: dir.display().to_string(),
        what: "open".into(),
        detail: e.to_string(),
    })
}

/// `parent`'s tree with `files` written over it, written.
fn tree_with(repo: &gix::Repository, parent: ObjectId, files: &[(String, Vec<u8>)]) -> Result<ObjectId, CommitError> {
    let tree = repo
        .find_commit(parent)
        .map_err(|e| git(repo, format!("read commit {parent}"))(gix::Error::from_error(e)))?
        .tree_id()
        .map_err(|e| git(repo, format!("the tree of {parent}"))(gix::Error::from_error(e)))?
        .detach();
    let mut editor = repo
        .edit_tree(tree)
        .map_err(|e| git(repo, "start a tree")(gix::Error::from_error(e)))?;
    for (path, text) in files {
        let blob = repo
            .write_blob(text)
            .map_err(|e| git(repo, format!("write {path}"))(gix::Error::from_error(e)))?
            .detach();
        editor
            .upsert(path.as_str(), EntryKind::Blob, blob)
            .map_err(|e| git(repo, format!("place {path}"))(gix::Error::from_error(e)))?;
    }
    Ok(editor
        .write()
        .map_err(|e| git(repo, "write the tree")(gix::Error::from_error(e)))?
        .detach())
}
