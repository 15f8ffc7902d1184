//! Which /24 of the environments' pool (`10.208.0.0/12`, 4,096 of them) each (environment,
//! node) pair gets. Pure: the caller reads what the ledger holds and writes what this returns.
//!
//! A subnet must be unique wherever two of them can meet:
//! - on one machine (nodes whose agents report the same host share a Docker engine), including
//!   the /24s other control planes' networks use there;
//! - on a node's mesh: a node routes the subnets of every environment it runs, on every node
//!   that runs it, so the subnets of two environments that can share a node must differ.
//!   Environments share a node only inside their pools, so a pair avoids every index held on
//!   the nodes of each pool that overlaps its own (and on nodes in no pool, and its own
//!   environment's anywhere: a moved environment's old nodes still route while it is cleaned).
//!
//! So the bound is 4,096 pairs per group of overlapping pools, not per fleet: disjoint pools
//! each have the whole pool. An edit that makes two pools overlap can bring earlier subnets
//! together on a node in both; the mesh leaves such a subnet out and says so
//! (`reconcile/mesh.rs`) rather than route it to the wrong place.

use std::collections::{BTreeMap, BTreeSet};

/// /24s in `10.208.0.0/12`.
pub const POOL_SIZE: usize = 4096;
const WORDS: usize = POOL_SIZE / 64;

/// A set of pool indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bits([u64; WORDS]);

impl Bits {
    const EMPTY: Bits = Bits([0; WORDS]);

    fn set(&mut self, idx: usize) {
        if idx < POOL_SIZE {
            self.0[idx / 64] |= 1 << (idx % 64);
        }
    }

    fn or(&mut self, other: &Bits) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a |= b;
        }
    }

    fn first_free(&self) -> Option<usize> {
        self.0
            .iter()
            .enumerate()
            .find(|(_, w)| **w != u64::MAX)
            .map(|(i, w)| i * 64 + w.trailing_ones() as usize)
    }
}

/// What the ledger holds, as the choice needs it.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    /// Every subnet held: (node, environment, pool index).
    pub held: Vec<(String, String, usize)>,
    /// The machine each node shares with others (its agent's host), where known.
    pub host: BTreeMap<String, String>,
    /// The indices other networks use on each node's machine, as its agent said.
    pub taken: BTreeMap<String, Vec<usize>>,
    /// Each declared pool's nodes.
    pub pools: BTreeMap<String, BTreeSet<String>>,
}

/// A pair wanting a subnet: its environment, the node, and the pool the environment is placed
/// in (`None`: unknown, so it avoids every index in the fleet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub environment: String,
    pub node: String,
    pub pool: Option<String>,
}

/// The outcome: new subnets (node, environment, index) and the pairs none was left for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Given {
    pub new: Vec<(String, String, usize)>,
    pub exhausted: Vec<(String, String)>,
}

/// The indices in use, by where they can meet.
struct Used<'a> {
    fleet: &'a Fleet,
    /// Pools each node is in.
    pools_of: BTreeMap<&'a str, Vec<&'a str>>,
    /// Pools sharing a node with each pool (itself included).
    overlaps: BTreeMap<&'a str, BTreeSet<&'a str>>,
    by_pool: BTreeMap<&'a str, Bits>,
    /// Held on nodes in no pool.
    unpooled: Bits,
    by_machine: BTreeMap<String, Bits>,
    by_environment: BTreeMap<String, Bits>,
    every: Bits,
}

impl<'a> Used<'a> {
    fn new(fleet: &'a Fleet) -> Used<'a> {
        let mut pools_of: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (pool, nodes) in &fleet.pools {
            for n in nodes {
                pools_of.entry(n.as_str()).or_default().push(pool.as_str());
            }
        }
        let mut overlaps: BTreeMap<&str, BTreeSet<&str>> = fleet
            .pools
            .keys()
            .map(|p| (p.as_str(), BTreeSet::from([p.as_str()])))
            .collect();
        for pools in pools_of.values() {
            for a in pools {
                overlaps.entry(a).or_default().extend(pools.iter().copied());
            }
        }
        let mut used = Used {
            fleet,
            pools_of,
            overlaps,
            by_pool: fleet.pools.keys().map(|p| (p.as_str(), Bits::EMPTY)).collect(),
            unpooled: Bits::EMPTY,
            by_machine: BTreeMap::new(),
            by_environment: BTreeMap::new(),
            every: Bits::EMPTY,
        };
        for (node, list) in &fleet.taken {
            let machine = used.machine(node);
            let bits = used.by_machine.entry(machine).or_insert(Bits::EMPTY);
            for i in list {
                bits.set(*i);
            }
        }
        for (node, env, idx) in &fleet.held {
            used.record(node, env, *idx);
        }
        used
    }

    fn machine(&self, node: &str) -> String {
        self.fleet
            .host
            .get(node)
            .map_or_else(|| format!("node:{node}"), |h| format!("host:{h}"))
    }

    fn record(&mut self, node: &str, env: &str, idx: usize) {
        match self.pools_of.get(node) {
            Some(pools) => {
                for p in pools {
                    if let Some(b) = self.by_pool.get_mut(p) {
                        b.set(idx);
                    }
                }
            }
            None => self.unpooled.set(idx),
        }
        self.by_machine
            .entry(self.machine(node))
            .or_insert(Bits::EMPTY)
            .set(idx);
        self.by_environment
            .entry(env.to_owned())
            .or_insert(Bits::EMPTY)
            .set(idx);
        self.every.set(idx);
    }

    /// Every index `want` must not take.
    fn avoid(&self, want: &Want) -> Bits {
        let mut out = self.unpooled;
        match want.pool.as_deref().and_then(|p| self.overlaps.get(p)) {
            Some(overlapping) => {
                for p in overlapping {
                    if let Some(b) = self.by_pool.get(p) {
                        out.or(b);
                    }
                }
            }
            None => out.or(&self.every),
        }
        // The node itself may be outside its environment's pool (an environment moving).
        if let Some(pools) = self.pools_of.get(want.node.as_str()) {
            for p in pools {
                if let Some(b) = self.by_pool.get(p) {
                    out.or(b);
                }
            }
        }
        if let Some(b) = self.by_machine.get(&self.machine(&want.node)) {
            out.or(b);
        }
        if let Some(b) = self.by_environment.get(&want.environment) {
            out.or(b);
        }
        out
    }
}

/// Gives each pair in `wants` that holds none a subnet: the lowest index it may take.
pub fn give(fleet: &Fleet, wants: &[Want]) -> Given {
    let mut used = Used::new(fleet);
    let mut have: BTreeSet<(&str, &str)> = fleet.held.iter().map(|(n, e, _)| (n.as_str(), e.as_str())).collect();
    let mut given = Given::default();
    for w in wants {
        if !have.insert((w.node.as_str(), w.environment.as_str())) {
            continue;
        }
        match used.avoid(w).first_free() {
            Some(idx) => {
                used.record(&w.node, &w.environment, idx);
                given.new.push((w.node.clone(), w.environment.clone(), idx));
            }
            None => given.exhausted.push((w.environment.clone(), w.node.clone())),
        }
    }
    given
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(env: &str, node: &str, pool: Option<&str>) -> Want {
        Want {
            environment: env.to_owned(),
            node: node.to_owned(),
            pool: pool.map(str::to_owned),
        }
    }

    fn pools(list: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        list.iter()
            .map(|(p, nodes)| ((*p).to_owned(), nodes.iter().map(|n| (*n).to_owned()).collect()))
            .collect()
    }

    #[test]
    fn disjoint_pools_reuse_indices_overlapping_ones_do_not() {
        let fleet = Fleet {
            pools: pools(&[("a", &["a1", "a2"]), ("b", &["b1", "b2"]), ("c", &["a2", "c1"])]),
            ..Fleet::default()
        };
        let given = give(
            &fleet,
            &[
                want("e", "a1", Some("a")),
                want("e", "a2", Some("a")),
                want("f", "b1", Some("b")),
                want("f", "b2", Some("b")),
                // c overlaps a at a2: g's subnets differ from e's everywhere.
                want("g", "c1", Some("c")),
                want("g", "a2", Some("c")),
            ],
        );
        assert_eq!(
            given.new,
            [
                ("a1".into(), "e".into(), 0),
                ("a2".into(), "e".into(), 1),
                ("b1".into(), "f".into(), 0),
                ("b2".into(), "f".into(), 1),
                ("c1".into(), "g".into(), 2),
                ("a2".into(), "g".into(), 3),
            ]
        );
        assert!(given.exhausted.is_empty());
    }

    #[test]
    fn a_machine_shares_nothing_and_an_unknown_pool_avoids_the_fleet() {
        let fleet = Fleet {
            held: vec![("x1".into(), "old".into(), 0), ("y1".into(), "old".into(), 1)],
            host: [("m1", "h"), ("m2", "h")]
                .iter()
                .map(|(n, h)| ((*n).to_owned(), (*h).to_owned()))
                .collect(),
            taken: [("m1".to_owned(), vec![2, 3])].into_iter().collect(),
            pools: pools(&[("x", &["x1"]), ("m", &["m1"]), ("n", &["m2"]), ("y", &["y1"])]),
        };
        let given = give(
            &fleet,
            &[
                // m1 and m2 share a machine where another control plane uses 2 and 3.
                want("e", "m1", Some("m")),
                want("f", "m2", Some("n")),
                // Held pairs keep theirs.
                want("old", "x1", Some("x")),
                // A pool the state does not declare: nothing the fleet holds.
                want("g", "y1", Some("gone")),
                want("h", "x1", None),
            ],
        );
        assert_eq!(
            given.new,
            [
                ("m1".into(), "e".into(), 0),
                ("m2".into(), "f".into(), 1),
                // (2 and 3 are taken only on m1's machine.)
                ("y1".into(), "g".into(), 2),
                ("x1".into(), "h".into(), 3),
            ]
        );
    }

    #[test]
    fn an_environment_never_repeats_its_own_index_and_a_full_group_is_exhausted() {
        let nodes: Vec<String> = (0..POOL_SIZE + 1).map(|i| format!("n{i}")).collect();
        let fleet = Fleet {
            pools: [("p".to_owned(), nodes.iter().cloned().collect())]
                .into_iter()
                .collect(),
            // e moved: its old subnet on a node outside p still counts.
            held: vec![("elsewhere".into(), "e".into(), 0)],
            ..Fleet::default()
        };
        let wants: Vec<Want> = nodes.iter().map(|n| want("e", n, Some("p"))).collect();
        let given = give(&fleet, &wants);
        assert_eq!(given.new.len(), POOL_SIZE - 1);
        assert_eq!(given.new[0].2, 1);
        assert_eq!(
            given.exhausted,
            [
                ("e".to_owned(), format!("n{}", POOL_SIZE - 1)),
                ("e".to_owned(), format!("n{POOL_SIZE}"))
            ]
        );
    }
}
