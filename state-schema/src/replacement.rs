//! Re-placement: what the fleet as it is now asks of the deployments that run. Pure: the
//! reconciler reads the live fleet and the running deployments from its ledger and writes what
//! [`replace`] returns; `pl plan --fleet` calls the same function over the fleet a control
//! plane reports, so a plan shows the moves the daemon would make.
//!
//! The policy:
//! - A deployment whose pool has no usable node (none active in Git and not lost), or from
//!   before placement knew pools, keeps what it runs: there is nowhere to move it.
//! - A replica that must leave its node (lost, draining, retired, out of the pool, no room)
//!   moves: the placement changes a node, which is a new generation (`release::change`).
//! - A waiting replica that now fits is added at the current generation, a scale, but only
//!   once the deployment's rollout is done: an unfinished rollout moves only to leave a node
//!   it cannot stay on.

use crate::canonical;
use crate::deployment::DeploymentSpec;
use crate::desired::Desired;
use crate::placement::Fleet;
use crate::release::{self, Change};

/// A deployment that runs now, as the ledger holds it.
#[derive(Clone, Debug)]
pub struct Running {
    pub branch: String,
    /// Its latest rollout has steps left.
    pub in_progress: bool,
    pub spec: DeploymentSpec,
}

/// A deployment placement changes, with what it becomes.
#[derive(Clone, Debug, PartialEq)]
pub struct Replaced {
    pub branch: String,
    /// `true`: a replica leaves a node (a new generation); `false`: waiting replicas are added.
    pub moved: bool,
    pub desired: Desired,
}

/// Places every running deployment again on `fleet`, in order, and returns those whose
/// placement changes. `fleet` must hold `running`'s reservations (`Fleet::new(nodes,
/// running)`); on return it holds what placement decided, kept or not.
pub fn replace(fleet: &mut Fleet, running: Vec<Running>) -> Vec<Replaced> {
    let mut out = Vec::new();
    for Running {
        branch,
        in_progress,
        spec: stored,
    } in running
    {
        if !stored.pool.as_ref().is_some_and(|p| fleet.has_usable(p)) {
            fleet.hold(&stored);
            continue;
        }
        let mut spec = stored.clone();
        let waiting = fleet.place(&mut spec);
        if spec == stored {
            continue;
        }
        let moved = release::change(&stored, &spec) == Change::Generation;
        if in_progress && !moved {
            fleet.hold(&stored);
            continue;
        }
        let spec_hash = canonical::hash(&spec);
        out.push(Replaced {
            branch,
            moved,
            desired: Desired {
                spec,
                spec_hash,
                waiting,
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NodeState, Placement};
    use crate::placement::tests::{fleet, name, node, nodes_of, spec};
    use crate::placement::{Fleet, Liveness};

    const ACTIVE: NodeState = NodeState::Active;

    /// `e` placed on a fleet of `a` and `b`, both ready: what runs.
    fn running_on_a_and_b(replicas: u32) -> DeploymentSpec {
        let mut s = spec("e", Placement::Spread, &[("w", "worker", 1000, replicas)]);
        let mut f = fleet(&[
            ("a", node("main", 1000, Liveness::Ready, ACTIVE)),
            ("b", node("main", 1000, Liveness::Ready, ACTIVE)),
        ]);
        f.place(&mut s);
        s
    }

    fn live(nodes: &[(&str, crate::placement::FleetNode)], running: &[DeploymentSpec]) -> Fleet {
        Fleet::new(nodes.iter().map(|(n, f)| (name(n), f.clone())).collect(), running)
    }

    fn one(spec: DeploymentSpec, in_progress: bool) -> Vec<Running> {
        vec![Running {
            branch: "main".into(),
            in_progress,
            spec,
        }]
    }

    #[test]
    fn a_replica_on_a_lost_node_moves_at_a_new_generation_even_mid_rollout() {
        let stored = running_on_a_and_b(2);
        assert_eq!(nodes_of(&stored), ["w/0@a", "w/1@b"]);
        let nodes = [
            ("a", node("main", 4000, Liveness::Ready, ACTIVE)),
            ("b", node("main", 4000, Liveness::Lost, ACTIVE)),
        ];
        for in_progress in [false, true] {
            let mut f = live(&nodes, std::slice::from_ref(&stored));
            let out = replace(&mut f, one(stored.clone(), in_progress));
            assert_eq!(out.len(), 1, "in progress: {in_progress}");
            assert!(out[0].moved);
            assert_eq!(nodes_of(&out[0].desired.spec), ["w/0@a", "w/1@a"]);
            assert_eq!(out[0].desired.spec_hash, canonical::hash(&out[0].desired.spec));
            assert_eq!(f.reserved(&name("a")).0, 2000, "the fleet holds the move");
        }
    }

    #[test]
    fn a_waiting_replica_that_now_fits_is_added_once_the_rollout_is_done() {
        // Placed when only `a` had room for one: replica 1 waits.
        let mut stored = spec("e", Placement::Spread, &[("w", "worker", 1000, 2)]);
        let waiting = live(&[("a", node("main", 1000, Liveness::Ready, ACTIVE))], &[]).place(&mut stored);
        assert_eq!(waiting.len(), 1);
        let nodes = [
            ("a", node("main", 1000, Liveness::Ready, ACTIVE)),
            ("b", node("main", 1000, Liveness::Ready, ACTIVE)),
        ];
        let mut f = live(&nodes, std::slice::from_ref(&stored));
        let out = replace(&mut f, one(stored.clone(), false));
        assert_eq!(out.len(), 1);
        assert!(!out[0].moved, "a scale, not a release");
        assert_eq!(nodes_of(&out[0].desired.spec), ["w/0@a", "w/1@b"]);
        assert!(out[0].desired.waiting.is_empty());
        // Mid-rollout: the new room waits for the rollout, and the fleet keeps what runs.
        let mut f = live(&nodes, std::slice::from_ref(&stored));
        assert!(replace(&mut f, one(stored, true)).is_empty());
        assert_eq!(f.reserved(&name("b")).0, 0);
    }

    #[test]
    fn nothing_usable_or_nothing_changed_keeps_what_runs() {
        let stored = running_on_a_and_b(2);
        let up = [
            ("a", node("main", 1000, Liveness::Ready, ACTIVE)),
            ("b", node("main", 1000, Liveness::Ready, ACTIVE)),
        ];
        let mut f = live(&up, std::slice::from_ref(&stored));
        assert!(replace(&mut f, one(stored.clone(), false)).is_empty());
        // Every node of the pool lost: nowhere to go, so it stays (and keeps its reservations).
        let gone = [
            ("a", node("main", 1000, Liveness::Lost, ACTIVE)),
            ("b", node("main", 1000, Liveness::Lost, ACTIVE)),
        ];
        let mut f = live(&gone, std::slice::from_ref(&stored));
        assert!(replace(&mut f, one(stored.clone(), false)).is_empty());
        assert_eq!(f.reserved(&name("a")).0, 1000);
        // A spec from before placement knew pools is never moved.
        let mut old = stored;
        old.pool = None;
        let mut f = live(
            &[("a", node("main", 4000, Liveness::Ready, ACTIVE))],
            std::slice::from_ref(&old),
        );
        assert!(replace(&mut f, one(old, false)).is_empty());
    }
}
