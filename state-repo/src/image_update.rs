//! Writing one image update (`pl image update`, the daemon's `[image_updates]`): the file that
//! names the image, as it is at the commit written on, with the `image` scalar replaced where
//! Git has it (the file's other bytes kept), as a signed commit on a branch.

use crate::commit::{CommitError, Expect, commit_on_branch};
use crate::source::{Commit, SourceError, StateRepo};
use gix::ObjectId;
use ssh_key::PrivateKey;
use state_schema::state::images::Updatable;

#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error("{file}:{line}:{column}: no image scalar to replace at the commit written on")]
    NoScalar { file: String, line: u32, column: u32 },
}

/// Where an update goes: the branch, the commit it goes on, and where the branch must stand.
pub struct Target<'a> {
    pub branch: &'a str,
    pub parent: ObjectId,
    pub expect: Expect,
}

/// Writes `o`'s image as `image` (found as `tag`) on `to`, signed with `key`; returns the
/// branch's tip and whether a commit was written (none when the branch holds that change).
pub fn write(
    repo: &StateRepo,
    o: &Updatable,
    (image, tag): (&str, &str),
    to: &Target<'_>,
    key: &PrivateKey,
) -> Result<(ObjectId, bool), UpdateError> {
    let at = Commit {
        spec: to.parent.to_string(),
        id: to.parent,
    };
    let text = repo
        .entry_at(&at, &o.file)?
        .map(|e| repo.read(repo.thread_repo().as_ref(), &e))
        .transpose()?
        .and_then(|b| String::from_utf8(b).ok());
    let Some(edited) = text.and_then(|t| state_schema::edit::replace_scalar(&t, o.at, image)) else {
        return Err(UpdateError::NoScalar {
            file: o.file.clone(),
            line: o.at.line,
            column: o.at.column,
        });
    };
    let message = format!(
        "{}: image {tag}\n\n{} → {image}\n\nWritten under the policy's `imageUpdates` by Pushleft's image updates.\n",
        o.label, o.image
    );
    let path = format!("{}{}", repo.prefix(), o.file);
    Ok(commit_on_branch(
        repo.root(),
        to.branch,
        to.parent,
        &[(path, edited.into_bytes())],
        &message,
        key,
        to.expect,
    )?)
}
