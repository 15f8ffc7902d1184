//! The kinds of the state format (`pushleft.dev/v1alpha1`) as typed values with defaults
//! filled in. Fields hold validated types, so a decoded object is valid on its own; rules that
//! span objects (references, hostnames) are checked in `state`.

use crate::values::SmallMap;
use crate::values::{Cpu, CronSchedule, Hostname, ImageRef, Memory, Name};
use serde::{Deserialize, Serialize};

pub const API_VERSION: &str = "pushleft.dev/v1alpha1";

/// The kinds, in the order objects are listed and planned (dependencies first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Kind {
    Repository,
    NodePool,
    Secret,
    Project,
    Environment,
    Domain,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Repository,
        Kind::NodePool,
        Kind::Secret,
        Kind::Project,
        Kind::Environment,
        Kind::Domain,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Repository => "Repository",
            Kind::NodePool => "NodePool",
            Kind::Secret => "Secret",
            Kind::Project => "Project",
            Kind::Environment => "Environment",
            Kind::Domain => "Domain",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metadata {
    pub name: Name,
    #[serde(skip_serializing_if = "SmallMap::is_empty")]
    pub labels: SmallMap<String, String>,
    #[serde(skip_serializing_if = "SmallMap::is_empty")]
    pub annotations: SmallMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Repository {
    pub base_domain: Hostname,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview_domain: Option<Hostname>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previews: Option<Previews>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_recipient: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Previews {
    pub branches: Vec<String>,
    pub pool: Name,
    pub ttl_hours: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Project {
    pub image: ImageRef,
    pub roles: SmallMap<Name, Role>,
    #[serde(skip_serializing_if = "SmallMap::is_empty")]
    pub env: SmallMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<Name>,
    /// How `pl image update` may move `image` (`image_updates.rs`); absent from the canonical
    /// form when unset.
    #[serde(rename = "imageUpdates", skip_serializing_if = "Option::is_none")]
    pub image_updates: Option<crate::image_updates::ImageUpdates>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Role {
    #[serde(flatten)]
    pub workload: Workload,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    pub resources: Resources,
    /// The ports it serves inside its environment besides a web role's `port` (web and worker
    /// roles; sorted): the only ones other containers of the environment may reach. Empty is
    /// left out of the canonical form, so roles without it keep their hashes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// Its volumes (`volumes.rs`): the environment's data, mounted at `path`, kept across
    /// generations, restarts and teardowns. Empty is left out of the canonical form.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// How much output its container keeps on the node; `None`: the defaults
    /// (`parse::defaults::LOG_MAX_BYTES` in `LOG_MAX_FILES` files), left out of the canonical
    /// form so that roles without it keep their hashes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<LogLimits>,
    /// How a new release of it is watched (`rollout`); `None` is left out of the canonical
    /// form, so roles without it keep their hashes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutPolicy>,
}

/// `rollout` of a role: after a new release's switch, its replicas are watched for
/// `watch_seconds` (0: not at all); one reported unhealthy meanwhile rolls the environment back.
/// A web role's `strategy: canary` sends a share of requests to the new release first, step
/// by step (`steps`), before the switch.
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutPolicy {
    pub watch_seconds: u32,
    pub steps: Vec<CanaryStep>,
    pub gates: Option<CanaryGate>,
    /// `strategy: rolling`: the replicas are replaced in batches instead of all at once.
    pub rolling: Option<Rolling>,
}

/// The canonical form is the input form (`strategy`, `steps` with `pause` in seconds, `gates`,
/// `maxSurge`/`maxUnavailable` as a count or `"25%"`, `watchSeconds` when set), so `pl show`
/// and a plan's YAML read back as the same policy. (It once printed the model's fields,
/// `watchSeconds: 0` and no `strategy`, which `pl validate` refuses.) The release hash leaves
/// `rollout` out, and the deployment spec carries its own fields, so this form moves no hash
/// that decides a generation.
impl Serialize for RolloutPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        #[derive(Serialize)]
        struct Step {
            weight: u8,
            #[serde(skip_serializing_if = "Option::is_none")]
            pause: Option<u32>,
        }
        let amount = |a: Amount| match a {
            Amount::Count(n) => serde_json::Value::from(n),
            Amount::Percent(p) => serde_json::Value::from(format!("{p}%")),
        };
        let mut m = s.serialize_map(None)?;
        if let Some(r) = &self.rolling {
            m.serialize_entry("strategy", "rolling")?;
            m.serialize_entry("maxSurge", &amount(r.max_surge))?;
            m.serialize_entry("maxUnavailable", &amount(r.max_unavailable))?;
        } else if !self.steps.is_empty() {
            m.serialize_entry("strategy", "canary")?;
            let steps: Vec<Step> = self
                .steps
                .iter()
                .map(|c| Step {
                    weight: c.weight,
                    pause: c.pause_seconds,
                })
                .collect();
            m.serialize_entry("steps", &steps)?;
            if let Some(g) = &self.gates {
                m.serialize_entry("gates", g)?;
            }
        }
        if self.watch_seconds > 0 {
            m.serialize_entry("watchSeconds", &self.watch_seconds)?;
        }
        m.end()
    }
}

/// A rolling replacement (`strategy: rolling`): at most `max_surge` replicas above the role's
/// count run during the rollout, and at most `max_unavailable` below it serve; each batch of
/// new replicas is healthy before the next starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rolling {
    pub max_surge: Amount,
    pub max_unavailable: Amount,
}

/// A number of replicas, or a percent of the role's (`25%`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Amount {
    Count(u32),
    Percent(u8),
}

impl Amount {
    /// How many of `replicas` it is: a percent rounded up (`up`, a surge) or down (what may be
    /// unavailable), as Kubernetes rounds them.
    pub fn of(self, replicas: u32, up: bool) -> u32 {
        match self {
            Amount::Count(n) => n,
            Amount::Percent(p) => {
                let x = u64::from(p) * u64::from(replicas);
                let n = if up { x.div_ceil(100) } else { x / 100 };
                u32::try_from(n).unwrap_or(u32::MAX)
            }
        }
    }
}

impl Rolling {
    /// The batch of a role of `replicas`: how many new replicas start at once (surge plus
    /// unavailable, at least one), and how many old ones of each batch stop first (leave the
    /// routes and stop before their new ones start).
    pub fn batch(self, replicas: u32) -> (u32, u32) {
        let surge = self.max_surge.of(replicas, true);
        let down = self.max_unavailable.of(replicas, false).min(replicas);
        let size = surge.saturating_add(down).max(1);
        (size, down.min(size))
    }
}

/// A canary's gates (`rollout.gates`): before each step after the first, and before the
/// switch, the ingress's measure of the requests the new release answered since the step
/// before: more than `max_error_percent` % of them 5xx (or failed), or a p95 latency above
/// `max_p95_ms`, fails the canary. Fewer than `min_requests` requests: not judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanaryGate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_error_percent: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_p95_ms: Option<u32>,
    pub min_requests: u32,
}

/// One step of a canary: `weight` percent of the hostname's requests go to the new release,
/// then the rollout waits `pause` (seconds; `None`: until `pl rollout promote`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStep {
    pub weight: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_seconds: Option<u32>,
}

/// A volume a role mounts: the environment's `name`, at `path` in the container.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: Name,
    pub path: String,
    /// What the user expects it to hold at most: reported against its measured use (the
    /// local driver enforces no size).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<Memory>,
    /// Days it is kept after its environment is torn down (default 7).
    pub retain_days: u32,
    /// Scheduled backups into the environment's `backups` repository.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup: Option<VolumeBackup>,
}

/// `backup` of a volume: when, how many snapshots are kept, and how a consistent copy is made.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeBackup {
    pub schedule: crate::values::CronSchedule,
    /// The newest snapshots of this volume kept; older ones are forgotten and pruned.
    pub keep: u32,
    /// Run in the role's running container; its standard output is what is saved (`pg_dump`).
    /// Absent: the volume's files, with the container paused while they are read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// With `command`: run in the role's container once it runs on a restored (new, empty)
    /// volume generation, the dump on its standard input (`pg_restore`). Without it a command's
    /// backup cannot be restored by `pl restore`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<Vec<String>>,
    /// A restore drill: the newest snapshot restored into a scratch container on the node,
    /// where `command` must succeed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<BackupVerify>,
}

/// `verify` of a volume's backup: when a restore drill runs, and what proves it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupVerify {
    pub schedule: crate::values::CronSchedule,
    /// Run in a scratch container of the role's image, without a network, with the restored
    /// copy mounted where the volume is: exit 0 proves the snapshot.
    pub command: Vec<String>,
}

/// `backups` of an Environment: the restic repository its volumes' backups go to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EnvironmentBackups {
    /// restic's location: an absolute path on the node (under a root the agent allows),
    /// `sftp:…`, `s3:…`, `rest:…`, `b2:…`, `azure:…`, `gs:…` or `swift:…`.
    pub repository: String,
    /// A Secret with `RESTIC_PASSWORD`; its other keys (`AWS_ACCESS_KEY_ID`, …) are the
    /// backend's environment.
    pub secret: Name,
}

/// A container's log on its node: `max_files` files of at most `max_size` each.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogLimits {
    pub max_size: Memory,
    pub max_files: u32,
}

/// What a role runs as; the fields that only make sense for some kinds live in their variant,
/// so a cron role without a schedule cannot be represented.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Workload {
    Web {
        port: u16,
        health: Health,
        replicas: u32,
    },
    Worker {
        replicas: u32,
    },
    Cron {
        schedule: CronSchedule,
    },
    Job {},
    Release {},
    /// One instance, no ingress, restarted in place: a database and the like.
    Service {},
}

impl Workload {
    pub fn kind_name(&self) -> &'static str {
        match self {
            Workload::Web { .. } => "web",
            Workload::Worker { .. } => "worker",
            Workload::Cron { .. } => "cron",
            Workload::Job {} => "job",
            Workload::Release {} => "release",
            Workload::Service {} => "service",
        }
    }

    /// Replicas for long-running roles (a service: one); `None` for cron, job and release
    /// roles.
    pub fn replicas(&self) -> Option<u32> {
        match self {
            Workload::Web { replicas, .. } | Workload::Worker { replicas } => Some(*replicas),
            Workload::Service {} => Some(1),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    pub path: String,
    pub timeout_seconds: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Resources {
    pub cpu: Cpu,
    pub memory: Memory,
    pub pids: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Production,
    Preview,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Production => "production",
            Stage::Preview => "preview",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Environment {
    pub project: Name,
    pub stage: Stage,
    pub pool: Name,
    #[serde(skip_serializing_if = "SmallMap::is_empty")]
    pub replicas: SmallMap<Name, u32>,
    #[serde(skip_serializing_if = "SmallMap::is_empty")]
    pub env: SmallMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Hostname>,
    /// HTTPS for the environment's hostnames. Absent: served over plain HTTP, as before (and
    /// absent from the canonical form, so trees without it keep their hashes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<EnvironmentTls>,
    /// Where its volumes' backups go; absent from the canonical form when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backups: Option<EnvironmentBackups>,
    /// How `pl image update` may move its own `image`; absent from the canonical form when unset.
    #[serde(rename = "imageUpdates", skip_serializing_if = "Option::is_none")]
    pub image_updates: Option<crate::image_updates::ImageUpdates>,
}

/// `tls` of an Environment: the certificate its hostnames are served with, and whether
/// responses carry HSTS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EnvironmentTls {
    /// A Secret with `CERT` (the PEM chain, leaf first) and `KEY` (its PEM private key): a
    /// certificate the user brings (wildcard, corporate CA).
    pub secret: Name,
    /// `Strict-Transport-Security` on every HTTPS response; off by default (a browser that saw
    /// it refuses plain HTTP for the name for a year, which is hard to take back).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hsts: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verification {
    Txt,
    Cname,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Domain {
    pub hostname: Hostname,
    pub environment: Name,
    pub verification: Verification,
    /// The certificate this hostname is served with (`CERT` and `KEY` of a Secret); absent
    /// from the canonical form when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<DomainTls>,
}

/// `tls` of a Domain: the Secret with its certificate (HSTS is the Environment's choice).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DomainTls {
    pub secret: Name,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    Spread,
    Pack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Active,
    Draining,
    Retired,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Active => "active",
            NodeState::Draining => "draining",
            NodeState::Retired => "retired",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodePool {
    pub region: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    pub placement: Placement,
    pub nodes: Vec<PoolNode>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolNode {
    pub name: Name,
    pub state: NodeState,
    pub capacity: Capacity,
    /// Where other nodes reach it for the mesh between nodes (an IP address: nothing is
    /// resolved); over the address its agent says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<core::net::IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Capacity {
    pub cpu: Cpu,
    pub memory: Memory,
}

/// Age ciphertext, ASCII-armoured. Never plaintext: Pushleft only decrypts on the control host
/// and on the node a value is sealed to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ciphertext(String);

impl Ciphertext {
    pub const BEGIN: &'static str = "-----BEGIN AGE ENCRYPTED FILE-----";
    pub const END: &'static str = "-----END AGE ENCRYPTED FILE-----";

    /// Checks the armour's shape (header, base64 body, footer); decryption is the trust layer's.
    pub fn new(s: &str) -> Result<Self, crate::values::Invalid> {
        let t = s.trim();
        let body = t.strip_prefix(Self::BEGIN).and_then(|r| r.strip_suffix(Self::END));
        let ok = body.is_some_and(|b| {
            let b = b.trim();
            !b.is_empty() && b.bytes().all(|c| c.is_ascii_alphanumeric() || b"+/=\r\n".contains(&c))
        });
        if ok {
            Ok(Ciphertext(format!("{t}\n")))
        } else {
            Err(crate::values::Invalid {
                message: "value is not ASCII-armoured age ciphertext".into(),
                hint: Some("set values with `pl secret set NAME KEY` or `age --armor`".into()),
            })
        }
    }

    pub fn armored(&self) -> &str {
        &self.0
    }

    /// `sha256:` and the first 12 hex digits of the ciphertext's SHA-256: enough to tell that a
    /// value changed, nothing about the value.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(self.0.as_bytes());
        let hex = hex::encode(&d[..6]);
        format!("sha256:{hex}")
    }
}

impl Serialize for Ciphertext {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Secret {
    pub recipients: Vec<String>,
    pub data: SmallMap<String, Ciphertext>,
}

/// One object of any kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    Repository(Repository),
    NodePool(NodePool),
    Secret(Secret),
    Project(Project),
    Environment(Environment),
    Domain(Domain),
}

impl Spec {
    pub fn kind(&self) -> Kind {
        match self {
            Spec::Repository(_) => Kind::Repository,
            Spec::NodePool(_) => Kind::NodePool,
            Spec::Secret(_) => Kind::Secret,
            Spec::Project(_) => Kind::Project,
            Spec::Environment(_) => Kind::Environment,
            Spec::Domain(_) => Kind::Domain,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Object {
    pub metadata: Metadata,
    pub spec: Spec,
}

impl Object {
    pub fn kind(&self) -> Kind {
        self.spec.kind()
    }
    pub fn name(&self) -> &Name {
        &self.metadata.name
    }
}
