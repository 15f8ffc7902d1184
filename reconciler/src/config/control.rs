//! `[control]`: the control plane's id and CA, node certificates, how long a silent node
//! keeps its standing, and how often the fleet beats.

use serde::Deserialize;
use std::path::PathBuf;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// This control plane's id, pinned: a fresh ledger takes it, and a ledger that holds
    /// another refuses to start (`control-plane-id-mismatch`). Unset, a fresh ledger makes one
    /// at random. Every object on the hosts names it, so a control plane rebuilt on a new
    /// ledger keeps them its own only with the same id.
    pub id: Option<ControlPlaneId>,
    /// The control CA that signs node certificates (used from the node-agent issue on).
    pub ca_cert: Option<PathBuf>,
    pub ca_key: Option<PathBuf>,
    /// The control host's age identity, which reseals secrets to nodes.
    pub age_identity: Option<PathBuf>,
    /// How long a node's client certificate is valid, in hours.
    #[serde(default = "default_node_cert_hours")]
    pub node_cert_hours: i64,
    /// Earlier control CAs whose node certificates are still accepted: the first phase of a
    /// CA rotation (new certificates come from `ca_cert`; nodes move over as they renew).
    /// Emptied in the second phase, after which only `ca_cert`'s certificates are accepted.
    #[serde(default)]
    pub trusted_cas: Vec<PathBuf>,
    /// How long a node may be silent before it is lost and its replicas are placed elsewhere.
    #[serde(default = "default_lost_after")]
    pub lost_after_seconds: i64,
    /// The most heartbeats a second the whole fleet sends (50, Nomad's default): each node is
    /// told an interval to match, and gets that much more grace before it is quiet, unhealthy
    /// or lost (`state_schema::placement::heartbeats`).
    #[serde(default = "default_heartbeats_per_second")]
    pub heartbeats_per_second: u32,
    /// The shortest interval a node is told, in seconds (0, the default: none beyond each
    /// agent's own `heartbeat_seconds`).
    #[serde(default)]
    pub heartbeat_min_seconds: u32,
    /// Rebuilding without the ledger (docs/operations.md): a client certificate a control CA
    /// signed, valid now, for a node the accepted state declares and the ledger has never
    /// known, re-admits that node (recorded with a `node-readmitted` event; its first
    /// heartbeat gives its age recipient). Off by default: a control plane admits only what it
    /// enrolled. Turn it off again once `pl nodes` shows every node back: the lost ledger's
    /// revocations are lost with it.
    #[serde(default)]
    pub readmit_nodes: bool,
    /// With `readmit_nodes`, on a ledger with no live deployment: how long deployments wait
    /// for every node Git declares to come back and report what it runs, before they are
    /// planned with what has been reported.
    #[serde(default = "default_readmit_wait")]
    pub readmit_wait_seconds: i64,
}

/// A control plane's id as a configuration pins it: [`agent_proto::CONTROL_PLANE_ID_LEN`]
/// lowercase hex digits, checked when the file is read (a wrong one is refused at its line).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ControlPlaneId(String);

impl ControlPlaneId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ControlPlaneId {
    type Error = String;
    fn try_from(id: String) -> Result<Self, String> {
        if agent_proto::valid_control_plane(&id) {
            Ok(ControlPlaneId(id))
        } else {
            Err(format!(
                "a control plane's id is {} lowercase hex digits, as `pl status` shows it (`{}` is not)",
                agent_proto::CONTROL_PLANE_ID_LEN,
                id.chars().take(32).collect::<String>()
            ))
        }
    }
}

fn default_lost_after() -> i64 {
    300
}

fn default_heartbeats_per_second() -> u32 {
    50
}

impl ControlConfig {
    /// How long a node may be silent before it is lost (`lost_after_seconds`), in ms: never
    /// less than the time after which it is unhealthy.
    pub fn lost_after_ms(&self) -> i64 {
        self.lost_after_seconds
            .saturating_mul(1000)
            .max(state_schema::placement::UNHEALTHY_AFTER_MS)
    }

    /// The fleet's heartbeat ceiling a second and the shortest interval told, in ms.
    pub fn cadence(&self) -> (u32, i64) {
        (self.heartbeats_per_second, i64::from(self.heartbeat_min_seconds) * 1000)
    }

    /// Every CA a node certificate may come from: the signing one first, then those still
    /// trusted during a rotation.
    pub fn client_cas(&self) -> Vec<&std::path::Path> {
        self.ca_cert
            .iter()
            .chain(self.trusted_cas.iter())
            .map(PathBuf::as_path)
            .collect()
    }

    /// The CA bundle (PEM) agents trust and enrolment pins against: [`Self::client_cas`]' files
    /// concatenated.
    pub fn ca_bundle(&self) -> std::io::Result<String> {
        let mut out = String::new();
        for p in self.client_cas() {
            let text = std::fs::read_to_string(p)?;
            out.push_str(text.trim_end());
            out.push('\n');
        }
        Ok(out)
    }
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            id: None,
            ca_cert: None,
            ca_key: None,
            age_identity: None,
            lost_after_seconds: default_lost_after(),
            heartbeats_per_second: default_heartbeats_per_second(),
            heartbeat_min_seconds: 0,
            trusted_cas: Vec::new(),
            node_cert_hours: default_node_cert_hours(),
            readmit_nodes: false,
            readmit_wait_seconds: default_readmit_wait(),
        }
    }
}

fn default_readmit_wait() -> i64 {
    120
}

fn default_node_cert_hours() -> i64 {
    24
}
