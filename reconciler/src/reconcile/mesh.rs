//! The mesh between nodes, decided purely from what the ledger holds: which nodes have a
//! WireGuard key (their agents sent its public half), where each listens, and which
//! environment has a subnet on which node. One function, [`plan`], so what a node is told and
//! what `pl` shows of it come from the same code.
//!
//! A node gets a peer for each other node it shares an environment with, and that peer's
//! allowed IPs are the subnets of the shared environments on it, nothing else; each of its
//! environments learns its subnets on those peers. Every peer gets keepalives: a node that
//! nobody can reach (no endpoint, behind NAT) keeps its paths open with them, and every link
//! handshakes at least every two minutes, so an old handshake means a broken link rather than
//! an idle one (`health.rs`). Two nodes without endpoints cannot meet, which the plan says.
//! Subnets are unique among environments whose pools overlap when the ledger gives them
//! (`state_schema::placement::subnets`); ones given before that rule, or before a pool edit
//! made two pools overlap, may collide on a node, and a colliding subnet is left out of that
//! node's mesh (said as a conflict) rather than routed to the wrong place.

use super::{DaemonError, mesh_health};
use crate::store::{Ledger, LedgerError, now_ms};
use agent_proto::mesh::{KEEPALIVE_SECS, MeshEnvironment, MeshPeer, MeshSpec};
use state_schema::declared;
use state_schema::model::NodePool;
use state_schema::values::Name;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

/// A node as the mesh sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshNode {
    pub name: String,
    /// Its WireGuard public key; `None` until its agent sends one (not in the mesh).
    pub key: Option<String>,
    /// Where it listens (`address:port`), from Git or its agent; `None`: unreachable.
    pub endpoint: Option<String>,
    /// What its service names answer with its own replicas: (environment, role) → addresses.
    pub names: BTreeMap<(String, String), Vec<String>>,
    /// Raised to have it make a new key pair.
    pub key_epoch: u64,
}

/// One environment's subnet on one node (its index in the pool).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placed {
    pub node: String,
    pub environment: String,
    pub idx: i64,
}

/// What one node is told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeMesh {
    pub peers: Vec<Peer>,
    pub environments: Vec<EnvironmentMesh>,
    pub key_epoch: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub node: String,
    pub key: String,
    pub endpoint: Option<String>,
    /// The pool indices of the shared environments' subnets on the peer.
    pub subnets: Vec<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvironmentMesh {
    pub environment: String,
    pub idx: i64,
    /// Its subnets on the peers.
    pub remote: Vec<i64>,
    /// Its roles' replicas on the peers, by role: addresses each peer's names gave, only
    /// those inside that peer's subnet of the environment (a node speaks for its own).
    pub names: BTreeMap<String, Vec<String>>,
}

/// Whether `address` is inside the pool's `idx`-th /24.
fn inside(address: &str, idx: i64) -> bool {
    address.parse::<std::net::Ipv4Addr>().is_ok_and(|a| {
        let o = a.octets();
        o[0] == 10 && i64::from(o[1]) == 208 + idx / 256 && i64::from(o[2]) == idx % 256
    })
}

/// Something the plan could not do.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// On `node`, subnet `idx` is held by more than one of the environments it would route:
    /// left out of its mesh.
    Conflict { node: String, idx: i64 },
    /// Neither node has an endpoint: no path between them.
    Unreachable { a: String, b: String },
}

/// Each keyed node's mesh, and what could not be done.
pub fn plan(nodes: &[MeshNode], placed: &[Placed]) -> (BTreeMap<String, NodeMesh>, Vec<Problem>) {
    let planner = Planner::new(nodes, placed);
    let mut problems = BTreeSet::new();
    let out = planner
        .nodes()
        .map(|name| (name.to_owned(), planner.node(name, &mut problems)))
        .collect();
    (out, problems.into_iter().collect())
}

/// The fleet's meshes, made one node at a time: the indices every node's mesh is read from
/// are built once, and a node's mesh only when asked, so a caller holds one at a time. Ten
/// thousand nodes' meshes, each with its ~250 peers, were hundreds of MB when made at once.
pub struct Planner<'a> {
    keyed: BTreeMap<&'a str, &'a MeshNode>,
    /// node -> environment -> idx
    on: BTreeMap<&'a str, BTreeMap<&'a str, i64>>,
    /// environment -> its keyed nodes and their subnets: a node's peers are found through its
    /// own environments only, so the work grows with the environments' sizes squared, not
    /// with the fleet's (ten thousand nodes are not 10^8 pairs to look at).
    members: BTreeMap<&'a str, Vec<(&'a str, i64)>>,
}

impl<'a> Planner<'a> {
    pub fn new(nodes: &'a [MeshNode], placed: &'a [Placed]) -> Self {
        let keyed: BTreeMap<&str, &MeshNode> = nodes
            .iter()
            .filter(|n| n.key.is_some())
            .map(|n| (n.name.as_str(), n))
            .collect();
        let mut on: BTreeMap<&str, BTreeMap<&str, i64>> = BTreeMap::new();
        for p in placed {
            on.entry(p.node.as_str())
                .or_default()
                .insert(p.environment.as_str(), p.idx);
        }
        let mut members: BTreeMap<&str, Vec<(&str, i64)>> = BTreeMap::new();
        for (node, envs) in &on {
            if keyed.contains_key(node) {
                for (env, idx) in envs {
                    members.entry(env).or_default().push((node, *idx));
                }
            }
        }
        Planner { keyed, on, members }
    }

    /// The nodes that have a mesh (their agents sent a key), in name order.
    pub fn nodes(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.keyed.keys().copied()
    }

    /// `name`'s mesh (empty for a node without a key), adding what it could not do to
    /// `problems`.
    pub fn node(&self, name: &str, problems: &mut BTreeSet<Problem>) -> NodeMesh {
        let Some(me) = self.keyed.get(name) else {
            return NodeMesh::default();
        };
        let empty = BTreeMap::new();
        let mine = self.on.get(name).unwrap_or(&empty);
        // Each peer's subnets of the shared environments, in the environments' order.
        let mut sharing: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for env in mine.keys() {
            for (other, idx) in self.members.get(env).map_or(&[][..], Vec::as_slice) {
                if *other != name {
                    sharing.entry(other).or_default().push(*idx);
                }
            }
        }
        let mut peers = Vec::new();
        for (other, subnets) in sharing {
            let Some(them) = self.keyed.get(other) else { continue };
            if me.endpoint.is_none() && them.endpoint.is_none() {
                let (a, b) = if name < other { (name, other) } else { (other, name) };
                problems.insert(Problem::Unreachable {
                    a: a.to_owned(),
                    b: b.to_owned(),
                });
            }
            peers.push(Peer {
                node: other.to_owned(),
                key: them.key.clone().unwrap_or_default(),
                endpoint: them.endpoint.clone(),
                subnets,
            });
        }
        // Every subnet this node routes, counted: one held twice goes nowhere.
        let mut count: BTreeMap<i64, usize> = BTreeMap::new();
        for idx in mine.values().chain(peers.iter().flat_map(|p| p.subnets.iter())) {
            *count.entry(*idx).or_default() += 1;
        }
        let clash: BTreeSet<i64> = count.into_iter().filter(|(_, n)| *n > 1).map(|(i, _)| i).collect();
        for idx in &clash {
            problems.insert(Problem::Conflict {
                node: name.to_owned(),
                idx: *idx,
            });
        }
        for p in &mut peers {
            p.subnets.retain(|i| !clash.contains(i));
        }
        peers.retain(|p| !p.subnets.is_empty());
        let environments = mine
            .iter()
            .map(|(env, idx)| environment_mesh(env, *idx, &peers, &self.on, &self.keyed, &clash))
            .collect();
        NodeMesh {
            peers,
            environments,
            key_epoch: me.key_epoch,
        }
    }
}

/// One environment's part of a node's mesh: where its subnet is on the node's peers (subnets
/// held twice left out) and the service names those peers serve for it, inside their subnets.
fn environment_mesh(
    env: &str,
    idx: i64,
    peers: &[Peer],
    on: &BTreeMap<&str, BTreeMap<&str, i64>>,
    keyed: &BTreeMap<&str, &MeshNode>,
    clash: &BTreeSet<i64>,
) -> EnvironmentMesh {
    let at: Vec<(&str, i64)> = peers
        .iter()
        .filter_map(|p| {
            on.get(p.node.as_str())
                .and_then(|t| t.get(env))
                .map(|i| (p.node.as_str(), *i))
        })
        .filter(|(_, i)| !clash.contains(i))
        .collect();
    let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (peer, i) in &at {
        let Some(n) = keyed.get(peer) else { continue };
        for ((e, role), addresses) in &n.names {
            if e != env {
                continue;
            }
            let list = names.entry(role.clone()).or_default();
            list.extend(addresses.iter().filter(|a| inside(a, *i)).cloned());
        }
    }
    for list in names.values_mut() {
        list.sort();
        list.dedup();
        list.truncate(agent_proto::mesh::MAX_NAME_ADDRESSES);
    }
    names.retain(|_, l| !l.is_empty());
    EnvironmentMesh {
        environment: env.to_owned(),
        idx,
        remote: at.iter().map(|(_, i)| *i).collect(),
        names,
    }
}

/// A node's mesh as its agent receives it (the generation is the ledger's, set when served).
pub fn wire(m: &NodeMesh, port: u16) -> MeshSpec {
    let subnet = crate::store::rows::subnet;
    MeshSpec {
        generation: 0,
        key_epoch: m.key_epoch,
        port,
        peers: m
            .peers
            .iter()
            .map(|p| MeshPeer {
                node: p.node.clone(),
                public_key: p.key.clone(),
                endpoint: p.endpoint.clone(),
                keepalive: Some(KEEPALIVE_SECS),
                subnets: p.subnets.iter().map(|i| subnet(*i)).collect(),
            })
            .collect(),
        environments: m
            .environments
            .iter()
            .map(|e| MeshEnvironment {
                environment: e.environment.clone(),
                subnet: subnet(e.idx),
                remote: e.remote.iter().map(|i| subnet(*i)).collect(),
                names: e
                    .names
                    .iter()
                    .map(|(role, addresses)| agent_proto::mesh::MeshName {
                        environment: String::new(),
                        role: role.clone(),
                        addresses: addresses.clone(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// How many nodes' changed meshes one write records (a node's spec is about 10 KB with its
/// ~250 peers at 10,000 nodes: a few MB a transaction).
pub const MESH_WRITE_CHUNK: usize = 256;

/// Decides every keyed node's mesh from what the ledger holds and records those that changed
/// (each at its next generation; agents fetch theirs with their next heartbeat). A node in
/// `retired` is in no one's mesh (its key no longer counts), whatever is still to be cleaned
/// up on it. A node's address is Git's (`declared`) when Git says one, else its agent's.
/// Problems are events when a mesh changes. Writes at most `chunk` nodes' meshes a
/// transaction; returns the nodes whose mesh changed.
pub async fn refresh(
    ledger: &Ledger,
    retired: &[String],
    declared: &BTreeMap<String, std::net::IpAddr>,
    chunk_nodes: usize,
    now_ms: i64,
) -> Result<Vec<String>, LedgerError> {
    let keys = ledger.nodes().mesh_keys().await?;
    let port = |k: &crate::store::mesh::KeyRow| {
        k.mesh_port
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(agent_proto::mesh::DEFAULT_MESH_PORT)
    };
    let nodes: Vec<MeshNode> = keys
        .iter()
        .map(|k| MeshNode {
            name: k.name.clone(),
            key: k.mesh_key.clone().filter(|_| !retired.contains(&k.name)),
            key_epoch: u64::try_from(k.mesh_key_epoch).unwrap_or(0),
            names: k
                .mesh_names
                .as_deref()
                .and_then(|t| serde_json::from_str::<Vec<agent_proto::mesh::MeshName>>(t).ok())
                .unwrap_or_default()
                .into_iter()
                .map(|n| ((n.environment, n.role), n.addresses))
                .collect(),
            endpoint: declared
                .get(&k.name)
                .copied()
                .or_else(|| k.mesh_address.as_deref().and_then(|a| a.parse().ok()))
                .map(|a| std::net::SocketAddr::new(a, port(k)).to_string()),
        })
        .collect();
    let placed: Vec<Placed> = ledger
        .nodes()
        .mesh_placed()
        .await?
        .into_iter()
        .map(|(node, environment, idx)| Placed { node, environment, idx })
        .collect();
    let planner = Planner::new(&nodes, &placed);
    let have = ledger.nodes().mesh_hashes().await?;
    let ports: BTreeMap<&str, u16> = keys.iter().map(|k| (k.name.as_str(), port(k))).collect();
    // Each node's mesh made, compared and, when changed, written in chunks: one at a time in
    // memory, and no writer transaction longer than a chunk's (all ten thousand nodes' specs
    // at once were hundreds of MB and one long hold of the writer).
    let (mut problems, mut changed, mut chunk) = (BTreeSet::new(), Vec::new(), Vec::new());
    for node in planner.nodes() {
        let m = planner.node(node, &mut problems);
        let spec = wire(
            &m,
            ports.get(node).copied().unwrap_or(agent_proto::mesh::DEFAULT_MESH_PORT),
        );
        let json = serde_json::to_string(&spec)?;
        let hash = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(json.as_bytes()))
        };
        if have.get(node).map(String::as_str) != Some(hash.as_str()) {
            changed.push(node.to_owned());
            chunk.push((node.to_owned(), hash, json));
            if chunk.len() >= chunk_nodes {
                ledger.nodes().write_meshes(&chunk, &[], now_ms).await?;
                chunk.clear();
            }
        }
    }
    let events: Vec<(String, String, String)> = if changed.is_empty() {
        Vec::new()
    } else {
        problems
            .iter()
            .map(|p| match p {
                Problem::Conflict { node, idx } => (
                    "mesh-subnet-conflict".to_owned(),
                    node.clone(),
                    format!(
                        "{} is held by more than one environment this node routes (given before their pools overlapped): left out of its mesh until one is torn down",
                        crate::store::rows::subnet(*idx)
                    ),
                ),
                Problem::Unreachable { a, b } => (
                    "mesh-unreachable".to_owned(),
                    a.clone(),
                    format!("neither {a} nor {b} has an address others reach it at: set nodes[].address or the agent's mesh_address"),
                ),
            })
            .collect()
    };
    ledger.nodes().write_meshes(&chunk, &events, now_ms).await?;
    Ok(changed)
}

impl super::Reconciler {
    /// The mesh between nodes (over `pools`, the applied branch's), decided again when what it
    /// follows changed, and its links judged when due.
    pub(super) async fn refresh_meshes(&self, pools: &[(Name, NodePool)]) -> Result<(), DaemonError> {
        // The mesh between nodes follows placement, the nodes' keys and their names: a changed
        // one goes to its node with its waiting lease (or its next heartbeat).
        let seen = self.mesh_seen.lock().map(|s| s.clone()).unwrap_or_default();
        if let Some(signature) = self.ledger.nodes().mesh_signature().await? {
            // A node retired in Git is in no mesh, whatever still waits to be cleaned up on it;
            // an address Git declares for a node wins over the one its agent says.
            let (retired, addresses) = (declared::retired(pools), declared::addresses(pools));
            let signature = format!("{signature}/{}/{addresses:?}", retired.join(","));
            if signature != seen {
                let changed = refresh(&self.ledger, &retired, &addresses, MESH_WRITE_CHUNK, now_ms()).await?;
                if !changed.is_empty() {
                    tracing::info!(nodes = changed.len(), "node meshes changed");
                    // Their agents' long polls take them now, not at their next heartbeat.
                    self.hub.nodes.wake(&changed);
                }
                if let Ok(mut s) = self.mesh_seen.lock() {
                    *s = signature;
                }
            }
        }
        // The mesh's links, judged from what the agents said: a change is an event, and
        // `/metrics` serves each link's state.
        let now = now_ms();
        if now >= self.mesh_health_due_ms.load(Ordering::Relaxed) {
            self.mesh_health_due_ms
                .store(now + mesh_health::CHECK_EVERY_MS, Ordering::Relaxed);
            let links = mesh_health::check(&self.ledger, now).await?;
            if let Ok(mut slot) = self.hub.mesh_links.lock() {
                *slot = links;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, key: bool, endpoint: Option<&str>) -> MeshNode {
        MeshNode {
            name: name.into(),
            key: key.then(|| format!("key-{name}")),
            endpoint: endpoint.map(str::to_owned),
            names: BTreeMap::new(),
            key_epoch: 0,
        }
    }

    fn at(node: &str, env: &str, idx: i64) -> Placed {
        Placed {
            node: node.into(),
            environment: env.into(),
            idx,
        }
    }

    #[test]
    fn nodes_peer_only_over_shared_environments_with_only_their_subnets() {
        let nodes = [
            node("n1", true, Some("10.77.0.1:51820")),
            node("n2", true, Some("10.77.0.2:51820")),
            node("n3", true, None),
            node("n4", false, Some("10.77.0.4:51820")),
        ];
        let placed = [
            at("n1", "api", 1),
            at("n1", "shop", 4),
            at("n2", "api", 2),
            at("n2", "blog", 3),
            at("n3", "shop", 5),
            at("n4", "api", 6),
        ];
        let (plan, problems) = plan(&nodes, &placed);
        assert!(problems.is_empty(), "{problems:?}");
        // n4 has no key: in nobody's mesh, and no plan of its own.
        assert!(!plan.contains_key("n4"));
        let n1 = &plan["n1"];
        let peers: Vec<(&str, &[i64])> = n1
            .peers
            .iter()
            .map(|p| (p.node.as_str(), p.subnets.as_slice()))
            .collect();
        // n2 through api only (its blog subnet is not n1's business), n3 through shop.
        assert_eq!(peers, [("n2", &[2][..]), ("n3", &[5][..])]);
        assert_eq!(n1.peers[1].endpoint, None);
        let envs: Vec<(&str, &[i64])> = n1
            .environments
            .iter()
            .map(|e| (e.environment.as_str(), e.remote.as_slice()))
            .collect();
        assert_eq!(envs, [("api", &[2][..]), ("shop", &[5][..])]);
        // n3 is unreachable: n1 waits for it to reach out.
        assert_eq!(plan["n3"].peers.len(), 1);
        assert_eq!(plan["n3"].peers[0].endpoint.as_deref(), Some("10.77.0.1:51820"));
        // n2 shares nothing with n3: no peer.
        assert_eq!(
            plan["n2"].peers.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(),
            ["n1"]
        );
        let blog = plan["n2"]
            .environments
            .iter()
            .find(|e| e.environment == "blog")
            .expect("blog");
        assert!(blog.remote.is_empty());
    }

    #[test]
    fn the_last_shared_environment_gone_leaves_no_peer_and_two_unreachable_nodes_are_said() {
        let nodes = [node("n1", true, None), node("n2", true, None)];
        let (plan_, problems) = plan(&nodes, &[at("n1", "api", 1), at("n2", "api", 2)]);
        assert_eq!(
            problems,
            [Problem::Unreachable {
                a: "n1".into(),
                b: "n2".into()
            }]
        );
        assert_eq!(plan_["n1"].peers.len(), 1);
        let (plan_, _) = plan(&nodes, &[at("n1", "api", 1)]);
        assert!(plan_["n1"].peers.is_empty());
        assert_eq!(plan_["n2"], NodeMesh::default());
    }

    #[test]
    fn names_carry_the_peers_replicas_of_the_same_environment_inside_their_own_subnets() {
        let mut n2 = node("n2", true, Some("10.77.0.2:51820"));
        n2.names.insert(
            ("api".into(), "db".into()),
            vec!["10.208.2.10".into(), "10.208.2.11".into()],
        );
        // Not n2's to say: an address of another subnet, and another environment's role.
        n2.names
            .insert(("api".into(), "cache".into()), vec!["10.208.9.10".into()]);
        n2.names
            .insert(("shop".into(), "db".into()), vec!["10.208.3.10".into()]);
        let mut n3 = node("n3", true, Some("10.77.0.3:51820"));
        n3.names.insert(("api".into(), "db".into()), vec!["10.208.4.10".into()]);
        let nodes = [node("n1", true, Some("10.77.0.1:51820")), n2, n3];
        let placed = [
            at("n1", "api", 1),
            at("n2", "api", 2),
            at("n2", "shop", 3),
            at("n3", "api", 4),
        ];
        let (plan, _) = plan(&nodes, &placed);
        let api = &plan["n1"].environments[0];
        assert_eq!(
            api.names,
            BTreeMap::from([(
                "db".to_owned(),
                vec!["10.208.2.10".to_owned(), "10.208.2.11".into(), "10.208.4.10".into()]
            )])
        );
    }

    #[test]
    fn a_subnet_held_twice_on_a_node_is_left_out_of_its_mesh() {
        let nodes = [
            node("n1", true, Some("10.77.0.1:51820")),
            node("n2", true, Some("10.77.0.2:51820")),
            node("n3", true, Some("10.77.0.3:51820")),
        ];
        // Given before their pools overlapped: api on n2 and shop on n3 share 7.
        let placed = [
            at("n1", "api", 1),
            at("n1", "shop", 2),
            at("n2", "api", 7),
            at("n3", "shop", 7),
        ];
        let (plan, problems) = plan(&nodes, &placed);
        assert_eq!(
            problems,
            [Problem::Conflict {
                node: "n1".into(),
                idx: 7
            }]
        );
        assert!(plan["n1"].peers.is_empty());
        assert!(plan["n1"].environments.iter().all(|e| e.remote.is_empty()));
        // n2 and n3 are each other's nothing, and n1's subnets still reach them.
        assert_eq!(plan["n2"].peers[0].subnets, [1]);
        assert_eq!(plan["n3"].peers[0].subnets, [2]);
    }
}
