//! What the applied branch's node pools declare of each node, read the way the control plane
//! needs it: the pools decoded from the ledger's canonical documents, which pool a node is in
//! and whether it is draining or retired, the mesh addresses declared, and the lifecycle state
//! `pl nodes` shows from that and from when the node was last heard from.

use crate::model::{NodePool, NodeState, Spec};
use crate::placement::Liveness;
use crate::values::Name;
use core::net::IpAddr;
use std::collections::{BTreeMap, HashMap};

/// A node as the applied branch's accepted state declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Declared {
    No,
    Retired,
    /// Declared and draining: it keeps what it runs and gets no new work.
    Draining {
        pool: String,
    },
    Yes {
        pool: String,
    },
}

/// The node pools in `documents` (canonical NodePool documents as the ledger keeps them);
/// anything else in them is left out.
pub fn node_pools<S: AsRef<str>>(documents: &[S]) -> Vec<(Name, NodePool)> {
    let mut out = Vec::new();
    for doc in documents {
        for l in crate::parse::parse_file("pool.yaml", doc.as_ref().as_bytes()).objects {
            if let Spec::NodePool(pool) = l.object.spec {
                out.push((l.object.metadata.name, pool));
            }
        }
    }
    out
}

/// What the pools declare of each node, by name.
pub fn declared_nodes(pools: &[(Name, NodePool)]) -> HashMap<String, Declared> {
    let mut out = HashMap::new();
    for (pool, p) in pools {
        for n in &p.nodes {
            let pool = pool.to_string();
            let d = match n.state {
                NodeState::Retired => Declared::Retired,
                NodeState::Draining => Declared::Draining { pool },
                NodeState::Active => Declared::Yes { pool },
            };
            out.insert(n.name.to_string(), d);
        }
    }
    out
}

/// The nodes the pools say are retired.
pub fn retired(pools: &[(Name, NodePool)]) -> Vec<String> {
    pools
        .iter()
        .flat_map(|(_, p)| &p.nodes)
        .filter(|n| n.state == NodeState::Retired)
        .map(|n| n.name.to_string())
        .collect()
}

/// Each node's declared mesh address (`nodes[].address`), where it has one.
pub fn addresses(pools: &[(Name, NodePool)]) -> BTreeMap<String, IpAddr> {
    pools
        .iter()
        .flat_map(|(_, p)| &p.nodes)
        .filter_map(|n| Some((n.name.to_string(), n.address?)))
        .collect()
}

/// The lifecycle state from what Git says and when the node was last seen (the same
/// thresholds placement uses: [`Liveness`]): `not-enrolled`, `active`, `unhealthy`, `lost`,
/// `draining` or `retired`.
pub fn lifecycle(
    git: NodeState,
    enrolled: bool,
    last_seen_ms: Option<i64>,
    now_ms: i64,
    lost_after_ms: i64,
) -> &'static str {
    match git {
        NodeState::Retired => return "retired",
        NodeState::Draining => return "draining",
        NodeState::Active => {}
    }
    if !enrolled {
        return "not-enrolled";
    }
    match Liveness::of(last_seen_ms, now_ms, lost_after_ms) {
        Liveness::Ready | Liveness::Quiet => "active",
        Liveness::Unhealthy | Liveness::Unseen => "unhealthy",
        Liveness::Lost => "lost",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_from_git_and_heartbeats() {
        let now = 1_000_000;
        assert_eq!(lifecycle(NodeState::Active, false, None, now, 300_000), "not-enrolled");
        assert_eq!(lifecycle(NodeState::Active, true, None, now, 300_000), "unhealthy");
        assert_eq!(
            lifecycle(NodeState::Active, true, Some(now - 1_000), now, 300_000),
            "active"
        );
        assert_eq!(
            lifecycle(NodeState::Active, true, Some(now - 91_000), now, 300_000),
            "unhealthy"
        );
        assert_eq!(
            lifecycle(NodeState::Active, true, Some(now - 301_000), now, 300_000),
            "lost"
        );
        assert_eq!(
            lifecycle(NodeState::Draining, true, Some(now), now, 300_000),
            "draining"
        );
        assert_eq!(lifecycle(NodeState::Retired, true, Some(now), now, 300_000), "retired");
    }

    #[test]
    fn pools_read_from_their_documents_say_what_each_node_is() {
        let doc = "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: main\nspec:\n  \
                   region: r1\n  capabilities: [docker]\n  placement: pack\n  nodes:\n    \
                   - {name: n1, capacity: {cpu: \"2\", memory: 4Gi}, address: 10.0.0.1}\n    \
                   - {name: n2, state: draining, capacity: {cpu: \"2\", memory: 4Gi}}\n    \
                   - {name: n3, state: retired, capacity: {cpu: \"2\", memory: 4Gi}}\n";
        let pools = node_pools(&[doc, "not: a pool"]);
        assert_eq!(pools.len(), 1, "{pools:?}");
        let d = declared_nodes(&pools);
        assert_eq!(d["n1"], Declared::Yes { pool: "main".into() });
        assert_eq!(d["n2"], Declared::Draining { pool: "main".into() });
        assert_eq!(d["n3"], Declared::Retired);
        assert_eq!(retired(&pools), ["n3"]);
        assert_eq!(addresses(&pools).keys().collect::<Vec<_>>(), ["n1"]);
    }
}
