//! The Docker executors (bollard): an environment's bridge network, a replica's hardened
//! container with its health, a run of a job or release role, and their removal. Each is safe
//! to run twice: it adopts what matches (same name, our labels, same spec hash), repairs what
//! drifted (a stopped container of ours is started), and refuses what is not ours (a container
//! or network with our name and without our labels) with a stable code.
//!
//! Architecture invariant: the agent touches only objects labelled `dev.pushleft.owned=true`;
//! a secret value is never in a container's environment, labels, command or `docker inspect`:
//! it is a file under a read-only bind of `/run/secrets`.

use crate::outcome::{Failure, permanent, retryable};
use agent_proto::{ApplicationSpec, NetworkSpec};
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, Ipam, IpamConfig, NetworkCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The label every object the agent made carries.
pub const OWNED: &str = "dev.pushleft.owned";
pub const ENVIRONMENT: &str = "dev.pushleft.environment";
pub const DEPLOYMENT: &str = "dev.pushleft.deployment";
pub const ROLE: &str = "dev.pushleft.role";
pub const INSTANCE: &str = "dev.pushleft.instance";
pub const GENERATION: &str = "dev.pushleft.generation";
pub const SPEC_HASH: &str = "dev.pushleft.spec-hash";
/// The node whose agent made it: agents sharing one engine (several nodes on one machine)
/// each see only their own containers.
pub const NODE: &str = "dev.pushleft.node";
/// The control plane whose agent made it: agents of several control planes sharing one engine
/// (two repositories' `pl up`, two fleets on one node) each see only their own.
pub const CONTROL_PLANE: &str = "dev.pushleft.control-plane";

/// Largest log tail a result carries.
pub const LOG_TAIL_BYTES: usize = 16 * 1024;
/// How long a run (job or release role) may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// How long a worker must stay up to count as started.
pub const WORKER_SETTLE: Duration = Duration::from_secs(2);

/// The Docker side of the agent: the engine and where secret files live.
pub struct Engine {
    pub docker: Docker,
    /// The control plane's id (from enrolment): on every object's labels, and in every filter.
    pub control_plane: String,
    /// This node's name (its certificate's): on every container's labels, and in every filter.
    pub node: String,
    /// A folder on a tmpfs (`/run/...`) holding each container's secret files.
    pub secrets_dir: PathBuf,
    /// The node's age identity file (from enrolment), which opens sealed secrets.
    pub identity: PathBuf,
    /// The images this agent pulled, one reference a line: the only images it ever removes.
    pub pulled: PathBuf,
    /// Held while that file is read and rewritten (tasks of a step and the drift round run at
    /// once).
    pulled_lock: std::sync::Mutex<()>,
    /// Credentials files by registry (`127.0.0.1:5000`), for pulls from registries that want
    /// them (`pl up`'s build registry).
    registry_auth: std::collections::BTreeMap<String, PathBuf>,
}

fn not_found(e: &DockerError) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code: 404, .. })
}

/// A Docker error as a failure: unreachable or a server error is worth retrying.
fn docker(code: &'static str, e: DockerError) -> Failure {
    retryable(code, format!("docker: {e}"))
}

fn owned(labels: Option<&HashMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(OWNED)).is_some_and(|v| v == "true")
}

/// Whether labels say the object is this control plane's and this node's (ours to change).
fn mine(labels: Option<&HashMap<String, String>>, control_plane: &str, node: &str) -> bool {
    let is = |key: &str, want: &str| labels.and_then(|l| l.get(key)).is_some_and(|v| v == want);
    owned(labels) && is(CONTROL_PLANE, control_plane) && is(NODE, node)
}

/// Whether a container found under `app`'s name is `app`'s own: our label, and its labels carry
/// exactly this control plane, node, environment, role, instance and generation. Ownership is decided by the
/// labels, never by the name: a container of another environment (or node) that happens to
/// have the name is foreign, and is never removed or adopted.
fn same_identity(
    labels: Option<&HashMap<String, String>>,
    control_plane: &str,
    node: &str,
    app: &ApplicationSpec,
) -> bool {
    let Some(l) = labels else { return false };
    let is = |key: &str, want: &str| l.get(key).is_some_and(|v| v == want);
    let instance = app.instance.map(|i| i.to_string());
    mine(labels, control_plane, node)
        && is(ENVIRONMENT, &app.environment)
        && is(ROLE, &app.role)
        && is(GENERATION, &app.generation.to_string())
        && l.get(INSTANCE) == instance.as_ref()
}

fn foreign_container(app: &ApplicationSpec) -> Failure {
    permanent(
        "foreign-container",
        format!(
            "a container named {} exists and is not this replica's (its labels name another owner): left untouched",
            app.container
        ),
    )
}

impl Engine {
    /// Connects to the engine at `socket`, negotiating the API version it speaks.
    pub async fn connect(
        socket: &Path,
        control_plane: &str,
        node: &str,
        secrets_dir: PathBuf,
        identity: PathBuf,
        pulled: PathBuf,
    ) -> Result<Engine, DockerError> {
        let docker = Docker::connect_with_unix(&socket.to_string_lossy(), 120, bollard::API_DEFAULT_VERSION)?
            .negotiate_version()
            .await?;
        Ok(Engine {
            docker,
            control_plane: control_plane.to_owned(),
            node: node.to_owned(),
            secrets_dir,
            identity,
            pulled,
            pulled_lock: std::sync::Mutex::new(()),
            registry_auth: std::collections::BTreeMap::new(),
        })
    }

    /// Pulls from these registries carry the credentials in these files
    /// ([`crate::registry_auth::read`]).
    pub fn with_registry_auth(mut self, files: std::collections::BTreeMap<String, PathBuf>) -> Engine {
        self.registry_auth = files;
        self
    }

    fn pulled_images(&self) -> Vec<String> {
        std::fs::read_to_string(&self.pulled)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Reads, changes and rewrites the list of pulled images, as one step.
    fn edit_pulled(&self, change: impl FnOnce(&mut Vec<String>)) -> Result<(), Failure> {
        let _held = self
            .pulled_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut images = self.pulled_images();
        let before = images.clone();
        change(&mut images);
        if images == before {
            return Ok(());
        }
        self.set_pulled(&images)
    }

    fn set_pulled(&self, images: &[String]) -> Result<(), Failure> {
        if let Some(dir) = self.pulled.parent() {
            std::fs::create_dir_all(dir).map_err(|e| retryable("state-write-failed", e.to_string()))?;
        }
        let tmp = self.pulled.with_extension("new");
        let mut text = images.join("\n");
        text.push('\n');
        std::fs::write(&tmp, text).map_err(|e| retryable("state-write-failed", e.to_string()))?;
        std::fs::rename(&tmp, &self.pulled).map_err(|e| retryable("state-write-failed", e.to_string()))
    }

    /// Disk: removes the images this agent pulled that no container (of anyone) uses any
    /// more. An image it did not pull is never touched. Returns the images removed.
    pub async fn collect_images(&self) -> Result<Vec<String>, Failure> {
        let pulled = self.pulled_images();
        if pulled.is_empty() {
            return Ok(Vec::new());
        }
        let containers = self
            .docker
            .list_containers(Some(ListContainersOptionsBuilder::default().all(true).build()))
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        let in_use: std::collections::HashSet<String> = containers.into_iter().filter_map(|c| c.image_id).collect();
        let (mut forgotten, mut removed) = (Vec::new(), Vec::new());
        for image in pulled {
            let id = match self.docker.inspect_image(&image).await {
                Ok(i) => i.id.unwrap_or_default(),
                Err(e) if not_found(&e) => {
                    forgotten.push(image); // gone already: forget it
                    continue;
                }
                Err(e) => return Err(docker("docker-unavailable", e)),
            };
            if in_use.contains(&id) {
                continue;
            }
            match self
                .docker
                .remove_image(&image, None::<bollard::query_parameters::RemoveImageOptions>, None)
                .await
            {
                Ok(_) => removed.push(image),
                Err(e) if not_found(&e) => forgotten.push(image),
                Err(_) => {} // in use after all (a race): next round
            }
        }
        // What was pulled meanwhile stays listed.
        self.edit_pulled(|list| list.retain(|i| !removed.contains(i) && !forgotten.contains(i)))?;
        Ok(removed)
    }

    /// The environment's bridge network with the subnet from the lease, labelled as ours.
    /// One that exists with our labels and that subnet is adopted; another subnet is
    /// `network-subnet-mismatch`; a network with that name that is not ours, `foreign-network`.
    pub async fn ensure_network(&self, net: &NetworkSpec) -> Result<String, Failure> {
        match self.docker.inspect_network(&net.network, None).await {
            Ok(n) => {
                if !mine(n.labels.as_ref(), &self.control_plane, &self.node) {
                    return Err(permanent(
                        "foreign-network",
                        format!(
                            "a network named {} exists and is not this node's of control plane {}: left untouched",
                            net.network, self.control_plane
                        ),
                    ));
                }
                let subnets: Vec<String> = n
                    .ipam
                    .and_then(|i| i.config)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|c| c.subnet)
                    .collect();
                if subnets != [net.subnet.clone()] {
                    return Err(permanent(
                        "network-subnet-mismatch",
                        format!("{} has subnet {subnets:?}, the lease says {}", net.network, net.subnet),
                    ));
                }
                Ok(format!("{} adopted", net.network))
            }
            Err(e) if not_found(&e) => {
                let labels = HashMap::from([
                    (OWNED.to_owned(), "true".to_owned()),
                    (CONTROL_PLANE.to_owned(), self.control_plane.clone()),
                    (ENVIRONMENT.to_owned(), net.environment.clone()),
                    (NODE.to_owned(), self.node.clone()),
                ]);
                let request = NetworkCreateRequest {
                    name: net.network.clone(),
                    driver: Some("bridge".into()),
                    ipam: Some(Ipam {
                        driver: Some("default".into()),
                        config: Some(vec![IpamConfig {
                            subnet: Some(net.subnet.clone()),
                            ..IpamConfig::default()
                        }]),
                        options: None,
                    }),
                    labels: Some(labels),
                    // The bridge gets a name of ours, so the routes executor can name it.
                    options: Some(HashMap::from([(
                        "com.docker.network.bridge.name".to_owned(),
                        crate::routes::bridge_name(&net.network),
                    )])),
                    ..NetworkCreateRequest::default()
                };
                self.docker
                    .create_network(request)
                    .await
                    .map_err(|e| docker("network-create-failed", e))?;
                Ok(format!("{} created with {}", net.network, net.subnet))
            }
            Err(e) => Err(docker("docker-unavailable", e)),
        }
    }

    /// The pool's /24s (`10.208.0.0/12`) that networks on this engine use and this control plane
    /// did not make (another control plane's, or anyone's network): the heartbeat reports them,
    /// so the control plane gives its environments other ones. A larger network counts every
    /// /24 of the pool it covers.
    pub async fn taken_subnets(&self) -> Result<Vec<String>, Failure> {
        let networks = self
            .docker
            .list_networks(None::<bollard::query_parameters::ListNetworksOptions>)
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        let mut out = std::collections::BTreeSet::new();
        for n in networks {
            let labels = n.labels.as_ref();
            let ours = owned(labels) && labels.and_then(|l| l.get(CONTROL_PLANE)) == Some(&self.control_plane);
            if ours {
                continue;
            }
            for cidr in n
                .ipam
                .and_then(|i| i.config)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.subnet)
            {
                out.extend(pool_slots(&cidr));
            }
        }
        Ok(out.into_iter().take(agent_proto::MAX_TAKEN_SUBNETS).collect())
    }

    /// Removes the environment's network if it is ours; gone already is done.
    pub async fn remove_network(&self, network: &str) -> Result<String, Failure> {
        match self.docker.inspect_network(network, None).await {
            Ok(n) if !mine(n.labels.as_ref(), &self.control_plane, &self.node) => Err(permanent(
                "foreign-network",
                format!(
                    "a network named {network} is not this node's of control plane {}: left untouched",
                    self.control_plane
                ),
            )),
            Ok(_) => match self.docker.remove_network(network).await {
                Ok(()) => Ok(format!("{network} removed")),
                Err(e) if not_found(&e) => Ok(format!("{network} already gone")),
                Err(e) => Err(docker("network-remove-failed", e)),
            },
            Err(e) if not_found(&e) => Ok(format!("{network} already gone")),
            Err(e) => Err(docker("docker-unavailable", e)),
        }
    }

    /// Containers of ours with every label in `filter`, with their labels and state.
    async fn ours(&self, filter: &[(&str, &str)]) -> Result<Vec<(String, HashMap<String, String>, bool)>, Failure> {
        let mut labels = vec![
            format!("{OWNED}=true"),
            format!("{CONTROL_PLANE}={}", self.control_plane),
            format!("{NODE}={}", self.node),
        ];
        labels.extend(filter.iter().map(|(k, v)| format!("{k}={v}")));
        let filters = HashMap::from([("label".to_owned(), labels)]);
        let list = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        Ok(list
            .into_iter()
            .map(|c| {
                let name = c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .unwrap_or_default()
                    .trim_start_matches('/')
                    .to_owned();
                let running = matches!(c.state, Some(bollard::models::ContainerSummaryStateEnum::RUNNING));
                (name, c.labels.unwrap_or_default(), running)
            })
            .collect())
    }

    /// Pulls `image` (by digest) when the engine does not have it. A registry that cannot
    /// resolve fails at once, for good, with a hint (a pull would fail the same way on every
    /// retry); one under `.invalid` (a placeholder) is refused without asking a resolver.
    async fn ensure_image(&self, image: &str) -> Result<(), Failure> {
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(docker("docker-unavailable", e)),
        }
        let unreachable = |registry: &str, why: &str| {
            permanent(
                "image-registry-unreachable",
                format!(
                    "{image}: the registry {registry} {why}; push the image to a registry this node resolves, or build it on this machine (`pl up --build PROJECT=DIR`)"
                ),
            )
        };
        if let Some(registry) = crate::registry_auth::registry_of(image)
            && registry
                .split(':')
                .next()
                .is_some_and(|h| h == "invalid" || h.ends_with(".invalid"))
        {
            return Err(unreachable(
                registry,
                "is a placeholder under .invalid, which never resolves",
            ));
        }
        let credentials =
            match crate::registry_auth::registry_of(image).and_then(|r| Some((r, self.registry_auth.get(r)?))) {
                Some((registry, file)) => Some(
                    crate::registry_auth::read(file, registry).map_err(|e| permanent("registry-auth-unreadable", e))?,
                ),
                None => None,
            };
        let mut pull = self.docker.create_image(
            Some(CreateImageOptionsBuilder::default().from_image(image).build()),
            None,
            credentials,
        );
        // Remembered before the pull: an image this agent pulled is the only kind it removes.
        self.edit_pulled(|list| {
            if !list.iter().any(|p| p == image) {
                list.push(image.to_owned());
            }
        })?;
        while let Some(step) = pull.next().await {
            if let Err(e) = step {
                return Err(match &e {
                    DockerError::DockerResponseServerError { status_code: 404, .. } => {
                        permanent("image-not-found", format!("{image}: {e}"))
                    }
                    DockerError::DockerStreamError { error }
                        if error.contains("not found") || error.contains("manifest unknown") =>
                    {
                        permanent("image-not-found", format!("{image}: {error}"))
                    }
                    _ if resolve_failed(&e.to_string()) => unreachable(
                        crate::registry_auth::registry_of(image).unwrap_or("docker.io"),
                        "does not resolve",
                    ),
                    _ => retryable("image-pull-failed", format!("{image}: {e}")),
                });
            }
        }
        Ok(())
    }

    /// Writes the secrets, opened with the node's identity, as files of their own folder
    /// (0700, files 0400) for a read-only bind at `/run/secrets`. Returns the folder.
    fn write_secrets(&self, app: &ApplicationSpec) -> Result<Option<PathBuf>, Failure> {
        if app.secrets.is_empty() {
            return Ok(None);
        }
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let identities = pushleft_secrets::load_identities(&self.identity)
            .map_err(|e| permanent("node-identity-unreadable", e.code().to_owned()))?;
        let dir = self.secrets_dir.join(&app.container);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| retryable("secrets-dir-failed", e.to_string()))?;
        for s in &app.secrets {
            if s.key.is_empty() || s.key.contains('/') || s.key.starts_with('.') {
                return Err(permanent("secret-key-invalid", "a secret key is not a plain file name"));
            }
            let plaintext = pushleft_secrets::decrypt(&s.sealed, &identities)
                .map_err(|e| permanent("secret-unopenable", e.code().to_owned()))?;
            let path = dir.join(&s.key);
            let _ = std::fs::remove_file(&path);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o444)
                .open(&path)
                .map_err(|e| retryable("secrets-write-failed", e.to_string()))?;
            use std::io::Write;
            f.write_all(&plaintext)
                .map_err(|e| retryable("secrets-write-failed", e.to_string()))?;
        }
        Ok(Some(dir))
    }

    fn labels(&self, app: &ApplicationSpec) -> HashMap<String, String> {
        let mut l = HashMap::from([
            (OWNED.to_owned(), "true".to_owned()),
            (CONTROL_PLANE.to_owned(), self.control_plane.clone()),
            (NODE.to_owned(), self.node.clone()),
            (ENVIRONMENT.to_owned(), app.environment.clone()),
            (DEPLOYMENT.to_owned(), app.deployment.clone()),
            (ROLE.to_owned(), app.role.clone()),
            (GENERATION.to_owned(), app.generation.to_string()),
            (SPEC_HASH.to_owned(), app.spec_hash.clone()),
        ]);
        if let Some(i) = app.instance {
            l.insert(INSTANCE.to_owned(), i.to_string());
        }
        l
    }

    /// Creates the hardened container: read-only root, a small `/tmp` tmpfs, every capability
    /// dropped, no new privileges, the role's CPU, memory (and swap) and pids limits, no
    /// published port, only the environment's network, an init as PID 1.
    async fn create(&self, app: &ApplicationSpec, secrets: Option<&Path>) -> Result<(), Failure> {
        let host = HostConfig {
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                "rw,noexec,nosuid,nodev,size=64m".to_owned(),
            )])),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            nano_cpus: Some(i64::try_from(app.cpu_millis.saturating_mul(1_000_000)).unwrap_or(i64::MAX)),
            memory: Some(i64::try_from(app.memory_bytes).unwrap_or(i64::MAX)),
            memory_swap: Some(i64::try_from(app.memory_bytes).unwrap_or(i64::MAX)),
            pids_limit: Some(i64::from(app.pids)),
            network_mode: Some(app.network.network.clone()),
            init: Some(true),
            binds: secrets.map(|d| vec![format!("{}:/run/secrets:ro", d.display())]),
            // Output is bounded on disk whatever the engine's default driver: a container that
            // writes without end could otherwise fill the disk under every environment and the
            // ledger (24 MiB of stdout grew the host's log by 25.6 MiB in the review).
            log_config: Some(HostConfigLogConfig {
                typ: Some("json-file".to_owned()),
                config: Some(HashMap::from([
                    ("max-size".to_owned(), app.log_max_bytes.max(1 << 20).to_string()),
                    ("max-file".to_owned(), app.log_max_files.clamp(1, 10).to_string()),
                ])),
            }),
            ..HostConfig::default()
        };
        let body = ContainerCreateBody {
            image: Some(app.image.clone()),
            cmd: (!app.command.is_empty()).then(|| app.command.clone()),
            env: Some(app.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(self.labels(app)),
            host_config: Some(host),
            stop_timeout: Some(10),
            ..ContainerCreateBody::default()
        };
        self.docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&app.container).build()),
                body,
            )
            .await
            .map_err(|e| docker("container-create-failed", e))?;
        Ok(())
    }

    /// The last [`LOG_TAIL_BYTES`] of a container's output.
    pub async fn log_tail(&self, container: &str) -> String {
        let mut out = Vec::new();
        let mut logs = self.docker.logs(
            container,
            Some(
                LogsOptionsBuilder::default()
                    .stdout(true)
                    .stderr(true)
                    .tail("200")
                    .build(),
            ),
        );
        // The engine sends at most 200 lines of at most 16 KiB each (it splits longer ones);
        // only the last LOG_TAIL_BYTES are ever held.
        while let Some(Ok(chunk)) = logs.next().await {
            out.extend_from_slice(&chunk.into_bytes());
            if out.len() > 2 * LOG_TAIL_BYTES {
                out.drain(..out.len() - LOG_TAIL_BYTES);
            }
        }
        let start = out.len().saturating_sub(LOG_TAIL_BYTES);
        String::from_utf8_lossy(&out[start..]).into_owned()
    }

    /// The container's address on the environment network.
    pub async fn address(&self, container: &str, network: &str) -> Option<String> {
        let c = self.docker.inspect_container(container, None).await.ok()?;
        c.network_settings?
            .networks?
            .get(network)?
            .ip_address
            .clone()
            .filter(|a| !a.is_empty())
    }

    /// One replica at its generation, healthy. See the module's rules for adopting, repairing
    /// and refusing.
    pub async fn ensure_application(&self, app: &ApplicationSpec) -> Result<String, Failure> {
        let instance = app.instance.map(|i| i.to_string()).unwrap_or_default();
        // A newer generation of this replica already runs: this task is stale.
        for (name, labels, _) in self
            .ours(&[
                (ENVIRONMENT, &app.environment),
                (ROLE, &app.role),
                (INSTANCE, &instance),
            ])
            .await?
        {
            let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            if g > app.generation {
                return Err(permanent(
                    "stale-generation",
                    format!("{name} runs generation {g}, newer than {}", app.generation),
                ));
            }
        }
        let existing = match self.docker.inspect_container(&app.container, None).await {
            Ok(c) => Some(c),
            Err(e) if not_found(&e) => None,
            Err(e) => return Err(docker("docker-unavailable", e)),
        };
        let mut note = "created";
        if let Some(c) = existing {
            let labels = c.config.as_ref().and_then(|c| c.labels.clone());
            if !same_identity(labels.as_ref(), &self.control_plane, &self.node, app) {
                return Err(foreign_container(app));
            }
            let hash = labels
                .as_ref()
                .and_then(|l| l.get(SPEC_HASH))
                .cloned()
                .unwrap_or_default();
            if hash == app.spec_hash {
                let running = c.state.and_then(|s| s.running).unwrap_or(false);
                note = if running { "adopted" } else { "restarted" };
            } else {
                self.remove(&app.container).await?;
            }
        }
        if note == "created" {
            self.ensure_image(&app.image).await?;
            let secrets = self.write_secrets(app)?;
            self.create(app, secrets.as_deref()).await?;
        }
        if note != "adopted" {
            self.docker
                .start_container(&app.container, None)
                .await
                .map_err(|e| docker("container-start-failed", e))?;
        }
        if let Err(f) = self.healthy(app).await {
            // A replica that never became healthy goes (its log tail is in the result), so it
            // is neither left half-started nor restarted as drift; the generation before it
            // keeps serving.
            if f.outcome == agent_proto::Outcome::Permanent {
                self.remove(&app.container).await?;
            }
            return Err(f);
        }
        Ok(format!("{} {note}, healthy", app.container))
    }

    /// Drift: the newest generation of each replica of ours should run. One found stopped
    /// (by hand, or its process died) is started again; returns (environment, what) for each.
    pub async fn repair_containers(&self) -> Result<Vec<(String, String)>, Failure> {
        let mut newest: HashMap<(String, String, String), (u64, String, bool)> = HashMap::new();
        for (name, labels, running) in self.ours(&[]).await? {
            let (Some(env), Some(role), Some(instance)) =
                (labels.get(ENVIRONMENT), labels.get(ROLE), labels.get(INSTANCE))
            else {
                continue; // runs have no instance: they are not kept running
            };
            let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            let key = (env.clone(), role.clone(), instance.clone());
            if newest.get(&key).is_none_or(|(n, _, _)| g > *n) {
                newest.insert(key, (g, name, running));
            }
        }
        let mut out = Vec::new();
        for ((env, _, _), (_, name, running)) in newest {
            if running {
                continue;
            }
            match self.docker.start_container(&name, None).await {
                Ok(()) => out.push((env, format!("container {name} was stopped: started again"))),
                Err(e) => tracing::warn!(container = %name, error = %e, "cannot start a drifted container"),
            }
        }
        Ok(out)
    }

    /// Web roles: an HTTP probe of the health path until it answers 2xx, within the role's
    /// deadline. Others: still running after [`WORKER_SETTLE`]. A missed deadline is permanent,
    /// with the last probe outcomes and the log tail.
    async fn healthy(&self, app: &ApplicationSpec) -> Result<(), Failure> {
        let exited = |detail: String| permanent("exited", detail);
        let Some(health) = &app.health else {
            tokio::time::sleep(WORKER_SETTLE).await;
            return match self.running(&app.container).await? {
                (true, _) => Ok(()),
                (false, code) => Err(exited(format!(
                    "exit code {code}\n{}",
                    self.log_tail(&app.container).await
                ))),
            };
        };
        let deadline = Instant::now() + Duration::from_secs(u64::from(health.timeout_seconds.max(1)));
        let mut probes: Vec<String> = Vec::new();
        loop {
            match self.running(&app.container).await? {
                (true, _) => {}
                (false, code) => {
                    return Err(exited(format!(
                        "exit code {code} before it was healthy\n{}",
                        self.log_tail(&app.container).await
                    )));
                }
            }
            let outcome = match self.address(&app.container, &app.network.network).await {
                None => "no address yet".to_owned(),
                Some(ip) => probe(&ip, app.port.unwrap_or(80), &health.path).await,
            };
            if outcome.starts_with('2') {
                return Ok(());
            }
            probes.push(outcome);
            if probes.len() > 5 {
                probes.remove(0);
            }
            if Instant::now() >= deadline {
                return Err(permanent(
                    "health-deadline",
                    format!(
                        "not healthy within {} s; last probes: {}\n{}",
                        health.timeout_seconds,
                        probes.join("; "),
                        self.log_tail(&app.container).await
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the container runs, and its exit code when it does not.
    async fn running(&self, container: &str) -> Result<(bool, i64), Failure> {
        let c = self
            .docker
            .inspect_container(container, None)
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        let s = c.state.unwrap_or_default();
        Ok((s.running.unwrap_or(false), s.exit_code.unwrap_or(0)))
    }

    /// Removes a container of ours (and its secret files); gone already is fine.
    async fn remove(&self, container: &str) -> Result<(), Failure> {
        match self
            .docker
            .remove_container(
                container,
                Some(RemoveContainerOptionsBuilder::default().force(true).build()),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(docker("container-remove-failed", e)),
        }
        let dir = self.secrets_dir.join(container);
        if dir.starts_with(&self.secrets_dir) && dir != self.secrets_dir {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    }

    /// Stops the replica's containers of generations older than `generation` (the new one is
    /// healthy by now); those two or more generations back are removed.
    pub async fn stop_older(
        &self,
        environment: &str,
        role: &str,
        instance: u32,
        generation: u64,
    ) -> Result<String, Failure> {
        let instance = instance.to_string();
        let mut done = Vec::new();
        for (name, labels, running) in self
            .ours(&[(ENVIRONMENT, environment), (ROLE, role), (INSTANCE, &instance)])
            .await?
        {
            let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            if g >= generation {
                continue;
            }
            if g + 1 < generation {
                self.remove(&name).await?;
                done.push(format!("{name} removed"));
            } else if running {
                match self
                    .docker
                    .stop_container(&name, Some(StopContainerOptionsBuilder::default().t(10).build()))
                    .await
                {
                    Ok(()) => done.push(format!("{name} stopped")),
                    Err(e) if not_found(&e) => {}
                    Err(DockerError::DockerResponseServerError { status_code: 304, .. }) => {}
                    Err(e) => return Err(docker("container-stop-failed", e)),
                }
            }
        }
        Ok(if done.is_empty() {
            "nothing older runs".into()
        } else {
            done.join(", ")
        })
    }

    /// Removes every container of the replica, of any generation up to `generation`.
    pub async fn teardown(
        &self,
        environment: &str,
        role: &str,
        instance: u32,
        generation: u64,
    ) -> Result<String, Failure> {
        let instance = instance.to_string();
        let mut n = 0;
        for (name, labels, _) in self
            .ours(&[(ENVIRONMENT, environment), (ROLE, role), (INSTANCE, &instance)])
            .await?
        {
            let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            if g <= generation {
                self.remove(&name).await?;
                n += 1;
            }
        }
        Ok(format!("{n} containers removed"))
    }

    /// A run of a job or release role: the same hardened container, bounded in time, removed
    /// on every way out. Exit 0 succeeds; another exit code is permanent, with the log tail. A
    /// run found finished (a replay after a crash) is judged by its exit code.
    pub async fn run_once(&self, app: &ApplicationSpec, timeout: Duration) -> Result<String, Failure> {
        let existing = match self.docker.inspect_container(&app.container, None).await {
            Ok(c) => Some(c),
            Err(e) if not_found(&e) => None,
            Err(e) => return Err(docker("docker-unavailable", e)),
        };
        match existing {
            Some(c)
                if !same_identity(
                    c.config.as_ref().and_then(|c| c.labels.as_ref()),
                    &self.control_plane,
                    &self.node,
                    app,
                ) =>
            {
                return Err(foreign_container(app));
            }
            Some(_) => {}
            None => {
                self.ensure_image(&app.image).await?;
                let secrets = self.write_secrets(app)?;
                self.create(app, secrets.as_deref()).await?;
                if let Err(e) = self.docker.start_container(&app.container, None).await {
                    self.remove(&app.container).await?;
                    return Err(docker("container-start-failed", e));
                }
            }
        }
        let started = Instant::now();
        let code = loop {
            match self.running(&app.container).await {
                Ok((false, code)) => break code,
                Ok((true, _)) if started.elapsed() < timeout => tokio::time::sleep(Duration::from_millis(200)).await,
                Ok((true, _)) => {
                    let tail = self.log_tail(&app.container).await;
                    self.remove(&app.container).await?;
                    return Err(permanent(
                        "run-timeout",
                        format!("still running after {} s\n{tail}", timeout.as_secs()),
                    ));
                }
                Err(f) => return Err(f),
            }
        };
        let tail = self.log_tail(&app.container).await;
        self.remove(&app.container).await?;
        if code == 0 {
            Ok(format!("exit code 0\n{tail}"))
        } else {
            Err(permanent("exit-code", format!("exit code {code}\n{tail}")))
        }
    }
}

/// Whether an engine's pull error says the registry's name does not exist (Go's resolver's
/// words for NXDOMAIN), which no retry mends; a resolver that failed for now is retried.
fn resolve_failed(error: &str) -> bool {
    error.contains("no such host")
}

/// The /24s of the subnet pool (`10.208.0.0/12`) that `cidr` overlaps, as `10.x.y.0/24`.
pub fn pool_slots(cidr: &str) -> Vec<String> {
    let Some((addr, len)) = cidr.split_once('/') else {
        return Vec::new();
    };
    let (Ok(addr), Ok(len)) = (addr.parse::<std::net::Ipv4Addr>(), len.parse::<u32>()) else {
        return Vec::new();
    };
    if len > 32 {
        return Vec::new();
    }
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    let start = u32::from(addr) & mask;
    let end = start | !mask;
    let (pool_start, pool_end) = (
        u32::from(std::net::Ipv4Addr::new(10, 208, 0, 0)),
        u32::from(std::net::Ipv4Addr::new(10, 223, 255, 255)),
    );
    let (from, to) = (start.max(pool_start) >> 8, end.min(pool_end) >> 8);
    if from > to {
        return Vec::new();
    }
    (from..=to)
        .map(|slot| format!("{}/24", std::net::Ipv4Addr::from(slot << 8)))
        .collect()
}

/// Largest header block a health probe reads; its body is never read.
pub const PROBE_MAX_HEADER_BYTES: usize = 8 * 1024;
/// How long one health probe may take, connection included.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One HTTP GET of `path` on the instance's own `ip:port` (ureq): the status code, or why not.
///
/// The agent runs as root on the host, so a probe must never become a request to anywhere
/// else: it follows no redirect (a 3xx fails the probe, saying where it pointed; the hardening
/// review had a container redirect the probe to a loopback service and from there to the
/// metadata address, and the replica was judged healthy), uses no proxy from the environment,
/// takes `ip` only as an address (never a name to resolve), and reads at most
/// [`PROBE_MAX_HEADER_BYTES`] of headers and no body, within [`PROBE_TIMEOUT`].
async fn probe(ip: &str, port: u16, path: &str) -> String {
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return format!("address {ip:?} is not an IP address");
    };
    if !path.starts_with('/') || path.len() > 1024 || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return "the health path is not an absolute URL path".to_owned();
    }
    let url = format!("http://{}{path}", std::net::SocketAddr::new(ip, port));
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .max_response_header_size(PROBE_MAX_HEADER_BYTES)
            .timeout_global(Some(PROBE_TIMEOUT))
            .build()
            .into();
        match agent.get(&url).call() {
            Ok(r) if r.status().is_redirection() => {
                let to = r
                    .headers()
                    .get("location")
                    .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned())
                    .unwrap_or_default();
                format!(
                    "{} redirect to {to:.120} not followed (a probe goes only to the instance itself)",
                    r.status().as_u16()
                )
            }
            Ok(r) => r.status().as_u16().to_string(),
            Err(e) => e.to_string(),
        }
    })
    .await
    .unwrap_or_else(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::pool_slots;

    #[test]
    fn a_network_takes_the_pool_slots_it_overlaps() {
        assert_eq!(pool_slots("10.208.3.0/24"), ["10.208.3.0/24"]);
        assert_eq!(pool_slots("10.208.3.128/25"), ["10.208.3.0/24"]);
        assert_eq!(pool_slots("10.209.0.0/23"), ["10.209.0.0/24", "10.209.1.0/24"]);
        assert_eq!(pool_slots("10.0.0.0/8").len(), 4096, "the whole pool");
        assert!(pool_slots("172.17.0.0/16").is_empty());
        assert!(pool_slots("10.224.0.0/24").is_empty());
        assert!(pool_slots("not a subnet").is_empty());
        assert!(pool_slots("fd00::/64").is_empty());
    }
}
