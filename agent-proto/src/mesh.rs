//! The mesh between nodes, as a lease will carry it to one node: the node's WireGuard peers
//! (other nodes' public keys and endpoints, never a private key) and, for each environment
//! this node runs, the environment's subnets on the other nodes. The control plane computes
//! it from placement; the agent applies it whole (`agent/src/mesh.rs`).

use serde::{Deserialize, Serialize};

/// Most peers one node's mesh may have.
pub const MAX_MESH_PEERS: usize = 1024;
/// Most subnets one peer may carry (the whole subnet pool).
pub const MAX_PEER_SUBNETS: usize = 4096;
/// The UDP port a node's mesh listens on unless its configuration says otherwise.
pub const DEFAULT_MESH_PORT: u16 = 51820;
/// Seconds between keepalives on every link (WireGuard's customary value for NAT): paths
/// through NAT stay open, and every link handshakes at least every two minutes, so its last
/// handshake tells its health.
pub const KEEPALIVE_SECS: u16 = 25;
/// The mesh interface's MTU: 1500 less WireGuard's 80 bytes of overhead (IPv6 outer header).
pub const MESH_MTU: u32 = 1420;

/// One node's mesh at one generation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshSpec {
    /// Rises with every change of the node's mesh: a stale retry never puts older peers back.
    pub generation: u64,
    /// The UDP port this node listens on.
    pub port: u16,
    pub peers: Vec<MeshPeer>,
    pub environments: Vec<MeshEnvironment>,
    /// Raised by the control plane to have this node make a new key pair before applying
    /// (`pl nodes rotate-mesh-key`); the node remembers the epoch it used last.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub key_epoch: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Another node, reached through the mesh.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshPeer {
    pub node: String,
    /// Its WireGuard public key (base64, as `wg` writes it).
    pub public_key: String,
    /// Where it listens (`address:port`); `None` when it is behind NAT and unreachable, so
    /// it reaches this node first (and keeps the path open with keepalives).
    pub endpoint: Option<String>,
    /// Keepalives every this many seconds; `None` for none.
    pub keepalive: Option<u16>,
    /// The subnets of environments both nodes run, on the peer: its allowed IPs.
    pub subnets: Vec<String>,
}

/// An environment this node runs, and its subnets on the other nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshEnvironment {
    pub environment: String,
    /// Its subnet on this node.
    pub subnet: String,
    /// Its subnets on the other nodes (each in exactly one peer's `subnets`).
    pub remote: Vec<String>,
    /// Its roles' healthy replicas on the other nodes, by role: what its service names add
    /// to this node's own replicas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<MeshName>,
}

/// A role of an environment and the addresses of its healthy replicas on one or more nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshName {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub environment: String,
    pub role: String,
    /// IPv4 addresses, at most [`MAX_NAME_ADDRESSES`].
    pub addresses: Vec<String>,
}

/// Most addresses one role's name carries between nodes (what a name's answer holds).
pub const MAX_NAME_ADDRESSES: usize = 16;
/// Most names one heartbeat may report.
pub const MAX_HEARTBEAT_NAMES: usize = 4096;

/// What a node's heartbeat says of its mesh: its WireGuard public key (never the private
/// one), the UDP port it listens on, and the address others reach it at when its agent is
/// told one (an IP literal: nothing is resolved).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshAdvert {
    pub public_key: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The generation of the mesh the agent applied last (0: none yet).
    #[serde(default)]
    pub applied: u64,
    /// Its peers and their last handshakes (at most [`MAX_MESH_PEERS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<MeshLink>,
    /// What its service names answer with its own replicas, by environment and role (at
    /// most [`MAX_HEARTBEAT_NAMES`]): what other nodes' names add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<MeshName>,
}

/// One peer of a node's mesh, as the node's WireGuard reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshLink {
    pub node: String,
    /// Unix seconds of the last handshake; `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handshake: Option<u64>,
}

/// The control plane's answer to a heartbeat: the node's name and, when the node has not
/// applied it yet, the mesh it should have (applied by the agent, fenced by generation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatReply {
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<MeshSpec>,
    /// When to beat next, in ms: the control plane derives it from the fleet's size so the
    /// fleet's heartbeats stay under its ceiling, and spreads it (absent from an older control
    /// plane's: the agent keeps its own interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_heartbeat_ms: Option<u64>,
}

impl MeshAdvert {
    /// Whether it is well formed: a key of 32 bytes in standard base64 (44 characters, `=`
    /// last), a port that is not 0, an address that is an IP literal.
    pub fn valid(&self) -> bool {
        let k = self.public_key.as_bytes();
        k.len() == 44
            && k[43] == b'='
            && k[..43]
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
            && self.port != 0
            && self.links.len() <= MAX_MESH_PEERS
            && self.names.len() <= MAX_HEARTBEAT_NAMES
            && self.names.iter().all(|n| {
                !n.environment.is_empty()
                    && n.addresses.len() <= MAX_NAME_ADDRESSES
                    && n.addresses.iter().all(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
            })
            && self
                .address
                .as_deref()
                .is_none_or(|a| a.parse::<std::net::IpAddr>().is_ok())
    }

    /// Where it is reached: `address:port` (`[address]:port` for IPv6), when it has an address.
    pub fn endpoint(&self) -> Option<String> {
        let a: std::net::IpAddr = self.address.as_deref()?.parse().ok()?;
        Some(std::net::SocketAddr::new(a, self.port).to_string())
    }
}

/// The mesh's WireGuard interface of `node` of `control_plane`: `plw` and ten hex digits of
/// the SHA-256 of both (the kernel's 15 bytes), so two control planes, and two nodes of one,
/// on one machine each have their own.
pub fn mesh_interface(control_plane: &str, node: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("{control_plane}/{node}").as_bytes());
    format!("plw{}", hex::encode(&d[..5]))
}

/// The mesh's nftables table on a node (`pl_<control plane>__mesh_<node>`: no environment's table
/// has `__`, as environment names are never empty).
pub fn mesh_table(control_plane: &str, node: &str) -> String {
    format!("pl_{control_plane}__mesh_{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_fit_and_differ_per_control_plane_and_node() {
        let a = mesh_interface("0123abcd", "n1");
        assert_eq!(a.len(), 13);
        assert_ne!(a, mesh_interface("0123abcd", "n2"));
        assert_ne!(a, mesh_interface("0123abce", "n1"));
        // No environment's table has `__`: environment names are DNS labels, never empty.
        assert_eq!(mesh_table("0123abcd", "n1"), "pl_0123abcd__mesh_n1");
        assert!(!crate::host_object("0123abcd", "mesh", "n1").contains("__"));
    }

    #[test]
    fn adverts_are_checked_before_the_control_plane_keeps_them() {
        let ok = MeshAdvert {
            public_key: "IjG2NTSQc3r9k/tNQfief6CqU2RRvmgCObP0GErpnAc=".into(),
            port: 51820,
            address: Some("10.77.0.1".into()),
            applied: 0,
            links: Vec::new(),
            names: vec![MeshName {
                environment: "api".into(),
                role: "db".into(),
                addresses: vec!["10.208.2.10".into()],
            }],
        };
        assert!(ok.valid());
        assert_eq!(ok.endpoint().as_deref(), Some("10.77.0.1:51820"));
        let v6 = MeshAdvert {
            address: Some("fd00::1".into()),
            ..ok.clone()
        };
        assert_eq!(v6.endpoint().as_deref(), Some("[fd00::1]:51820"));
        for bad in [
            MeshAdvert {
                public_key: "short=".into(),
                ..ok.clone()
            },
            MeshAdvert {
                public_key: "IjG2NTSQc3r9k/tNQfief6CqU2RRvmgCObP0GErpnA\n=".into(),
                ..ok.clone()
            },
            MeshAdvert { port: 0, ..ok.clone() },
            MeshAdvert {
                names: vec![MeshName {
                    environment: "api".into(),
                    role: "db".into(),
                    addresses: vec!["db.example.invalid".into()],
                }],
                ..ok.clone()
            },
            MeshAdvert {
                address: Some("node.example.invalid".into()),
                ..ok.clone()
            },
        ] {
            assert!(!bad.valid(), "{bad:?}");
        }
        assert_eq!(MeshAdvert { address: None, ..ok }.endpoint(), None);
    }
}
