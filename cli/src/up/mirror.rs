//! The mirror: a bare repository the local reconciler reads, whose `main` is the user's signed
//! commit or a local revision of the working tree signed by `pl up`'s own key, with the images
//! `--build` made; preview branches follow the user's. (Through the `git` program: moving it to
//! gix and `ssh-key`'s `SshSig` is open work.)

use super::local::{Local, Ports, Trust};
use super::processes::{run, run_with_input};
use anyhow::{Result, anyhow, bail};
use std::path::Path;
use std::process::Command;

pub(crate) fn git(mirror: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("--git-dir")
        .arg(mirror)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "pl up")
        .env("GIT_AUTHOR_EMAIL", "pl-up@localhost")
        .env("GIT_COMMITTER_NAME", "pl up")
        .env("GIT_COMMITTER_EMAIL", "pl-up@localhost");
    c
}

impl Local {
    /// Whether a revision was ever applied here (the mirror has a `main`).
    pub(crate) fn has_applied(&self) -> bool {
        self.path("mirror.git").exists()
            && run(git(&self.path("mirror.git")).args(["rev-parse", "-q", "--verify", "refs/heads/main"])).is_ok()
    }

    /// Commits `tree_from` (the working tree) into the mirror's `main`, signed by the local
    /// key; nothing when the tree is the same as `main`'s. The new head, and whether it moved.
    pub(crate) fn commit_worktree(
        &self,
        leave_out: &[String],
        rev: Option<&str>,
        replace: &[(String, String)],
    ) -> Result<(String, bool)> {
        self.commit_to("refs/heads/main", leave_out, rev, replace)
    }

    /// The same, into the mirror's branch `reference`, with the files of `replace` (`--build`'s
    /// image pins) in place of the user's.
    pub(crate) fn commit_to(
        &self,
        reference: &str,
        leave_out: &[String],
        rev: Option<&str>,
        replace: &[(String, String)],
    ) -> Result<(String, bool)> {
        let mirror = self.path("mirror.git");
        let index = self.path("index");
        let _ = std::fs::remove_file(&index);
        match rev {
            // A commit's tree: fetched into the mirror, then read into the index.
            Some(rev) => {
                let sha = self.fetch(rev)?;
                run(git(&mirror)
                    .args(["read-tree", &format!("{sha}^{{tree}}")])
                    .env("GIT_INDEX_FILE", &index))?;
            }
            None => {
                run(git(&mirror)
                    .arg("--work-tree")
                    .arg(&self.repo)
                    .args(["add", "-A", "."])
                    .env("GIT_INDEX_FILE", &index))?;
            }
        }
        for file in leave_out {
            run(git(&mirror)
                .args(["rm", "-q", "--cached", "--", file])
                .env("GIT_INDEX_FILE", &index))?;
        }
        for (file, text) in replace {
            let blob = run_with_input(git(&mirror).args(["hash-object", "-w", "--stdin"]), text.as_bytes())?;
            run(git(&mirror)
                .args(["update-index", "--add", "--cacheinfo"])
                .arg(format!("100644,{blob},{file}"))
                .env("GIT_INDEX_FILE", &index))?;
        }
        let tree = run(git(&mirror).arg("write-tree").env("GIT_INDEX_FILE", &index))?;
        let parent = run(git(&mirror).args(["rev-parse", "-q", "--verify", reference])).ok();
        if let Some(p) = &parent
            && run(git(&mirror).args(["rev-parse", &format!("{p}^{{tree}}")]))? == tree
        {
            return Ok((p.clone(), false));
        }
        let mut commit = git(&mirror);
        commit
            .args(["-c", "gpg.format=ssh", "-c"])
            .arg(format!("user.signingkey={}", self.path("local.key").display()))
            .args(["commit-tree", &tree, "-S", "-m"])
            .arg(format!(
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
            ));
        if let Some(p) = &parent {
            commit.args(["-p", p]);
        }
        let sha = run(&mut commit)?;
        run(git(&mirror).args(["update-ref", reference, &sha]))?;
        Ok((sha, true))
    }

    /// Preview branches: every branch of the user's repository that a pattern of the
    /// Repository's `previews.branches` matches goes to the mirror (a local revision of its
    /// tip, or the signed tip itself), and a mirrored one that is gone (or no longer matches;
    /// `pl down` passes no pattern) is deleted, so the
    /// reconciler deploys and tears down previews as on a fleet. Whether anything moved.
    pub(crate) fn sync_previews(&self, patterns: &[String], trust: &Trust) -> Result<bool> {
        let mut globs = globset::GlobSetBuilder::new();
        for p in patterns {
            globs.add(globset::Glob::new(p).map_err(|e| anyhow!("previews.branches: `{p}`: {e}"))?);
        }
        let globs = globs.build()?;
        let list = |cmd: &mut Command| -> Result<Vec<String>> {
            Ok(
                run(cmd.args(["for-each-ref", "--format=%(refname:short)", "refs/heads"]))?
                    .lines()
                    .filter(|b| *b != "main")
                    .map(str::to_owned)
                    .collect(),
            )
        };
        let mirror = self.path("mirror.git");
        // A folder outside Git has no branches, so no previews.
        let theirs: Vec<String> = if self.in_git() {
            list(Command::new("git").arg("-C").arg(&self.repo))?
                .into_iter()
                .filter(|b| globs.is_match(b))
                .collect()
        } else {
            Vec::new()
        };
        // Every mirrored branch but `main`: one no longer matching (or gone) is deleted.
        let ours = list(&mut git(&mirror))?;
        let mut moved = false;
        for branch in &theirs {
            let reference = format!("refs/heads/{branch}");
            moved |= match trust {
                Trust::Local => self.commit_to(&reference, &[], Some(branch), &[])?.1,
                Trust::Signed { .. } => {
                    let sha = self.fetch(branch)?;
                    let before = run(git(&mirror).args(["rev-parse", "-q", "--verify", &reference])).ok();
                    run(git(&mirror).args(["update-ref", &reference, &sha]))?;
                    before.as_deref() != Some(sha.as_str())
                }
            };
        }
        for branch in ours.iter().filter(|b| !theirs.contains(b)) {
            run(git(&mirror).args(["update-ref", "-d", &format!("refs/heads/{branch}")]))?;
            moved = true;
        }
        Ok(moved)
    }

    /// Fetches `rev` of the user's repository into the mirror (no ref of ours moves); its sha.
    pub(crate) fn fetch(&self, rev: &str) -> Result<String> {
        let sha = run(Command::new("git").arg("-C").arg(&self.repo).args([
            "rev-parse",
            "--verify",
            "-q",
            &format!("{rev}^{{commit}}"),
        ]))
        .map_err(|_| anyhow!("{rev} is not a commit of {}", self.repo.display()))?;
        run(git(&self.path("mirror.git"))
            .args(["fetch", "-q", "--no-tags"])
            .arg(&self.repo)
            .arg(&sha))?;
        Ok(sha)
    }

    /// Points the mirror's `main` at the user's commit `rev`, as it is (the reconciler judges
    /// its signature, and refuses a history rewrite as the daemon does). The new head, whether
    /// it moved, and whether it replaces a local revision of `pl up`'s own (a `pl down`
    /// teardown) that it does not descend from: that rewrite is `pl up`'s to approve.
    pub(crate) fn apply_commit(&self, rev: &str) -> Result<(String, bool, bool)> {
        let sha = self.fetch(rev)?;
        let mirror = self.path("mirror.git");
        let before = run(git(&mirror).args(["rev-parse", "-q", "--verify", "refs/heads/main"])).ok();
        if before.as_deref() == Some(sha.as_str()) {
            return Ok((sha, false, false));
        }
        let mut replaces_local = false;
        if let Some(b) = &before
            && !git(&mirror)
                .args(["merge-base", "--is-ancestor", b, &sha])
                .status()
                .is_ok_and(|s| s.success())
        {
            // Only a local revision (committed by `pl up` with the state folder's key) may be
            // left behind; a signed commit of yours is history the reconciler keeps.
            let author = run(git(&mirror).args(["log", "-1", "--format=%an", b])).unwrap_or_default();
            if author != "pl up" {
                bail!(
                    "{rev} does not descend from what this local control plane applied last ({}, an older branch); start afresh by removing {} (its history goes with it)",
                    &b[..12],
                    self.state.display()
                );
            }
            replaces_local = true;
        }
        run(git(&mirror).args(["update-ref", "refs/heads/main", &sha]))?;
        Ok((sha, true, replaces_local))
    }

    /// `--build`: the local registry (its port chosen once), each image built and pushed, and
    /// the files that pin them in the local revision (none without `--build`).
    pub(crate) fn build(
        &self,
        builds: &[super::build::Build],
        state: &state_schema::state::State,
        rev: Option<&str>,
        socket: &Path,
        ports: Ports,
    ) -> Result<Vec<(String, String)>> {
        if builds.is_empty() {
            return Ok(Vec::new());
        }
        super::build::registry(&self.state, ports.registry)?;
        let built = super::build::build_all(builds, ports.registry, socket, &self.state)?;
        super::build::remember(&self.state, builds)?;
        super::build::overrides(state, &built, |file| match rev {
            None => Ok(std::fs::read_to_string(self.repo.join(file))?),
            Some(r) => Ok(run(Command::new("git")
                .arg("-C")
                .arg(&self.repo)
                .args(["show", &format!("{r}:{file}")]))?
                + "\n"),
        })
    }
}
