//! The mirror `pl up` writes and its local reconciler reads: a bare repository whose `main` is
//! either a commit of the user's, copied with its history as it is (the reconciler judges its
//! signature), or a *local revision*: the state files of the working tree (or of a commit),
//! committed and signed by `pl up`'s own SSH key, which only the local control plane trusts.
//!
//! Through gix and `ssh-key` alone: no `git` or `ssh-keygen` program runs. A local revision is
//! signed as `git commit -S` with `gpg.format=ssh` signs (an `SshSig` in the `git` namespace
//! over the commit without its `gpgsig` header), so the reconciler's ordinary trust check,
//! the one that judges a fleet's commits, judges it too.

use gix::ObjectId;
use gix::objs::tree::EntryKind;
use gix::objs::{Kind, Write as _};
use gix::refs::transaction::PreviousValue;
use ssh_key::{HashAlg, LineEnding, PrivateKey, SshSig};
use std::collections::BTreeSet;
use std::path::Path;

/// Who local revisions are by.
pub const LOCAL_NAME: &str = "pl up";
pub const LOCAL_EMAIL: &str = "pl-up@localhost";

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("the mirror at {path}: {what}")]
    Git {
        path: String,
        what: String,
        #[source]
        source: gix::Error,
    },
    #[error("signing a local revision: {0}")]
    Sign(#[from] ssh_key::Error),
    #[error("the local key {path}: {source}")]
    Key {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the OS random source: {0}")]
    Random(String),
}

/// A local revision to write: which branch, what files, and the message.
pub struct LocalRevision<'a> {
    /// The full reference (`refs/heads/main`).
    pub reference: &'a str,
    /// `/`-separated paths under the state tree's root, with their contents.
    pub files: &'a [(String, Vec<u8>)],
    pub message: &'a str,
}

/// The mirror, open.
pub struct Mirror {
    repo: gix::Repository,
}

impl Mirror {
    /// Opens the bare repository at `path`, made first (its `HEAD` names `main`) when missing.
    pub fn open_or_init(path: &Path) -> Result<Mirror, MirrorError> {
        let fail = |what: &str| {
            let (path, what) = (path.display().to_string(), what.to_owned());
            move |source| MirrorError::Git { path, what, source }
        };
        let repo = if path.join("HEAD").exists() {
            gix::open(path).map_err(fail("open"))?
        } else {
            gix::init_bare(path).map_err(fail("create"))?
        };
        Ok(Mirror { repo })
    }

    fn fail(&self, what: impl Into<String>) -> impl FnOnce(gix::Error) -> MirrorError {
        let (path, what) = (self.repo.path().display().to_string(), what.into());
        move |source| MirrorError::Git { path, what, source }
    }

    /// The commit `reference` points at, if it exists.
    pub fn head(&self, reference: &str) -> Result<Option<ObjectId>, MirrorError> {
        let found = self
            .repo
            .try_find_reference(reference)
            .map_err(self.fail(format!("read {reference}")))?;
        Ok(match found {
            Some(mut r) => Some(r.peel_to_id().map_err(self.fail(format!("peel {reference}")))?.detach()),
            None => None,
        })
    }

    /// The short names of the mirror's branches (`refs/heads/*`).
    pub fn branches(&self) -> Result<Vec<String>, MirrorError> {
        let platform = self.repo.references().map_err(self.fail("list references"))?;
        let mut out = Vec::new();
        for r in platform.local_branches().map_err(self.fail("list branches"))? {
            let r = r.map_err(self.fail("read a branch"))?;
            out.push(r.name().shorten().to_string());
        }
        out.sort();
        Ok(out)
    }

    /// Points `reference` at `id` (an object the mirror holds).
    pub fn set(&self, reference: &str, id: ObjectId) -> Result<(), MirrorError> {
        self.repo
            .reference(reference, id, PreviousValue::Any, "pl up")
            .map_err(self.fail(format!("set {reference}")))?;
        Ok(())
    }

    /// Deletes `reference`, if it exists.
    pub fn delete(&self, reference: &str) -> Result<(), MirrorError> {
        if let Some(r) = self
            .repo
            .try_find_reference(reference)
            .map_err(self.fail(format!("read {reference}")))?
        {
            r.delete().map_err(self.fail(format!("delete {reference}")))?;
        }
        Ok(())
    }

    /// Whether `ancestor` is `descendant` or one of its ancestors.
    pub fn is_ancestor(&self, ancestor: ObjectId, descendant: ObjectId) -> Result<bool, MirrorError> {
        if ancestor == descendant {
            return Ok(true);
        }
        let base = self
            .repo
            .merge_base(ancestor, descendant)
            .map_err(self.fail("the merge base"))?;
        Ok(base.is_some_and(|b| b.detach() == ancestor))
    }

    /// The author's name of commit `id`.
    pub fn author_of(&self, id: ObjectId) -> Result<String, MirrorError> {
        let commit = self.repo.find_commit(id).map_err(self.fail(format!("read {id}")))?;
        let author = commit.author().map_err(self.fail(format!("the author of {id}")))?;
        Ok(author.name.to_string())
    }

    /// Copies commit `tip` of `from` into the mirror, with every ancestor, tree and blob the
    /// mirror does not hold yet (a local fetch: the walk stops at commits it has).
    pub fn import(&self, from: &gix::Repository, tip: ObjectId) -> Result<(), MirrorError> {
        let mut commits = vec![tip];
        let mut seen = BTreeSet::new();
        while let Some(id) = commits.pop() {
            if !seen.insert(id) || self.repo.has_object(id) {
                continue;
            }
            let commit = from.find_commit(id).map_err(self.fail(format!("read {id} to copy")))?;
            let tree = commit
                .tree_id()
                .map_err(self.fail(format!("the tree of {id}")))?
                .detach();
            self.import_tree(from, tree)?;
            commits.extend(commit.parent_ids().map(gix::Id::detach));
            self.repo
                .write_buf(Kind::Commit, &commit.data)
                .map_err(self.fail(format!("write {id}")))?;
        }
        Ok(())
    }

    fn import_tree(&self, from: &gix::Repository, id: ObjectId) -> Result<(), MirrorError> {
        if self.repo.has_object(id) {
            return Ok(());
        }
        let tree = from
            .find_tree(id)
            .map_err(self.fail(format!("read tree {id} to copy")))?;
        for entry in tree.iter() {
            let entry = entry.map_err(|e| MirrorError::Git {
                path: self.repo.path().display().to_string(),
                what: format!("an entry of tree {id}"),
                source: gix::Error::from_error(e),
            })?;
            let oid = entry.oid().to_owned();
            match entry.mode().kind() {
                EntryKind::Tree => self.import_tree(from, oid)?,
                // A submodule's commit lives in another repository.
                EntryKind::Commit => {}
                _ if self.repo.has_object(oid) => {}
                _ => {
                    let blob = from
                        .find_blob(oid)
                        .map_err(self.fail(format!("read blob {oid} to copy")))?;
                    self.repo
                        .write_buf(Kind::Blob, &blob.data)
                        .map_err(self.fail(format!("write blob {oid}")))?;
                }
            }
        }
        self.repo
            .write_buf(Kind::Tree, &tree.data)
            .map_err(self.fail(format!("write tree {id}")))?;
        Ok(())
    }

    /// Writes `rev` as a commit on its reference, signed with `key`, unless its tree is the
    /// tree the reference has: the head, and whether it moved.
    pub fn commit(&self, rev: &LocalRevision<'_>, key: &PrivateKey) -> Result<(ObjectId, bool), MirrorError> {
        let mut editor = self.repo.empty_tree().edit().map_err(self.fail("start a tree"))?;
        for (path, bytes) in rev.files {
            let blob = self
                .repo
                .write_blob(bytes)
                .map_err(self.fail(format!("write {path}")))?;
            editor
                .upsert(path.as_str(), EntryKind::Blob, blob)
                .map_err(self.fail(format!("place {path}")))?;
        }
        let tree = editor.write().map_err(self.fail("write the tree"))?.detach();
        let parent = self.head(rev.reference)?;
        if let Some(p) = parent {
            let c = self.repo.find_commit(p).map_err(self.fail(format!("read {p}")))?;
            if c.tree_id().map_err(self.fail(format!("the tree of {p}")))? == tree {
                return Ok((p, false));
            }
        }
        let who = gix::actor::Signature {
            name: LOCAL_NAME.into(),
            email: LOCAL_EMAIL.into(),
            time: gix::date::Time::now_utc(),
        };
        let mut commit = gix::objs::Commit {
            tree,
            parents: parent.into_iter().collect(),
            author: who.clone(),
            committer: who,
            encoding: None,
            message: rev.message.into(),
            extra_headers: Vec::new(),
        };
        let mut payload = Vec::new();
        gix::objs::WriteTo::write_to(&commit, &mut payload).map_err(|e| MirrorError::Git {
            path: self.repo.path().display().to_string(),
            what: "serialize the commit".into(),
            source: gix::Error::from_error(e),
        })?;
        let signature = SshSig::sign(key, "git", HashAlg::Sha512, &payload)?.to_pem(LineEnding::LF)?;
        commit
            .extra_headers
            .push(("gpgsig".into(), signature.trim_end().into()));
        let id = self
            .repo
            .write_object(&commit)
            .map_err(self.fail("write the commit"))?
            .detach();
        self.set(rev.reference, id)?;
        Ok((id, true))
    }
}

/// Makes `pl up`'s own signing key at `path` (an Ed25519 key in OpenSSH's format, 0600) and
/// returns its public line (`ssh-ed25519 AAAA… comment`).
pub fn new_local_key(path: &Path, comment: &str) -> Result<String, MirrorError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| MirrorError::Random(e.to_string()))?;
    let pair = ssh_key::private::Ed25519Keypair::from_seed(&seed);
    zeroize::Zeroize::zeroize(&mut seed);
    let mut key = PrivateKey::from(pair);
    key.set_comment(comment);
    key.write_openssh_file(path, LineEnding::LF)?;
    Ok(key.public_key().to_openssh()?)
}

/// Reads `pl up`'s signing key.
pub fn read_local_key(path: &Path) -> Result<PrivateKey, MirrorError> {
    Ok(PrivateKey::read_openssh_file(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::StateRepo;
    use crate::trust::allowed_signers;

    fn files(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        pairs
            .iter()
            .map(|(p, t)| ((*p).to_owned(), t.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn a_local_revision_is_signed_so_the_reconcilers_own_check_and_git_accept_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let public = new_local_key(&dir.path().join("local.key"), "pl-up-local").expect("key");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("local.key"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "the key is for its owner alone: {mode:o}");
        let key = read_local_key(&dir.path().join("local.key")).expect("read key");
        let mirror_dir = dir.path().join("mirror.git");
        let mirror = Mirror::open_or_init(&mirror_dir).expect("mirror");
        let rev = LocalRevision {
            reference: "refs/heads/main",
            files: &files(&[("a.yaml", "a: 1\n"), ("envs/b.yaml", "b: 2\n")]),
            message: "pl up: the working tree",
        };
        let (first, moved) = mirror.commit(&rev, &key).expect("commit");
        assert!(moved);
        assert_eq!(mirror.head("refs/heads/main").expect("head"), Some(first));
        // The same files again: nothing moves.
        assert_eq!(mirror.commit(&rev, &key).expect("again"), (first, false));
        let second = mirror
            .commit(
                &LocalRevision {
                    files: &files(&[("a.yaml", "a: 2\n")]),
                    ..rev
                },
                &key,
            )
            .expect("second")
            .0;
        assert!(mirror.is_ancestor(first, second).expect("ancestry"));
        assert!(!mirror.is_ancestor(second, first).expect("ancestry"));
        assert_eq!(mirror.author_of(second).expect("author"), LOCAL_NAME);

        // The reconciler's check: signed by the key the allowed signers name.
        let signers = allowed_signers::parse(&format!("pl-up-local {public}\n")).expect("signers");
        let repo = StateRepo::open(&mirror_dir).expect("open");
        let verdict = repo.verify_commit(second, &signers, &[], None, None).expect("verify");
        assert!(verdict.result.is_ok(), "{:?}", verdict.result);
        let stranger = new_local_key(&dir.path().join("other.key"), "other").expect("key");
        let others = allowed_signers::parse(&format!("someone {stranger}\n")).expect("signers");
        let verdict = repo.verify_commit(second, &others, &[], None, None).expect("verify");
        assert!(verdict.result.is_err(), "another key is not trusted");

        // Git itself reads the same signature and objects, where its tools are installed.
        let signers_file = dir.path().join("allowed_signers");
        std::fs::write(&signers_file, format!("pl-up-local {public}\n")).expect("write");
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .arg("--git-dir")
                .arg(&mirror_dir)
                .arg("-c")
                .arg(format!("gpg.ssh.allowedSignersFile={}", signers_file.display()))
                .args(args)
                .output()
        };
        if let Ok(out) = git(&["verify-commit", &second.to_string()]) {
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "git verify-commit: {said}");
            assert!(said.contains("Good \"git\" signature"), "{said}");
            let fsck = git(&["fsck", "--strict"]).expect("fsck");
            assert!(fsck.status.success(), "{}", String::from_utf8_lossy(&fsck.stderr));
            let show = git(&["show", &format!("{second}:a.yaml")]).expect("show");
            assert_eq!(show.stdout, b"a: 2\n");
        }
    }

    #[test]
    fn import_copies_a_commit_with_its_history_and_stops_at_what_the_mirror_has() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key_path = dir.path().join("k");
        new_local_key(&key_path, "k").expect("key");
        let key = read_local_key(&key_path).expect("key");
        // A "user" repository with two commits, made through the same writer.
        let user_dir = dir.path().join("user.git");
        let user = Mirror::open_or_init(&user_dir).expect("user");
        let one = user
            .commit(
                &LocalRevision {
                    reference: "refs/heads/main",
                    files: &files(&[("x/y.yaml", "y\n")]),
                    message: "one",
                },
                &key,
            )
            .expect("one")
            .0;
        let two = user
            .commit(
                &LocalRevision {
                    reference: "refs/heads/main",
                    files: &files(&[("x/y.yaml", "y\n"), ("z.yaml", "z\n")]),
                    message: "two",
                },
                &key,
            )
            .expect("two")
            .0;
        let mirror = Mirror::open_or_init(&dir.path().join("m.git")).expect("mirror");
        let from = gix::open(&user_dir).expect("open user");
        mirror.import(&from, two).expect("import");
        mirror.set("refs/heads/main", two).expect("set");
        assert!(
            mirror.is_ancestor(one, two).expect("ancestry"),
            "the history came along"
        );
        assert_eq!(mirror.branches().expect("branches"), ["main"]);
        mirror.set("refs/heads/feature", one).expect("set");
        mirror.delete("refs/heads/feature").expect("delete");
        mirror
            .delete("refs/heads/feature")
            .expect("deleting what is gone is fine");
        assert_eq!(mirror.branches().expect("branches"), ["main"]);
        let tree = mirror.repo.find_commit(two).expect("commit").tree().expect("tree");
        let entry = tree.lookup_entry_by_path("x/y.yaml").expect("lookup").expect("there");
        assert_eq!(entry.object().expect("blob").data, b"y\n");
    }
}
