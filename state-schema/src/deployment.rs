//! What one generation of an environment runs, as the ledger stores it and the planner, the
//! placement and the release rules read it: types only, so that `desired` (derivation),
//! `placement` and `release` depend on them and not on each other.

use crate::model::Placement;
use crate::runspec::RoleSpec;
use crate::values::SmallMap;
use crate::values::{Hostname, Name};
use serde::{Deserialize, Serialize};

/// One replica of a long-running role, placed on a node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Instance {
    pub role: Name,
    pub index: u32,
    pub node: Name,
    /// How often this replica moved to another node within its generation (a drain, a lost
    /// node): part of its container's name, so the moved replica's container and the one it
    /// replaces differ in name, and both can run at once on an engine two nodes share.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moves: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Instance {
    /// A replica that never moved.
    pub fn new(role: Name, index: u32, node: Name) -> Instance {
        Instance {
            role,
            index,
            node,
            moves: 0,
        }
    }

    /// Whether `self` and `other` are one replica (the same role and index), wherever each runs.
    pub fn same_slot(&self, other: &Instance) -> bool {
        self.role == other.role && self.index == other.index
    }
}

/// What one generation of an environment runs: stored with the deployment, so cleanup and
/// teardown know what an older generation placed where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentSpec {
    pub environment: Name,
    pub project: Name,
    pub instances: Vec<Instance>,
    /// Release roles, run once per generation before the new replicas start, on this node.
    pub release: Vec<(Name, Name)>,
    /// Cron roles and the node their runs go to (the release node's rule).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cron: Vec<(Name, Name)>,
    pub hostnames: Vec<Hostname>,
    /// Every node with a part of the environment, sorted.
    pub nodes: Vec<Name>,
    /// Nodes with a web replica: where the ingress routes live.
    pub ingress_nodes: Vec<Name>,
    /// What the release depends on ([`crate::release::Releases`]): equal hashes, the same
    /// release. Empty in specs stored before it existed, which any change then rolls anew.
    #[serde(default)]
    pub release_hash: String,
    /// The pool the environment runs in; `None` in specs stored before placement knew it
    /// (those are never re-placed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Name>,
    #[serde(default = "spread")]
    pub placement: Placement,
    /// Replicas wanted per long-running role (some may wait for room).
    #[serde(default)]
    pub replicas: SmallMap<Name, u32>,
    /// What each role runs, as a lease hands it to an agent.
    #[serde(default)]
    pub roles: SmallMap<Name, RoleSpec>,
    /// The certificates people bring, by hostname: the Environment's `tls.secret` for its own
    /// hostname, each Domain's for its. A hostname not here is served with the certificate the
    /// control plane issues, if it issues any, else over plain HTTP. Absent from the stored form
    /// when empty, so specs without it keep their hashes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<(Hostname, TlsSpec)>,
    /// Which of `hostnames` are Domains (custom domains, served only once their ownership is
    /// proven in DNS), with how it is proven; absent when empty, so the hashes of
    /// environments without Domains do not move.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<(Hostname, crate::model::Verification)>,
    /// The repository its volumes' backups go to (the Environment's `backups`); absent when
    /// unset, so specs without it keep their hashes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backups: Option<BackupsSpec>,
}

/// A backups repository as ciphertext from Git: a lease seals the Secret's values to the node
/// that runs the backup.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackupsSpec {
    pub repository: String,
    /// The Secret (named in events and errors; never a value).
    pub secret: Name,
    /// Its keys and their ASCII-armoured age ciphertexts, `RESTIC_PASSWORD` among them.
    pub values: Vec<(String, String)>,
}

/// What a deployment uses that the reconciler looks for among the live ones (backups to
/// schedule, cron roles, custom domains): kept in columns beside the stored
/// spec, so no query searches the spec's text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uses {
    /// A volume with a `backup`, and the environment's `backups` repository.
    pub backups: bool,
    pub cron: bool,
    pub domains: bool,
}

impl DeploymentSpec {
    /// What it uses ([`Uses`]).
    pub fn uses(&self) -> Uses {
        Uses {
            backups: self.backups.is_some()
                && self
                    .roles
                    .values()
                    .any(|r| r.volumes.iter().any(|v| v.backup.is_some())),
            cron: !self.cron.is_empty(),
            domains: !self.domains.is_empty(),
        }
    }

    /// The certificate brought for `hostname`, if any.
    /// How a Domain hostname's ownership is proven (`None`: not a Domain).
    pub fn domain(&self, hostname: &str) -> Option<crate::model::Verification> {
        self.domains
            .iter()
            .find(|(h, _)| h.as_str() == hostname)
            .map(|(_, v)| *v)
    }

    /// The environment's own hostname (not a Domain), the target of `cname` verification.
    pub fn own_hostname(&self) -> Option<&Hostname> {
        self.hostnames.iter().find(|h| self.domain(h.as_str()).is_none())
    }

    pub fn certificate(&self, hostname: &str) -> Option<&TlsSpec> {
        self.certificates
            .iter()
            .find(|(h, _)| h.as_str() == hostname)
            .map(|(_, t)| t)
    }
}

/// The certificate an environment's hostnames are served with, as ciphertext from Git: a lease
/// seals it to the node that serves them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TlsSpec {
    /// The Secret it came from (named in events and errors; never a value).
    pub secret: Name,
    /// `CERT`: the PEM chain, ASCII-armoured age ciphertext as in Git.
    pub cert: String,
    /// `KEY`: the PEM private key, ciphertext as in Git.
    pub key: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hsts: bool,
}

fn spread() -> Placement {
    Placement::Spread
}
