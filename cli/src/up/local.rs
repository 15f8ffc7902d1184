//! The local control plane of one repository: its state folder (CA, admin token, local signing
//! key, SQLite ledger, bare mirror, enrolment, configurations, logs, pid files), the processes
//! it runs in the background (`pl-reconciler`, `pl-agent`, Caddy, the build registry), and the
//! mirror's local revisions.

use super::processes::{
    alive, caddy_program, free_port, run, run_daemon, run_with_input, spawn_detached, stop, tail, tool, write_private,
};
use crate::operator::{Client, ServerArgs};
use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How a local control plane trusts what it applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Trust {
    /// Local revisions signed by the state folder's own key.
    Local,
    /// The user's signed commits, judged against their allowed signers (and policy).
    Signed {
        allowed_signers: PathBuf,
        policy: Option<PathBuf>,
    },
}

impl Trust {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Trust::Local => "local",
            Trust::Signed { .. } => "signed",
        }
    }

    /// The `[trust]` table of the reconciler's configuration.
    pub(crate) fn table(&self) -> String {
        match self {
            Trust::Local => "[trust]\nallowed_signers = \"allowed_signers\"\n".to_owned(),
            Trust::Signed {
                allowed_signers,
                policy,
            } => {
                let mut t = format!("[trust]\nallowed_signers = {allowed_signers:?}\n");
                if let Some(p) = policy {
                    t.push_str(&format!("policy = {p:?}\n"));
                }
                t
            }
        }
    }
}

/// The local control plane of one repository.
pub(crate) struct Local {
    pub(crate) repo: PathBuf,
    pub(crate) state: PathBuf,
}

/// The ports a local control plane uses, chosen once.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy)]
pub(crate) struct Ports {
    pub(crate) api: u16,
    pub(crate) agent: u16,
    /// Where Caddy's ingress server listens (its admin API is a unix socket, never a port).
    pub(crate) http: u16,
    /// The local registry `--build` pushes to (0: none chosen yet).
    #[serde(default)]
    pub(crate) registry: u16,
}

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
    pub(crate) fn new(dir: Option<&Path>) -> Result<Local> {
        let repo =
            std::fs::canonicalize(dir.unwrap_or(Path::new("."))).with_context(|| "the state repository".to_string())?;
        let state = match std::env::var_os("PL_STATE_DIR") {
            Some(d) => PathBuf::from(d),
            None => {
                use sha2::Digest;
                let base = std::env::var_os("XDG_STATE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
                    .ok_or_else(|| anyhow!("neither XDG_STATE_HOME nor HOME is set"))?;
                let hash = sha2::Sha256::digest(repo.to_string_lossy().as_bytes());
                let hex = hex::encode(&hash[..6]);
                let name = repo
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                base.join("pushleft").join(format!("{name}-{hex}"))
            }
        };
        Ok(Local { repo, state })
    }

    /// Whether the repository folder is inside a Git repository (its working tree is applied
    /// either way; commits, signatures and preview branches need Git).
    pub(crate) fn in_git(&self) -> bool {
        self.repo.ancestors().any(|d| d.join(".git").exists())
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.state.join(name)
    }

    /// Whether a revision was ever applied here (the mirror has a `main`).
    pub(crate) fn has_applied(&self) -> bool {
        self.path("mirror.git").exists()
            && run(git(&self.path("mirror.git")).args(["rev-parse", "-q", "--verify", "refs/heads/main"])).is_ok()
    }

    /// The ports recorded by an earlier `pl up`, if any.
    pub(crate) fn recorded_ports(&self) -> Result<Option<Ports>> {
        match std::fs::read(self.path("ports.json")) {
            Ok(b) => Ok(Some(serde_json::from_slice(&b)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The CA, API certificate, admin token, local signing key, mirror and ports: made once
    /// (`port`, when given, replaces the recorded ingress port).
    pub(crate) fn init(&self, port: Option<u16>) -> Result<Ports> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(&self.state)?;
        std::fs::set_permissions(&self.state, std::fs::Permissions::from_mode(0o700))?;
        let reconciler = tool("pl-reconciler")?;
        if !self.path("tls/ca.crt").exists() {
            let said = run(Command::new(&reconciler)
                .args(["tls-init", "--dir"])
                .arg(self.path("tls")))?;
            let fingerprint = said
                .split_whitespace()
                .find(|w| w.starts_with("SHA256:"))
                .ok_or_else(|| anyhow!("tls-init printed no CA fingerprint"))?;
            std::fs::write(self.path("ca.fingerprint"), fingerprint)?;
        }
        if !self.path("admin.token").exists() {
            let line = run(Command::new(&reconciler)
                .args(["token", "--name", "pl-up", "--role", "admin", "--out"])
                .arg(self.path("admin.token")))?;
            std::fs::write(self.path("tokens.toml"), line)?;
        }
        if !self.path("local.key").exists() {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "pl-up-local", "-f"])
                .arg(self.path("local.key")))?;
            let public = std::fs::read_to_string(self.path("local.key.pub"))?;
            std::fs::write(self.path("allowed_signers"), format!("pl-up-local {public}"))?;
        }
        if !self.path("mirror.git").exists() {
            run(Command::new("git")
                .args(["init", "-q", "--bare", "-b", "main"])
                .arg(self.path("mirror.git")))?;
        }
        let ports = match self.recorded_ports()? {
            // `--port` for a control plane that does not run (the caller checked): taken now.
            Some(p) if port.is_some_and(|n| n != p.http) => Ports {
                http: port.unwrap_or(p.http),
                ..p
            },
            // A state folder from before `--build` has no registry port yet.
            Some(p) if p.registry == 0 => Ports {
                registry: free_port()?,
                ..p
            },
            Some(p) => return Ok(p),
            None => Ports {
                api: free_port()?,
                agent: free_port()?,
                http: match port {
                    Some(p) => p,
                    None => free_port()?,
                },
                registry: free_port()?,
            },
        };
        std::fs::write(self.path("ports.json"), serde_json::to_vec(&ports)?)?;
        Ok(ports)
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

    /// The age identity the local reconciler reseals Secrets with: `identity` (kept, 0600, in
    /// the state folder, so the background reconciler needs nothing of the caller's), or the
    /// one kept by an earlier `pl up`. Refused before anything starts when the environments use
    /// Secrets and no identity opens every one of them.
    pub(crate) fn settle_identity(&self, state: &state_schema::state::State, identity: Option<&Path>) -> Result<()> {
        use pushleft_secrets as secrets;
        let kept = self.path("age-identity");
        let path = match identity {
            Some(p) => p.to_owned(),
            None => kept.clone(),
        };
        let used: std::collections::BTreeSet<&str> = state
            .environments()
            .filter_map(|(_, e)| state.project(e.project.as_str()))
            .flat_map(|p| p.secrets.iter().map(|n| n.as_str()))
            .collect();
        if used.is_empty() && identity.is_none() {
            return Ok(());
        }
        if identity.is_none() && !kept.exists() {
            bail!(
                "[secret-no-identity] the environments use Secrets ({}): give pl up an age identity that opens them (--identity FILE, or PL_AGE_IDENTITY), as for `pl secret show`",
                used.iter().copied().collect::<Vec<_>>().join(", ")
            );
        }
        let ids = secrets::load_identities(&path).map_err(|e| anyhow!("[{}] {e}", e.code()))?;
        for name in &used {
            let Some(located) = state.get(state_schema::model::Kind::Secret, name) else {
                continue;
            };
            let state_schema::model::Spec::Secret(secret) = &located.object.spec else {
                continue;
            };
            if let Some((key, value)) = secret.data.iter().next()
                && secrets::opens(value.armored(), &ids).is_err()
            {
                bail!(
                    "[secret-not-decryptable] {} does not open {key} of Secret {name}: add its recipient to the Secret (`pl secret recipients {name} --add RECIPIENT`) or give the identity that does",
                    path.display()
                );
            }
        }
        if identity.is_some() {
            let bytes = zeroize::Zeroizing::new(std::fs::read(&path)?);
            let same = std::fs::read(&kept).is_ok_and(|k| zeroize::Zeroizing::new(k) == bytes);
            if !same {
                write_private(&kept, &bytes)?;
            }
        }
        Ok(())
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

    /// The trust this control plane was set up with (`mode`): a different one is refused.
    pub(crate) fn settle_trust(&self, trust: &Trust) -> Result<()> {
        let path = self.path("mode");
        match std::fs::read_to_string(&path) {
            Ok(mode) if mode.trim() != trust.name() => bail!(
                "this repository's local control plane applies {} revisions; `pl down` first to apply {} ones",
                mode.trim(),
                trust.name()
            ),
            Ok(_) => Ok(()),
            Err(_) => Ok(std::fs::write(path, trust.name())?),
        }
    }

    pub(crate) fn server(&self, ports: Ports) -> ServerArgs {
        ServerArgs {
            server: Some(format!("https://localhost:{}", ports.api)),
            ca_cert: Some(self.path("tls/ca.crt")),
            token_file: Some(self.path("admin.token")),
            format: crate::operator::OutFormat::Text,
            local: None,
        }
    }

    /// The reconciler, started when it does not run; waits until it answers.
    pub(crate) fn reconciler(&self, ports: Ports, trust: &Trust, previews: &[String]) -> Result<Client> {
        let config = format!(
            "[source]\npath = {:?}\nbranch = \"main\"\npreview_branches = {:?}\n\n{}\n[ledger]\nurl = \"sqlite://{}\"\n\n[reconcile]\ninterval_seconds = 2\n\n[control]\nca_cert = \"tls/ca.crt\"\nca_key = \"tls/ca.key\"\n{}\n[agent_api]\nlisten = \"127.0.0.1:{}\"\n\n[api]\nlisten = \"127.0.0.1:{}\"\ntls_cert = \"tls/api.crt\"\ntls_key = \"tls/api.key\"\n\n{}\n",
            self.path("mirror.git"),
            previews,
            trust.table(),
            self.path("ledger.db").display(),
            if self.path("age-identity").exists() {
                "age_identity = \"age-identity\"\n"
            } else {
                ""
            },
            ports.agent,
            ports.api,
            std::fs::read_to_string(self.path("tokens.toml"))?
        );
        let pid = self.path("reconciler.pid");
        // A running reconciler with another configuration (the trust changed) starts anew.
        if std::fs::read_to_string(self.path("reconciler.toml")).ok().as_deref() != Some(config.as_str()) {
            stop(&pid, "pl-reconciler");
        }
        std::fs::write(self.path("reconciler.toml"), config)?;
        let mut started = run_daemon(
            "pl-reconciler",
            &self.path("reconciler.toml"),
            &self.path("reconciler.log"),
            &pid,
        )?;
        let client = Client::new(&self.server(ports))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if client.json("GET", "/v1/status").is_ok() {
                return Ok(client);
            }
            // (Just after the start, /proc may still show `pl`'s own command line: the child
            // itself says whether it ended.)
            let ended = match started.as_mut() {
                Some(child) => child.try_wait().ok().flatten().is_some(),
                None => alive(&pid, "pl-reconciler").is_none(),
            };
            if ended || Instant::now() > deadline {
                bail!(
                    "the local reconciler did not start; its log ({}) ends:\n{}",
                    self.path("reconciler.log").display(),
                    tail(&self.path("reconciler.log"))
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Caddy's admin socket, `caddy-admin/admin.sock` in the state folder: a folder of its own,
    /// 0700 like the state folder, so only this user reaches Caddy's unauthenticated admin API
    /// (on a TCP port every local user could rewrite its routes).
    pub(crate) fn caddy_admin(&self) -> Result<String> {
        let socket = self.path("caddy-admin").join("admin.sock");
        let text = socket.display().to_string();
        // sockaddr_un holds 107 bytes and a NUL.
        if text.len() > 107 || text.contains(['"', '\\']) {
            bail!(
                "Caddy's admin socket {text} is too long a path for a unix socket (or has a quote): set PL_STATE_DIR to a shorter folder"
            );
        }
        Ok(format!("unix/{text}"))
    }

    /// Caddy (≥ 2.8) for ingress, started when it does not run, its admin API on a unix socket
    /// in a 0700 folder.
    pub(crate) fn caddy(&self) -> Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let pid = self.path("caddy.pid");
        if alive(&pid, "caddy").is_some() {
            return Ok(());
        }
        let caddy = caddy_program()?;
        let admin = self.caddy_admin()?;
        let folder = self.path("caddy-admin");
        std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&folder)?;
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o700))?;
        let socket = folder.join("admin.sock");
        let _ = std::fs::remove_file(&socket);
        std::fs::write(
            self.path("caddy.json"),
            serde_json::json!({"admin": {"listen": admin}}).to_string(),
        )?;
        spawn_detached(
            Command::new(caddy)
                .args(["run", "--config"])
                .arg(self.path("caddy.json"))
                .env("XDG_DATA_HOME", self.path("caddy-data"))
                .env("XDG_CONFIG_HOME", self.path("caddy-config")),
            &self.path("caddy.log"),
            &pid,
        )?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if Instant::now() > deadline {
                bail!("Caddy did not start; its log ends:\n{}", tail(&self.path("caddy.log")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The folder of `node`'s agent: its enrolment (`node/`), configuration, pid, log, state
    /// and secrets. Each node this machine runs has one; they share Caddy and its upstreams.
    pub(crate) fn agent_dir(&self, node: &str) -> PathBuf {
        self.path("agents").join(node)
    }

    /// The nodes enrolled here before, by name.
    pub(crate) fn enrolled_nodes(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.path("agents"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().join("node").join(pushleft_agent_files::CERT).exists())
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// The pid files of every agent this state folder started.
    pub(crate) fn agent_pids(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.path("agents"))
            .map(|d| d.flatten().map(|e| e.path().join("agent.pid")).collect())
            .unwrap_or_default()
    }

    /// A node's agent: enrolled once, started when it does not run.
    pub(crate) fn agent(&self, client: &Client, ports: Ports, node: &str, docker: &Path) -> Result<()> {
        let home = self.agent_dir(node);
        std::fs::create_dir_all(&home)?;
        let enrolled = home.join("node");
        if enrolled.join(pushleft_agent_files::CERT).exists()
            && !enrolled.join(pushleft_agent_files::CONTROL_PLANE).exists()
        {
            // Enrolled before control planes had ids: what that agent made names none, so it
            // enrols again (its old folder kept aside) and its objects are foreign from now on.
            let aside = home.join("node.before-control-plane-id");
            let _ = std::fs::remove_dir_all(&aside);
            std::fs::rename(&enrolled, &aside)?;
        }
        if !enrolled.join(pushleft_agent_files::CERT).exists() {
            let deadline = Instant::now() + Duration::from_secs(30);
            let token = loop {
                match client.json("POST", &format!("/v1/nodes/{node}/token")) {
                    Ok(v) => break v["token"].as_str().unwrap_or_default().to_owned(),
                    Err(e) if Instant::now() > deadline => {
                        return Err(e.context(format!("no enrolment token for node {node}")));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            };
            let fingerprint = std::fs::read_to_string(self.path("ca.fingerprint"))?;
            let mut enroll = Command::new(tool("pl-agent")?);
            enroll
                .args(["enroll", "--control", &format!("https://localhost:{}", ports.api)])
                .args(["--ca-fingerprint", fingerprint.trim(), "--node", node, "--dir"])
                .arg(&enrolled)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = enroll.spawn().context("pl-agent enroll")?;
            if let Some(mut stdin) = child.stdin.take() {
                use std::io::Write;
                stdin.write_all(token.as_bytes())?;
            }
            let o = child.wait_with_output()?;
            if !o.status.success() {
                bail!("enrolling node {node}: {}", String::from_utf8_lossy(&o.stderr).trim());
            }
        }
        let config = format!(
            "control = \"https://localhost:{}\"\ndir = \"node\"\ndocker_socket = {:?}\nsecrets_dir = \"secrets\"\nstate_dir = \"state\"\nheartbeat_seconds = 1\nparallel_environments = 16\ncaddy_admin = {:?}\ningress_listen = [\"127.0.0.1:{}\"]\ningress_upstreams = {:?}\ningress_host_suffix = \".localhost\"\n",
            ports.agent,
            docker.display().to_string(),
            self.caddy_admin()?,
            ports.http,
            self.path("ingress").display().to_string(),
        );
        // The build registry's credentials, for pulls of what `--build` pushed.
        let config = if ports.registry != 0 {
            let (auth, _) = super::build::credentials(&self.state)?;
            format!(
                "{config}\n[registry_auth]\n\"127.0.0.1:{}\" = {:?}\n",
                ports.registry,
                auth.display().to_string()
            )
        } else {
            config
        };
        std::fs::write(home.join("agent.toml"), config)?;
        run_daemon(
            "pl-agent",
            &home.join("agent.toml"),
            &home.join("agent.log"),
            &home.join("agent.pid"),
        )?;
        Ok(())
    }
}

/// The API of the local control plane `pl up` started for the repository at `dir`.
pub(crate) fn local_server(dir: &Path) -> Result<ServerArgs> {
    let local = Local::new(Some(dir))?;
    let ports: Ports = serde_json::from_slice(&std::fs::read(local.path("ports.json")).map_err(|_| {
        anyhow!(
            "no local control plane for {}: run `pl up` there first",
            local.repo.display()
        )
    })?)?;
    Ok(local.server(ports))
}

/// The API of a local control plane that runs for the current folder or a folder above it
/// (the repository `pl up` applied, from any of its subfolders).
pub(crate) fn running_local_server() -> Option<ServerArgs> {
    let here = std::env::current_dir().ok()?;
    for dir in here.ancestors() {
        let Ok(local) = Local::new(Some(dir)) else { continue };
        if alive(&local.path("reconciler.pid"), "pl-reconciler").is_none() {
            continue;
        }
        let ports: Ports = serde_json::from_slice(&std::fs::read(local.path("ports.json")).ok()?).ok()?;
        return Some(local.server(ports));
    }
    None
}

/// Names of the enrolment folder's files (the agent's own, repeated: `pl` links no agent).
mod pushleft_agent_files {
    pub const CERT: &str = "node.crt";
    pub const CONTROL_PLANE: &str = "control-plane";
}
