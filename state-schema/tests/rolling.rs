//! A rolling rollout's steps, walked replica by replica: whatever `maxSurge` and
//! `maxUnavailable` say, no more replicas run than the role's count plus the surge, no fewer
//! serve than its count less what may be unavailable, no route ever points at a replica that
//! is stopped or not started, and every old replica is stopped by the end.

#[path = "support/spec.rs"]
mod spec_support;

use state_schema::deployment::DeploymentSpec;
use state_schema::rolling::{rolled_upstreams, rolling_of};
use state_schema::rollout::{rollback_steps, rollout_steps};
use state_schema::task::Task;
use std::collections::{BTreeMap, BTreeSet};

fn tree(release: &str, replicas: u32, rollout: &str) -> String {
    // A release is its image digest.
    let image = format!("{:0>64}", release.trim_start_matches('v'));
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata: {{name: t}}\nspec: {{baseDomain: example.com}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {{name: main}}\nspec:\n  region: eu\n  nodes:\n    - {{name: n1, capacity: {{cpu: \"8\", memory: 16Gi}}}}\n    - {{name: n2, capacity: {{cpu: \"8\", memory: 16Gi}}}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@sha256:{image}\n  roles:\n    web: {{kind: web, port: 8080, replicas: {replicas}, rollout: {rollout}}}\n    jobs: {{kind: worker, replicas: 1}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {{name: api-production}}\nspec: {{project: api, stage: production, pool: main}}\n"
    )
}

fn spec(text: &str) -> DeploymentSpec {
    spec_support::first_spec(text)
}

/// Walks the steps of rolling `old` to `new` (web replicas); returns the most replicas running
/// at once and the fewest routed. Each node's routes are its own (its ingress), and no node
/// that routed something is ever left with nothing.
fn walk(old: &DeploymentSpec, new: &DeploymentSpec) -> (usize, usize) {
    let retired = std::slice::from_ref(old);
    let steps = rollout_steps(new, 2, retired);
    let web = |role: &str| role == "web";
    let count = old.instances.iter().filter(|i| web(i.role.as_str())).count();
    let mut old_up: BTreeSet<u32> = old
        .instances
        .iter()
        .filter(|i| web(i.role.as_str()))
        .map(|i| i.index)
        .collect();
    let mut new_up: BTreeSet<u32> = BTreeSet::new();
    // What each node's routes hold: (older, index).
    let mut routes: BTreeMap<String, BTreeSet<(bool, u32)>> = BTreeMap::new();
    for i in old.instances.iter().filter(|i| web(i.role.as_str())) {
        routes.entry(i.node.to_string()).or_default().insert((true, i.index));
    }
    let routed = |r: &BTreeMap<String, BTreeSet<(bool, u32)>>| r.values().map(BTreeSet::len).sum::<usize>();
    let (mut most, mut fewest) = (old_up.len(), routed(&routes));
    for step in &steps {
        for (task, node) in step {
            match task {
                Task::EnsureApplication { role, instance, .. } if web(role.as_str()) => {
                    new_up.insert(*instance);
                }
                Task::PublishIngress { rolled, .. } => {
                    let now: BTreeSet<(bool, u32)> = match rolled {
                        Some(r) => rolled_upstreams(new, retired, node.as_str(), *r)
                            .into_iter()
                            .map(|u| (u.older, u.instance))
                            .collect(),
                        None => new
                            .instances
                            .iter()
                            .filter(|i| web(i.role.as_str()) && &i.node == node)
                            .map(|i| (false, i.index))
                            .collect(),
                    };
                    assert!(!now.is_empty(), "a publish on {node} with nothing to route to");
                    routes.insert(node.to_string(), now);
                }
                _ => {}
            }
        }
        for (task, _) in step {
            if let Task::StopApplication { role, instance, .. } = task
                && web(role.as_str())
            {
                assert!(
                    routes.values().all(|r| !r.contains(&(true, *instance))),
                    "old {instance} stops while routed"
                );
                old_up.remove(instance);
            }
        }
        for (node, r) in &routes {
            assert!(!r.is_empty(), "{node} routes nowhere");
            for (older, i) in r {
                let up = if *older { &old_up } else { &new_up };
                assert!(
                    up.contains(i),
                    "a route to {} replica {i}, which does not run",
                    if *older { "old" } else { "new" }
                );
            }
        }
        most = most.max(old_up.len() + new_up.len());
        fewest = fewest.min(routed(&routes));
    }
    assert!(old_up.is_empty(), "old replicas left running: {old_up:?}");
    let all: BTreeSet<(bool, u32)> = routes.values().flatten().copied().collect();
    let want: BTreeSet<(bool, u32)> = (0..u32::try_from(count).expect("few")).map(|i| (false, i)).collect();
    assert_eq!(all, want, "every request to the new release");
    (most, fewest)
}

#[test]
fn batches_keep_within_the_surge_and_the_unavailable_and_never_route_to_a_stopped_replica() {
    // (rollout, surge, unavailable, batch size, batches); the last: batches of 3 and 1.
    for (rollout, surge, down, size, batches) in [
        ("{strategy: rolling}", 1, 0, 1, 4),
        ("{strategy: rolling, maxSurge: 2}", 2, 0, 2, 2),
        ("{strategy: rolling, maxSurge: 0, maxUnavailable: 1}", 0, 1, 1, 4),
        ("{strategy: rolling, maxSurge: 1, maxUnavailable: 1}", 1, 1, 2, 2),
        (
            "{strategy: rolling, maxSurge: '25%', maxUnavailable: '50%'}",
            1,
            2,
            3,
            2,
        ),
    ] {
        let old = spec(&tree("v1", 4, rollout));
        let new = spec(&tree("v2", 4, rollout));
        assert_eq!(
            rolling_of(&new, std::slice::from_ref(&old)).get("web").map(|b| b.0),
            Some(size),
            "{rollout}"
        );
        let (most, fewest) = walk(&old, &new);
        assert_eq!(most, 4 + surge, "{rollout}: at most the count plus the surge run");
        assert_eq!(
            fewest,
            4 - down,
            "{rollout}: at least the count less the unavailable serve"
        );
        let publishes: BTreeSet<String> = rollout_steps(&new, 2, std::slice::from_ref(&old))
            .iter()
            .flatten()
            .filter(|(t, _)| matches!(t, Task::PublishIngress { .. }))
            .map(|(t, _)| t.idempotency_key())
            .collect();
        let rolled = publishes.iter().filter(|k| k.contains(":publish/b")).count();
        // Each batch but the last joins the routes by its own publish, and each that stops
        // replicas first takes them out of the routes first.
        let out = if down > 0 { batches } else { 0 };
        assert_eq!(
            u32::try_from(rolled).expect("few"),
            batches - 1 + out,
            "{rollout}: {publishes:?}"
        );
    }
}

#[test]
fn a_node_s_last_routed_replica_is_never_taken_down_first() {
    // Two replicas, one on each node: `maxUnavailable: 1` would leave a node's ingress with
    // nothing to route to, so each is replaced surge-first (its new one joins, then it stops).
    let rollout = "{strategy: rolling, maxSurge: 0, maxUnavailable: 1}";
    let (old, new) = (spec(&tree("v1", 2, rollout)), spec(&tree("v2", 2, rollout)));
    assert_eq!(
        walk(&old, &new),
        (3, 2),
        "one extra replica at a time, every node routed throughout"
    );
    let steps = rollout_steps(&new, 2, std::slice::from_ref(&old));
    assert!(
        steps
            .iter()
            .flatten()
            .all(|(t, _)| !t.idempotency_key().contains("-out")),
        "nothing leaves the routes first"
    );
}

#[test]
fn a_replica_that_moves_nodes_switches() {
    let rollout = "{strategy: rolling}";
    let old = spec(&tree("v1", 4, rollout));
    let moved =
        spec(&tree("v2", 4, rollout).replace("- {name: n1, capacity", "- {name: n1, state: draining, capacity"));
    assert!(moved.instances.iter().all(|i| i.node.as_str() == "n2"));
    assert!(rolling_of(&moved, std::slice::from_ref(&old)).is_empty());
}

#[test]
fn a_first_release_a_switch_and_a_rollback_do_not_roll() {
    let rolling = "{strategy: rolling}";
    let first = spec(&tree("v1", 4, rolling));
    assert!(rolling_of(&first, &[]).is_empty(), "nothing to replace");
    let steps = rollout_steps(&first, 1, &[]);
    assert!(
        steps[2]
            .iter()
            .filter(|(t, _)| matches!(t, Task::EnsureApplication { .. }))
            .count()
            == 5
    );
    let old = spec(&tree("v1", 4, "{strategy: switch}"));
    let new = spec(&tree("v2", 4, "{strategy: switch}"));
    assert!(rolling_of(&new, std::slice::from_ref(&old)).is_empty());
    let back = rollback_steps(&spec(&tree("v1", 4, rolling)), 3, &[spec(&tree("v2", 4, rolling))]);
    assert!(
        back.iter()
            .flatten()
            .all(|(t, _)| !matches!(t, Task::PublishIngress { rolled: Some(_), .. })),
        "a rollback brings the previous release back at once"
    );
}

#[test]
fn a_worker_rolls_without_routes_and_other_roles_start_first() {
    let with = |image: &str| {
        tree(image, 2, "{strategy: switch}").replace(
            "jobs: {kind: worker, replicas: 1}",
            "jobs: {kind: worker, replicas: 3, rollout: {strategy: rolling}}",
        )
    };
    let (old, new) = (spec(&with("v1")), spec(&with("v2")));
    let steps = rollout_steps(&new, 2, std::slice::from_ref(&old));
    let ensures = |s: &Vec<(Task, _)>| -> Vec<String> {
        s.iter()
            .filter_map(|(t, _)| match t {
                Task::EnsureApplication { role, instance, .. } => Some(format!("{role}/{instance}")),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        ensures(&steps[2]),
        ["web/0", "web/1"],
        "the switching role starts whole"
    );
    let batches: Vec<Vec<String>> = steps[3..].iter().map(ensures).filter(|e| !e.is_empty()).collect();
    assert_eq!(batches, [["jobs/0"], ["jobs/1"], ["jobs/2"]]);
    assert!(
        steps
            .iter()
            .flatten()
            .all(|(t, _)| !matches!(t, Task::PublishIngress { rolled: Some(_), .. })),
        "a worker has no routes to move"
    );
    // Each old worker stops beside the next one's start, the last after the switch.
    let stops: Vec<usize> = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            s.iter()
                .any(|(t, _)| matches!(t, Task::StopApplication { role, .. } if role.as_str() == "jobs"))
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(stops.len(), 3, "{stops:?}");
}
