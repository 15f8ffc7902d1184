//! What a lease carries besides the task: the execution spec of the job's own generation
//! (an application's containers, its network, volumes and sealed secrets; an ingress's
//! upstreams and certificate; a backup's or a restore drill's plan).

use super::*;

/// What a leased task runs with, by kind of task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Execution {
    /// Ensure network, apply firewall, ensure routes, remove network.
    Network(NetworkSpec),
    /// Ensure application, run once.
    Application(Box<ApplicationSpec>),
    /// Publish ingress.
    Ingress(IngressSpec),
    /// Stop or tear down a replica, remove ingress, place an ACME challenge: the task itself
    /// names everything it needs.
    Removal,
    /// Back up a volume.
    Backup(Box<BackupSpec>),
    /// A restore drill: the repository as for a backup, and the scratch container to run on
    /// the restored copy.
    Drill(Box<DrillSpec>),
}

/// A restore drill of one volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrillSpec {
    /// The volume, its repository and the repository's sealed Secret.
    pub backup: BackupSpec,
    /// The scratch container: the role's image, resources and secrets, the backup's
    /// `verify.command`, no network, and the restored copy (the volume at generation
    /// [`DRILL_GENERATION`]) mounted where the volume is.
    pub run: ApplicationSpec,
}

/// A restore drill's scratch container for `environment`'s `volume`: no replica's or run's
/// name ends in `_drill`.
pub fn drill_container_name(control_plane: &str, environment: &str, volume: &str) -> String {
    format!("pl_{control_plane}_{environment}_{volume}_drill")
}

/// The volume generation a drill restores into: never a real one (those start at 1).
pub const DRILL_GENERATION: u64 = 0;

/// The network a drill's scratch container joins: Docker's `none`, no interface but loopback.
pub const DRILL_NETWORK: &str = "none";

/// How one volume is backed up, and where to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupSpec {
    pub environment: String,
    /// The volume at its current generation (where its role's containers mount it).
    pub mount: VolumeMount,
    /// The role's container that mounts it ([`container_name`]), if its role runs one: paused
    /// for a file backup, the command's host. `None` for a job or release role's volume.
    pub container: Option<String>,
    /// Run in `container`; its standard output is what is saved.
    pub command: Option<Vec<String>>,
    /// A move's first half (`pl volume move`): this role's replica is removed before the
    /// volume's files are saved, and stays down (the role runs next on the node the volume
    /// moves to); no retention runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_role: Option<String>,
    /// Snapshots of this volume kept.
    pub keep: u32,
    /// restic's repository location.
    pub repository: String,
    /// The Secret the values came from (named in errors; never a value).
    pub secret: String,
    /// `RESTIC_PASSWORD` and the backend's variables, sealed to the node.
    pub values: Vec<SealedSecret>,
}

/// What a backup saved, as the agent reports it with its success.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupReport {
    /// restic's snapshot id (short form).
    pub snapshot: String,
    /// Bytes read from the volume or the command.
    pub bytes: u64,
    /// Bytes the repository grew by.
    pub data_added: u64,
}

/// What a node's ingress saw of a canary's new release since its share began, as the agent
/// reports it with a `measure-canary` success. The control plane judges the gates on every
/// ingress node's measure together (`state_schema::rollout::advance::verdict`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CanaryMeasure {
    /// Round trips to the new release's upstreams on this node.
    pub requests: u32,
    /// Those answered 5xx, or not at all.
    pub errors: u32,
    /// Their 95th percentile duration (nearest rank), microseconds; none without requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_micros: Option<u64>,
    /// False when this machine's Caddy had no proxy log to read: nothing was measured.
    pub logged: bool,
}

/// An environment's network on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkSpec {
    pub environment: String,
    /// The Docker network: [`host_object`] of the environment and the node.
    pub network: String,
    /// The environment's subnet on this node (a /24 the control plane chose, unique here).
    pub subnet: String,
}

/// A container to run: one replica, or one run of a job or release role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplicationSpec {
    pub environment: String,
    pub deployment: String,
    pub role: String,
    /// `web`, `worker`, `service`, `cron`, `job` or `release`.
    pub role_kind: String,
    /// The replica's index; `None` for a run.
    pub instance: Option<u32>,
    pub generation: u64,
    pub spec_hash: String,
    /// [`container_name`]: `pl_<environment>_<role>_<instance>_g<generation>` (`run` for a run).
    pub container: String,
    /// Pinned by digest.
    pub image: String,
    pub command: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pids: u32,
    pub port: Option<u16>,
    /// The ports it serves inside its environment besides `port` (sorted): with `port`, the
    /// only ones other containers of the environment may reach (the agent's firewall).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    pub health: Option<HealthSpec>,
    pub network: NetworkSpec,
    /// Secret files (`/run/secrets/<key>`), each sealed to this node's age recipient alone.
    pub secrets: Vec<SealedSecret>,
    /// The container's log on the node: at most this many bytes a file…
    pub log_max_bytes: u64,
    /// …in at most this many files (Docker's json-file driver rotates them).
    pub log_max_files: u32,
    /// The environment's volumes it mounts; absent for a role without any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// What the image must carry to run, from the policy's `images` rules for its project
    /// (absent when no rule names the project): the agent checks it before it pulls or runs
    /// anything, and refuses with `image-unsigned`, `image-signer-untrusted` or
    /// `image-signature-invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_trust: Option<ImageTrust>,
    /// A rollback's replica: the previous release's container (by name) kept on the node. The
    /// agent resumes it (paused: thawed; stopped: started again) instead of making `container`,
    /// and it serves as this generation's; made afresh when it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<String>,
}

/// An image's signatures and the keys trusted to have made them (`pushleft-image-trust`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageTrust {
    /// An image without a signature is refused.
    pub required: bool,
    /// Armored SSH signatures over the image's manifest digest, as the state tree holds them
    /// (`image-signatures/`), at most [`MAX_IMAGE_SIGNATURES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signatures: Vec<String>,
    /// The keys whose signature is enough, at most [`MAX_IMAGE_SIGNERS`].
    pub signers: Vec<ImageSigner>,
}

/// Most signatures an [`ImageTrust`] carries (the state tree's own limit per image).
pub const MAX_IMAGE_SIGNATURES: usize = 16;
/// Most keys an [`ImageTrust`] trusts.
pub const MAX_IMAGE_SIGNERS: usize = 256;

/// A key trusted to sign the image, as an OpenSSH public-key line, with its principal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageSigner {
    pub principal: String,
    pub key: String,
}

/// One volume of the environment, mounted read-write at `path`. The agent names it
/// [`volume_name`] and owns it only with its labels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeMount {
    pub volume: String,
    /// Grows with each restore: a restore makes a new volume and keeps the old one.
    pub generation: u64,
    pub path: String,
    /// The backup's `restore` command: when a restored dump waits for this generation on the
    /// node, it runs in the role's container, the dump on its standard input, once the
    /// container is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<Vec<String>>,
}

/// The Docker volume of an environment's `volume` at `generation` on `node`, for the control
/// plane `control_plane`: `pl_<plane>_<node>_<environment>_<volume>_v<generation>`. Names
/// are RFC 1123 labels (no `_`), so each part is unambiguous.
pub fn volume_name(control_plane: &str, node: &str, environment: &str, volume: &str, generation: u64) -> String {
    format!("pl_{control_plane}_{node}_{environment}_{volume}_v{generation}")
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthSpec {
    pub path: String,
    pub timeout_seconds: u32,
}

/// One secret value, age-encrypted to the node's own recipient.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SealedSecret {
    pub key: String,
    pub sealed: String,
}

/// A hostname's route to this generation's web replicas on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IngressSpec {
    pub environment: String,
    pub hostname: String,
    pub generation: u64,
    pub upstreams: Vec<Upstream>,
    pub network: NetworkSpec,
    /// Served over HTTPS with this certificate (plain HTTP then only redirects). Absent: plain
    /// HTTP, and an agent that predates it reads the spec as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<IngressTls>,
    /// A custom domain whose ownership was never proven: not routed here (whatever route it
    /// has goes), until a publish without it comes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

/// The certificate of a hostname, sealed to the node's own age recipient (the proxy is the only
/// one that gets the key in the clear).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IngressTls {
    /// The Secret it came from: named in errors, never a value.
    pub secret: String,
    /// The PEM chain, leaf first.
    pub cert: String,
    /// The PEM private key.
    pub key: String,
    /// `Strict-Transport-Security` on every HTTPS response.
    #[serde(default)]
    pub hsts: bool,
}

/// A web replica an ingress route sends to: the container (its address on the environment
/// network is the agent's to resolve) and its port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Upstream {
    pub container: String,
    pub port: u16,
    /// A rolling rollout's replica not replaced yet: the agent routes to the newest container
    /// of an older generation it runs for this replica (stopped or paused ones: not at all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub older: Option<OlderReplica>,
}

/// The replica an older upstream stands for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OlderReplica {
    pub role: String,
    pub instance: u32,
}
