//! A heartbeat: what a node can run, what runs there (as its agent observed it), what it
//! repaired, its volumes' use, its machine and the subnets others use there, and its mesh.

use super::*;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The task set this crate's agent runs: 1 since `ensure-environment` (an environment's
/// network, firewall and routes as one task). Raised with each task a control plane must not
/// send an older agent.
pub const PROTOCOL: u32 = 1;

/// Most replicas one heartbeat may report.
pub const MAX_HEARTBEAT_INSTANCES: usize = 512;

/// `POST /v1/agent/heartbeat`: the node is alive, can run `capabilities` (`docker`,
/// `ingress`, `nftables`, `routes`), and runs `running`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    pub agent_version: String,
    /// The revision of the task set this agent runs ([`PROTOCOL`] for this crate's); absent
    /// (0) from an agent that predates `ensure-environment`: the control plane queues its
    /// environments' set-ups as the three tasks such an agent knows.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub protocol: u32,
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
    /// The node's age recipient (`age1…`, public), as given at enrolment: a control plane
    /// rebuilt without its ledger (`control.readmit_nodes`) learns it from here, since it
    /// seals the node's secrets to it. One that holds the node's recipient ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_recipient: Option<String>,
    /// This control plane's environment networks on the node (at most
    /// [`MAX_HEARTBEAT_NETWORKS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<OwnNetwork>,
}

/// Most environment networks one heartbeat may report.
pub const MAX_HEARTBEAT_NETWORKS: usize = 1024;

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
    /// The spec hash the replica was made from (its label): a control plane rebuilt without
    /// its ledger adopts the generation when Git's head asks for the same spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_hash: Option<String>,
    /// The image the container was made from (its label): what runs, not what was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Who signed that image, as the agent verified before it pulled and made the container
    /// (its labels); absent when no image rule named the project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_signed: Option<ImageSigned>,
}

/// An image signature the agent verified: the principal and key of the trusted signer, and
/// when (Unix ms, the node's clock).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageSigned {
    pub principal: String,
    /// `SHA256:…`.
    pub fingerprint: String,
    pub verified_at_ms: i64,
}

/// Longest image reference, principal or fingerprint a heartbeat may report.
pub const MAX_IMAGE_TEXT: usize = 512;

impl RunningInstance {
    /// Whether its image fields are within [`MAX_IMAGE_TEXT`].
    pub fn bounded(&self) -> bool {
        self.image.as_ref().is_none_or(|i| i.len() <= MAX_IMAGE_TEXT)
            && self
                .image_signed
                .as_ref()
                .is_none_or(|s| s.principal.len() <= MAX_IMAGE_TEXT && s.fingerprint.len() <= MAX_IMAGE_TEXT)
    }
}

/// One environment's network of this control plane on the node, and its subnet: a control
/// plane rebuilt without its ledger keeps the subnets its nodes report (a network's subnet
/// cannot change under running replicas).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OwnNetwork {
    pub environment: String,
    pub subnet: String,
}

impl Heartbeat {
    /// A heartbeat of this crate's agent (its [`PROTOCOL`]) that reports capabilities and
    /// nothing running.
    pub fn new(agent_version: &str, capabilities: &[&str]) -> Heartbeat {
        Heartbeat {
            agent_version: agent_version.to_owned(),
            protocol: PROTOCOL,
            capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
            running: Vec::new(),
            repaired: Vec::new(),
            host: None,
            taken_subnets: Vec::new(),
            volumes: Vec::new(),
            mesh: None,
            age_recipient: None,
            networks: Vec::new(),
        }
    }
}
