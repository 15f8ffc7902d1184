//! The mirror: a bare repository the local reconciler reads, whose `main` is the user's signed
//! commit (copied with its history) or a local revision of the state files of the working tree
//! (or of a commit) signed by `pl up`'s own key, with the images `--build` made; preview
//! branches follow the user's. Written through `state_repo::mirror` (gix and `ssh-key`): no
//! `git` or `ssh-keygen` program runs.

use super::local::{Local, Ports, Trust};
use anyhow::{Context, Result, anyhow, bail};
use state_repo::mirror::{LOCAL_NAME, LocalRevision, Mirror, read_local_key};
use state_repo::source::{Rev, StateRepo};
use std::path::Path;

/// In the state folder: the newest commit of `main` the local control plane accepted.
const ACCEPTED_FILE: &str = "accepted-main";

impl Local {
    fn mirror(&self) -> Result<Mirror> {
        Ok(Mirror::open_or_init(&self.path("mirror.git"))?)
    }

    /// The user's state tree (and the repository around it).
    fn user(&self) -> Result<StateRepo> {
        Ok(StateRepo::open(&self.repo)?)
    }

    /// Whether a revision was ever applied here (the mirror has a `main`).
    pub(crate) fn has_applied(&self) -> bool {
        self.path("mirror.git").exists()
            && self
                .mirror()
                .and_then(|m| Ok(m.head("refs/heads/main")?))
                .is_ok_and(|h| h.is_some())
    }

    /// Commits the state files of the working tree (or of `rev`) into the mirror's `main`,
    /// signed by the local key; nothing when the tree is the same as `main`'s. The new head,
    /// and whether it moved.
    pub(crate) fn commit_worktree(
        &self,
        leave_out: &[String],
        rev: Option<&str>,
        replace: &[(String, String)],
    ) -> Result<(String, bool)> {
        self.commit_to("refs/heads/main", leave_out, rev, replace)
    }

    /// The same, into the mirror's branch `reference`, without the files of `leave_out` and
    /// with the files of `replace` (`--build`'s image pins) in place of the user's. The files
    /// are the state files `pl validate` and `pl plan` read of the same side, so a local
    /// revision holds what a plan showed.
    pub(crate) fn commit_to(
        &self,
        reference: &str,
        leave_out: &[String],
        rev: Option<&str>,
        replace: &[(String, String)],
    ) -> Result<(String, bool)> {
        let user = self.user()?;
        let side = match rev {
            Some(r) => Rev::Commit(
                user.resolve(r)
                    .with_context(|| format!("{r} is not a commit of {}", self.repo.display()))?,
            ),
            None => Rev::WorkTree,
        };
        let listing = user.list(&side)?;
        let repo = user.thread_repo();
        let mut files: Vec<(String, Vec<u8>)> = Vec::with_capacity(listing.files.len());
        for entry in &listing.files {
            if leave_out.contains(&entry.path) || replace.iter().any(|(f, _)| *f == entry.path) {
                continue;
            }
            files.push((entry.path.clone(), user.read(repo.as_ref(), entry)?));
        }
        files.extend(replace.iter().map(|(f, text)| (f.clone(), text.as_bytes().to_vec())));
        let message = format!(
            "pl up: {} of {}{}",
            rev.unwrap_or("the working tree"),
            self.repo.display(),
            if replace.is_empty() {
                String::new()
            } else {
                format!(
                    ", with the images pl up --build made in {}",
                    replace.iter().map(|r| r.0.as_str()).collect::<Vec<_>>().join(", ")
                )
            }
        );
        let key = read_local_key(&self.path("local.key"))?;
        let (id, moved) = self.mirror()?.commit(
            &LocalRevision {
                reference,
                files: &files,
                message: &message,
            },
            &key,
        )?;
        Ok((id.to_string(), moved))
    }

    /// Preview branches: every branch of the user's repository that a pattern of the
    /// Repository's `previews.branches` matches goes to the mirror (a local revision of its
    /// tip, or the signed tip itself), and a mirrored one that is gone (or no longer matches;
    /// `pl down` passes no pattern) is deleted, so the
    /// reconciler deploys and tears down previews as on a fleet. Whether anything moved.
    pub(crate) fn sync_previews(&self, patterns: &[String], trust: &Trust, built: &Built) -> Result<bool> {
        let mut globs = globset::GlobSetBuilder::new();
        for p in patterns {
            globs.add(globset::Glob::new(p).map_err(|e| anyhow!("previews.branches: `{p}`: {e}"))?);
        }
        let globs = globs.build()?;
        let mirror = self.mirror()?;
        // A folder outside Git has no branches, so no previews.
        let theirs: Vec<String> = if self.in_git() {
            self.user()?
                .branches()?
                .into_iter()
                .map(|(b, _)| b)
                .filter(|b| b != "main" && globs.is_match(b))
                .collect()
        } else {
            Vec::new()
        };
        // Every mirrored branch but `main`: one no longer matching (or gone) is deleted.
        let ours: Vec<String> = mirror.branches()?.into_iter().filter(|b| b != "main").collect();
        let mut moved = false;
        for branch in &theirs {
            let reference = format!("refs/heads/{branch}");
            moved |= match trust {
                Trust::Local => {
                    let files = self.built_files(branch, built)?;
                    self.commit_to(&reference, &[], Some(branch), &files)?.1
                }
                Trust::Signed { .. } => {
                    let sha = self.fetch(branch)?;
                    let before = mirror.head(&reference)?;
                    mirror.set(&reference, sha)?;
                    before != Some(sha)
                }
            };
        }
        for branch in ours.iter().filter(|b| !theirs.contains(b)) {
            mirror.delete(&format!("refs/heads/{branch}"))?;
            moved = true;
        }
        Ok(moved)
    }

    /// Copies `rev` of the user's repository into the mirror with its history (no ref of ours
    /// moves); its id.
    pub(crate) fn fetch(&self, rev: &str) -> Result<state_repo::ObjectId> {
        let user = self.user()?;
        let commit = user
            .resolve(rev)
            .map_err(|_| anyhow!("{rev} is not a commit of {}", self.repo.display()))?;
        let repo = user
            .thread_repo()
            .ok_or_else(|| anyhow!("{} is not in a Git repository", self.repo.display()))?;
        self.mirror()?.import(&repo, commit.id)?;
        Ok(commit.id)
    }

    /// Points the mirror's `main` at the user's commit `rev`, as it is (the reconciler judges
    /// its signature, and refuses a history rewrite as the daemon does). The new head, whether
    /// it moved, and whether it replaces a local revision of `pl up`'s own (a `pl down`
    /// teardown) that it does not descend from: that rewrite is `pl up`'s to approve.
    pub(crate) fn apply_commit(&self, rev: &str) -> Result<(String, bool, bool)> {
        let sha = self.fetch(rev)?;
        let mirror = self.mirror()?;
        let before = mirror.head("refs/heads/main")?;
        if before == Some(sha) {
            return Ok((sha.to_string(), false, false));
        }
        let mut replaces_local = false;
        // A head the control plane rejected was never applied: a commit that replaces it (an
        // amended, now signed one) descends from what was last accepted, as the reconciler
        // asks, and is no rewrite. Only what was accepted counts.
        if let Some(b) = before
            && !mirror.is_ancestor(b, sha)?
        {
            // A local revision (committed by `pl up` with the state folder's key) left behind
            // is `pl up`'s to approve; a signed commit of yours is history the reconciler
            // keeps, unless the control plane never accepted it.
            if mirror.author_of(b)? == LOCAL_NAME {
                replaces_local = true;
            } else if !self
                .last_accepted()
                .is_some_and(|a| mirror.is_ancestor(a, sha).unwrap_or(false))
            {
                bail!(
                    "{rev} does not descend from what this local control plane applied last ({}, an older branch); start afresh by removing {} (its history goes with it)",
                    &b.to_string()[..12],
                    self.state.display()
                );
            }
        }
        mirror.set("refs/heads/main", sha)?;
        Ok((sha.to_string(), true, replaces_local))
    }

    /// The newest commit of `main` this control plane accepted, as `pl up` last read it
    /// ([`Local::remember_accepted`]); `None` before any, or when the file is unreadable.
    fn last_accepted(&self) -> Option<state_repo::ObjectId> {
        let text = std::fs::read_to_string(self.path(ACCEPTED_FILE)).ok()?;
        state_repo::ObjectId::from_hex(text.trim().as_bytes()).ok()
    }

    /// Records the newest commit of `main` the control plane accepted (from its revisions), so
    /// that a commit replacing a rejected one is not taken for a rewrite of applied history.
    pub(crate) fn remember_accepted(&self, client: &crate::client::Client) -> Result<()> {
        let revisions = client.revisions(Some("main"), 50)?.revisions;
        let newest = revisions
            .iter()
            .find(|r| r.verdict == operator_proto::revisions::Verdict::Accepted)
            .map(|r| r.sha.as_str());
        if let Some(sha) = newest {
            std::fs::write(self.path(ACCEPTED_FILE), format!("{sha}\n"))?;
        }
        Ok(())
    }

    /// `--build`: each image built and pushed to the local control plane's store (which must
    /// run), and the files that pin them in the local revision (none without `--build`).
    pub(crate) fn build(
        &self,
        builds: &[super::build::Build],
        state: &state_schema::state::State,
        rev: Option<&str>,
        socket: &Path,
        ports: Ports,
    ) -> Result<Built> {
        if builds.is_empty() {
            return Ok(Built::default());
        }
        let built = super::build::build_all(builds, &self.server(ports), socket)?;
        super::build::remember(&self.state, builds)?;
        let files = super::build::overrides(state, &built, |file| match rev {
            None => Ok(std::fs::read_to_string(self.repo.join(file))?),
            Some(r) => {
                let user = self.user()?;
                let commit = user.resolve(r)?;
                let entry = user
                    .entry_at(&commit, file)?
                    .ok_or_else(|| anyhow!("{file} is not in {r}"))?;
                let text = String::from_utf8(user.read(user.thread_repo().as_ref(), &entry)?)
                    .map_err(|_| anyhow!("{file} of {r} is not UTF-8"))?;
                Ok(text)
            }
        })?;
        Ok(Built { images: built, files })
    }

    /// The files of branch `branch`'s tip with `built`'s images in place of its projects': a
    /// preview of a built project runs the build, as main does.
    fn built_files(&self, branch: &str, built: &Built) -> Result<Vec<(String, String)>> {
        if built.images.is_empty() {
            return Ok(Vec::new());
        }
        let user = self.user()?;
        let commit = user.resolve(branch)?;
        let loaded = state_repo::load::load(&user, &Rev::Commit(commit.clone()))?;
        super::build::overrides(&loaded.state, &built.images, |file| {
            let entry = user
                .entry_at(&commit, file)?
                .ok_or_else(|| anyhow!("{file} is not in {branch}"))?;
            String::from_utf8(user.read(user.thread_repo().as_ref(), &entry)?)
                .map_err(|_| anyhow!("{file} of {branch} is not UTF-8"))
        })
    }
}

/// What `--build` made: each project's image, and main's files pointed at them.
#[derive(Default)]
pub(crate) struct Built {
    pub images: Vec<(String, state_schema::values::ImageRef)>,
    pub files: Vec<(String, String)>,
}
