//! Which of the store's digests each node may fetch: a manifest that a job of the node names
//! (the ledger decides, `ops::images::node_may_fetch`), and what such a manifest references,
//! for a while. Pure: the caller passes the time. Bounded: a node holds at most
//! `MAX_PER_NODE` grants, each for `GRANT_TTL`; the oldest go first.

use registry::oci::Digest;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a grant lasts: a pull of the largest image the store takes, with room.
pub const GRANT_TTL: Duration = Duration::from_secs(3600);
/// Grants one node may hold (an image is a manifest, a config and its layers; an index a few
/// of those).
pub const MAX_PER_NODE: usize = 4096;

#[derive(Default)]
pub struct Grants {
    nodes: HashMap<String, HashMap<Digest, Instant>>,
}

impl Grants {
    /// Whether `node` holds an unexpired grant for `d`.
    pub fn allows(&self, node: &str, d: &Digest, now: Instant) -> bool {
        self.nodes
            .get(node)
            .and_then(|g| g.get(d))
            .is_some_and(|until| *until > now)
    }

    /// Grants `node` the digests until `now + GRANT_TTL`, dropping expired grants (every
    /// node's) and, past the bound, the node's oldest.
    pub fn grant(&mut self, node: &str, digests: impl IntoIterator<Item = Digest>, now: Instant) {
        self.nodes.retain(|_, g| {
            g.retain(|_, until| *until > now);
            !g.is_empty()
        });
        let g = self.nodes.entry(node.to_owned()).or_default();
        for d in digests {
            g.insert(d, now + GRANT_TTL);
        }
        while g.len() > MAX_PER_NODE {
            let Some(oldest) = g.iter().min_by_key(|(_, until)| **until).map(|(d, _)| d.clone()) else {
                break;
            };
            g.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: char) -> Digest {
        Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).expect("digest")
    }

    #[test]
    fn a_grant_is_the_nodes_own_and_expires() {
        let now = Instant::now();
        let mut g = Grants::default();
        g.grant("n1", [d('a'), d('b')], now);
        assert!(g.allows("n1", &d('a'), now));
        assert!(!g.allows("n2", &d('a'), now), "another node's grant");
        assert!(!g.allows("n1", &d('c'), now), "never granted");
        assert!(!g.allows("n1", &d('a'), now + GRANT_TTL), "expired");
        g.grant("n2", [d('c')], now + GRANT_TTL);
        assert!(!g.nodes.contains_key("n1"), "expired grants are dropped");
    }

    #[test]
    fn a_node_holds_a_bounded_number() {
        let now = Instant::now();
        let mut g = Grants::default();
        let many: Vec<Digest> = (0..MAX_PER_NODE + 10)
            .map(|i| Digest::parse(&format!("sha256:{i:064x}")).expect("digest"))
            .collect();
        for (i, x) in many.iter().enumerate() {
            g.grant("n1", [x.clone()], now + Duration::from_millis(i as u64));
        }
        assert_eq!(g.nodes["n1"].len(), MAX_PER_NODE);
        assert!(!g.allows("n1", &many[0], now), "the oldest went first");
        assert!(g.allows("n1", &many[MAX_PER_NODE + 9], now));
    }
}
