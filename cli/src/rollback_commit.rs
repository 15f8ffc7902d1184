//! `pl rollback ENV --commit [-C DIR] [--signing-key FILE]`: the GitOps rollback, for when the
//! repository is the only authority: a signed commit that reverts the commit which brought the
//! environment's current release, on a branch of its own (`pl-rollback/<env>`) on top of
//! `HEAD`, so that merging or pushing it is the rollback, through the same trust checks as any
//! other commit. Nothing is pushed, no control plane is asked, and the work tree, index and
//! current branch are left as they are.
//!
//! Which commit: walking the first parents back from `HEAD`, the environment's release (its
//! image, variables and project roles: `state_schema::release`) at each commit, to the one
//! whose parent has another release (the previous one). It is reverted by `state_repo::revert`
//! (gix and `ssh-key`: no `git` program), signed with the user's own SSH signing key (git's
//! `user.signingkey`, or `--signing-key`), and the result is checked before the command says
//! so: the new commit must give the previous release. Later changes to the environment (a
//! scale, say) stay.

use anyhow::{Result, anyhow};
use state_repo::revert::{self, Revert};
use state_repo::source::{Commit, Rev, StateRepo};
use state_schema::release::Releases;
use std::path::{Path, PathBuf};

/// How far back the walk looks for the previous release.
const MAX_WALK: usize = 500;

/// The release of `env` in the state at `rev`; `None` where it is not declared.
fn release_at(repo: &StateRepo, rev: &Rev, env: &str) -> Result<Option<String>> {
    let loaded = state_repo::load::load(repo, rev)?;
    let Some((_, e)) = loaded.state.environments().find(|(n, _)| n.as_str() == env) else {
        return Ok(None);
    };
    Ok(Releases::new(&loaded.state).release_hash(e))
}

fn parent(repo: &StateRepo, c: &Commit) -> Option<Commit> {
    repo.resolve(&format!("{}^", c.id)).ok()
}

/// The signing key: `--signing-key`, or git's `user.signingkey` (a public key's path names its
/// private key beside it, as `ssh-keygen` writes them). An unencrypted OpenSSH private key.
pub(crate) fn signing_key(repo: &StateRepo, flag: Option<&Path>) -> Result<ssh_key::PrivateKey> {
    let path = match flag {
        Some(p) => p.to_owned(),
        None => {
            let named = repo
                .thread_repo()
                .and_then(|r| r.config_snapshot().string("user.signingkey").map(|v| v.to_string()))
                .ok_or_else(|| anyhow!("no signing key: pass --signing-key FILE, or set git's user.signingkey"))?;
            let named = named.strip_prefix("~/").map_or_else(
                || PathBuf::from(&named),
                |rest| std::env::var_os("HOME").map_or_else(|| PathBuf::from(&named), |h| PathBuf::from(h).join(rest)),
            );
            match named.extension().is_some_and(|e| e == "pub") {
                true => named.with_extension(""),
                false => named,
            }
        }
    };
    let key = state_repo::mirror::read_local_key(&path)
        .map_err(|e| anyhow!("the signing key {}: {e} (an OpenSSH private key file)", path.display()))?;
    if key.is_encrypted() {
        return Err(anyhow!(
            "the signing key {} is encrypted; pass an unencrypted one with --signing-key",
            path.display()
        ));
    }
    Ok(key)
}

pub fn rollback_commit(dir: &Path, environment: &str, signing_key_file: Option<&Path>) -> Result<u8> {
    let repo = StateRepo::open(dir)?;
    let head = repo.resolve("HEAD")?;
    let Some(current) = release_at(&repo, &Rev::Commit(head.clone()), environment)? else {
        eprintln!("pl rollback --commit: error[unknown-environment]: {environment} is not declared at HEAD");
        return Ok(1);
    };
    // Back along the first parents to the commit that brought the current release.
    let mut at = head.clone();
    let mut walked = 0;
    let (brought, previous) = loop {
        walked += 1;
        if walked > MAX_WALK {
            eprintln!(
                "pl rollback --commit: error[history-too-deep]: no previous release of {environment} within {MAX_WALK} commits"
            );
            return Ok(1);
        }
        let Some(p) = parent(&repo, &at) else {
            eprintln!(
                "pl rollback --commit: error[no-previous-release]: {environment} had no other release before this one in this branch's history"
            );
            return Ok(1);
        };
        match release_at(&repo, &Rev::Commit(p.clone()), environment)? {
            Some(b) if b == current => at = p,
            Some(b) => break (at, b),
            None => {
                eprintln!(
                    "pl rollback --commit: error[no-previous-release]: {environment} was first declared in {}; there is no release before it",
                    &at.id.to_string()[..12]
                );
                return Ok(1);
            }
        }
    };
    let key = signing_key(&repo, signing_key_file)?;
    let branch = format!("pl-rollback/{environment}");
    let subject = brought_subject(&repo, &brought);
    let message = format!(
        "Roll {environment} back to its previous release\n\nReverts {} ({subject}).\n\nWritten by `pl rollback --commit`.\n",
        brought.id
    );
    let written = revert::write(
        dir,
        &Revert {
            head: head.id,
            reverted: brought.id,
            branch: &branch,
            message: &message,
        },
        &key,
    );
    let id = match written {
        Ok(id) => id,
        Err(e @ revert::RevertError::Conflict { .. }) => {
            eprintln!("pl rollback --commit: error[revert-conflict]: {e}; nothing was written");
            return Ok(1);
        }
        Err(e @ revert::RevertError::BranchExists(_)) => {
            eprintln!("pl rollback --commit: error[branch-exists]: {e}; delete it or merge it first");
            return Ok(1);
        }
        Err(e) => return Err(e.into()),
    };
    // What it says must be true: the new commit gives the previous release.
    let written = Commit {
        spec: branch.clone(),
        id,
    };
    if release_at(&repo, &Rev::Commit(written), environment)?.as_deref() != Some(previous.as_str()) {
        eprintln!(
            "pl rollback --commit: error[revert-incomplete]: {branch} ({}) does not give {environment}'s previous release back; delete the branch",
            &id.to_string()[..12]
        );
        return Ok(1);
    }
    println!(
        "{environment}: wrote {branch} ({}), reverting {} ({subject}), signed; merge or push it to roll {environment} back",
        &id.to_string()[..12],
        &brought.id.to_string()[..12]
    );
    Ok(0)
}

/// A commit's subject line (its message's first line).
fn brought_subject(repo: &StateRepo, c: &Commit) -> String {
    repo.thread_repo()
        .and_then(|r| r.find_commit(c.id).ok().map(|c| c.message_raw_sloppy().to_string()))
        .and_then(|m| m.lines().next().map(str::to_owned))
        .unwrap_or_default()
}
