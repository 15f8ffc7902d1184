//! Re-placement: what the fleet as it is now asks of the deployments that run. Pure: the
//! reconciler reads the live fleet and the running deployments from its ledger and writes what
//! [`replace`] returns; `pl plan --fleet` calls the same function over the fleet a control
//! plane reports, so a plan shows the moves the daemon would make.
//!
//! The policy:
//! - A deployment whose pool has no usable node (none active in Git and not lost), or from
//!   before placement knew pools, keeps what it runs: there is nowhere to move it.
//! - A replica that must leave its node (lost, draining, retired, out of the pool, no room)
//!   moves: at the current generation when its rollout is done (a scale, `release::change`:
//!   the replicas that stay keep their containers), else at a new generation (which replaces
//!   the unfinished rollout, whose steps may wait on the node that is gone).
//! - A waiting replica that now fits is added at the current generation, a scale, but only
//!   once the deployment's rollout is done: an unfinished rollout moves only to leave a node
//!   it cannot stay on.

use crate::canonical;
use crate::deployment::DeploymentSpec;
use crate::desired::Desired;
use crate::model::NodePool;
use crate::placement::{Fleet, FleetNode, Liveness, Pin};
use crate::release::{self, Change};
use crate::state::State;
use crate::values::Name;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What the control plane has seen of a node: its last heartbeat and what its agent can run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeenNode {
    pub last_seen_ms: Option<i64>,
    pub capabilities: BTreeSet<String>,
}

/// The live fleet as a control plane sees it at one moment: what re-placement decides on,
/// and what `pl plan --fleet` fetches (`GET /v1/fleet`) to decide the same way.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub at_ms: i64,
    /// Silence after which a node is lost (the control plane's setting).
    pub lost_after_ms: i64,
    /// Every enrolled node, by name.
    pub nodes: BTreeMap<String, SeenNode>,
    /// Every running deployment, in environment order.
    pub running: Vec<Running>,
    /// Where roles with volumes have their data (absent from an older control plane's).
    #[serde(default)]
    pub pins: Vec<Pin>,
    /// Environments a rollback holds away from Git (absent from an older control plane's).
    #[serde(default)]
    pub held: Vec<Held>,
}

/// One page of a snapshot (`GET /v1/fleet?limit=N`): the first carries the nodes, the pins
/// and the holds with its share of the running deployments, the others only theirs, all of
/// the same moment (`atMs`); `next` names the next page of the same snapshot, absent on the
/// last. `Snapshot::running` of every page, in order, is the snapshot's.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotPage {
    pub snapshot: Snapshot,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// An environment a rollback holds at an older release: it differs from what Git says until a
/// commit changes it or an operator releases it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    pub environment: String,
    /// The rollback's generation.
    pub generation: u64,
    /// The generation whose release it runs again.
    pub to: u64,
    /// Who asked (an operator token's name, or `watch` for a release's failed watch).
    pub by: String,
}

/// The fleet `pools`' nodes form with what was seen of them at `now_ms`, holding what
/// `running` deployments reserve: what the reconciler places on, and `pl plan --fleet` too.
pub fn live_fleet(
    pools: &[(Name, NodePool)],
    seen: &BTreeMap<String, SeenNode>,
    running: &[DeploymentSpec],
    now_ms: i64,
    lost_after_ms: i64,
) -> Fleet {
    let mut nodes = BTreeMap::new();
    for (pool, p) in pools {
        for n in &p.nodes {
            let s = seen.get(n.name.as_str());
            let liveness = s.map_or(Liveness::Unseen, |s| {
                Liveness::of(s.last_seen_ms, now_ms, lost_after_ms)
            });
            let capabilities = Some(s.map(|s| s.capabilities.clone()).unwrap_or_default());
            nodes.insert(n.name.clone(), FleetNode::of(pool, n, liveness, capabilities));
        }
    }
    Fleet::new(nodes, running)
}

/// What the ledger holds of the fleet: what heartbeats said of each node, what runs, the
/// volumes' pins, and after how long a silent node is lost.
#[derive(Clone, Debug, Default)]
pub struct FleetRows {
    pub seen: BTreeMap<String, SeenNode>,
    pub running: Vec<DeploymentSpec>,
    pub pins: Vec<crate::placement::Pin>,
    pub lost_after_ms: i64,
}

/// The live fleet of `pools` from what the ledger holds (`rows`) at `now_ms`, with its
/// volumes' pins: what the daemon places on and judges a volume move against.
pub fn fleet_of(pools: &[(Name, NodePool)], rows: &FleetRows, now_ms: i64) -> Fleet {
    let mut fleet = live_fleet(pools, &rows.seen, &rows.running, now_ms, rows.lost_after_ms);
    fleet.pin(rows.pins.iter().cloned());
    fleet
}

/// A deployment that runs now, as the ledger holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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
    /// `true`: a replica leaves a node; `false`: waiting replicas are added.
    pub moved: bool,
    /// It takes a new generation: the rollout is unfinished, or the change is one a scale
    /// cannot express (`release::change`); otherwise a scale at the current generation.
    pub new_generation: bool,
    pub desired: Desired,
}

/// One replica whose node re-placement changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    pub environment: Name,
    pub role: Name,
    pub index: u32,
    /// Where it runs now; `None`: it waits for a node.
    pub from: Option<Name>,
    /// Where it goes; `None`: it waits (with `reason`).
    pub to: Option<Name>,
    /// A new generation of the environment (its rollout is unfinished), rather than a scale.
    pub new_generation: bool,
    /// Why it waits, when it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What re-placing `snapshot`'s running deployments on `state`'s node pools (with what the
/// snapshot saw of each node) would move: the daemon's decision ([`replace`] over
/// [`live_fleet`]) on a state that is not applied yet.
pub fn preview(snapshot: &Snapshot, state: &State) -> Vec<Move> {
    let pools: Vec<(Name, NodePool)> = state.pools().map(|(n, p)| (n.clone(), p.clone())).collect();
    let before: BTreeMap<&Name, &DeploymentSpec> = snapshot
        .running
        .iter()
        .map(|r| (&r.spec.environment, &r.spec))
        .collect();
    let mut out = Vec::new();
    for r in replace_snapshot(snapshot.clone(), &pools) {
        let new = &r.desired.spec;
        let Some(old) = before.get(&new.environment) else {
            continue;
        };
        let node_of = |s: &DeploymentSpec, role: &Name, index: u32| {
            s.instances
                .iter()
                .find(|i| &i.role == role && i.index == index)
                .map(|i| i.node.clone())
        };
        for (role, count) in &new.replicas {
            for index in 0..*count {
                let (from, to) = (node_of(old, role, index), node_of(new, role, index));
                if from == to {
                    continue;
                }
                let reason = r
                    .desired
                    .waiting
                    .iter()
                    .find(|w| &w.role == role && w.index == index)
                    .map(|w| w.reason.clone());
                out.push(Move {
                    environment: new.environment.clone(),
                    role: role.clone(),
                    index,
                    from,
                    to,
                    new_generation: r.new_generation,
                    reason,
                });
            }
        }
    }
    out
}

/// Re-places everything `snapshot` runs on `pools`' nodes as the snapshot saw them: the
/// decision the reconciler makes each time its fleet changes, and [`preview`]'s.
/// With a live fleet (`pl plan --fleet`): the replicas of `environments` that the daemon would
/// leave waiting if it applied `head` now, by its own placement: the head's pools over what
/// agents reported, holding what runs and the volumes' pins (`Ledger::fleet_view`), then
/// `desired::deployments`. Counted per role and reason.
pub fn unplaced_on(
    snapshot: &Snapshot,
    head: &crate::state::State,
    environments: &std::collections::BTreeSet<Name>,
) -> Vec<crate::placement::Unplaced> {
    let pools: Vec<(Name, NodePool)> = head.pools().map(|(n, p)| (n.clone(), p.clone())).collect();
    let running: Vec<DeploymentSpec> = snapshot.running.iter().map(|r| r.spec.clone()).collect();
    let mut fleet = live_fleet(
        &pools,
        &snapshot.nodes,
        &running,
        snapshot.at_ms,
        snapshot.lost_after_ms,
    );
    fleet.pin(snapshot.pins.iter().cloned());
    let (wanted, _) = crate::desired::deployments(head, None, &mut fleet);
    let mut out = Vec::new();
    for d in wanted.iter().filter(|d| environments.contains(&d.spec.environment)) {
        let mut by: BTreeMap<(&Name, &str), u32> = BTreeMap::new();
        for w in &d.waiting {
            *by.entry((&w.role, w.reason.as_str())).or_default() += 1;
        }
        out.extend(
            by.into_iter()
                .map(|((role, reason), waiting)| crate::placement::Unplaced {
                    environment: d.spec.environment.clone(),
                    role: role.clone(),
                    waiting,
                    reason: reason.to_owned(),
                }),
        );
    }
    out.sort();
    out
}

pub fn replace_snapshot(snapshot: Snapshot, pools: &[(Name, NodePool)]) -> Vec<Replaced> {
    let mut fleet = live_fleet(pools, &snapshot.nodes, &[], snapshot.at_ms, snapshot.lost_after_ms);
    fleet.pin(snapshot.pins.iter().cloned());
    for r in &snapshot.running {
        fleet.hold(&r.spec);
    }
    replace(&mut fleet, snapshot.running)
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
        let moved = stored
            .instances
            .iter()
            .any(|o| spec.instances.iter().any(|n| n.same_slot(o) && n.node != o.node));
        let generation = release::change(&stored, &spec) == Change::Generation;
        if in_progress && !moved && !generation {
            fleet.hold(&stored);
            continue;
        }
        let new_generation = in_progress || generation;
        let spec_hash = canonical::hash(&spec);
        out.push(Replaced {
            branch,
            moved,
            new_generation,
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
    fn a_replica_on_a_lost_node_moves_as_a_scale_or_mid_rollout_at_a_new_generation() {
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
            assert_eq!(out[0].new_generation, in_progress, "a scale once the rollout is done");
            assert_eq!(nodes_of(&out[0].desired.spec), ["w/0@a", "w/1@a"]);
            let moves: Vec<u32> = out[0].desired.spec.instances.iter().map(|i| i.moves).collect();
            assert_eq!(moves, [0, 1], "w/1 moved once; w/0 stays as it was");
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

    /// A tree whose pool `main` has nodes n1 and n2, and a 3-replica web environment.
    fn tree() -> State {
        let text = "apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata: {name: t}\nspec: {baseDomain: example.com}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n    - {name: n1, capacity: {cpu: \"2\", memory: 4Gi}}\n    - {name: n2, capacity: {cpu: \"2\", memory: 4Gi}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {name: api}\nspec:\n  image: registry.example.invalid/api@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n  roles:\n    web: {kind: web, port: 8080, health: {path: /healthz}, replicas: 3}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: api-production}\nspec: {project: api, stage: production, pool: main}\n";
        let (root, rest) = text.split_once("---\n").expect("two parts");
        let files = vec![
            crate::parse::parse_file("pushleft.yaml", root.as_bytes()),
            crate::parse::parse_file("state.yaml", rest.as_bytes()),
        ];
        let loaded = crate::state::assemble(files, Vec::new());
        assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
        loaded.state
    }

    #[test]
    fn a_plan_on_a_live_fleet_shows_the_moves_the_daemon_would_make() {
        let state = tree();
        let ready = |caps: &[&str]| SeenNode {
            last_seen_ms: Some(1_000_000),
            capabilities: caps.iter().map(|c| (*c).to_owned()).collect(),
        };
        // Placed while both nodes were up: replicas spread over n1 and n2.
        let (placed, _) = crate::desired::deployments(&state, None, &mut Fleet::declared(&state));
        let spec = placed[0].spec.clone();
        assert_eq!(nodes_of(&spec), ["web/0@n1", "web/1@n2", "web/2@n1"]);
        let mut snapshot = Snapshot {
            pins: Vec::new(),
            held: Vec::new(),
            at_ms: 1_000_000,
            lost_after_ms: 300_000,
            nodes: BTreeMap::from([
                ("n1".to_owned(), ready(&["docker", "ingress"])),
                ("n2".to_owned(), ready(&["docker", "ingress"])),
            ]),
            running: vec![Running {
                branch: "main".into(),
                in_progress: false,
                spec,
            }],
        };
        assert!(
            preview(&snapshot, &state).is_empty(),
            "nothing to move on a healthy fleet"
        );
        // n2 silent past the lost threshold: its replica moves to n1, a scale at the current
        // generation (its rollout is done); the replicas on n1 stay as they are.
        snapshot.nodes.get_mut("n2").expect("n2").last_seen_ms = Some(1_000_000 - 300_001);
        let moves = preview(&snapshot, &state);
        assert_eq!(
            moves,
            [Move {
                environment: name("api-production"),
                role: name("web"),
                index: 1,
                from: Some(name("n2")),
                to: Some(name("n1")),
                new_generation: false,
                reason: None,
            }]
        );
        // Mid-rollout, the same move takes a new generation (the unfinished one waits on n2).
        snapshot.running[0].in_progress = true;
        assert!(preview(&snapshot, &state).iter().all(|m| m.new_generation));
        snapshot.running[0].in_progress = false;
        // The daemon's own call on the same inputs decides the same placement.
        let pools: Vec<_> = state.pools().map(|(n, p)| (n.clone(), p.clone())).collect();
        let daemon = replace_snapshot(snapshot.clone(), &pools);
        assert_eq!(nodes_of(&daemon[0].desired.spec), ["web/0@n1", "web/1@n1", "web/2@n1"]);
        // The snapshot crosses the wire as JSON and reads back whole.
        let wire = serde_json::to_string(&snapshot).expect("json");
        let back: Snapshot = serde_json::from_str(&wire).expect("read back");
        assert_eq!(preview(&back, &state), moves);
    }
}
