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
/// Seconds between keepalives to a peer behind NAT (WireGuard's customary value).
pub const NAT_KEEPALIVE_SECS: u16 = 25;
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
    /// Keepalives every this many seconds (this node is behind NAT); `None` for none.
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
}
