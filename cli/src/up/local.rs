//! The local control plane of one repository: its state folder (CA, admin token, local signing
//! key, SQLite ledger, bare mirror, enrolment, configurations, logs, pid files) and the trust
//! and identity it was set up with. The mirror's revisions are in `mirror.rs`, the services it
//! runs in `services.rs`, the processes in `processes.rs`.

use super::processes::{alive, free_ports, run, tool, write_private};
use crate::client::ServerArgs;
use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The age identity (in the state folder) issued certificates' keys are sealed to.
pub(crate) const CERTIFICATES_IDENTITY: &str = "certificates.age";
/// The local CA the reconciler makes for HTTPS, which users trust to browse `https://….localhost`.
pub(crate) const LOCAL_CA: &str = "ingress-ca/ca.crt";

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
    /// Where the ingress serves HTTPS (0: none chosen yet, or plain HTTP only).
    #[serde(default)]
    pub(crate) https: u16,
    /// The loopback port of the ingress's certificates server, which Caddy's handshakes fetch
    /// certificates from (0: none chosen yet).
    #[serde(default)]
    pub(crate) certs: u16,
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

    /// The ports recorded by an earlier `pl up`, if any.
    pub(crate) fn recorded_ports(&self) -> Result<Option<Ports>> {
        match std::fs::read(self.path("ports.json")) {
            Ok(b) => Ok(Some(serde_json::from_slice(&b)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The CA, API certificate, admin token, local signing key, mirror and ports: made once
    /// (`port` and `https_port`, when given, replace the recorded ones; an HTTPS port is chosen
    /// when `https` and none is recorded), and with `https` the age identity issued
    /// certificates' keys are sealed to.
    pub(crate) fn init(&self, port: Option<u16>, https_port: Option<u16>, https: bool) -> Result<Ports> {
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
            let public = state_repo::mirror::new_local_key(&self.path("local.key"), "pl-up-local")?;
            std::fs::write(self.path("allowed_signers"), format!("pl-up-local {public}\n"))?;
        }
        state_repo::mirror::Mirror::open_or_init(&self.path("mirror.git"))?;
        if https && !self.path(CERTIFICATES_IDENTITY).exists() {
            use age::secrecy::ExposeSecret;
            let id = age::x25519::Identity::generate();
            let text = zeroize::Zeroizing::new(format!(
                "# pl up: issued certificates' keys are sealed to this identity\n# public key: {}\n{}\n",
                id.to_public(),
                id.to_string().expose_secret()
            ));
            write_private(&self.path(CERTIFICATES_IDENTITY), text.as_bytes())?;
        }
        // Every port this start may need, chosen at once: distinct, and none the user named or
        // the state folder recorded.
        let recorded = self.recorded_ports()?;
        let mut named: Vec<u16> = port.into_iter().chain(https_port).collect();
        if let Some(r) = &recorded {
            named.extend([r.api, r.agent, r.http, r.https, r.certs]);
        }
        let [api, agent, http, https_free, certs] = free_ports::<5>(&named)?;
        let ports = match recorded {
            // `--port` for a control plane that does not run (the caller checked): taken now.
            Some(p) if port.is_some_and(|n| n != p.http) => Ports {
                http: port.unwrap_or(p.http),
                ..p
            },
            Some(p) => p,
            None => Ports {
                api,
                agent,
                http: port.unwrap_or(http),
                https: 0,
                certs,
            },
        };
        // A state folder from before the certificates server has no port for it yet.
        let ports = if ports.certs == 0 {
            Ports { certs, ..ports }
        } else {
            ports
        };
        let ports = match (https, https_port) {
            (true, Some(h)) => Ports { https: h, ..ports },
            (true, None) if ports.https == 0 => Ports {
                https: https_free,
                ..ports
            },
            (true, None) => ports,
            (false, _) => Ports { https: 0, ..ports },
        };
        if self.recorded_ports()?.is_some_and(|r| {
            (r.api, r.agent, r.http, r.https, r.certs) == (ports.api, ports.agent, ports.http, ports.https, ports.certs)
        }) {
            return Ok(ports);
        }
        std::fs::write(self.path("ports.json"), serde_json::to_vec(&ports)?)?;
        Ok(ports)
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

    /// Whether this control plane serves HTTPS (`scheme`, kept until `pl down`): the other is
    /// refused, since what runs was published the first way.
    /// Checked before anything starts; [`Self::settle_scheme`] records it once the state
    /// folder exists.
    pub(crate) fn check_scheme(&self, https: bool) -> Result<()> {
        let wanted = if https { "https" } else { "http" };
        match std::fs::read_to_string(self.path("scheme")) {
            Ok(s) if s.trim() != wanted => bail!(
                "this repository's local control plane serves {}; `pl down` first to serve {wanted}{}",
                s.trim(),
                if https {
                    " (leave out --http)"
                } else {
                    " (pl up --http)"
                }
            ),
            _ => Ok(()),
        }
    }

    pub(crate) fn settle_scheme(&self, https: bool) -> Result<()> {
        self.check_scheme(https)?;
        Ok(std::fs::write(
            self.path("scheme"),
            if https { "https" } else { "http" },
        )?)
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
            format: crate::client::OutFormat::Text,
            local: None,
        }
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
