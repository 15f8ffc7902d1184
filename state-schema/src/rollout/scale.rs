//! A scale's steps: the jobs that change where an environment's replicas and routes run at
//! the same generation (a scale, a drain, a lost node), and the held removals a scale puts
//! back. Pure, like the rest of `rollout`.

use super::{Step, infra_tasks, instance_hash};
use crate::deployment::DeploymentSpec;
use crate::task::Task;
use crate::values::{Hostname, Name};

/// The jobs of a scale at `generation` to `spec` (see [`crate::release::change`]), in the
/// order they run: infrastructure on nodes the environment gains, new replicas, ingress on every
/// node whose web replicas changed (or that gains them); then ingress on nodes it leaves, the
/// replicas removed, and the networks of nodes left.
///
/// Two lists: what runs now, and what runs once all of that succeeded. A scale that both adds
/// and removes replicas (a move: a drain, a lost node) removes only after the replicas that
/// replace them run and are published, on whatever node: a node's jobs run in order, but
/// nothing orders two nodes' jobs, and the removal of the only replica must not come first.
/// A scale that only adds, or only removes, has nothing to wait for (each node publishes
/// before it removes, in its own order).
pub fn scale_tasks(spec: &DeploymentSpec, generation: u64, change: &crate::release::Change) -> (Step, Step) {
    let crate::release::Change::Scale {
        added,
        removed,
        nodes_added,
        ingress_added,
        hostnames_added,
        certificates_changed,
        ..
    } = change
    else {
        return (Vec::new(), Vec::new());
    };
    let env = &spec.environment;
    let mut out: Step = Vec::new();
    let waits = !added.is_empty() && !removed.is_empty();
    for node in nodes_added {
        out.extend(infra_tasks(env, generation, node));
    }
    for i in added {
        let task = Task::EnsureApplication {
            environment: env.clone(),
            role: i.role.clone(),
            instance: i.index,
            generation,
            spec_hash: instance_hash(spec, &i.role, i.index, &i.node),
            repair: 0,
        };
        out.push((task, i.node.clone()));
    }
    // Nodes that keep serving but whose web replicas change are published again (a scale's
    // publish is a job of its own): after the new replicas, so they get traffic, and before the
    // removed ones go, so no request reaches a replica that is gone.
    let is_web = |role: &Name| spec.roles.get(role).is_some_and(|r| r.is_web());
    let mut publish_on: Vec<Name> = added
        .iter()
        .chain(removed)
        .filter(|i| is_web(&i.role) && spec.ingress_nodes.contains(&i.node))
        .map(|i| i.node.clone())
        .chain(ingress_added.iter().cloned())
        .collect();
    publish_on.sort();
    publish_on.dedup();
    // A node that only loses replicas publishes with the removals when the scale waits.
    let gains = |n: &Name| added.iter().any(|i| &i.node == n) || ingress_added.contains(n);
    let (publish_now, publish_after): (Vec<Name>, Vec<Name>) =
        publish_on.iter().cloned().partition(|n| !waits || gains(n));
    ingress_tasks(generation, env, &publish_now, &spec.hostnames, false, &mut out);
    // A hostname gained is published on the other serving nodes too, and so is one whose
    // brought certificate changed (the publish hands the node the new pair: in place, no
    // restart); one lost is taken out wherever it was served.
    let others: Vec<Name> = spec
        .ingress_nodes
        .iter()
        .filter(|n| !publish_on.contains(n))
        .cloned()
        .collect();
    let certificates = certificates_changed.iter().filter(|h| !hostnames_added.contains(h));
    let hosts: Vec<Hostname> = hostnames_added.iter().chain(certificates).cloned().collect();
    ingress_tasks(generation, env, &others, &hosts, false, &mut out);
    let mut after: Step = Vec::new();
    let later = match waits {
        true => &mut after,
        false => &mut out,
    };
    ingress_tasks(generation, env, &publish_after, &spec.hostnames, false, later);
    removals(spec, generation, change, later);
    (out, after)
}

/// The removals an earlier scale at `generation` may hold that this scale puts back: the
/// teardown of a replica placed again on the node it was leaving, the network and routes of a
/// node that takes the environment again. Released after this scale's jobs ran, they would
/// remove what it made; the caller cancels them.
pub fn held_conflicts(spec: &DeploymentSpec, generation: u64, change: &crate::release::Change) -> Step {
    let crate::release::Change::Scale {
        added,
        nodes_added,
        ingress_added,
        ..
    } = change
    else {
        return Vec::new();
    };
    let env = &spec.environment;
    let mut out: Step = added
        .iter()
        .map(|i| {
            let task = Task::TeardownApplication {
                environment: env.clone(),
                role: i.role.clone(),
                instance: i.index,
                generation,
            };
            (task, i.node.clone())
        })
        .collect();
    for node in nodes_added {
        let task = Task::RemoveNetwork {
            environment: env.clone(),
            generation,
        };
        out.push((task, node.clone()));
    }
    for node in ingress_added {
        for hostname in &spec.hostnames {
            let task = Task::RemoveIngress {
                environment: env.clone(),
                hostname: hostname.clone(),
                generation,
            };
            out.push((task, node.clone()));
        }
    }
    out
}

/// A publish (or, `remove`, a removal) of each of `hosts` on each of `nodes`.
fn ingress_tasks(generation: u64, env: &Name, nodes: &[Name], hosts: &[Hostname], remove: bool, out: &mut Step) {
    for node in nodes {
        for host in hosts {
            let (environment, hostname) = (env.clone(), host.clone());
            let task = if remove {
                Task::RemoveIngress {
                    environment,
                    hostname,
                    generation,
                }
            } else {
                Task::PublishIngress {
                    environment,
                    hostname,
                    generation,
                    repair: 0,
                    weight: None,
                    rolled: None,
                    wait: None,
                }
            };
            out.push((task, node.clone()));
        }
    }
}

/// What a scale removes: routes on nodes it leaves and of hostnames it lost, the replicas
/// removed, the networks of nodes left.
fn removals(spec: &DeploymentSpec, generation: u64, change: &crate::release::Change, later: &mut Step) {
    let crate::release::Change::Scale {
        removed,
        nodes_removed,
        ingress_removed,
        hostnames_removed,
        ..
    } = change
    else {
        return;
    };
    let env = &spec.environment;
    ingress_tasks(generation, env, ingress_removed, &spec.hostnames, true, later);
    let serving: Vec<Name> = spec.ingress_nodes.iter().chain(ingress_removed).cloned().collect();
    ingress_tasks(generation, env, &serving, hostnames_removed, true, later);
    for i in removed {
        let task = Task::TeardownApplication {
            environment: env.clone(),
            role: i.role.clone(),
            instance: i.index,
            generation,
        };
        later.push((task, i.node.clone()));
    }
    for node in nodes_removed {
        let task = Task::RemoveNetwork {
            environment: env.clone(),
            generation,
        };
        later.push((task, node.clone()));
    }
}
