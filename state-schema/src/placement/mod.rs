//! Capacity-aware placement: which node runs each replica. Pure: the caller says what the
//! fleet looks like (what Git declares, what the control plane has seen of each node, where
//! replicas run now) and gets placements back; `pl plan` and the reconciler call the same
//! function, so a plan never promises a placement the daemon makes otherwise.
//!
//! The rules (issue: the fleet):
//! - A replica stays where it runs while that node is in the environment's pool, active in Git,
//!   not lost, and still has room for it: placement is sticky, so a scale or another
//!   environment's change never moves it.
//! - A new replica (or one that must move) goes only to an *eligible* node: active in Git, seen
//!   within 60 s, in the pool, reporting the capabilities the role needs (`docker`; `ingress`
//!   for a web role), with room for the role's CPU and memory.
//! - `spread` puts replicas of one role on different nodes before doubling up; `pack` fills
//!   nodes in name order.
//! - Reserved CPU and memory are those of every placed replica; a node never holds more than its
//!   declared capacity. A replica that fits nowhere waits, with the reason.

pub mod heartbeats;
mod place;
pub mod subnets;

use crate::deployment::{DeploymentSpec, Instance};
use crate::model::{NodeState, Placement, PoolNode};
use crate::state::State;
use crate::values::Name;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// Silence after which a node takes no new replicas.
pub const ELIGIBLE_WITHIN_MS: i64 = 60_000;
/// Silence after which a node is unhealthy: it keeps its replicas, gets nothing new.
pub const UNHEALTHY_AFTER_MS: i64 = 90_000;
/// Silence after which a node is lost by default: its replicas are placed elsewhere.
pub const LOST_AFTER_MS: i64 = 300_000;

/// What the control plane has seen of a node, by silence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Liveness {
    /// Seen within 60 s: takes new replicas.
    Ready,
    /// Silent 60 to 90 s: keeps what it runs, takes nothing new yet.
    Quiet,
    /// Silent more than 90 s: keeps what it runs, takes nothing new.
    Unhealthy,
    /// Silent past the lost threshold: what it ran is placed elsewhere.
    Lost,
    /// Never enrolled or never heard from.
    Unseen,
}

impl Liveness {
    /// From the last heartbeat's time (`None`: never), with the lost threshold.
    pub fn of(last_seen_ms: Option<i64>, now_ms: i64, lost_after_ms: i64) -> Liveness {
        match last_seen_ms {
            None => Liveness::Unseen,
            Some(t) if now_ms - t > lost_after_ms => Liveness::Lost,
            Some(t) if now_ms - t > UNHEALTHY_AFTER_MS => Liveness::Unhealthy,
            Some(t) if now_ms - t > ELIGIBLE_WITHIN_MS => Liveness::Quiet,
            Some(_) => Liveness::Ready,
        }
    }
}

/// One node as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetNode {
    pub pool: Name,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub git: NodeState,
    pub liveness: Liveness,
    /// What the agent reported it can run; `None`: anything (the plan's view of a fleet).
    pub capabilities: Option<BTreeSet<String>>,
}

impl FleetNode {
    /// Node `n` of `pool` as Git declares it (capacity and state), with what was seen of it.
    pub fn of(pool: &Name, n: &PoolNode, liveness: Liveness, capabilities: Option<BTreeSet<String>>) -> FleetNode {
        FleetNode {
            pool: pool.clone(),
            cpu_millis: n.capacity.cpu.millis(),
            memory_bytes: n.capacity.memory.bytes(),
            git: n.state,
            liveness,
            capabilities,
        }
    }

    fn takes_new(&self, needs: &[&str]) -> bool {
        self.git == NodeState::Active
            && self.liveness == Liveness::Ready
            && self
                .capabilities
                .as_ref()
                .is_none_or(|c| needs.iter().all(|n| c.contains(*n)))
    }

    fn keeps(&self) -> bool {
        self.git == NodeState::Active
            && matches!(self.liveness, Liveness::Ready | Liveness::Quiet | Liveness::Unhealthy)
    }
}

/// A replica that could not be placed, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub role: Name,
    pub index: u32,
    /// `no-eligible-node` or `no-capacity`.
    pub reason: String,
}

/// Replicas of a role a change asks for that no node has room for, counted by reason: they
/// would wait (`pl up` and `pl wait` do not call that done). `pl plan`'s consequence.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Unplaced {
    pub environment: Name,
    pub role: Name,
    pub waiting: u32,
    /// `no-capacity` or `no-eligible-node`.
    pub reason: String,
}

/// The fleet as one placement run sees it: nodes, what is reserved on each, and where each
/// environment's replicas run now. Placing environments one after another in one `Fleet`
/// keeps every node within its capacity across all of them.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    nodes: BTreeMap<Name, FleetNode>,
    used: HashMap<Name, (u64, u64)>,
    current: HashMap<Name, Vec<(Instance, u64, u64)>>,
    /// Where each environment's roles with volumes have their data: `(environment, role)`.
    pins: HashMap<(Name, Name), Name>,
    /// Volumes past their first generation (restored): `(environment, volume)`.
    generations: HashMap<(Name, Name), u64>,
    /// Pinned roles whose volume is being moved and not restored yet: `(environment, role)`.
    moving: HashSet<(Name, Name)>,
}

/// Where a role's volumes live: its one instance runs on `node`, and nowhere else.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Pin {
    pub environment: Name,
    pub role: Name,
    pub node: Name,
    /// Its volumes past their first generation (each restore makes one more), by name: the
    /// role mounts those.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<(Name, u64)>,
    /// Its volume is being moved (`pl volume move`) and not restored on the new node yet: the
    /// role runs nowhere meanwhile (its data is on its way), so no generation starts it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub moving: bool,
}

/// Why a role whose volume is being moved does not run until the move restored it.
pub const VOLUME_MOVING: &str = "volume-moving";

/// Why a role pinned by its volumes does not run where its data is.
pub const VOLUME_PINNED: &str = "volume-pinned";

/// Why a volume cannot move to a node: it takes no new replicas (draining, retired, silent,
/// unknown, or not able to run the role).
pub const NOT_ELIGIBLE: &str = "node-not-eligible";

impl Fleet {
    /// From nodes and the deployments that run now (their replicas hold reservations).
    pub fn new(nodes: BTreeMap<Name, FleetNode>, running: &[DeploymentSpec]) -> Fleet {
        let mut fleet = Fleet {
            nodes,
            ..Fleet::default()
        };
        for spec in running {
            fleet.hold(spec);
        }
        fleet
    }

    /// The fleet as Git alone declares it: every active node ready, empty, able to run
    /// anything. What `pl plan` places against.
    pub fn declared(state: &State) -> Fleet {
        let mut nodes = BTreeMap::new();
        for (pool, p) in state.pools() {
            for n in &p.nodes {
                nodes.insert(n.name.clone(), FleetNode::of(pool, n, Liveness::Ready, None));
            }
        }
        Fleet::new(nodes, &[])
    }

    /// Pins roles to the nodes that hold their volumes (the control plane's volume rows).
    pub fn pin(&mut self, pins: impl IntoIterator<Item = Pin>) {
        for p in pins {
            for (volume, generation) in p.generations {
                self.generations.insert((p.environment.clone(), volume), generation);
            }
            if p.moving {
                self.moving.insert((p.environment.clone(), p.role.clone()));
            }
            self.pins.insert((p.environment, p.role), p.node);
        }
    }

    /// The node `environment`'s `role` is pinned to by its volumes, if any.
    pub fn pinned(&self, environment: &Name, role: &Name) -> Option<&Name> {
        self.pins.get(&(environment.clone(), role.clone()))
    }

    /// Pinned instances that stay on a node draining in Git: the drain cannot finish until
    /// the user moves their volumes (`pl volume move`).
    pub fn pinned_to_draining(&self) -> Vec<Pin> {
        let mut out: Vec<Pin> = self
            .pins
            .iter()
            .filter(|(_, node)| self.nodes.get(*node).is_some_and(|n| n.git == NodeState::Draining))
            .map(|((environment, role), node)| Pin {
                environment: environment.clone(),
                role: role.clone(),
                node: node.clone(),
                generations: Vec::new(),
                moving: false,
            })
            .collect();
        out.sort();
        out
    }

    /// Whether `node` was heard from lately (ready or quiet): its agent takes jobs.
    pub fn answers(&self, node: &Name) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|n| matches!(n.liveness, Liveness::Ready | Liveness::Quiet))
    }

    /// Whether `spec`'s `role` would run on `to` once its volumes were there (`pl volume move`
    /// asks before it stops anything): `to` must take new replicas (active in Git, heard from
    /// lately, able to run the role) and placement, with the role pinned to `to`, must put it
    /// there (the pool, room beside everything else reserved). `Err` is why not, a stable
    /// code: `node-not-eligible`, `no-capacity`, or the placement's own reason. `self` (the
    /// live fleet, holding what runs) is left as it was.
    pub fn move_lands(&self, spec: &DeploymentSpec, role: &Name, to: &Name) -> Result<(), String> {
        let Some(node) = self.nodes.get(to) else {
            return Err(NOT_ELIGIBLE.into());
        };
        if node.git != NodeState::Active || node.liveness != Liveness::Ready {
            return Err(NOT_ELIGIBLE.into());
        }
        let mut fleet = self.clone();
        fleet.pins.insert((spec.environment.clone(), role.clone()), to.clone());
        fleet.moving.remove(&(spec.environment.clone(), role.clone()));
        let mut moved = spec.clone();
        let waiting = fleet.place(&mut moved);
        if let Some(w) = waiting.iter().find(|w| &w.role == role) {
            return Err(w.reason.clone());
        }
        let on_to = moved.instances.iter().any(|i| &i.role == role && &i.node == to)
            || moved
                .release
                .iter()
                .chain(&moved.cron)
                .any(|(r, n)| r == role && n == to);
        let needs: &[&str] = if spec.roles.get(role).is_some_and(|r| r.is_web()) {
            &["docker", "ingress"]
        } else {
            &["docker"]
        };
        if !on_to || !node.takes_new(needs) {
            return Err(NOT_ELIGIBLE.into());
        }
        // A pinned role is placed where its data is whatever the room there (it has nowhere
        // else to go), so room is asked here, before anything moves: everything now reserved
        // on `to`, the moved role included, within its capacity.
        let (cpu, mem) = fleet.reserved(to);
        if cpu > node.cpu_millis || mem > node.memory_bytes {
            return Err("no-capacity".into());
        }
        Ok(())
    }

    /// Records `spec`'s replicas as running and reserved (replacing what the environment held).
    pub fn hold(&mut self, spec: &DeploymentSpec) {
        self.release(&spec.environment);
        let held: Vec<(Instance, u64, u64)> = spec
            .instances
            .iter()
            .map(|i| {
                let (cpu, mem) = spec
                    .roles
                    .get(&i.role)
                    .map_or((0, 0), |r| (r.cpu_millis, r.memory_bytes));
                (i.clone(), cpu, mem)
            })
            .collect();
        for (i, cpu, mem) in &held {
            let u = self.used.entry(i.node.clone()).or_default();
            u.0 += cpu;
            u.1 += mem;
        }
        self.current.insert(spec.environment.clone(), held);
    }

    /// Drops an environment's reservations (a teardown).
    pub fn release(&mut self, environment: &Name) {
        if let Some(held) = self.current.remove(environment) {
            for (i, cpu, mem) in held {
                if let Some(u) = self.used.get_mut(&i.node) {
                    u.0 = u.0.saturating_sub(cpu);
                    u.1 = u.1.saturating_sub(mem);
                }
            }
        }
    }

    /// CPU (millis) and memory (bytes) reserved on `node`.
    pub fn reserved(&self, node: &Name) -> (u64, u64) {
        self.used.get(node).copied().unwrap_or_default()
    }

    fn fits(&self, node: &Name, n: &FleetNode, cpu: u64, mem: u64) -> bool {
        let (c, m) = self.reserved(node);
        c + cpu <= n.cpu_millis && m + mem <= n.memory_bytes
    }

    /// Nodes of `pool` that could take a replica needing `needs` if it had room: what a
    /// replica that fits nowhere is told.
    fn any_eligible(&self, pool: &Name, needs: &[&str]) -> bool {
        self.nodes.values().any(|n| &n.pool == pool && n.takes_new(needs))
    }

    /// Whether `environment` has replicas running (held) in this fleet.
    pub fn is_running(&self, environment: &Name) -> bool {
        self.current.get(environment).is_some_and(|h| !h.is_empty())
    }

    /// Whether some node of `pool` is active in Git and not lost: an environment with none
    /// cannot be placed at all, and keeps what it runs.
    pub fn has_usable(&self, pool: &Name) -> bool {
        self.nodes.values().any(|n| &n.pool == pool && n.keeps())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::runspec::RoleSpec;

    pub(crate) fn name(s: &str) -> Name {
        Name::new(s).expect("name")
    }

    pub(crate) fn node(pool: &str, cpu: u64, liveness: Liveness, git: NodeState) -> FleetNode {
        FleetNode {
            pool: name(pool),
            cpu_millis: cpu,
            memory_bytes: 8 << 30,
            git,
            liveness,
            capabilities: Some(["docker", "ingress"].iter().map(|s| s.to_string()).collect()),
        }
    }

    pub(crate) fn fleet(nodes: &[(&str, FleetNode)]) -> Fleet {
        Fleet::new(nodes.iter().map(|(n, f)| (name(n), f.clone())).collect(), &[])
    }

    pub(crate) fn role(kind: &str, cpu: u64) -> RoleSpec {
        RoleSpec {
            image_signatures: Vec::new(),
            kind: kind.into(),
            image: "img@sha256:00".into(),
            command: Vec::new(),
            env: Default::default(),
            cpu_millis: cpu,
            memory_bytes: 1 << 20,
            pids: 64,
            port: None,
            health: None,
            schedule: None,
            secrets: Default::default(),
            logs: None,
            ports: Vec::new(),
            volumes: Vec::new(),
            watch_seconds: None,
            canary: Vec::new(),
            canary_gate: None,
            rolling: None,
        }
    }

    pub(crate) fn spec(env: &str, placement: Placement, roles: &[(&str, &str, u64, u32)]) -> DeploymentSpec {
        DeploymentSpec {
            environment: name(env),
            project: name("p"),
            instances: Vec::new(),
            release: Vec::new(),
            cron: Vec::new(),
            hostnames: Vec::new(),
            nodes: Vec::new(),
            ingress_nodes: Vec::new(),
            release_hash: "h".into(),
            pool: Some(name("main")),
            placement,
            replicas: roles.iter().map(|(r, _, _, n)| (name(r), *n)).collect(),
            roles: roles.iter().map(|(r, k, cpu, _)| (name(r), role(k, *cpu))).collect(),
            certificates: Vec::new(),
            domains: Vec::new(),
            backups: None,
        }
    }

    fn with_volume(s: &mut DeploymentSpec, role: &str) {
        let r = s.roles.get_mut(&name(role)).expect("role");
        r.volumes.push(crate::runspec::VolumeSpec {
            name: "data".into(),
            path: "/data".into(),
            size_bytes: None,
            retain_days: 7,
            generation: 1,
            backup: None,
        });
    }

    pub(crate) fn nodes_of(s: &DeploymentSpec) -> Vec<String> {
        s.instances
            .iter()
            .map(|i| format!("{}/{}@{}", i.role, i.index, i.node))
            .collect()
    }

    const UP: Liveness = Liveness::Ready;
    const ACTIVE: NodeState = NodeState::Active;

    #[test]
    fn spread_uses_every_node_before_doubling_up_and_pack_fills_in_name_order() {
        let nodes = [
            ("a", node("main", 4000, UP, ACTIVE)),
            ("b", node("main", 4000, UP, ACTIVE)),
            ("c", node("main", 4000, UP, ACTIVE)),
        ];
        let mut s = spec("e", Placement::Spread, &[("web", "web", 1000, 4)]);
        assert!(fleet(&nodes).place(&mut s).is_empty());
        assert_eq!(nodes_of(&s), ["web/0@a", "web/1@b", "web/2@c", "web/3@a"]);
        assert_eq!(s.ingress_nodes, [name("a"), name("b"), name("c")]);
        let mut p = spec("e", Placement::Pack, &[("web", "web", 1000, 5)]);
        assert!(fleet(&nodes).place(&mut p).is_empty());
        assert_eq!(
            nodes_of(&p),
            ["web/0@a", "web/1@a", "web/2@a", "web/3@a", "web/4@b"],
            "a is full at four"
        );
    }

    #[test]
    fn no_node_goes_over_capacity_and_what_does_not_fit_waits_with_its_reason() {
        let mut f = fleet(&[
            ("a", node("main", 2000, UP, ACTIVE)),
            ("b", node("main", 1000, UP, ACTIVE)),
        ]);
        let mut first = spec("e1", Placement::Spread, &[("w", "worker", 1000, 2)]);
        assert!(f.place(&mut first).is_empty());
        let mut second = spec("e2", Placement::Spread, &[("w", "worker", 1000, 2)]);
        let waiting = f.place(&mut second);
        assert_eq!(nodes_of(&second), ["w/0@a"]);
        assert_eq!(waiting.len(), 1);
        assert_eq!((waiting[0].index, waiting[0].reason.as_str()), (1, "no-capacity"));
        assert_eq!(f.reserved(&name("a")), (2000, 2 << 20));
        assert_eq!(f.reserved(&name("b")).0, 1000);
        // Tearing the first down frees its room: the waiting replica now fits.
        f.release(&name("e1"));
        assert!(f.place(&mut second).is_empty());
        assert_eq!(
            nodes_of(&second),
            ["w/0@a", "w/1@b"],
            "w/0 stays where it runs, w/1 spreads"
        );
        // No node that could ever take it: a different reason.
        let mut f = fleet(&[("a", node("main", 2000, Liveness::Unhealthy, ACTIVE))]);
        let mut s = spec("e", Placement::Spread, &[("w", "worker", 100, 1)]);
        assert_eq!(f.place(&mut s)[0].reason, "no-eligible-node");
    }

    #[test]
    fn replicas_stay_put_unless_their_node_is_lost_draining_or_retired() {
        let up = [
            ("a", node("main", 4000, UP, ACTIVE)),
            ("b", node("main", 4000, UP, ACTIVE)),
            ("c", node("main", 4000, UP, ACTIVE)),
        ];
        let mut s = spec("e", Placement::Spread, &[("w", "worker", 500, 2)]);
        fleet(&up).place(&mut s);
        assert_eq!(nodes_of(&s), ["w/0@a", "w/1@b"]);
        let again = |a: FleetNode| {
            let mut f = fleet(&[("a", a), up[1].clone(), up[2].clone()]);
            f.hold(&s);
            let mut next = s.clone();
            f.place(&mut next);
            nodes_of(&next)
        };
        assert_eq!(again(node("main", 4000, Liveness::Quiet, ACTIVE)), ["w/0@a", "w/1@b"]);
        assert_eq!(
            again(node("main", 4000, Liveness::Unhealthy, ACTIVE)),
            ["w/0@a", "w/1@b"],
            "an unhealthy node keeps its replicas"
        );
        assert_eq!(again(node("main", 4000, Liveness::Lost, ACTIVE)), ["w/0@c", "w/1@b"]);
        assert_eq!(again(node("main", 4000, UP, NodeState::Draining)), ["w/0@c", "w/1@b"]);
        assert_eq!(again(node("main", 4000, UP, NodeState::Retired)), ["w/0@c", "w/1@b"]);
        assert_eq!(
            again(node("other", 4000, UP, ACTIVE)),
            ["w/0@c", "w/1@b"],
            "left the pool"
        );
    }

    #[test]
    fn a_restored_volume_is_mounted_at_its_new_generation_and_moves_the_deployment_on() {
        let nodes = [("b", node("main", 4000, UP, ACTIVE))];
        let running = {
            let mut f = fleet(&nodes);
            let mut s = spec("e", Placement::Pack, &[("db", "service", 500, 1)]);
            with_volume(&mut s, "db");
            f.place(&mut s);
            s
        };
        let generation_of = |s: &DeploymentSpec| s.roles.get(&name("db")).expect("db").volumes[0].generation;
        assert_eq!(generation_of(&running), 1);
        let pin = |generations: Vec<(Name, u64)>| Pin {
            moving: false,
            environment: name("e"),
            role: name("db"),
            node: name("b"),
            generations,
        };
        let replaced = |p: Pin| {
            let mut f = fleet(&nodes);
            f.pin([p]);
            f.hold(&running);
            let run = crate::replacement::Running {
                branch: "main".into(),
                in_progress: false,
                spec: running.clone(),
            };
            crate::replacement::replace(&mut f, vec![run])
        };
        assert!(replaced(pin(Vec::new())).is_empty(), "nothing restored: nothing moves");
        let moved = replaced(pin(vec![(name("data"), 2)]));
        assert_eq!(moved.len(), 1);
        assert!(moved[0].new_generation, "a new generation of the deployment");
        assert!(!moved[0].moved, "it stays on its node");
        assert_eq!(generation_of(&moved[0].desired.spec), 2);
        assert_eq!(nodes_of(&moved[0].desired.spec), ["db/0@b"]);
    }

    #[test]
    fn a_role_pinned_by_its_volume_stays_with_its_data_or_waits_and_never_moves() {
        let up = [
            ("a", node("main", 4000, UP, ACTIVE)),
            ("b", node("main", 4000, UP, ACTIVE)),
        ];
        let pin = Pin {
            moving: false,
            environment: name("e"),
            role: name("db"),
            node: name("b"),
            generations: Vec::new(),
        };
        let place = |a: FleetNode, b: FleetNode| {
            let mut f = fleet(&[("a", a), ("b", b)]);
            f.pin([pin.clone()]);
            let mut s = spec(
                "e",
                Placement::Pack,
                &[("db", "service", 500, 1), ("w", "worker", 500, 1)],
            );
            with_volume(&mut s, "db");
            let waiting = f.place(&mut s);
            let reasons: Vec<String> = waiting
                .iter()
                .map(|w| format!("{}/{}:{}", w.role, w.index, w.reason))
                .collect();
            (nodes_of(&s), reasons, f.pinned_to_draining())
        };
        // Pack would put it on `a`; its data is on `b`.
        let (placed, waits, draining) = place(up[0].1.clone(), up[1].1.clone());
        assert_eq!(placed, ["db/0@b", "w/0@a"]);
        assert!(waits.is_empty() && draining.is_empty());
        // Draining: it stays (and the drain waits for a move); unhealthy: it stays.
        let (placed, _, draining) = place(up[0].1.clone(), node("main", 4000, UP, NodeState::Draining));
        assert_eq!(placed, ["db/0@b", "w/0@a"]);
        assert_eq!(draining, std::slice::from_ref(&pin));
        let (placed, _, _) = place(up[0].1.clone(), node("main", 4000, Liveness::Unhealthy, ACTIVE));
        assert_eq!(placed, ["db/0@b", "w/0@a"]);
        // Lost, retired or out of the pool: it waits with `volume-pinned`, never placed on `a`.
        for b in [
            node("main", 4000, Liveness::Lost, ACTIVE),
            node("main", 4000, UP, NodeState::Retired),
            node("other", 4000, UP, ACTIVE),
        ] {
            let (placed, waits, _) = place(up[0].1.clone(), b);
            assert_eq!(placed, ["w/0@a"]);
            assert_eq!(waits, ["db/0:volume-pinned"]);
        }
        // A second replica of a pinned role (one writer) is never placed.
        let mut f = fleet(&up);
        f.pin([pin.clone()]);
        let mut s = spec("e", Placement::Spread, &[("db", "service", 500, 2)]);
        with_volume(&mut s, "db");
        assert_eq!(f.place(&mut s).len(), 1);
        assert_eq!(nodes_of(&s), ["db/0@b"]);
    }

    #[test]
    fn a_move_lands_only_on_a_node_that_takes_the_role_with_room_for_it() {
        let pin = Pin {
            moving: false,
            environment: name("e"),
            role: name("db"),
            node: name("a"),
            generations: Vec::new(),
        };
        let mut s = spec("e", Placement::Pack, &[("db", "service", 1500, 1)]);
        with_volume(&mut s, "db");
        let fleet_of = |b: FleetNode, c: FleetNode, s: &mut DeploymentSpec| {
            let mut f = fleet(&[("a", node("main", 4000, UP, ACTIVE)), ("b", b), ("c", c)]);
            f.pin([pin.clone()]);
            f.place(s);
            f
        };
        let f = fleet_of(node("main", 4000, UP, ACTIVE), node("main", 1000, UP, ACTIVE), &mut s);
        assert_eq!(nodes_of(&s), ["db/0@a"]);
        assert_eq!(f.move_lands(&s, &name("db"), &name("b")), Ok(()));
        // Too small for it, unknown, draining, silent, or in another pool: refused.
        assert_eq!(f.move_lands(&s, &name("db"), &name("c")), Err("no-capacity".to_owned()));
        assert_eq!(
            f.move_lands(&s, &name("db"), &name("z")).map_err(|e| e == NOT_ELIGIBLE),
            Err(true)
        );
        for b in [
            node("main", 4000, UP, NodeState::Draining),
            node("main", 4000, Liveness::Unhealthy, ACTIVE),
        ] {
            let f = fleet_of(b, node("main", 1000, UP, ACTIVE), &mut s);
            assert_eq!(
                f.move_lands(&s, &name("db"), &name("b")).map_err(|e| e == NOT_ELIGIBLE),
                Err(true)
            );
        }
        let f = fleet_of(node("other", 4000, UP, ACTIVE), node("main", 1000, UP, ACTIVE), &mut s);
        assert!(f.move_lands(&s, &name("db"), &name("b")).is_err());
        // While the move is under way the role runs nowhere (its data is on its way), and a
        // move to elsewhere would still land.
        let mut mid = fleet(&[
            ("a", node("main", 4000, UP, ACTIVE)),
            ("b", node("main", 4000, UP, ACTIVE)),
        ]);
        mid.pin([Pin {
            moving: true,
            ..pin.clone()
        }]);
        let mut during = spec("e", Placement::Pack, &[("db", "service", 1500, 1)]);
        with_volume(&mut during, "db");
        let waits = mid.place(&mut during);
        assert!(nodes_of(&during).is_empty());
        assert_eq!((waits.len(), waits[0].reason.as_str()), (1, VOLUME_MOVING));
        assert_eq!(mid.move_lands(&during, &name("db"), &name("b")), Ok(()));
        // Asking changed nothing: the role still holds its place on `a`.
        assert_eq!(f.pinned(&name("e"), &name("db")), Some(&name("a")));
        assert_eq!(f.reserved(&name("a")).0, 1500);
    }

    #[test]
    fn a_web_role_needs_a_node_with_ingress() {
        let mut plain = node("main", 4000, UP, ACTIVE);
        plain.capabilities = Some(["docker".to_string()].into_iter().collect());
        let mut f = fleet(&[("a", plain), ("b", node("main", 4000, UP, ACTIVE))]);
        let mut s = spec("e", Placement::Pack, &[("web", "web", 100, 1), ("w", "worker", 100, 1)]);
        f.place(&mut s);
        assert_eq!(nodes_of(&s), ["w/0@a", "web/0@b"]);
    }
}
