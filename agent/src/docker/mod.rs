//! The Docker executors (bollard): an environment's bridge network, a replica's hardened
//! container with its health, a run of a job or release role, and their removal. Each is safe
//! to run twice: it adopts what matches (same name, our labels, same spec hash), repairs what
//! drifted (a stopped container of ours is started), and refuses what is not ours (a container
//! or network with our name and without our labels) with a stable code.
//!
//! Architecture invariant: the agent touches only objects labelled `dev.pushleft.owned=true`;
//! a secret value is never in a container's environment, labels, command or `docker inspect`:
//! it is a file under a read-only bind of `/run/secrets`.

pub mod backup;
mod container;
pub mod drill;
mod health;
mod image;
mod load;
mod network;
mod older;

use health::probe;
pub mod resume;
mod secrets;
mod volume;

pub use backup::{BackupOf, Backups};
pub use network::pool_slots;
pub use volume::{VOLUME, VOLUME_GENERATION, VolumeUse};

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
/// The image the container was made from, and who signed it as the agent verified before the
/// pull (`principal`, `SHA256:` fingerprint, Unix ms): what the heartbeat reports as provenance.
pub const IMAGE: &str = "dev.pushleft.image";
pub const IMAGE_SIGNER: &str = "dev.pushleft.image-signer";
pub const IMAGE_FINGERPRINT: &str = "dev.pushleft.image-fingerprint";
pub const IMAGE_VERIFIED_AT: &str = "dev.pushleft.image-verified-at";
/// The ports other containers of the environment may reach, `8080,6379` (empty: none). A
/// container without the label (made before it existed) is reachable on every port.
pub const PORTS: &str = "dev.pushleft.ports";
/// A web replica's health check, `<port> <path>`: what the heartbeat probes, so `healthy`
/// says the replica answers, not only that its process runs. A container without it (made
/// before it existed, or not a web replica) is healthy while it runs.
pub const HEALTH: &str = "dev.pushleft.health";
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
/// How long a worker must stay up to count as started (sooner once every port it declares
/// accepts a connection).
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
    /// The control plane's image store as this agent serves it to the engine
    /// (`crate::image_proxy`); `None` when there is no control plane to fetch from.
    store_proxy: Option<crate::image_proxy::StoreProxy>,
    /// Restored dumps waiting for their role to load them (`<volume's name>.dump`, 0600),
    /// beside the `pulled` file in the agent's state folder: never inside the volume, which a
    /// restore leaves empty for the role's first start.
    pub restores_dir: PathBuf,
    /// How long an image this agent pulled stays once nothing uses it (a replica moved back,
    /// or scaled up again, starts without a pull).
    unused_image_grace: std::time::Duration,
    /// When each pulled image was first seen unused (forgotten when it is used again).
    unused_since: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// Containers resumed by a rollback, and the generation each serves (`resume.rs`).
    resumed: std::sync::Mutex<Option<HashMap<String, resume::Resumed>>>,
    /// When this agent paused each previous generation's web replica (`resume.rs`).
    paused_at: std::sync::Mutex<HashMap<String, Instant>>,
    /// How long a previous generation's web replicas stay paused for a rollback (zero: stopped
    /// at once).
    rollback_window: Duration,
    /// How long a finished run's container may wait for its job's replay before the drift
    /// round removes it ([`RUN_SWEEP_GRACE`]).
    run_sweep_grace: Duration,
    /// When this process first saw each finished, unclaimed run container.
    runs_unclaimed: std::sync::Mutex<HashMap<String, Instant>>,
    /// Backup repositories this process found or made (by location): not checked again
    /// before each backup (a restic run costs its key derivation, about 0.7 s, on every call).
    known_repositories: std::sync::Mutex<std::collections::HashSet<String>>,
    /// One holder at a time per repository on this node: a backup, its retention (which runs
    /// after the backup is reported, and prunes under restic's exclusive lock), a restore, a
    /// drill.
    repository_locks: std::sync::Mutex<HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>,
}

/// How long a finished run's container (a release or cron run, a drill) is left for a replay
/// of its job to judge by its exit code, counted from when this agent process first saw it
/// finished: a killed agent's job comes back at its first lease after the restart, seconds
/// later; one a newer release cancelled never does, and its container would stay forever.
pub const RUN_SWEEP_GRACE: Duration = Duration::from_secs(600);

/// How long an unused pulled image is kept: Nomad's `image_delay` default (3 minutes).
pub const UNUSED_IMAGE_GRACE: std::time::Duration = std::time::Duration::from_secs(180);

fn not_found(e: &DockerError) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code: 404, .. })
}

/// A Docker error as a failure: unreachable or a server error is worth retrying. A full disk
/// on the node is named as such (`node-disk-full`), whatever the call was: the engine answers
/// it as a bare 500, and "docker unavailable" would send an operator to the wrong place.
fn docker(code: &'static str, e: DockerError) -> Failure {
    if disk_full(&e) {
        return retryable(
            "node-disk-full",
            format!("docker: the node's disk is full (free space where the engine keeps images and containers): {e}"),
        );
    }
    retryable(code, format!("docker: {e}"))
}

/// An engine error as the tasks report it when nothing more specific applies (for tests of
/// the classification outside this module).
#[cfg(test)]
pub(crate) fn failure_of(e: DockerError) -> Failure {
    docker("docker-unavailable", e)
}

/// Whether the engine failed because the disk under it is full (ENOSPC's words, which the
/// engine passes on in its error text: it has no code of its own for it).
pub fn disk_full(e: &DockerError) -> bool {
    e.to_string().contains("no space left on device")
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
            restores_dir: pulled.with_file_name("restores"),
            pulled,
            pulled_lock: std::sync::Mutex::new(()),
            registry_auth: std::collections::BTreeMap::new(),
            store_proxy: None,
            unused_image_grace: UNUSED_IMAGE_GRACE,
            unused_since: std::sync::Mutex::default(),
            resumed: std::sync::Mutex::default(),
            paused_at: std::sync::Mutex::default(),
            rollback_window: resume::ROLLBACK_WINDOW,
            run_sweep_grace: RUN_SWEEP_GRACE,
            runs_unclaimed: std::sync::Mutex::default(),
            known_repositories: std::sync::Mutex::default(),
            repository_locks: std::sync::Mutex::default(),
        })
    }

    /// Leaves finished runs' containers this long for their jobs' replays (tests: zero).
    pub fn with_run_sweep_grace(mut self, grace: Duration) -> Engine {
        self.run_sweep_grace = grace;
        self
    }

    /// Keeps the previous generation's web replicas paused this long after a switch (zero:
    /// stopped at once).
    pub fn with_rollback_window(mut self, window: Duration) -> Engine {
        self.rollback_window = window;
        self
    }

    /// Keeps unused pulled images this long (tests: zero).
    pub fn with_unused_image_grace(mut self, grace: std::time::Duration) -> Engine {
        self.unused_image_grace = grace;
        self
    }

    /// Images of the control plane's store are pulled through `proxy`.
    pub fn with_image_store(self, proxy: crate::image_proxy::StoreProxy) -> Engine {
        self.with_image_store_if(Some(proxy))
    }

    pub fn with_image_store_if(mut self, proxy: Option<crate::image_proxy::StoreProxy>) -> Engine {
        self.store_proxy = proxy;
        self
    }

    /// Pulls from these registries carry the credentials in these files
    /// ([`crate::registry_auth::read`]).
    pub fn with_registry_auth(mut self, files: std::collections::BTreeMap<String, PathBuf>) -> Engine {
        self.registry_auth = files;
        self
    }

    /// The engine's list filter for objects of ours (this control plane's, this node's) with
    /// every label in `filter` too.
    pub(crate) fn our_filter(&self, filter: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
        let mut labels = vec![
            format!("{OWNED}=true"),
            format!("{CONTROL_PLANE}={}", self.control_plane),
            format!("{NODE}={}", self.node),
        ];
        labels.extend(filter.iter().map(|(k, v)| format!("{k}={v}")));
        HashMap::from([("label".to_owned(), labels)])
    }

    /// Containers of ours with every label in `filter`, with their labels and state.
    pub async fn ours(&self, filter: &[(&str, &str)]) -> Result<Vec<(String, HashMap<String, String>, bool)>, Failure> {
        let filters = self.our_filter(filter);
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
        let resumed = self.resumed();
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
                let mut labels = c.labels.unwrap_or_default();
                // A container a rollback resumed serves that rollback's generation.
                if let Some(r) = resumed.get(&name) {
                    labels.insert(GENERATION.to_owned(), r.generation.to_string());
                }
                (name, labels, running)
            })
            .collect())
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
}
