//! The steps of a rollout, a scale and a teardown: the ordered tasks each generation's change
//! becomes, per node. Pure: the daemon writes them as jobs and `pl plan` shows them.

pub mod advance;
mod scale;

pub use scale::{held_conflicts, scale_tasks};

use crate::canonical;
use crate::deployment::DeploymentSpec;
use crate::model::{CanaryGate, CanaryStep};
use crate::task::{Rolled, Task, Wait};
use crate::values::Name;
use std::collections::BTreeSet;

/// One job of a step: a task for a node.
pub type Step = Vec<(Task, Name)>;

/// The ordered steps that roll generation `generation` of `spec` out. `retired` are the specs
/// of older generations still running somewhere: the last step stops their replicas and
/// removes the routes and networks the new generation no longer uses. Each step starts only
/// when every job of the one before succeeded.
pub fn rollout_steps(spec: &DeploymentSpec, generation: u64, retired: &[DeploymentSpec]) -> Vec<Step> {
    let (steps, gate) = canary_of(spec, retired);
    // A canary shares the hostnames' requests by weight; rolling batches share them by
    // replica. The environment's canary, when a web role declares one, is its rollout.
    let rolling = if steps.is_empty() {
        crate::rolling::rolling_of(spec, retired)
    } else {
        Default::default()
    };
    steps_with(spec, generation, retired, &steps, gate, &rolling)
}

/// The canary a new generation of `spec` goes through before its switch: the steps of its
/// first web role (by name) that declares them. None when nothing serves the hostnames yet
/// (an environment's first release, or one that had no web replica): there is no old release
/// to share the requests with, so it is published whole.
pub fn canary_of(spec: &DeploymentSpec, retired: &[DeploymentSpec]) -> (Vec<CanaryStep>, Option<CanaryGate>) {
    if spec.hostnames.is_empty() || spec.ingress_nodes.is_empty() {
        return (Vec::new(), None);
    }
    let served_before = retired.iter().any(|r| {
        !r.hostnames.is_empty()
            && r.instances
                .iter()
                .any(|i| r.roles.get(&i.role).is_some_and(|x| x.is_web()))
    });
    if !served_before {
        return (Vec::new(), None);
    }
    spec.roles
        .iter()
        .filter(|(name, r)| r.is_web() && spec.instances.iter().any(|i| &i.role == *name))
        .find(|(_, r)| !r.canary.is_empty())
        .map(|(_, r)| (r.canary.clone(), r.canary_gate))
        .unwrap_or_default()
}

fn steps_with(
    spec: &DeploymentSpec,
    generation: u64,
    retired: &[DeploymentSpec],
    canary: &[CanaryStep],
    gate: Option<CanaryGate>,
    rolling: &crate::rolling::Batches,
) -> Vec<Step> {
    let env = &spec.environment;
    let mut steps: Vec<Step> = Vec::new();
    steps.push(
        spec.nodes
            .iter()
            .flat_map(|node| infra_tasks(env, generation, node))
            .collect(),
    );
    steps.push(
        spec.release
            .iter()
            .map(|(role, node)| {
                let task = Task::RunOnce {
                    environment: env.clone(),
                    role: role.clone(),
                    generation,
                };
                (task, node.clone())
            })
            .collect(),
    );
    steps.push(
        spec.instances
            .iter()
            .filter(|i| !rolling.contains_key(&i.role))
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
            })
            .collect(),
    );
    // A canary: one step per weight, each waiting out the pause of the one before; the switch
    // (every request to the new release) waits out the last one's. With gates, a step of
    // measures comes between each share's pause and the next share: the control plane judges
    // what every ingress measured of the share (`advance::verdict`) before it goes on.
    // What the next share (or the switch) waits for, and the share before it, to be measured.
    let (mut wait, mut before): (Option<Wait>, Option<u8>) = (None, None);
    let gated = |steps: &mut Vec<Step>, wait: Option<Wait>, before: Option<u8>| -> Option<Wait> {
        match (gate, before) {
            (Some(g), Some(w)) => {
                steps.push(measure(spec, generation, w, wait, g));
                None
            }
            _ => wait,
        }
    };
    for c in canary {
        let w = gated(&mut steps, wait, before);
        steps.push(publish(spec, generation, Some(c.weight), w, None));
        wait = Some(c.pause_seconds.map_or(Wait::Promote, Wait::Seconds));
        before = Some(c.weight);
    }
    // Rolling batches: each its replicas' steps, the routes moving to them between batches.
    let stopped = crate::rolling::batch_steps(spec, generation, retired, rolling, &mut steps, |r| {
        publish(spec, generation, None, None, Some(r))
    });
    let w = gated(&mut steps, wait, before);
    steps.push(publish(spec, generation, None, w, None));
    steps.push(cleanup(spec, generation, retired, &stopped));
    fill_spec_hash(&mut steps, spec);
    steps
}

/// A publish of every hostname on every ingress node: a canary's share (`weight`), a rolling
/// batch's routes (`rolled`) or the switch, waiting for `wait` first.
fn publish(
    spec: &DeploymentSpec,
    generation: u64,
    weight: Option<u8>,
    wait: Option<Wait>,
    rolled: Option<Rolled>,
) -> Step {
    let mut step = Vec::new();
    for node in &spec.ingress_nodes {
        for host in &spec.hostnames {
            let task = Task::PublishIngress {
                environment: spec.environment.clone(),
                hostname: host.clone(),
                generation,
                repair: 0,
                weight,
                wait,
                rolled,
            };
            step.push((task, node.clone()));
        }
    }
    step
}

/// A canary share's measures on every ingress node, for its gates.
fn measure(spec: &DeploymentSpec, generation: u64, weight: u8, wait: Option<Wait>, gate: CanaryGate) -> Step {
    let mut step = Vec::new();
    for node in &spec.ingress_nodes {
        for host in &spec.hostnames {
            let task = Task::MeasureCanary {
                environment: spec.environment.clone(),
                hostname: host.clone(),
                generation,
                weight,
                wait,
                gate,
            };
            step.push((task, node.clone()));
        }
    }
    step
}

/// What the retired generations leave to remove once the switch is done: on each node the
/// hostname's route first (requests stop going to the old replicas, and those in flight get
/// the ingress's drain time), then the replicas (except those rolling batches `stopped`),
/// then the network.
fn cleanup(
    spec: &DeploymentSpec,
    generation: u64,
    retired: &[DeploymentSpec],
    stopped: &BTreeSet<(Name, u32, Name)>,
) -> Step {
    let env = &spec.environment;
    let mut cleanup: Step = Vec::new();
    for old in retired {
        for i in &old.instances {
            // A replica that stays on its node keeps its stopped container (the agent removes
            // those two generations back); one that moved to another node leaves nothing behind.
            let still_placed = spec
                .instances
                .iter()
                .any(|n| n.role == i.role && n.index == i.index && n.node == i.node);
            let task = if still_placed {
                if stopped.contains(&(i.role.clone(), i.index, i.node.clone())) {
                    continue;
                }
                Task::StopApplication {
                    environment: env.clone(),
                    role: i.role.clone(),
                    instance: i.index,
                    generation,
                }
            } else {
                Task::TeardownApplication {
                    environment: env.clone(),
                    role: i.role.clone(),
                    instance: i.index,
                    generation,
                }
            };
            cleanup.push((task, i.node.clone()));
        }
        for node in &old.ingress_nodes {
            for host in &old.hostnames {
                if !(spec.ingress_nodes.contains(node) && spec.hostnames.contains(host)) {
                    let task = Task::RemoveIngress {
                        environment: env.clone(),
                        hostname: host.clone(),
                        generation,
                    };
                    cleanup.push((task, node.clone()));
                }
            }
        }
        for node in &old.nodes {
            if !spec.nodes.contains(node) {
                let task = Task::RemoveNetwork {
                    environment: env.clone(),
                    generation,
                };
                cleanup.push((task, node.clone()));
            }
        }
    }
    let phase = |t: &Task| match t {
        Task::RemoveIngress { .. } => 0,
        Task::RemoveNetwork { .. } => 2,
        _ => 1,
    };
    cleanup.sort_by(|a, b| (phase(&a.0), a.0.idempotency_key(), &a.1).cmp(&(phase(&b.0), b.0.idempotency_key(), &b.1)));
    cleanup.dedup();
    cleanup
}

/// The steps of a rollback's generation: a rollout of the previous release's spec without its
/// release step. The release (migrations, say) ran when that release first rolled out; running
/// the older release's command again over data a newer release already changed is what a
/// rollback must not do (Kamal's rollback runs no hooks either). The previous generation's
/// image is still on each node, kept by its stopped containers, so nothing is pulled.
pub fn rollback_steps(spec: &DeploymentSpec, generation: u64, retired: &[DeploymentSpec]) -> Vec<Step> {
    // No canary or batches either: the previous release served until moments ago.
    let mut steps = steps_with(spec, generation, retired, &[], None, &Default::default());
    if let Some(release) = steps.get_mut(1) {
        release.clear();
    }
    steps
}

/// An environment's infrastructure on one node (its network, firewall table and routes): one
/// task, which the agent runs in that order.
pub(super) fn infra_tasks(env: &Name, generation: u64, node: &Name) -> [(Task, Name); 1] {
    [(
        Task::EnsureEnvironment {
            environment: env.clone(),
            generation,
        },
        node.clone(),
    )]
}

/// `step` as its nodes' agents can run it: on a node `older` names (its agent predates
/// `ensure-environment`), each environment's set-up is queued as the three tasks that agent
/// knows (network, firewall, routes), so a control plane upgraded before its agents, as the
/// upgrade order asks, still releases to them. Everything else is left as it is.
pub fn for_agents(step: Step, older: impl Fn(&Name) -> bool) -> Step {
    let mut out = Vec::with_capacity(step.len() + 2);
    for (task, node) in step {
        match task {
            Task::EnsureEnvironment {
                environment,
                generation,
            } if older(&node) => out.extend(
                [
                    Task::EnsureNetwork {
                        environment: environment.clone(),
                        generation,
                    },
                    Task::ApplyFirewall {
                        environment: environment.clone(),
                        generation,
                    },
                    Task::EnsureRoutes {
                        environment,
                        generation,
                    },
                ]
                .map(|t| (t, node.clone())),
            ),
            task => out.push((task, node)),
        }
    }
    out
}

/// Whether `step` sets up an environment on some node (what [`for_agents`] may split).
pub fn sets_up(step: &Step) -> bool {
    step.iter().any(|(t, _)| matches!(t, Task::EnsureEnvironment { .. }))
}

/// After repair `repair` of a replica on `node` succeeded: the environment's routes on that
/// node are published again (the new container may have another address), one job each, when
/// the node serves ingress for `spec` at `generation`.
pub fn republish_after_repair(spec: &DeploymentSpec, generation: u64, repair: u32, node: &str) -> Step {
    if !spec.ingress_nodes.iter().any(|n| n.as_str() == node) {
        return Vec::new();
    }
    let Ok(node) = Name::new(node) else {
        return Vec::new();
    };
    spec.hostnames
        .iter()
        .map(|hostname| {
            let task = Task::PublishIngress {
                environment: spec.environment.clone(),
                hostname: hostname.clone(),
                generation,
                repair,
                weight: None,
                rolled: None,
                wait: None,
            };
            (task, node.clone())
        })
        .collect()
}

/// The index of the publish step in [`rollout_steps`]: a rollout at this step or past it has
/// its replicas up and its routes published (or being published).
pub const PUBLISH_STEP: usize = 3;

/// Where the `repair` numbers of certificate re-publishes start: far above any drift repair's
/// (at most 20 per replica and generation), so the two never share a job key.
pub const CERTIFICATE_REPUBLISH: u32 = 1 << 20;

/// Where the `repair` number of a Domain's re-publish starts, when it is first proven: above
/// every certificate re-publish's.
pub const DOMAIN_REPUBLISH: u32 = 1 << 21;

/// A hostname's certificate was issued (or renewed) for the `issued`-th time: every node that
/// serves it publishes its routes again at `generation`, which hands them the new certificate.
pub fn republish_certificate(spec: &DeploymentSpec, generation: u64, hostname: &str, issued: u32) -> Step {
    republish(spec, generation, hostname, CERTIFICATE_REPUBLISH.saturating_add(issued))
}

/// A Domain was proven for the first time: every node that serves its environment publishes
/// it at `generation` (its publishes so far held it back).
pub fn republish_domain(spec: &DeploymentSpec, generation: u64, hostname: &str) -> Step {
    republish(spec, generation, hostname, DOMAIN_REPUBLISH)
}

fn republish(spec: &DeploymentSpec, generation: u64, hostname: &str, repair: u32) -> Step {
    spec.hostnames
        .iter()
        .filter(|h| h.as_str() == hostname)
        .flat_map(|h| {
            spec.ingress_nodes.iter().map(move |node| {
                let task = Task::PublishIngress {
                    environment: spec.environment.clone(),
                    hostname: h.clone(),
                    generation,
                    repair,
                    weight: None,
                    rolled: None,
                    wait: None,
                };
                (task, node.clone())
            })
        })
        .collect()
}

/// The spec hash of one replica: its release and where it runs, not how many others there
/// are, so a scale leaves the running replicas' hashes (and containers) alone.
pub fn instance_hash(spec: &DeploymentSpec, role: &Name, instance: u32, node: &Name) -> String {
    canonical::hash(&(&spec.environment, role, instance, node, &spec.release_hash))
}

/// `EnsureApplication` carries the replica's own spec hash, so an agent can tell a container
/// that already matches from one that needs replacing.
fn fill_spec_hash(steps: &mut [Step], spec: &DeploymentSpec) {
    for step in steps {
        for (task, node) in step.iter_mut() {
            if let Task::EnsureApplication {
                role,
                instance,
                spec_hash,
                ..
            } = task
            {
                *spec_hash = instance_hash(spec, role, *instance, node);
            }
        }
    }
}

/// The ordered steps that tear generation `generation` down: routes first (traffic leaves),
/// then containers, then the network with its firewall table and routes. `running` are the
/// specs of every generation that may still have something on a node.
pub fn teardown_steps(environment: &Name, generation: u64, running: &[DeploymentSpec]) -> Vec<Step> {
    let mut ingress = Vec::new();
    let mut apps = Vec::new();
    let mut nets = Vec::new();
    for spec in running {
        for node in &spec.ingress_nodes {
            for host in &spec.hostnames {
                let task = Task::RemoveIngress {
                    environment: environment.clone(),
                    hostname: host.clone(),
                    generation,
                };
                ingress.push((task, node.clone()));
            }
        }
        for i in &spec.instances {
            let task = Task::TeardownApplication {
                environment: environment.clone(),
                role: i.role.clone(),
                instance: i.index,
                generation,
            };
            apps.push((task, i.node.clone()));
        }
        for node in &spec.nodes {
            let task = Task::RemoveNetwork {
                environment: environment.clone(),
                generation,
            };
            nets.push((task, node.clone()));
        }
    }
    let mut steps = vec![ingress, apps, nets];
    for s in &mut steps {
        s.sort_by(|a, b| (a.0.idempotency_key(), &a.1).cmp(&(b.0.idempotency_key(), &b.1)));
        s.dedup();
    }
    steps
}
