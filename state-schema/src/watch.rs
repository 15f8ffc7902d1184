//! A release's watch (`rollout.watchSeconds`): how long after its switch a generation's
//! replicas are watched, and whether what one node reported in a heartbeat fails it. Pure: the
//! ledger judges each heartbeat with it (`reconciler::store::watch`), and the pass rolls a
//! failed generation back.

use crate::deployment::DeploymentSpec;

/// One replica as a node's heartbeat reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen<'a> {
    pub environment: &'a str,
    pub role: &'a str,
    pub instance: u32,
    pub generation: u64,
    pub healthy: bool,
}

/// The watch window of a generation of `spec`, in seconds: the longest `watchSeconds` of a role
/// with replicas placed; `None` when none is watched.
pub fn window(spec: &DeploymentSpec) -> Option<u32> {
    spec.instances
        .iter()
        .filter_map(|i| spec.roles.get(&i.role)?.watch_seconds)
        .max()
}

/// Whether node `node`'s heartbeat at `at_ms` (`seen`) fails generation `generation` of `spec`,
/// switched at `from_ms`: a replica placed there, of a watched role whose window holds `at_ms`,
/// reported unhealthy or not at all. During a canary (`canary`, from its first share of
/// requests to its switch), every replica of the generation is watched, whatever its role's
/// `watchSeconds`. Says which replica and what was seen.
pub fn judge(
    spec: &DeploymentSpec,
    generation: u64,
    from_ms: i64,
    node: &str,
    at_ms: i64,
    seen: &[Seen<'_>],
    canary: bool,
) -> Option<String> {
    if at_ms < from_ms {
        return None;
    }
    let env = spec.environment.as_str();
    for i in spec.instances.iter().filter(|i| i.node.as_str() == node) {
        let watched = spec.roles.get(&i.role).and_then(|r| r.watch_seconds);
        let after = at_ms - from_ms;
        let window = match (canary, watched) {
            (true, _) => "during its canary".to_owned(),
            (false, Some(w)) if after <= i64::from(w) * 1000 => format!("watchSeconds {w}"),
            _ => continue,
        };
        let found = seen.iter().find(|s| {
            s.environment == env && s.role == i.role.as_str() && s.instance == i.index && s.generation == generation
        });
        let what = match found {
            Some(s) if s.healthy => continue,
            Some(_) => "not healthy",
            None => "gone",
        };
        return Some(format!(
            "{}/{} on {node}: {what} at generation {generation}, {:.1} s after the {} ({window})",
            i.role,
            i.index,
            after as f64 / 1000.0,
            if canary { "canary began" } else { "switch" }
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deployment::Instance;
    use crate::model::Placement;
    use crate::runspec::RoleSpec;
    use crate::values::{Name, SmallMap};

    fn n(s: &str) -> Name {
        Name::new(s).expect("name")
    }

    fn role(watch: Option<u32>) -> RoleSpec {
        RoleSpec {
            image_signatures: Vec::new(),
            canary: Vec::new(),
            canary_gate: None,
            rolling: None,
            kind: "web".into(),
            image: String::new(),
            command: Vec::new(),
            env: Default::default(),
            cpu_millis: 0,
            memory_bytes: 0,
            pids: 0,
            port: Some(8080),
            health: None,
            schedule: None,
            secrets: Default::default(),
            logs: None,
            ports: Vec::new(),
            volumes: Vec::new(),
            watch_seconds: watch,
        }
    }

    fn spec() -> DeploymentSpec {
        let instance = |r: &str, i: u32, node: &str| Instance::new(n(r), i, n(node));
        DeploymentSpec {
            environment: n("e"),
            project: n("p"),
            instances: vec![
                instance("web", 0, "n1"),
                instance("web", 1, "n2"),
                instance("worker", 0, "n1"),
            ],
            release: Vec::new(),
            cron: Vec::new(),
            hostnames: Vec::new(),
            nodes: vec![n("n1"), n("n2")],
            ingress_nodes: vec![n("n1")],
            release_hash: "r".into(),
            pool: None,
            placement: Placement::Spread,
            replicas: SmallMap::new(),
            roles: [(n("web"), role(Some(30))), (n("worker"), role(None))]
                .into_iter()
                .collect(),
            certificates: Vec::new(),
            domains: Vec::new(),
            backups: None,
        }
    }

    fn seen(role: &'static str, instance: u32, generation: u64, healthy: bool) -> Seen<'static> {
        Seen {
            environment: "e",
            role,
            instance,
            generation,
            healthy,
        }
    }

    #[test]
    fn the_window_is_the_longest_watch_of_a_placed_role() {
        assert_eq!(window(&spec()), Some(30));
        let mut s = spec();
        s.roles = [(n("web"), role(None))].into_iter().collect();
        assert_eq!(window(&s), None);
    }

    #[test]
    fn a_placed_replica_unhealthy_or_gone_within_its_window_fails_the_generation() {
        let s = spec();
        let ok = [seen("web", 0, 5, true), seen("worker", 0, 5, false)];
        assert_eq!(
            judge(&s, 5, 1_000, "n1", 2_000, &ok, false),
            None,
            "the worker is not watched"
        );
        let sick = [seen("web", 0, 5, false)];
        let why = judge(&s, 5, 1_000, "n1", 11_000, &sick, false).expect("fails");
        assert!(
            why.starts_with("web/0 on n1: not healthy at generation 5, 10.0 s after"),
            "{why}"
        );
        let old = [seen("web", 0, 4, true)];
        assert!(
            judge(&s, 5, 1_000, "n1", 2_000, &old, false)
                .expect("fails")
                .contains("gone")
        );
        assert_eq!(
            judge(&s, 5, 1_000, "n1", 32_000, &sick, false),
            None,
            "after the window"
        );
        assert_eq!(
            judge(&s, 5, 1_000, "n1", 900, &sick, false),
            None,
            "a report from before the switch"
        );
        assert_eq!(
            judge(&s, 5, 1_000, "n3", 2_000, &[], false),
            None,
            "nothing placed there"
        );
        assert!(
            judge(&s, 5, 1_000, "n2", 2_000, &[], false).is_some(),
            "n2's replica gone"
        );
    }

    #[test]
    fn during_a_canary_every_replica_of_the_generation_is_watched_whatever_its_window() {
        let s = spec();
        let sick_worker = [seen("web", 0, 5, true), seen("worker", 0, 5, false)];
        assert_eq!(judge(&s, 5, 1_000, "n1", 2_000, &sick_worker, false), None);
        let why = judge(&s, 5, 1_000, "n1", 2_000, &sick_worker, true).expect("fails");
        assert!(why.starts_with("worker/0 on n1: not healthy"), "{why}");
        assert!(why.contains("during its canary"), "{why}");
        let sick = [seen("web", 0, 5, false)];
        assert!(
            judge(&s, 5, 1_000, "n1", 3_600_000, &sick, true).is_some(),
            "a canary has no window: it lasts until its switch"
        );
    }
}
