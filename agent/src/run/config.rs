//! `pl-agent run`'s configuration (TOML): where the control plane is, the node's folders, which
//! executors are on, and every limit, each with its default.

use agent_proto::Capability;
use anyhow::{Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// `pl-agent run --config FILE` (TOML).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The control plane's agent API, `https://host:port`.
    pub control: String,
    /// The enrolment folder (`pl-agent enroll --dir`): the node's key, certificate, CA and age
    /// identity.
    pub dir: PathBuf,
    #[serde(default = "default_socket")]
    pub docker_socket: PathBuf,
    /// Where containers' secret files live: a tmpfs, so they never reach a disk.
    #[serde(default = "default_secrets")]
    pub secrets_dir: PathBuf,
    /// Environments whose tasks run at once.
    #[serde(default = "default_parallel")]
    pub parallel_environments: usize,
    #[serde(default = "default_heartbeat")]
    pub heartbeat_seconds: u64,
    /// The `nft` program (a path, or a wrapper; `nft` on `PATH` by default).
    #[serde(default = "crate::firewall::default_nft")]
    pub nft: PathBuf,
    /// Where the agent keeps its fences (the firewall's applied generations).
    #[serde(default = "default_state")]
    pub state_dir: PathBuf,
    /// The executors this node runs: `docker`, `nftables`, `routes`, `ingress` (all by default;
    /// another name is refused when the file is read). A task
    /// for one that is off fails with `executor-missing`, and the heartbeat does not offer it.
    #[serde(default = "default_executors")]
    pub executors: Vec<Capability>,
    /// How often what the agent made is checked for drift and repaired (1 to 30 s).
    #[serde(default = "default_drift")]
    pub drift_seconds: u64,
    /// How long after a switch the previous generation's web replicas stay paused, so a
    /// rollback resumes them in milliseconds (0: stopped at once; at most a day).
    #[serde(default = "default_rollback_window")]
    pub rollback_window_seconds: u64,
    /// Caddy's admin API, for ingress: a unix socket (`unix//<path>`) in a folder closed to
    /// other users. A TCP address is refused (every local user could reach it).
    #[serde(default = "default_caddy")]
    pub caddy_admin: String,
    /// Where the ingress server of ours listens in Caddy.
    #[serde(default = "default_ingress_listen")]
    pub ingress_listen: Vec<String>,
    /// The folder of ingress upstream files, which Caddy reads on each request (so it must be
    /// able to read them; they hold container addresses, no secret).
    #[serde(default = "default_ingress_upstreams")]
    pub ingress_upstreams: PathBuf,
    /// Where the HTTPS server of ours listens in Caddy, for hostnames whose environment brings
    /// a certificate (`[]`: none is served, and such a publish fails with `tls-not-configured`).
    #[serde(default = "default_ingress_tls_listen")]
    pub ingress_tls_listen: Vec<String>,
    /// The certificate files Caddy serves: a folder per hostname and node, keys 0600 (owned by
    /// Caddy's user, the owner of `caddy_admin`'s folder, when the agent runs as root).
    #[serde(default = "default_ingress_tls_dir")]
    pub ingress_tls_dir: PathBuf,
    /// The loopback `ip:port` of the certificates server of ours in Caddy, which its HTTPS
    /// handshakes fetch each hostname's certificate file from (`ingress/tls.rs`).
    #[serde(default = "default_ingress_certs_listen")]
    pub ingress_certs_listen: String,
    /// Whether the agent sets the kernel's `net.ipv4.tcp_migrate_req` to 1 in its network
    /// namespace when it runs the ingress, so Caddy's reloads move waiting connections to the
    /// new listening socket instead of resetting them (`ingress/kernel.rs`; on by default).
    #[serde(default = "default_true")]
    pub ingress_migrate_requests: bool,
    /// Routes also match each hostname with this appended (`pl up` sets `.localhost`).
    #[serde(default)]
    pub ingress_host_suffix: Option<String>,
    /// Credentials for pulls, by registry: `"127.0.0.1:5000" = "/path/to/file"`, each file
    /// `username:password` and mode 0600 (`pl up` names its build registry's).
    #[serde(default)]
    pub registry_auth: std::collections::BTreeMap<String, PathBuf>,
    /// The folders a repository on the node itself (`backups.repository: /path`) may be in:
    /// a path elsewhere is refused (`backup-repository-refused`), so a signer cannot make
    /// the agent write a repository into `/etc`.
    #[serde(default = "default_backup_roots")]
    pub backup_roots: Vec<PathBuf>,
    /// The `restic` program (Debian's `restic` on `PATH` by default).
    #[serde(default = "default_restic")]
    pub restic: PathBuf,
    /// Whether this node joins the mesh between nodes (its heartbeat then carries its
    /// WireGuard public key; the key pair is made on the node at start).
    #[serde(default = "default_true")]
    pub mesh: bool,
    /// The UDP port the mesh listens on.
    #[serde(default = "default_mesh_port")]
    pub mesh_port: u16,
    /// The address other nodes reach this one at (an IP literal), when Git's
    /// `nodes[].address` does not say it; none: reached only if Git says.
    #[serde(default)]
    pub mesh_address: Option<std::net::IpAddr>,
}

fn default_mesh_port() -> u16 {
    agent_proto::mesh::DEFAULT_MESH_PORT
}

fn default_backup_roots() -> Vec<PathBuf> {
    vec!["/var/backups/pushleft".into()]
}

fn default_restic() -> PathBuf {
    "restic".into()
}

fn default_true() -> bool {
    true
}

fn default_ingress_upstreams() -> PathBuf {
    "/var/lib/pushleft-ingress".into()
}

fn default_ingress_tls_listen() -> Vec<String> {
    vec![":443".into()]
}

fn default_ingress_tls_dir() -> PathBuf {
    "/var/lib/pushleft-ingress-tls".into()
}

fn default_ingress_certs_listen() -> String {
    "127.0.0.1:2021".into()
}

fn default_caddy() -> String {
    "unix//run/pushleft-caddy/admin.sock".into()
}

fn default_ingress_listen() -> Vec<String> {
    vec![":80".into()]
}

fn default_drift() -> u64 {
    10
}

fn default_rollback_window() -> u64 {
    crate::docker::resume::ROLLBACK_WINDOW.as_secs()
}

fn default_executors() -> Vec<Capability> {
    Capability::ALL.to_vec()
}

fn default_state() -> PathBuf {
    "/var/lib/pushleft-agent/state".into()
}

fn default_socket() -> PathBuf {
    "/var/run/docker.sock".into()
}

fn default_secrets() -> PathBuf {
    "/run/pushleft-agent/secrets".into()
}

fn default_parallel() -> usize {
    4
}

fn default_heartbeat() -> u64 {
    10
}

impl Config {
    /// Reads and checks the configuration (at most 64 KiB; paths relative to its folder).
    pub fn load(path: &Path) -> Result<Config> {
        let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        anyhow::ensure!(meta.len() <= 64 * 1024, "{} is larger than 64 KiB", path.display());
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut c: Config = toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        for p in [
            &mut c.dir,
            &mut c.docker_socket,
            &mut c.secrets_dir,
            &mut c.state_dir,
            &mut c.ingress_upstreams,
            &mut c.ingress_tls_dir,
        ] {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        for p in c.registry_auth.values_mut().chain(c.backup_roots.iter_mut()) {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        anyhow::ensure!(
            (1..=64).contains(&c.parallel_environments),
            "parallel_environments must be 1 to 64"
        );
        anyhow::ensure!(c.control.starts_with("https://"), "control must be an https:// URL");
        anyhow::ensure!((1..=30).contains(&c.drift_seconds), "drift_seconds must be 1 to 30");
        anyhow::ensure!(
            c.rollback_window_seconds <= 86_400,
            "rollback_window_seconds must be 0 to 86400"
        );
        if c.executors.contains(&Capability::Ingress) {
            let admin = crate::ingress::caddy_admin::Admin::parse(&c.caddy_admin).map_err(anyhow::Error::msg)?;
            // A folder that exists and lets others in is refused now; one Caddy has not made
            // yet is checked on every admin call.
            if admin.socket().parent().is_some_and(Path::exists) {
                admin.check_private().map_err(anyhow::Error::msg)?;
            }
        }
        Ok(c)
    }
}
