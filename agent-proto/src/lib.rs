//! The agent protocol's wire types, owned by this crate alone: the reconciler serves them and
//! the agent's client sends them, and neither sees the other's domain or row types. Every
//! refusal is a stable code from [`Refusal`]; codes are only ever added.
//!
//! Architecture invariant: no I/O, no SQL, no TLS here: types, their JSON form, and pure
//! functions of them (names, a certificate's fingerprint).

use serde::{Deserialize, Serialize};

pub mod mesh;
pub mod task;
pub use task::{Capability, Task, is_acme_token};

/// A certificate's fingerprint as the protocol names it everywhere (the CA pin, the agent
/// API's peer, revocations): SHA-256 of its DER, lowercase hex.
pub fn cert_fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(der))
}

/// Length of a control plane's id: hex digits, made at random once per ledger.
pub const CONTROL_PLANE_ID_LEN: usize = 8;

/// Whether `id` is a control plane's id: [`CONTROL_PLANE_ID_LEN`] lowercase hex digits.
pub fn valid_control_plane(id: &str) -> bool {
    id.len() == CONTROL_PLANE_ID_LEN && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The name of an environment's objects on a node's machine: its Docker network and its
/// nftables table (`pl_<control plane>_<environment>_<node>`; its bridge is named from this).
/// The control plane's id is part of it because several control planes may share a machine
/// (two repositories' `pl up`, two fleets on one node) with the same environment and node
/// names; the node because several agents of one control plane may share a machine as several
/// nodes (`pl up` with two nodes, a drain rehearsal). Ids are hex and names are DNS labels, so
/// `_` separates them unambiguously.
pub fn host_object(control_plane: &str, environment: &str, node: &str) -> String {
    format!("pl_{control_plane}_{environment}_{node}")
}

/// The container of one replica (`instance`) at one generation, or of a generation's run of a
/// role (`None`): `pl_<control plane>_<environment>_<role>_<instance>_g<generation>` or
/// `pl_<control plane>_<environment>_<role>_run_g<generation>`. Environment and role names are
/// DNS labels and the control plane's id is hex, none ever contains `_`, so the name reads back
/// to exactly one identity: with `-` between them, an environment `a-web` with role `web` and
/// an environment `a` with role `web-web` once spelled the same container, and one
/// environment's rollout removed the other's replica. The agent still decides ownership by the
/// container's labels, never by its name.
pub fn container_name(
    control_plane: &str,
    environment: &str,
    role: &str,
    instance: Option<u32>,
    generation: u64,
) -> String {
    match instance {
        Some(i) => format!("pl_{control_plane}_{environment}_{role}_{i}_g{generation}"),
        None => format!("pl_{control_plane}_{environment}_{role}_run_g{generation}"),
    }
}

/// The container of replica `index` of `role` that moved `moves` times within `generation`
/// (`state_schema::deployment::Instance::moves`): [`container_name`] when it never moved,
/// else `pl_<control plane>_<environment>_<role>_<index>m<moves>_g<generation>`. A moved
/// replica's new container and the one it replaces run side by side for a moment, on one
/// engine when two nodes share it, so their names differ.
pub fn replica_name(
    control_plane: &str,
    environment: &str,
    role: &str,
    index: u32,
    moves: u32,
    generation: u64,
) -> String {
    match moves {
        0 => container_name(control_plane, environment, role, Some(index), generation),
        m => format!("pl_{control_plane}_{environment}_{role}_{index}m{m}_g{generation}"),
    }
}

/// Largest enrolment request accepted, in bytes.
pub const MAX_ENROLL_BYTES: usize = 16 * 1024;

/// `POST /v1/enroll`: a node declared in Git asks for its first client certificate, with the
/// one-time token an operator made for it (`pl node token NODE`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrollRequest {
    pub node: String,
    /// The one-time enrolment token (`ple_…`).
    pub token: String,
    /// A PKCS#10 certificate signing request (PEM) for the node's own TLS key; its subject's
    /// common name is the node's name.
    pub csr: String,
    /// The node's age recipient (`age1…`): secrets reach the node sealed to it.
    pub age_recipient: String,
}

/// The answer to an accepted enrolment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrollResponse {
    /// The node's client certificate (PEM), signed by the control CA.
    pub certificate: String,
    /// The control CA (PEM), to verify the control plane with from now on.
    pub ca: String,
    /// When the certificate expires, milliseconds since the epoch.
    pub not_after_ms: i64,
    /// The control plane's id ([`valid_control_plane`]), which every host object the node's
    /// agent makes names (empty from a control plane older than the id).
    #[serde(default)]
    pub control_plane: String,
}

/// Most jobs one lease call may take.
pub const MAX_LEASE_BATCH: u32 = 8;
/// Longest a lease call may wait for work, in milliseconds.
pub const MAX_LEASE_WAIT_MS: u64 = 30_000;
/// Largest agent request accepted (heartbeats, completions), in bytes.
pub const MAX_AGENT_BODY_BYTES: usize = 64 * 1024;
/// Largest `detail` a completion may carry (a log tail), in bytes.
pub const MAX_DETAIL_BYTES: usize = 16 * 1024;

/// `POST /v1/agent/lease`: up to `max` jobs targeted at the calling node, waiting up to
/// `wait_ms` for one to be queued.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRequest {
    pub max: u32,
    #[serde(default)]
    pub wait_ms: u64,
    /// The newest mesh generation the agent holds (applied or being applied), when it is in
    /// the mesh: a newer one comes with the lease, and wakes a long poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh_applied: Option<u64>,
}

/// What proves a lease: present it to renew or complete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseProof {
    pub job_id: i64,
    pub lease_token: String,
    pub fencing_token: i64,
}

/// One leased job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeasedJob {
    pub key: String,
    /// What to do: a closed, typed task.
    pub task: Task,
    /// Everything the task needs to run (what with): the agent reads nothing else.
    pub execution: Execution,
    pub attempt: i64,
    pub proof: LeaseProof,
    pub expires_at_ms: i64,
}

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
    /// A rollback's replica: the previous release's container (by name) kept on the node. The
    /// agent resumes it (paused: thawed; stopped: started again) instead of making `container`,
    /// and it serves as this generation's; made afresh when it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<String>,
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseResponse {
    pub jobs: Vec<LeasedJob>,
    /// The node's mesh, when it is newer than the request's `meshApplied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<mesh::MeshSpec>,
}

/// `POST /v1/agent/renew`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewRequest {
    pub proof: LeaseProof,
}

/// How a job ended, as the agent reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Succeeded,
    Retryable,
    Permanent,
}

/// `POST /v1/agent/complete`: one job's end, with its proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteRequest {
    pub proof: LeaseProof,
    pub outcome: Outcome,
    /// A bounded log tail or reason; never a secret.
    #[serde(default)]
    pub detail: String,
    /// What a succeeded `backup-volume` saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupReport>,
}

/// `POST /v1/agent/complete-batch`: several jobs' ends in one request (at most
/// [`MAX_LEASE_BATCH`]), each judged on its own: what one lease handed out can come back at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteBatch {
    pub completions: Vec<CompleteRequest>,
    /// The caller's next lease, taken once the completions are recorded: one round trip per
    /// lease cycle instead of two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseRequest>,
}

/// The answer to a [`CompleteBatch`]: per completion, in order, `None` when it was recorded or
/// the refusal that recorded nothing for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteBatchResponse {
    pub results: Vec<Option<RefusalBody>>,
    /// The lease asked for with the completions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leased: Option<LeaseResponse>,
    /// Why that lease was refused (`node-draining`, `node-retired`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_refused: Option<RefusalBody>,
}

/// `POST /v1/agent/certificate`: a node renews its certificate before it expires, with a new
/// key; the answer is an [`EnrollResponse`]. The old certificate is revoked when the new one
/// is first used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewCertificateRequest {
    pub csr: String,
}

/// Most replicas one heartbeat may report.
pub const MAX_HEARTBEAT_INSTANCES: usize = 512;

/// `POST /v1/agent/heartbeat`: the node is alive, can run `capabilities` (`docker`,
/// `ingress`, `nftables`, `routes`), and runs `running`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    pub agent_version: String,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub running: Vec<RunningInstance>,
    /// What the agent found drifted and repaired since its last heartbeat (at most
    /// [`MAX_HEARTBEAT_REPAIRS`]): recorded as `drift-repaired` events.
    #[serde(default)]
    pub repaired: Vec<Repair>,
    /// The machine the agent runs on (its `/etc/machine-id`, else its Docker engine's id; at
    /// most [`MAX_HOST_LEN`] of `[A-Za-z0-9._-]`). Several agents may share one machine as several nodes; the control
    /// plane gives the environments of nodes on one machine subnets that do not overlap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The /24s of the subnet pool (`10.208.0.0/12`) that networks of others use on this
    /// machine (another control plane's, or any network that is not Pushleft's), at most
    /// [`MAX_TAKEN_SUBNETS`]: the control plane gives its environments other ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taken_subnets: Vec<String>,
    /// This control plane's volumes on the node and what each holds (at most
    /// [`MAX_HEARTBEAT_VOLUMES`]), in the heartbeat after each measurement (at most one a
    /// minute); absent otherwise, which changes nothing the control plane keeps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeUsage>,
    /// The node's mesh (its WireGuard public key and where it listens); absent when the agent
    /// runs no mesh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<mesh::MeshAdvert>,
}

/// Most volumes one heartbeat may report.
pub const MAX_HEARTBEAT_VOLUMES: usize = 4096;

/// One volume of the node and the bytes its files hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeUsage {
    pub environment: String,
    pub volume: String,
    pub generation: u64,
    pub bytes: u64,
}

/// Most taken subnets one heartbeat may report (the whole pool).
pub const MAX_TAKEN_SUBNETS: usize = 4096;

/// Longest `host` a heartbeat may carry.
pub const MAX_HOST_LEN: usize = 64;

/// Whether `host` is one a heartbeat may carry.
pub fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= MAX_HOST_LEN
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Most repairs one heartbeat may report.
pub const MAX_HEARTBEAT_REPAIRS: usize = 64;

/// One drift the agent repaired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Repair {
    pub environment: String,
    /// What was repaired, e.g. `container pl-…-g3 started`, `firewall table re-applied`.
    pub what: String,
}

impl Heartbeat {
    /// A heartbeat that reports capabilities and nothing running.
    pub fn new(agent_version: &str, capabilities: &[&str]) -> Heartbeat {
        Heartbeat {
            agent_version: agent_version.to_owned(),
            capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
            running: Vec::new(),
            repaired: Vec::new(),
            host: None,
            taken_subnets: Vec::new(),
            volumes: Vec::new(),
            mesh: None,
        }
    }
}

/// What a node running every executor reports it can run.
pub const FULL_CAPABILITIES: [&str; 4] = ["docker", "ingress", "nftables", "routes"];

/// One replica the node observes running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunningInstance {
    pub environment: String,
    pub role: String,
    pub instance: u32,
    pub generation: u64,
    pub healthy: bool,
}

/// Why the control plane refused an agent's request. Each refusal records nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Refusal {
    /// No enrolment token matches.
    TokenUnknown,
    /// The token was used already.
    TokenUsed,
    /// The token's 15 minutes have passed.
    TokenExpired,
    /// The token was made for another node.
    TokenWrongNode,
    /// No node of that name is declared in the applied branch's accepted state.
    NodeNotDeclared,
    /// The node is retired in Git.
    NodeRetired,
    /// The signing request does not parse, or its signature does not verify.
    CsrInvalid,
    /// The signing request names another node.
    CsrNameMismatch,
    /// The age recipient is not an `age1…` X25519 recipient.
    RecipientInvalid,
    /// The control plane holds no CA to sign with (`control.ca_cert`, `control.ca_key`).
    NoControlCa,
    /// The request body is not the expected JSON.
    MalformedRequest,
    /// The client certificate is not one the control plane issued, or was revoked.
    CertificateRevoked,
    /// The client certificate's validity has ended.
    CertificateExpired,
    /// The node is draining in Git: it gets no new work.
    NodeDraining,
    /// The job is another node's.
    NotYourJob,
    /// The lease was taken over (expired and leased again) or ended: its fencing token is stale.
    StaleFencingToken,
    /// A completion's detail looks like a secret (age ciphertext or an identity).
    SecretInResult,
    /// The log stream is over (its reader left, or it was never opened for this node).
    LogStreamGone,
}

impl Refusal {
    /// The stable code, as JSON carries it.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::TokenUnknown => "token-unknown",
            Refusal::TokenUsed => "token-used",
            Refusal::TokenExpired => "token-expired",
            Refusal::TokenWrongNode => "token-wrong-node",
            Refusal::NodeNotDeclared => "node-not-declared",
            Refusal::NodeRetired => "node-retired",
            Refusal::CsrInvalid => "csr-invalid",
            Refusal::CsrNameMismatch => "csr-name-mismatch",
            Refusal::RecipientInvalid => "recipient-invalid",
            Refusal::NoControlCa => "no-control-ca",
            Refusal::MalformedRequest => "malformed-request",
            Refusal::CertificateRevoked => "certificate-revoked",
            Refusal::CertificateExpired => "certificate-expired",
            Refusal::NodeDraining => "node-draining",
            Refusal::NotYourJob => "not-your-job",
            Refusal::StaleFencingToken => "stale-fencing-token",
            Refusal::SecretInResult => "secret-in-result",
            Refusal::LogStreamGone => "log-stream-gone",
        }
    }
}

/// A request for the logs of an environment's role on the asking node, as
/// `/v1/agent/logs/wait` hands it over; the agent posts the lines to `/v1/agent/logs/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogRequest {
    pub id: String,
    pub environment: String,
    pub role: String,
    /// Lines from the end of each container's log (at most [`MAX_LOG_TAIL_LINES`]).
    pub tail: u32,
    /// Keep sending new lines until the reader leaves.
    pub follow: bool,
}

/// `/v1/agent/logs/wait`: how long to wait for a request (at most [`MAX_LOG_WAIT_MS`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogWait {
    pub wait_ms: u64,
}

/// The log requests for the asking node (at most [`MAX_LOG_STREAMS_PER_NODE`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogRequests {
    pub requests: Vec<LogRequest>,
}

/// Most lines a log request asks for from each container.
pub const MAX_LOG_TAIL_LINES: u32 = 10_000;
/// Largest body of one posted piece of a log stream.
pub const MAX_LOG_CHUNK_BYTES: usize = 64 * 1024;
/// Longest log line relayed (the engine splits longer output into 16 KiB pieces itself).
pub const MAX_LOG_LINE_BYTES: usize = 16 * 1024;
/// Most bytes a log request that does not follow relays in all (its tails, every container
/// together); past it the stream ends with a line that says so.
pub const MAX_LOG_TAIL_BYTES: usize = 16 * 1024 * 1024;
/// Longest wait for a log request.
pub const MAX_LOG_WAIT_MS: u64 = 25_000;
/// Most log streams open at once for one node.
pub const MAX_LOG_STREAMS_PER_NODE: usize = 8;

/// A refusal as it travels: the code and a message with no secret in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalBody {
    pub code: Refusal,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_json_form() {
        for r in [
            Refusal::TokenUnknown,
            Refusal::TokenUsed,
            Refusal::TokenExpired,
            Refusal::TokenWrongNode,
            Refusal::NodeNotDeclared,
            Refusal::NodeRetired,
            Refusal::CsrInvalid,
            Refusal::CsrNameMismatch,
            Refusal::RecipientInvalid,
            Refusal::NoControlCa,
            Refusal::MalformedRequest,
            Refusal::CertificateRevoked,
            Refusal::CertificateExpired,
            Refusal::NodeDraining,
            Refusal::NotYourJob,
            Refusal::StaleFencingToken,
            Refusal::SecretInResult,
            Refusal::LogStreamGone,
        ] {
            let json = serde_json::to_string(&r).expect("json");
            assert_eq!(json, format!("\"{}\"", r.code()));
            assert_eq!(serde_json::from_str::<Refusal>(&json).expect("back"), r);
        }
        let unknown = r#"{"node":"n1","token":"t","csr":"c","ageRecipient":"a","extra":1}"#;
        assert!(
            serde_json::from_str::<EnrollRequest>(unknown).is_err(),
            "unknown fields refused"
        );
    }
}

#[cfg(test)]
mod names {
    use super::*;

    #[test]
    fn container_names_are_one_identity_each() {
        // The collision the hardening review found: environment `a-web` + role `web` against
        // environment `a` + role `web-web`.
        assert_ne!(
            container_name("0123abcd", "a-web", "web", Some(0), 1),
            container_name("0123abcd", "a", "web-web", Some(0), 1)
        );
        // Two control planes with the same environment, role and instance.
        assert_ne!(
            container_name("0123abcd", "a", "web", Some(0), 1),
            container_name("89abcdef", "a", "web", Some(0), 1)
        );
        assert_ne!(host_object("0123abcd", "a", "n1"), host_object("89abcdef", "a", "n1"));
        assert!(valid_control_plane("0123abcd"));
        for bad in ["", "0123abc", "0123ABCD", "0123abcde", "0123_bcd"] {
            assert!(!valid_control_plane(bad), "{bad}");
        }
        // Every split of a run of labels into (environment, role), with instances, runs and
        // generations, gives a distinct name.
        let labels = ["a", "web", "a-web", "web-web", "a-web-web", "0", "run", "g1", "1-g1"];
        let mut seen = std::collections::BTreeMap::new();
        for env in labels {
            for role in labels {
                for instance in [None, Some(0), Some(1), Some(10)] {
                    for moves in [0, 1, 11] {
                        for generation in [1, 10, 11] {
                            let name = match instance {
                                Some(i) => replica_name("0123abcd", env, role, i, moves, generation),
                                None if moves == 0 => container_name("0123abcd", env, role, None, generation),
                                None => continue,
                            };
                            let identity = (env, role, instance, moves, generation);
                            if let Some(other) = seen.insert(name.clone(), identity) {
                                panic!("{name} names both {other:?} and {identity:?}");
                            }
                        }
                    }
                }
            }
        }
    }
}
