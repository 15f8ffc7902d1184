//! `pl-agent run`: heartbeats with what the node can run and what runs, leases its own jobs
//! with the lease loop (`lease_loop.rs`: one environment's tasks in order, different
//! environments in parallel up to a bound, each end reported with its fencing proof). The executors live in `docker/`, `firewall.rs`, `routes.rs` and
//! `ingress.rs`; a task for an executor the configuration turns off fails for good with
//! `executor-missing`, never pretends.

use crate::client::AgentClient;
use crate::docker::{ENVIRONMENT, Engine, GENERATION, INSTANCE, ROLE, RUN_TIMEOUT};
use crate::firewall::Firewall;
use crate::ingress::Share;
use crate::lease_loop::{Ended, LeaseLoop, Tasks, blocking};
use crate::outcome::{Failure, permanent};
use agent_proto::{Capability, Execution, Heartbeat, LeasedJob, RunningInstance, Task};
use anyhow::{Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

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
    /// handshakes fetch each hostname's certificate file from (`ingress_tls.rs`).
    #[serde(default = "default_ingress_certs_listen")]
    pub ingress_certs_listen: String,
    /// Whether the agent sets the kernel's `net.ipv4.tcp_migrate_req` to 1 in its network
    /// namespace when it runs the ingress, so Caddy's reloads move waiting connections to the
    /// new listening socket instead of resetting them (`ingress_kernel.rs`; on by default).
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
            let admin = crate::caddy_admin::Admin::parse(&c.caddy_admin).map_err(anyhow::Error::msg)?;
            // A folder that exists and lets others in is refused now; one Caddy has not made
            // yet is checked on every admin call.
            if admin.socket().parent().is_some_and(Path::exists) {
                admin.check_private().map_err(anyhow::Error::msg)?;
            }
        }
        Ok(c)
    }
}

/// What the node runs now: its containers of replicas, as the heartbeat reports them (none
/// while Docker does not answer). Healthy: running, and for a web replica answering its health
/// path now (probed each heartbeat), so what `pl status` counts and what a release's watch
/// judges is what serves.
async fn observed(engine: &Engine) -> Vec<RunningInstance> {
    let Ok(list) = engine.ours(&[]).await else {
        return Vec::new();
    };
    let failing = engine.failing_health().await.unwrap_or_default();
    list.into_iter()
        .filter_map(|(name, l, running)| {
            Some(RunningInstance {
                environment: l.get(ENVIRONMENT)?.clone(),
                role: l.get(ROLE)?.clone(),
                instance: l.get(INSTANCE)?.parse().ok()?,
                generation: l.get(GENERATION)?.parse().ok()?,
                healthy: running && !failing.contains(&name),
            })
        })
        .take(agent_proto::MAX_HEARTBEAT_INSTANCES)
        .collect()
}

/// The executors of this node.
pub struct Executors {
    pub engine: Engine,
    pub firewall: Arc<Firewall>,
    /// Which executors are on (`Config::executors`).
    pub enabled: Vec<Capability>,
    /// Where the routes each environment should have are remembered (for drift repair).
    pub routes_dir: PathBuf,
    pub ingress: Arc<crate::ingress::Ingress>,
    /// Each environment's service names, served on its network's gateway (`names.rs`).
    pub names: crate::names_server::NameService,
    /// Woken when a task changed what runs: the heartbeat reports it now, not at its next
    /// interval (what `pl up`, `pl wait` and drift repair read comes from heartbeats).
    pub changed: tokio::sync::Notify,
    /// Backups: the restic program, its cache, and where repositories on the node may be.
    pub backups: crate::docker::backup::Backups,
    /// The mesh between nodes (its routes are part of each environment's table).
    pub mesh: Arc<crate::mesh::Mesh>,
    /// Whether this node is in the mesh (its configuration says so, and it has the routes
    /// and nftables executors the mesh needs).
    pub mesh_on: bool,
    /// Newer meshes from leases and heartbeats, for the task that applies them.
    pub mesh_offers: crate::mesh::offers::Offers,
}

impl Executors {
    fn on(&self, executor: Capability) -> bool {
        self.enabled.contains(&executor)
    }

    /// One round of drift repair: containers, firewall tables, routes. Returns (environment,
    /// what was repaired).
    pub async fn repair(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.on(Capability::Docker) {
            match self.engine.repair_containers().await {
                Ok(r) => out.extend(r),
                Err(f) => tracing::warn!(code = f.code, "cannot check containers for drift"),
            }
            // Every environment's firewall sets are written again (a set emptied by hand, or
            // an apply that raced a write, heals within a round).
            self.names.forget_pushed();
            self.names.refresh(&self.engine).await;
            // Memory: the previous generations' replicas paused past the rollback window.
            match self.engine.expire_paused().await {
                Ok(stopped) if !stopped.is_empty() => {
                    tracing::info!(
                        containers = stopped.len(),
                        "stopped replicas kept past the rollback window"
                    )
                }
                Ok(_) => {}
                Err(f) => tracing::warn!(code = f.code, "cannot stop replicas kept for a rollback"),
            }
            // Runs whose jobs never came back for them (cancelled while their agent was down).
            match self.engine.sweep_runs().await {
                Ok(removed) if !removed.is_empty() => {
                    tracing::info!(containers = ?removed, "removed finished runs no job claimed")
                }
                Ok(_) => {}
                Err(f) => tracing::warn!(code = f.code, "cannot sweep finished runs"),
            }
            // Disk: images this agent pulled that nothing uses any more.
            match self.engine.collect_images().await {
                Ok(removed) if !removed.is_empty() => tracing::info!(images = removed.len(), "removed unused images"),
                Ok(_) => {}
                Err(f) => tracing::warn!(code = f.code, "cannot collect unused images"),
            }
        }
        if self.on(Capability::Nftables) {
            let fw = Arc::clone(&self.firewall);
            let reach = self.names.reach_all();
            out.extend(
                tokio::task::spawn_blocking(move || fw.repair(&reach))
                    .await
                    .unwrap_or_default(),
            );
        }
        if self.on(Capability::Ingress) {
            let ingress = Arc::clone(&self.ingress);
            out.extend(
                tokio::task::spawn_blocking(move || ingress.repair())
                    .await
                    .unwrap_or_default(),
            );
        }
        if self.on(Capability::Routes) && self.on(Capability::Nftables) {
            match self.mesh.repair().await {
                Some(Ok(note)) => out.push(("mesh".to_owned(), format!("mesh applied again: {note}"))),
                Some(Err(f)) => tracing::warn!(code = f.code, "cannot repair the mesh"),
                None => {}
            }
        }
        if self.on(Capability::Routes)
            && let Ok(dir) = std::fs::read_dir(&self.routes_dir)
            && let Ok(routes) = crate::routes::Routes::connect()
        {
            for entry in dir.flatten() {
                let env = entry.file_name().to_string_lossy().into_owned();
                let subnet = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let subnet = subnet.trim();
                let network = agent_proto::host_object(&self.engine.control_plane, &env, &self.engine.node);
                let _turn = self.mesh.routes.lock().await;
                let (iface, remote) = (self.mesh.interface(), self.mesh.remote_of(&env));
                let mesh = Some((iface.as_str(), remote.as_slice()));
                if routes.verify(&network, subnet, mesh).await.is_ok() {
                    continue;
                }
                match routes.ensure(&network, subnet, mesh).await {
                    Ok(_) => out.push((env.clone(), "routes re-applied".to_owned())),
                    Err(f) => tracing::warn!(environment = %env, code = f.code, "cannot repair routes"),
                }
            }
        }
        out
    }
}

/// Runs an executor's blocking work (`nft`, Caddy's admin API) off the async threads, with
/// the executor it needs.
async fn off_thread<X: Send + Sync + 'static, T: Send + 'static>(
    executor: &Arc<X>,
    f: impl FnOnce(&X) -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    let executor = Arc::clone(executor);
    tokio::task::spawn_blocking(move || f(&executor))
        .await
        .unwrap_or_else(|e| Err(crate::outcome::retryable("agent-task-failed", e.to_string())))
}

/// Runs one task with what its lease carries. After a Docker task, whatever its outcome (a
/// failed ensure removes its container), the service names and the firewall's sets follow
/// what runs.
pub async fn execute(x: &Executors, job: &LeasedJob) -> Result<Ended, Failure> {
    let outcome = match (&job.task, &job.execution) {
        (Task::BackupVolume { .. }, Execution::Backup(spec)) if x.on(Capability::Docker) => {
            x.engine.backup(&x.backups, spec).await
        }
        (Task::VerifyBackup { .. }, Execution::Drill(spec)) if x.on(Capability::Docker) => {
            x.engine.drill(&x.backups, spec).await
        }
        (Task::RestoreVolume { snapshot, .. }, Execution::Backup(spec)) if x.on(Capability::Docker) => {
            x.engine.restore(&x.backups, spec, snapshot).await.map(Ended::from)
        }
        _ => run_task(x, job).await.map(Ended::from),
    };
    if job.task.needs() == Capability::Docker && x.on(Capability::Docker) {
        x.names.refresh(&x.engine).await;
    }
    outcome
}

async fn run_task(x: &Executors, job: &LeasedJob) -> Result<String, Failure> {
    let engine = &x.engine;
    let needs = job.task.needs();
    if !x.on(needs) {
        return Err(permanent(
            "executor-missing",
            format!("this agent has no {needs} executor on for {}", job.task.kind()),
        ));
    }
    match (&job.task, &job.execution) {
        (Task::EnsureNetwork { .. }, Execution::Network(net)) => engine.ensure_network(net).await,
        (Task::ApplyFirewall { generation, .. }, Execution::Network(net)) => {
            let (env, subnet, generation) = (net.environment.clone(), net.subnet.clone(), *generation);
            // The mesh's set comes from the applied mesh: a mesh apply running now finishes
            // first (or finds this table made), so neither misses the other.
            let _turn = x.mesh.routes.lock().await;
            // The sets as the replicas are now, so replacing the table never empties them.
            x.names.refresh(engine).await;
            let reach = x.names.reach_of(&env);
            let pushed = reach.clone();
            let note = off_thread(&x.firewall, move |fw| fw.apply(&env, &subnet, generation, &reach)).await?;
            x.names.pushed(&net.environment, pushed);
            Ok(note)
        }
        (Task::EnsureRoutes { .. }, Execution::Network(net)) => {
            let _turn = x.mesh.routes.lock().await;
            let (iface, remote) = (x.mesh.interface(), x.mesh.remote_of(&net.environment));
            let note = crate::routes::Routes::connect()?
                .ensure(&net.network, &net.subnet, Some((iface.as_str(), remote.as_slice())))
                .await?;
            // Remembered for drift repair (the environment's name is a plain label).
            let _ = std::fs::create_dir_all(&x.routes_dir);
            std::fs::write(x.routes_dir.join(&net.environment), &net.subnet)
                .map_err(|e| crate::outcome::retryable("state-write-failed", e.to_string()))?;
            Ok(note)
        }
        (
            Task::RemoveNetwork {
                environment,
                generation,
            },
            execution,
        ) => {
            // Teardown's last step: the firewall table and the routes first, then the network.
            let (env, generation) = (environment.clone(), *generation);
            let mut notes = Vec::new();
            if x.on(Capability::Nftables) {
                notes.push(off_thread(&x.firewall, move |fw| fw.remove(&env, generation)).await?);
            }
            if let (true, Execution::Network(net)) = (x.on(Capability::Routes), execution) {
                notes.push(crate::routes::Routes::connect()?.remove(&net.subnet).await?);
                let _ = std::fs::remove_file(x.routes_dir.join(&net.environment));
            }
            let network = agent_proto::host_object(&engine.control_plane, environment, &engine.node);
            notes.push(engine.remove_network(&network).await?);
            Ok(notes.join("; "))
        }
        (Task::EnsureApplication { .. }, Execution::Application(app)) => {
            let note = engine.ensure_application(app).await?;
            // Healthy: its role's name may stand for it now (the refresh after the task); a
            // rollback's resumed container stands for it under its own name.
            x.names.judge(&engine.serving(&app.container));
            Ok(note)
        }
        (Task::RunOnce { .. } | Task::RunCron { .. }, Execution::Application(app)) => {
            engine.run_once(app, RUN_TIMEOUT).await
        }
        (
            Task::StopApplication {
                environment,
                role,
                instance,
                generation,
            },
            _,
        ) => {
            withdraw_names(x, environment, role, *instance, *generation, true).await?;
            engine.stop_older(environment, role, *instance, *generation, true).await
        }
        (
            Task::TeardownApplication {
                environment,
                role,
                instance,
                generation,
            },
            _,
        ) => {
            withdraw_names(x, environment, role, *instance, *generation, false).await?;
            engine.teardown(environment, role, *instance, *generation).await
        }
        (
            Task::RemoveVolume {
                environment,
                volume,
                generation,
            },
            _,
        ) => engine.remove_volume(environment, volume, *generation).await,
        (Task::PublishIngress { .. }, Execution::Ingress(spec)) if spec.held => {
            // A custom domain not proven yet: nothing of it is routed on this node.
            let (env, host, generation) = (spec.environment.clone(), spec.hostname.clone(), spec.generation);
            let note = off_thread(&x.ingress, move |ingress| ingress.remove(&env, &host, generation)).await?;
            Ok(format!("held until its domain is verified ({note})"))
        }
        (
            Task::PublishIngress {
                weight, repair, gate, ..
            },
            Execution::Ingress(spec),
        ) => {
            // This generation's replicas on this node, by their address on the environment's
            // network.
            let mut dials = Vec::new();
            for u in &spec.upstreams {
                // A rollback's replica may be a resumed container of the previous release; a
                // rolling rollout's replica not replaced yet is the older one that runs.
                let container = match &u.older {
                    Some(o) => match engine
                        .older_serving(&spec.environment, &o.role, o.instance, spec.generation)
                        .await?
                    {
                        Some(c) => c,
                        None => continue,
                    },
                    None => engine.serving(&u.container),
                };
                if let Some(ip) = engine.address(&container, &spec.network.network).await {
                    dials.push(format!("{ip}:{}", u.port));
                }
            }
            let (env, host, generation) = (spec.environment.clone(), spec.hostname.clone(), spec.generation);
            let sealed = spec.tls.clone();
            let share = match (weight, repair) {
                (Some(w), _) => Share::Canary(*w),
                (None, 0) => Share::Whole,
                (None, _) => Share::Repair,
            };
            let gate = *gate;
            off_thread(&x.ingress, move |ingress| {
                ingress.publish_share(&env, &host, generation, &dials, sealed.as_ref(), share, gate.as_ref())
            })
            .await
        }
        (
            Task::RemoveIngress {
                environment,
                hostname,
                generation,
            },
            _,
        ) => {
            let (env, host, generation) = (environment.clone(), hostname.clone(), *generation);
            off_thread(&x.ingress, move |ingress| ingress.remove(&env, &host, generation)).await
        }
        (
            Task::PlaceAcmeChallenge {
                hostname,
                token,
                key_authorization,
                ..
            },
            _,
        ) => {
            let (host, token, key) = (hostname.clone(), token.clone(), key_authorization.clone());
            off_thread(&x.ingress, move |ingress| ingress.place_challenge(&host, &token, &key)).await
        }
        (task, _) => Err(permanent(
            "task-malformed",
            format!("a {} task came without the execution it needs", task.kind()),
        )),
    }
}

/// How long a replica's name is withdrawn before the replica ends, when other nodes serve the
/// name too (its environment is in the mesh): the withdrawal reaches them with the next
/// heartbeat and their leases (tens of milliseconds), and an answer a caller got just before
/// lives one TTL ([`crate::names::TTL`], 1 s).
pub const NAME_DRAIN: Duration = Duration::from_secs(1);

/// Before a stop or a teardown: the replicas about to end leave their role's name first, and
/// the heartbeat says so at once; when other nodes serve the name, the replica keeps running
/// for [`NAME_DRAIN`] while they learn it, so a caller anywhere is never sent to a replica that
/// is gone.
async fn withdraw_names(
    x: &Executors,
    environment: &str,
    role: &str,
    instance: u32,
    generation: u64,
    older_only: bool,
) -> Result<(), Failure> {
    let ending = x
        .engine
        .ending(environment, role, instance, generation, older_only)
        .await?;
    let mut withdrawn = false;
    for container in &ending {
        withdrawn |= x.names.withdraw(container);
    }
    if !withdrawn {
        return Ok(());
    }
    x.names.refresh(&x.engine).await;
    x.changed.notify_one();
    if x.mesh_on && !x.mesh.remote_of(environment).is_empty() {
        tokio::time::sleep(NAME_DRAIN).await;
    }
    Ok(())
}

/// Sooner than its interval, a heartbeat waits at least this long after the one before: a
/// burst of completions makes one early heartbeat, not one each.
pub const EARLY_HEARTBEAT_GAP: Duration = Duration::from_millis(100);

/// The agent's main loop, until the process is stopped.
pub async fn run(config: Config) -> Result<()> {
    let client = Arc::new(AgentClient::from_dir(&config.control, &config.dir).context("the enrolment folder")?);
    std::fs::create_dir_all(&config.secrets_dir)
        .with_context(|| format!("creating {}", config.secrets_dir.display()))?;
    let node = crate::enroll::node_of(&config.dir)?;
    let control_plane = crate::enroll::control_plane_of(&config.dir)?;
    if config.executors.contains(&Capability::Ingress) && config.ingress_migrate_requests {
        crate::ingress_kernel::ensure_migrate_requests();
    }
    let firewall = Arc::new(Firewall {
        nft: config.nft.clone(),
        control_plane: control_plane.clone(),
        node: node.clone(),
        state_dir: config.state_dir.clone(),
    });
    let (mesh_offers, mut mesh_taken) = crate::mesh::offers::Offers::new();
    let engine = Arc::new(Executors {
        mesh_on: config.mesh
            && config.executors.contains(&Capability::Routes)
            && config.executors.contains(&Capability::Nftables),
        mesh_offers,
        engine: Engine::connect(
            &config.docker_socket,
            &control_plane,
            &node,
            config.secrets_dir.clone(),
            config.dir.join(crate::enroll::AGE),
            config.state_dir.join("images-pulled"),
        )
        .await
        .with_context(|| format!("Docker at {}", config.docker_socket.display()))?
        .with_registry_auth(config.registry_auth.clone())
        .with_rollback_window(Duration::from_secs(config.rollback_window_seconds)),
        firewall: Arc::clone(&firewall),
        mesh: Arc::new(crate::mesh::Mesh {
            control_plane: control_plane.clone(),
            node: node.clone(),
            state_dir: config.state_dir.clone(),
            nft: config.nft.clone(),
            routes: tokio::sync::Mutex::new(()),
            applying: tokio::sync::Mutex::new(()),
        }),
        enabled: config.executors.clone(),
        routes_dir: config.state_dir.join("routes"),
        ingress: Arc::new({
            let ingress = crate::ingress::Ingress::new(
                &config.caddy_admin,
                config.ingress_listen.clone(),
                config.ingress_upstreams.clone(),
                &format!("{control_plane}_{node}"),
            )
            .map_err(anyhow::Error::msg)?;
            let ingress = match &config.ingress_host_suffix {
                Some(suffix) => ingress.with_host_suffix(suffix).map_err(anyhow::Error::msg)?,
                None => ingress,
            };
            if config.ingress_tls_listen.is_empty() {
                ingress
            } else {
                ingress
                    .with_tls(crate::ingress_tls::TlsConfig {
                        listen: config.ingress_tls_listen.clone(),
                        dir: config.ingress_tls_dir.clone(),
                        identity: config.dir.join(crate::enroll::AGE),
                        certs_listen: config.ingress_certs_listen.clone(),
                    })
                    .map_err(anyhow::Error::msg)?
            }
        }),
        names: {
            let names = crate::names_server::NameService::from_host();
            if config.executors.contains(&Capability::Nftables) {
                let fw = Arc::clone(&firewall);
                names.with_reach(Arc::new(move |env: &str, r: &crate::firewall::Reachable| {
                    fw.set_reachable(env, r)
                        .map_err(|f| format!("{}: {}", f.code, f.detail))
                }))
            } else {
                names
            }
        },
        changed: tokio::sync::Notify::new(),
        backups: crate::docker::Backups {
            restic: crate::restic::Restic {
                program: config.restic.clone(),
                timeout: crate::docker::backup::BACKUP_TIMEOUT,
            },
            roots: config.backup_roots.clone(),
            cache_dir: config.state_dir.join("restic-cache"),
        },
    });
    if engine.on(Capability::Docker) {
        // What already runs keeps its names from the start (it was judged before a restart).
        engine.names.refresh(&engine.engine).await;
    }
    // `pl logs`: this node's requests, served as they come.
    tokio::spawn(crate::logs::serve(
        Arc::clone(&client),
        engine.engine.docker.clone(),
        crate::logs::Scope {
            control_plane: control_plane.clone(),
            node: node.clone(),
        },
    ));
    // Drift: checked every `drift_seconds`; what was repaired goes with the next heartbeat.
    let repairs: Arc<std::sync::Mutex<Vec<agent_proto::Repair>>> = Arc::default();
    {
        let (engine, repairs) = (Arc::clone(&engine), Arc::clone(&repairs));
        let every = Duration::from_secs(config.drift_seconds);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let found = engine.repair().await;
                for (environment, what) in found {
                    tracing::info!(environment = %environment, what = %what, "drift repaired");
                    if let Ok(mut r) = repairs.lock()
                        && r.len() < agent_proto::MAX_HEARTBEAT_REPAIRS
                    {
                        r.push(agent_proto::Repair { environment, what });
                    }
                }
            }
        });
    }
    let nft_works = std::process::Command::new(&config.nft)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    // Other nodes' names as the mesh applied last carried them (an agent restart keeps them).
    if let Some(spec) = engine.mesh.applied() {
        engine.names.set_remote(crate::mesh::remote_names(&spec));
    }
    // Meshes as leases and heartbeats bring them, applied one at a time, newest first.
    if engine.mesh_on {
        let engine = Arc::clone(&engine);
        tokio::spawn(async move {
            while let Some(spec) = crate::mesh::offers::next(&mut mesh_taken, || engine.mesh.fence()).await {
                match engine.mesh.apply(&spec).await {
                    Ok(note) => {
                        // Other nodes' names, served with this node's own.
                        engine.names.set_remote(crate::mesh::remote_names(&spec));
                        tracing::info!(generation = spec.generation, note = %note, "mesh applied")
                    }
                    Err(f) => {
                        engine.mesh_offers.failed(spec.generation);
                        tracing::warn!(generation = spec.generation, code = f.code, detail = %f.detail, "cannot apply the mesh")
                    }
                }
                // The next heartbeat says which generation holds, now.
                engine.changed.notify_one();
            }
        });
    }
    // The mesh: the node's key pair made now (only its public half is ever sent).
    let mesh = if config.mesh {
        match engine.mesh.public_key() {
            Ok(public_key) => Some(agent_proto::mesh::MeshAdvert {
                public_key,
                port: config.mesh_port,
                address: config.mesh_address.map(|a| a.to_string()),
                applied: 0,
                links: Vec::new(),
                names: Vec::new(),
            }),
            Err(f) => {
                tracing::warn!(code = f.code, detail = %f.detail, "no mesh key: this node stays out of the mesh");
                None
            }
        }
    } else {
        None
    };
    // Heartbeats: alive, able to run containers while Docker answers, and what runs.
    // The machine: its id, else the Docker engine's (agents sharing an engine share a machine).
    let host = match crate::enroll::machine_id() {
        Some(id) => Some(id),
        None => engine
            .engine
            .docker
            .info()
            .await
            .ok()
            .and_then(|i| i.id)
            .map(|id| id.replace(':', "-"))
            .filter(|id| agent_proto::valid_host(id)),
    };
    // The mesh's links (each peer's last handshake), read from the device every
    // MESH_LINKS_EVERY off the async threads and bounded: a device that is slow to answer (a
    // wireguard-go starting) never holds a heartbeat, which says the links as last read.
    let links: Arc<std::sync::Mutex<Vec<agent_proto::mesh::MeshLink>>> = Arc::default();
    if mesh.is_some() {
        let (engine, links) = (Arc::clone(&engine), Arc::clone(&links));
        tokio::spawn(async move {
            loop {
                let e = Arc::clone(&engine);
                let read =
                    tokio::time::timeout(MESH_READ, tokio::task::spawn_blocking(move || e.mesh.link_reports())).await;
                if let Ok(Ok(read)) = read
                    && let Ok(mut l) = links.lock()
                {
                    *l = read;
                }
                tokio::time::sleep(MESH_LINKS_EVERY).await;
            }
        });
    }
    {
        let (client, engine, repairs) = (Arc::clone(&client), Arc::clone(&engine), Arc::clone(&repairs));
        let links = Arc::clone(&links);
        let every = Duration::from_secs(config.heartbeat_seconds.max(1));
        tokio::spawn(async move {
            // Volumes are walked at most once a minute, whatever the heartbeat interval, and
            // reported in the heartbeat that follows a walk only (the control plane keeps the
            // last figures; an empty list changes nothing there).
            let mut measured_at: Option<std::time::Instant> = None;
            loop {
                let docker_up = engine.engine.docker.ping().await.is_ok();
                let mut volumes = Vec::new();
                if docker_up && measured_at.is_none_or(|t| t.elapsed() >= VOLUME_MEASURE_EVERY) {
                    if let Ok(measured) = engine.engine.measure_volumes().await {
                        volumes = measured
                            .into_iter()
                            .take(agent_proto::MAX_HEARTBEAT_VOLUMES)
                            .map(|v| agent_proto::VolumeUsage {
                                environment: v.environment,
                                volume: v.volume,
                                generation: v.generation,
                                bytes: v.bytes,
                            })
                            .collect();
                    }
                    measured_at = Some(std::time::Instant::now());
                }
                let mut capabilities = Vec::new();
                for c in &engine.enabled {
                    let works = match c {
                        Capability::Docker => docker_up,
                        Capability::Nftables => nft_works,
                        Capability::Routes => true,
                        Capability::Ingress => engine.ingress.answers().await,
                    };
                    if works {
                        capabilities.push(c.name().to_owned());
                    }
                }
                let repaired = repairs.lock().map(|mut r| std::mem::take(&mut *r)).unwrap_or_default();
                let hb = Heartbeat {
                    agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                    capabilities,
                    running: observed(&engine.engine).await,
                    repaired,
                    host: host.clone(),
                    taken_subnets: engine.engine.taken_subnets().await.unwrap_or_default(),
                    volumes,
                    mesh: mesh.as_ref().map(|m| agent_proto::mesh::MeshAdvert {
                        // Read each time: a rotation replaces it.
                        public_key: engine.mesh.public_key().unwrap_or_else(|_| m.public_key.clone()),
                        applied: engine.mesh.fence(),
                        links: links.lock().map(|l| l.clone()).unwrap_or_default(),
                        names: crate::mesh::local_names(&engine.names.local()),
                        ..m.clone()
                    }),
                };
                match blocking(&client, move |c| c.heartbeat(&hb)).await {
                    Ok(reply) => {
                        // A newer mesh than the one applied: applied off the heartbeat's path.
                        if let Some(spec) = reply.mesh
                            && mesh.is_some()
                            && engine.mesh_on
                        {
                            engine.mesh_offers.offer(spec, engine.mesh.fence());
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                }
                tokio::time::sleep(EARLY_HEARTBEAT_GAP).await;
                tokio::select! {
                    _ = tokio::time::sleep(every.saturating_sub(EARLY_HEARTBEAT_GAP)) => {}
                    _ = engine.changed.notified() => {}
                }
            }
        });
    }
    // One queue per environment (its tasks in order), at most `parallel_environments` at work;
    // a step's ends go back with the next lease.
    let leasing = LeaseLoop::new(client, engine, config.parallel_environments, LONG_POLL);
    leasing.run(&AtomicBool::new(false)).await;
    Ok(())
}

/// How long one read of the mesh's device for its links may take.
pub const MESH_READ: Duration = Duration::from_secs(2);

/// How often the mesh's links are read for the heartbeats.
pub const MESH_LINKS_EVERY: Duration = Duration::from_secs(5);

/// How often the heartbeat measures what the node's volumes hold.
pub const VOLUME_MEASURE_EVERY: Duration = Duration::from_secs(60);

/// How long a lease waits for a job when the node holds none.
pub const LONG_POLL: Duration = Duration::from_secs(20);

impl Tasks for Executors {
    fn execute(&self, job: &LeasedJob) -> impl std::future::Future<Output = Result<Ended, Failure>> + Send {
        execute(self, job)
    }

    fn changed(&self) {
        self.changed.notify_one();
    }

    fn mesh_held(&self) -> Option<u64> {
        self.mesh_on.then(|| self.mesh_offers.held(self.mesh.fence()))
    }

    fn mesh(&self, spec: agent_proto::mesh::MeshSpec) {
        if self.mesh_on {
            self.mesh_offers.offer(spec, self.mesh.fence());
        }
    }
}
