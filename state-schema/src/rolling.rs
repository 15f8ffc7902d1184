//! A rolling rollout's batches (`rollout.strategy: rolling`): which replicas each batch
//! replaces, the steps that replace them, and which replicas, new and old, the routes hold
//! between batches. Pure: the daemon writes the steps as jobs, `pl plan` shows them, and the
//! control plane lists a rolled publish's upstreams from [`rolled_upstreams`].
//!
//! A batch of a role of N replicas is `maxSurge + maxUnavailable` of them (by index, at least
//! one): its first `maxUnavailable` old replicas leave the routes and stop, its new replicas
//! start and must be healthy, the routes take them in place of the batch's old ones, and the
//! rest of the batch's old replicas stop beside the next batch's first step. So at most N +
//! maxSurge replicas run and at least N - maxUnavailable serve, as Kubernetes' Deployments
//! promise, with one exception: an old replica that is the last its node routes to is never
//! taken down first (each node's ingress routes to its own replicas; it would have none), it
//! stops after its new one joined, as a surge. The last batch joins the routes with the
//! rollout's usual switch, and its old replicas stop in the usual cleanup after it. A role one
//! of whose replicas moves to another node switches instead of rolling.

use crate::deployment::DeploymentSpec;
use crate::task::{Rolled, Task};
use crate::values::Name;
use std::collections::{BTreeMap, BTreeSet};

/// One job of a step, as `rollout::Step` (kept here so the two modules do not import each
/// other: `rollout` calls in).
type Step = Vec<(Task, Name)>;

/// Each rolling role's batch: how many replicas it replaces at once, and how many of its old
/// ones stop before its new ones start.
pub type Batches = BTreeMap<Name, (u32, u32)>;

/// A replica a rolled publish routes to: its role, index, port, and whether it is the old
/// release's (the newest older generation's container the node runs for it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolledUpstream {
    pub role: Name,
    pub instance: u32,
    pub port: u16,
    pub older: bool,
}

/// The roles of `spec` that roll: `strategy: rolling`, with replicas in `spec` and in a
/// retired spec. A role with nothing to replace (its first release) starts whole.
pub fn rolling_of(spec: &DeploymentSpec, retired: &[DeploymentSpec]) -> Batches {
    spec.roles
        .iter()
        .filter_map(|(name, r)| {
            let rolling = r.rolling?;
            let n = replicas(spec, name);
            let replaces = retired.iter().any(|o| o.instances.iter().any(|i| &i.role == name));
            // A replica whose index moved to another node switches instead: its node's routes
            // could be left with neither its old nor its new replica between batches.
            let stays = retired.iter().all(|o| {
                o.instances.iter().filter(|i| &i.role == name).all(|old| {
                    spec.instances
                        .iter()
                        .find(|i| &i.role == name && i.index == old.index)
                        .is_none_or(|new| new.node == old.node)
                })
            });
            (n > 0 && replaces && stays).then(|| (name.clone(), rolling.batch(n)))
        })
        .collect()
}

fn replicas(spec: &DeploymentSpec, role: &Name) -> u32 {
    u32::try_from(spec.instances.iter().filter(|i| &i.role == role).count()).unwrap_or(u32::MAX)
}

/// How many batches each rolling role takes: (role, replicas a batch replaces, batches).
pub fn role_batches<'a>(spec: &'a DeploymentSpec, batches: &'a Batches) -> impl Iterator<Item = (&'a Name, u32, u32)> {
    batches
        .iter()
        .map(|(role, (size, _))| (role, *size, replicas(spec, role).div_ceil((*size).max(1))))
}

/// How many batches the rollout takes: the most any rolling role needs.
pub fn batch_count(spec: &DeploymentSpec, batches: &Batches) -> u32 {
    role_batches(spec, batches).map(|(_, _, n)| n).max().unwrap_or(0)
}

/// The old replicas of `role`: each (index, node) once, with its port in the newest retired
/// spec that runs it there.
fn old_replicas(retired: &[DeploymentSpec], role: &Name) -> BTreeMap<(u32, Name), Option<u16>> {
    let mut out = BTreeMap::new();
    for old in retired.iter().rev() {
        let port = old.roles.get(role).filter(|r| r.is_web()).and_then(|r| r.port);
        for i in old.instances.iter().filter(|i| &i.role == role) {
            out.entry((i.index, i.node.clone())).or_insert(port);
        }
    }
    out
}

/// Whether the rolling roles' batches move routes: a rolling web role in an environment with
/// hostnames served somewhere.
fn moves_routes(spec: &DeploymentSpec, batches: &Batches) -> bool {
    !spec.hostnames.is_empty()
        && !spec.ingress_nodes.is_empty()
        && batches.keys().any(|r| spec.roles.get(r).is_some_and(|x| x.is_web()))
}

/// Appends the batches' steps to `steps` (the rollout's first steps before them; its switch
/// and cleanup after), publishing rolled routes with `publish`. Returns the old replicas
/// (role, index, node) they stop, which the cleanup then leaves out.
pub fn batch_steps(
    spec: &DeploymentSpec,
    generation: u64,
    retired: &[DeploymentSpec],
    batches: &Batches,
    steps: &mut Vec<Step>,
    publish: impl Fn(Rolled) -> Step,
) -> BTreeSet<(Name, u32, Name)> {
    let env = &spec.environment;
    let count = batch_count(spec, batches);
    let routes = moves_routes(spec, batches);
    let stop = |role: &Name, instance: u32, node: &Name| {
        let task = Task::StopApplication {
            environment: env.clone(),
            role: role.clone(),
            instance,
            generation,
        };
        (task, node.clone())
    };
    let mut stopped = BTreeSet::new();
    // The rest of a batch's old replicas, stopped beside the next batch's first step.
    let mut carry: Step = Vec::new();
    for batch in 0..count {
        let last = batch + 1 == count;
        let (mut down, mut up, mut rest) = (Vec::new(), Vec::new(), Vec::new());
        let first = down_first(spec, retired, batches, batch);
        for (role, &(size, _)) in batches {
            let lo = batch.saturating_mul(size);
            let hi = lo.saturating_add(size);
            let n = replicas(spec, role);
            for (index, node) in old_replicas(retired, role).into_keys() {
                // Old replicas past the new count leave with the switch's cleanup.
                if index >= n || !(lo..hi).contains(&index) {
                    continue;
                }
                if first.contains(&(role.clone(), index, node.clone())) {
                    down.push(stop(role, index, &node));
                } else if !last {
                    rest.push(stop(role, index, &node));
                } else {
                    continue;
                }
                stopped.insert((role.clone(), index, node));
            }
            up.extend(
                spec.instances
                    .iter()
                    .filter(|i| &i.role == role && (lo..hi).contains(&i.index))
                    .map(|i| {
                        let task = Task::EnsureApplication {
                            environment: env.clone(),
                            role: i.role.clone(),
                            instance: i.index,
                            generation,
                            spec_hash: String::new(),
                            repair: 0,
                        };
                        (task, i.node.clone())
                    }),
            );
        }
        // A rolled publish goes to the nodes it leaves something to route to (a node whose
        // replicas have not started yet has no route to change).
        let serving = |rolled: Rolled| -> Step {
            let mut jobs = publish(rolled);
            jobs.retain(|(_, node)| !routes_on(spec, retired, batches, node.as_str(), rolled).is_empty());
            jobs
        };
        let mut head = std::mem::take(&mut carry);
        if !down.is_empty() {
            if routes {
                head.extend(serving(Rolled { batch, out: true }));
            }
            steps.push(std::mem::take(&mut head));
            steps.push(down);
        }
        head.extend(up);
        steps.push(head);
        if !last {
            if routes {
                steps.push(serving(Rolled { batch, out: false }));
            }
            carry = rest;
        }
    }
    stopped
}

/// The old replicas of batch `batch` that leave the routes and stop before its new ones start:
/// its first `maxUnavailable` by index, except on a node where that would leave the routes with
/// no replica at all (those stop after their new ones joined, as a surge).
fn down_first(
    spec: &DeploymentSpec,
    retired: &[DeploymentSpec],
    batches: &Batches,
    batch: u32,
) -> BTreeSet<(Name, u32, Name)> {
    let mut down = BTreeSet::new();
    for (role, &(size, first)) in batches {
        let lo = batch.saturating_mul(size);
        let n = replicas(spec, role);
        for (index, node) in old_replicas(retired, role).into_keys() {
            if index < n && index >= lo && index < lo.saturating_add(first) {
                down.insert((role.clone(), index, node));
            }
        }
    }
    if moves_routes(spec, batches) {
        let rolled = Rolled { batch, out: true };
        for node in &spec.ingress_nodes {
            let web_here = |(r, _, n): &(Name, u32, Name)| n == node && spec.roles.get(r).is_some_and(|x| x.is_web());
            if down.iter().any(web_here) && routes(spec, retired, batches, node.as_str(), rolled, &down).is_empty() {
                down.retain(|d| !web_here(d));
            }
        }
    }
    down
}

/// The replicas a publish on `node` at stage `rolled` routes to: every web role's new
/// replicas on the node that do not roll; of a rolling role, the new replicas of the batches
/// that joined and the old replicas of those that have not left.
pub fn rolled_upstreams(
    spec: &DeploymentSpec,
    retired: &[DeploymentSpec],
    node: &str,
    rolled: Rolled,
) -> Vec<RolledUpstream> {
    routes_on(spec, retired, &rolling_of(spec, retired), node, rolled)
}

fn routes_on(
    spec: &DeploymentSpec,
    retired: &[DeploymentSpec],
    batches: &Batches,
    node: &str,
    rolled: Rolled,
) -> Vec<RolledUpstream> {
    let down = match rolled.out {
        true => down_first(spec, retired, batches, rolled.batch),
        false => BTreeSet::new(),
    };
    routes(spec, retired, batches, node, rolled, &down)
}

/// [`rolled_upstreams`] with the batch's replicas that stop first (`down`, at an `out` stage).
fn routes(
    spec: &DeploymentSpec,
    retired: &[DeploymentSpec],
    batches: &Batches,
    node: &str,
    rolled: Rolled,
    down: &BTreeSet<(Name, u32, Name)>,
) -> Vec<RolledUpstream> {
    let mut out = Vec::new();
    for i in spec.instances.iter().filter(|i| i.node.as_str() == node) {
        let Some(port) = spec.roles.get(&i.role).filter(|r| r.is_web()).and_then(|r| r.port) else {
            continue;
        };
        let joined = match batches.get(&i.role) {
            None => true,
            Some((size, _)) => {
                let upto = if rolled.out { rolled.batch } else { rolled.batch + 1 };
                i.index < upto.saturating_mul(*size)
            }
        };
        if joined {
            out.push(RolledUpstream {
                role: i.role.clone(),
                instance: i.index,
                port,
                older: false,
            });
        }
    }
    for (role, (size, _)) in batches {
        let from = if rolled.out {
            rolled.batch.saturating_mul(*size)
        } else {
            (rolled.batch + 1).saturating_mul(*size)
        };
        for ((index, at), port) in old_replicas(retired, role) {
            if let Some(port) = port
                && at.as_str() == node
                && index >= from
                && !down.contains(&(role.clone(), index, at.clone()))
            {
                out.push(RolledUpstream {
                    role: role.clone(),
                    instance: index,
                    port,
                    older: true,
                });
            }
        }
    }
    out
}
