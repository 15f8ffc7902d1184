//! What a branch's wanted deployments do to the generations the ledger holds: which start a
//! new rollout generation, which scale at their current one, which are torn down, and which
//! another branch owns. Pure: the daemon reads the rows (`Current`, the stored specs, the
//! owners), calls these two functions, and writes what they return; a test can call them with
//! any rows.
//!
//! Two steps, because the daemon reads stored specs and owners only for what changed:
//! [`changes`] compares hashes alone, [`decide`] decides with the specs of what changed.

use crate::deployment::DeploymentSpec;
use crate::desired::Desired;
use crate::release::{self, Change};
use std::collections::BTreeMap;

/// What a deployment's current generation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    Rollout,
    Teardown,
}

impl Action {
    /// As the ledger writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Rollout => "rollout",
            Action::Teardown => "teardown",
        }
    }

    /// As the ledger wrote it; `None` for anything else.
    pub fn parse(s: &str) -> Option<Action> {
        match s {
            "rollout" => Some(Action::Rollout),
            "teardown" => Some(Action::Teardown),
            _ => None,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a deployment's current generation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    InProgress,
    Done,
    Failed,
}

impl Status {
    /// As the ledger writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in-progress",
            Status::Done => "done",
            Status::Failed => "failed",
        }
    }

    /// As the ledger wrote it; `None` for anything else.
    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "in-progress" => Some(Status::InProgress),
            "done" => Some(Status::Done),
            "failed" => Some(Status::Failed),
            _ => None,
        }
    }
}

/// A deployment of the branch as the ledger holds it (its specs are read later, for changes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Current {
    pub generation: u64,
    pub action: Action,
    pub status: Status,
    pub spec_hash: String,
}

/// What differs between the wanted deployments and the ledger's, by hash alone.
#[derive(Debug, Default)]
pub struct Changes {
    /// Wanted deployments whose spec hash differs from what runs (or that do not run), with
    /// the current generation when there is one.
    pub changed: Vec<(Desired, Option<Current>)>,
    /// Deployments of the branch no longer wanted (and not kept): torn down.
    pub gone: Vec<(String, Current)>,
}

impl Changes {
    /// The environments no generation of this branch runs yet: another branch may own them.
    pub fn new_environments(&self) -> Vec<&str> {
        self.changed
            .iter()
            .filter(|(_, c)| c.is_none())
            .map(|(d, _)| d.spec.environment.as_str())
            .collect()
    }

    /// The environments whose stored specs the decision needs.
    pub fn existing_environments(&self) -> Vec<&str> {
        self.changed
            .iter()
            .filter(|(_, c)| c.is_some())
            .map(|(d, _)| d.spec.environment.as_str())
            .chain(self.gone.iter().map(|(env, _)| env.as_str()))
            .collect()
    }
}

/// Compares `wanted` with the branch's deployments in the ledger (`current`): an unchanged
/// rollout is left alone; a deployment no longer wanted is gone unless `kept` says otherwise
/// (an unplaceable environment keeps what runs; a re-placement plans only what it moves).
pub fn changes(wanted: Vec<Desired>, mut current: BTreeMap<String, Current>, kept: impl Fn(&str) -> bool) -> Changes {
    let mut changed = Vec::new();
    for d in wanted {
        let now = current.remove(d.spec.environment.as_str());
        if let Some(c) = &now
            && c.action == Action::Rollout
            && c.spec_hash == d.spec_hash
        {
            continue;
        }
        changed.push((d, now));
    }
    let gone = current
        .into_iter()
        .filter(|(env, c)| c.action != Action::Teardown && !kept(env))
        .collect();
    Changes { changed, gone }
}

/// A generation to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub action: Action,
    pub spec: DeploymentSpec,
    pub spec_hash: String,
    /// Specs of older generations whose replicas may still run (the new steps retire them).
    pub retired: Vec<DeploymentSpec>,
    pub generation: u64,
    /// Whether the environment had a generation before (and so may have jobs to cancel).
    pub existed: bool,
    /// A rollback's generation ([`rollback`]): the previous release again, without its
    /// release step.
    pub rollback: bool,
}

/// A deployment that scales at its current generation (`release::change` said so).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scale {
    pub spec: DeploymentSpec,
    pub spec_hash: String,
    pub generation: u64,
    pub change: Change,
}

/// What a branch's changes come to.
#[derive(Debug, Default)]
pub struct Decision {
    /// Rollouts first, in the order of the wanted deployments, then teardowns.
    pub starts: Vec<Start>,
    pub scales: Vec<Scale>,
    /// Environments another branch deploys: (environment, that branch). Nothing starts.
    pub conflicts: Vec<(String, String)>,
}

/// What the nodes run of environments a rebuilt ledger has no deployment of: each
/// environment's newest generation reported and the spec hashes of its replicas at that
/// generation (`rollout::instance_hash`: release, role, instance and node).
pub type Adopted = BTreeMap<String, (u64, std::collections::BTreeSet<String>)>;

/// The newest generation of each environment in `reports` (environment, generation, the
/// replica's spec hash as its label says) and its replicas' hashes; a replica without a hash
/// (an agent older than the field) counts with an empty one, which no replica matches.
pub fn adoptable<'a>(reports: impl IntoIterator<Item = (&'a str, u64, Option<&'a str>)>) -> Adopted {
    let mut out: Adopted = BTreeMap::new();
    for (env, generation, hash) in reports {
        let hash = hash.unwrap_or_default().to_owned();
        match out.get_mut(env) {
            Some((g, _)) if *g > generation => {}
            Some((g, hashes)) if *g == generation => {
                hashes.insert(hash);
            }
            Some(slot) => *slot = (generation, [hash].into()),
            None => {
                out.insert(env.to_owned(), (generation, [hash].into()));
            }
        }
    }
    out
}

/// Whether the replicas `spec` asks for include every one that runs (`running`: their spec
/// hashes): then they are adopted at their generation as they are.
fn runs_as_asked(spec: &DeploymentSpec, running: &std::collections::BTreeSet<String>) -> bool {
    let asked: std::collections::BTreeSet<String> = spec
        .instances
        .iter()
        .map(|i| crate::rollout::instance_hash(spec, &i.role, i.index, &i.node))
        .collect();
    !running.is_empty() && running.is_subset(&asked)
}

/// Decides `changes` with the stored specs of the existing deployments (`specs`: spec and
/// retired specs) and the branches that own new environments (`owners`). A finished rollout
/// whose release stays the same scales at its generation (the decision is
/// [`release::change`], the one `pl plan` prints rollouts from); any other change starts the
/// next generation, and a gone deployment the next generation as a teardown.
///
/// A new environment starts at generation 1, unless its nodes already run it (`adopted`: a
/// control plane rebuilt without its ledger): at the generation they run when Git asks for
/// each replica that runs, where it runs, with the release it runs (they are adopted as they
/// are, none restarted), else at the one after (a rollout, never a generation the nodes
/// would refuse as older than theirs).
pub fn decide(
    changes: Changes,
    owners: &BTreeMap<String, String>,
    mut specs: BTreeMap<String, (DeploymentSpec, Vec<DeploymentSpec>)>,
    adopted: &Adopted,
) -> Decision {
    let mut out = Decision::default();
    for (d, now) in changes.changed {
        let env = d.spec.environment.to_string();
        if let Some(owner) = owners.get(&env) {
            out.conflicts.push((env, owner.clone()));
            continue;
        }
        if let (Some(c), Some((stored, _))) = (&now, specs.get(&env))
            && c.action == Action::Rollout
            && c.status == Status::Done
        {
            let change = release::change(stored, &d.spec);
            if change != Change::Generation {
                specs.remove(&env);
                out.scales.push(Scale {
                    spec: d.spec,
                    spec_hash: d.spec_hash,
                    generation: c.generation,
                    change,
                });
                continue;
            }
        }
        let (generation, retired, existed) = match (now, specs.remove(&env)) {
            (Some(c), Some((spec, mut retired))) => {
                if !retired.contains(&spec) {
                    retired.push(spec);
                }
                (c.generation + 1, retired, true)
            }
            (Some(c), None) => (c.generation + 1, Vec::new(), true),
            (None, _) => match adopted.get(&env) {
                Some((g, running)) if runs_as_asked(&d.spec, running) => (*g, Vec::new(), false),
                Some((g, _)) => (g.saturating_add(1), Vec::new(), false),
                None => (1, Vec::new(), false),
            },
        };
        out.starts.push(Start {
            action: Action::Rollout,
            spec: d.spec,
            spec_hash: d.spec_hash,
            retired,
            generation,
            existed,
            rollback: false,
        });
    }
    for (env, c) in changes.gone {
        let Some((spec, retired)) = specs.remove(&env) else {
            continue;
        };
        out.starts.push(Start {
            action: Action::Teardown,
            spec,
            spec_hash: String::new(),
            retired,
            generation: c.generation + 1,
            existed: true,
            rollback: false,
        });
    }
    out
}

/// Why a rollback is refused, with the refusal's stable code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RollbackRefusal {
    /// No finished generation before the current one, or it runs the same release.
    NoPrevious,
    /// A rollback holds the environment already: release it first.
    AlreadyHeld,
    /// The environment is torn down (or being torn down).
    TornDown,
}

impl RollbackRefusal {
    pub fn code(self) -> &'static str {
        match self {
            RollbackRefusal::NoPrevious => "no-previous-release",
            RollbackRefusal::AlreadyHeld => "rollback-held",
            RollbackRefusal::TornDown => "environment-torn-down",
        }
    }
}

/// What a rollback runs: `previous`'s release (image, roles, variables, secrets, hostnames)
/// at `current`'s replica counts and placement, for the roles both have: a rollback takes the
/// release back, not the scale (one that cut 2 replicas to 1 surprised its user). A role only
/// the previous release has keeps its own count and placement; one only the current has goes.
/// Nodes and ingress nodes follow the instances. Equal to `previous` when the counts and
/// placement did not change since.
pub fn rollback_spec(previous: &DeploymentSpec, current: &DeploymentSpec) -> DeploymentSpec {
    let mut spec = previous.clone();
    let kept =
        |role: &crate::values::Name| previous.replicas.get(role).is_some() && current.replicas.get(role).is_some();
    for (role, n) in current.replicas.iter() {
        if previous.replicas.get(role).is_some() {
            spec.replicas.insert(role.clone(), *n);
        }
    }
    spec.instances = previous
        .instances
        .iter()
        .filter(|i| !kept(&i.role))
        .chain(current.instances.iter().filter(|i| kept(&i.role)))
        .cloned()
        .collect();
    spec.instances
        .sort_by(|a, b| (&a.role, a.index).cmp(&(&b.role, b.index)));
    let mut nodes: Vec<crate::values::Name> = spec
        .instances
        .iter()
        .map(|i| i.node.clone())
        .chain(spec.release.iter().map(|(_, n)| n.clone()))
        .chain(spec.cron.iter().map(|(_, n)| n.clone()))
        .collect();
    nodes.sort();
    nodes.dedup();
    spec.nodes = nodes;
    let mut ingress: Vec<crate::values::Name> = spec
        .instances
        .iter()
        .filter(|i| spec.roles.get(&i.role).is_some_and(|r| r.is_web()))
        .map(|i| i.node.clone())
        .collect();
    ingress.sort();
    ingress.dedup();
    spec.ingress_nodes = ingress;
    if spec.instances == previous.instances && spec.replicas == previous.replicas {
        return previous.clone();
    }
    spec
}

/// A rollback to start: generation `generation` runs generation `to`'s spec again, replacing
/// generation `from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollbackAsk {
    pub from: u64,
    pub to: u64,
    pub generation: u64,
}

/// Whether `current` (running the release `release`) can roll back to `previous` (the
/// generation that finished before it started, with its release hash) and at which
/// generation. A rollback is a new generation (every
/// fence on the nodes only moves forward), whatever the current one's status: a rollout still
/// going or failed is replaced the same way.
pub fn rollback(
    current: &Current,
    release: &str,
    previous: Option<(u64, &str)>,
    held: bool,
) -> Result<RollbackAsk, RollbackRefusal> {
    if held {
        return Err(RollbackRefusal::AlreadyHeld);
    }
    if current.action == Action::Teardown {
        return Err(RollbackRefusal::TornDown);
    }
    match previous {
        Some((to, hash)) if to > 0 && to < current.generation && hash != release => Ok(RollbackAsk {
            from: current.generation,
            to,
            generation: current.generation + 1,
        }),
        _ => Err(RollbackRefusal::NoPrevious),
    }
}

/// What an accepted commit does to its branch's holds (`held`: environment → the spec hash Git
/// wanted when the hold began). A held environment Git still wants the same way is kept as the
/// rollback left it (first set: leave it out of the comparison); any other (Git changed it, or
/// no longer declares it) is released (second list), and the commit decides it as usual.
pub fn holds(wanted: &[Desired], held: &BTreeMap<String, String>) -> (std::collections::BTreeSet<String>, Vec<String>) {
    let mut kept = std::collections::BTreeSet::new();
    let mut ended = Vec::new();
    for (env, git_hash) in held {
        let same = wanted
            .iter()
            .any(|d| d.spec.environment.as_str() == env && &d.spec_hash == git_hash);
        if same {
            kept.insert(env.clone());
        } else {
            ended.push(env.clone());
        }
    }
    (kept, ended)
}

/// How the jobs of a generation's current step stand.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepJobs {
    /// Queued or leased.
    pub pending: u64,
    /// Failed for good, or dead after their attempts.
    pub broken: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deployment::Instance;
    use crate::model::Placement;
    use crate::values::Name;
    use crate::values::SmallMap;

    fn n(s: &str) -> Name {
        Name::new(s).expect("name")
    }

    fn spec(env: &str, replicas: u32, release: &str) -> DeploymentSpec {
        DeploymentSpec {
            environment: n(env),
            project: n("p"),
            instances: (0..replicas).map(|i| Instance::new(n("web"), i, n("n1"))).collect(),
            release: Vec::new(),
            cron: Vec::new(),
            hostnames: Vec::new(),
            nodes: vec![n("n1")],
            ingress_nodes: vec![n("n1")],
            release_hash: release.into(),
            pool: Some(n("main")),
            placement: Placement::Spread,
            replicas: [(n("web"), replicas)].into_iter().collect(),
            roles: SmallMap::new(),
            certificates: Vec::new(),
            domains: Vec::new(),
            backups: None,
        }
    }

    fn desired(env: &str, replicas: u32, release: &str) -> Desired {
        Desired {
            spec: spec(env, replicas, release),
            spec_hash: format!("{env}-{replicas}-{release}"),
            waiting: Vec::new(),
        }
    }

    fn current(env: &str, replicas: u32, release: &str, generation: u64, status: Status) -> Current {
        Current {
            generation,
            action: Action::Rollout,
            status,
            spec_hash: format!("{env}-{replicas}-{release}"),
        }
    }

    /// A rollback takes the release back, not the scale: release one ran 1 replica, release
    /// two was scaled to 2; the rollback runs release one with 2 (it once ran 1 without a word).
    #[test]
    fn a_rollback_keeps_todays_replica_count_and_placement() {
        let previous = spec("e", 1, "r1");
        let mut current = spec("e", 2, "r2");
        current.instances[1].node = n("n2");
        current.nodes = vec![n("n1"), n("n2")];
        let back = rollback_spec(&previous, &current);
        assert_eq!(back.release_hash, "r1", "the previous release");
        assert_eq!(back.replicas.get(&n("web")), Some(&2));
        assert_eq!(back.instances, current.instances);
        assert_eq!(back.nodes, [n("n1"), n("n2")]);
        // Nothing scaled since: exactly the previous spec (its hash too).
        assert_eq!(rollback_spec(&previous, &spec("e", 1, "r2")), previous);
        // A role only the previous release has keeps its own count.
        let mut older = spec("e", 1, "r1");
        older.replicas.insert(n("jobs"), 1);
        older.instances.push(Instance::new(n("jobs"), 0, n("n1")));
        let back = rollback_spec(&older, &current);
        assert_eq!(back.replicas.get(&n("jobs")), Some(&1));
        assert_eq!(back.instances.len(), 3);
    }

    #[test]
    fn a_new_environment_the_nodes_run_is_adopted_at_their_generation_or_rolled_past_it() {
        // Git asks for one web replica of release r1 on n1 in each environment, two in "more".
        let asked = |env: &str| -> String {
            let s = spec(env, 1, "r1");
            crate::rollout::instance_hash(&s, &n("web"), 0, &n("n1"))
        };
        let elsewhere = crate::rollout::instance_hash(&spec("moved", 1, "r1"), &n("web"), 0, &n("n2"));
        let older = crate::rollout::instance_hash(&spec("changed", 1, "r0"), &n("web"), 0, &n("n1"));
        let (same, more) = (asked("same"), asked("more"));
        let reports = [
            ("same", 3, Some(same.as_str())),
            ("same", 2, Some("an older release")),
            ("more", 4, Some(more.as_str())),
            ("changed", 5, Some(older.as_str())),
            ("moved", 2, Some(elsewhere.as_str())),
            ("old-agent", 2, None),
        ];
        let adopted = adoptable(reports);
        assert_eq!(
            adopted.get("same"),
            Some(&(3, [same.clone()].into())),
            "the newest generation"
        );
        let c = changes(
            vec![
                desired("same", 1, "r1"),
                desired("more", 2, "r1"),
                desired("changed", 1, "r1"),
                desired("moved", 1, "r1"),
                desired("old-agent", 1, "r1"),
                desired("fresh", 1, "r1"),
            ],
            BTreeMap::new(),
            |_| false,
        );
        let d = decide(c, &BTreeMap::new(), BTreeMap::new(), &adopted);
        let starts: BTreeMap<&str, u64> = d
            .starts
            .iter()
            .map(|s| (s.spec.environment.as_str(), s.generation))
            .collect();
        assert_eq!(
            starts.get("same"),
            Some(&3),
            "what runs is what Git asks for: its generation"
        );
        assert_eq!(
            starts.get("more"),
            Some(&4),
            "Git asks for one more replica: made at that generation"
        );
        assert_eq!(starts.get("changed"), Some(&6), "another release: the generation after");
        assert_eq!(starts.get("moved"), Some(&3), "another node: the generation after");
        assert_eq!(starts.get("old-agent"), Some(&3), "no hash reported: rolled past it");
        assert_eq!(starts.get("fresh"), Some(&1));
    }

    #[test]
    fn unchanged_is_left_alone_new_starts_at_one_gone_is_torn_down_kept_stays() {
        let rows = BTreeMap::from([
            ("same".to_owned(), current("same", 1, "r1", 4, Status::Done)),
            ("old".to_owned(), current("old", 1, "r1", 2, Status::Done)),
            ("kept".to_owned(), current("kept", 1, "r1", 3, Status::Done)),
        ]);
        let c = changes(vec![desired("same", 1, "r1"), desired("fresh", 2, "r1")], rows, |e| {
            e == "kept"
        });
        assert_eq!(c.new_environments(), ["fresh"]);
        assert_eq!(c.existing_environments(), ["old"]);
        let specs = BTreeMap::from([("old".to_owned(), (spec("old", 1, "r1"), Vec::new()))]);
        let d = decide(c, &BTreeMap::new(), specs, &Adopted::new());
        let starts: Vec<(Action, &str, u64, bool)> = d
            .starts
            .iter()
            .map(|s| (s.action, s.spec.environment.as_str(), s.generation, s.existed))
            .collect();
        assert_eq!(
            starts,
            [(Action::Rollout, "fresh", 1, false), (Action::Teardown, "old", 3, true)]
        );
        assert!(d.scales.is_empty() && d.conflicts.is_empty());
    }

    #[test]
    fn a_finished_rollout_with_the_same_release_scales_and_anything_else_rolls() {
        let rows = BTreeMap::from([
            ("done".to_owned(), current("done", 1, "r1", 5, Status::Done)),
            ("busy".to_owned(), current("busy", 1, "r1", 5, Status::InProgress)),
            (
                "new-release".to_owned(),
                current("new-release", 1, "r1", 5, Status::Done),
            ),
        ]);
        let c = changes(
            vec![
                desired("done", 3, "r1"),
                desired("busy", 3, "r1"),
                desired("new-release", 1, "r2"),
            ],
            rows,
            |_| false,
        );
        let specs: BTreeMap<_, _> = ["done", "busy", "new-release"]
            .iter()
            .map(|e| (e.to_string(), (spec(e, 1, "r1"), Vec::new())))
            .collect();
        let d = decide(c, &BTreeMap::new(), specs, &Adopted::new());
        assert_eq!(d.scales.len(), 1);
        assert_eq!(
            (d.scales[0].spec.environment.as_str(), d.scales[0].generation),
            ("done", 5)
        );
        assert!(matches!(d.scales[0].change, Change::Scale { .. }));
        let rolled: Vec<(&str, u64, usize)> = d
            .starts
            .iter()
            .map(|s| (s.spec.environment.as_str(), s.generation, s.retired.len()))
            .collect();
        // A rollout still going gets the next generation, and retires the stored spec.
        assert_eq!(rolled, [("busy", 6, 1), ("new-release", 6, 1)]);
    }

    #[test]
    fn another_branchs_environment_is_a_conflict_and_starts_nothing() {
        let c = changes(vec![desired("shared", 1, "r1")], BTreeMap::new(), |_| false);
        let owners = BTreeMap::from([("shared".to_owned(), "main".to_owned())]);
        let d = decide(c, &owners, BTreeMap::new(), &Adopted::new());
        assert_eq!(d.conflicts, [("shared".to_owned(), "main".to_owned())]);
        assert!(d.starts.is_empty());
    }

    #[test]
    fn a_rollback_goes_to_the_previous_release_at_the_next_generation_or_is_refused() {
        let now = current("e", 1, "r2", 7, Status::Done);
        let ask = rollback(&now, "r2", Some((6, "r1")), false);
        assert_eq!(
            ask,
            Ok(RollbackAsk {
                from: 7,
                to: 6,
                generation: 8
            })
        );
        // A rollout still going (or failed) is rolled back the same way.
        let busy = current("e", 1, "r2", 7, Status::InProgress);
        assert_eq!(rollback(&busy, "r2", Some((5, "r1")), false).map(|a| a.to), Ok(5));
        assert_eq!(rollback(&now, "r2", None, false), Err(RollbackRefusal::NoPrevious));
        assert_eq!(
            rollback(&now, "r2", Some((6, "r2")), false),
            Err(RollbackRefusal::NoPrevious),
            "the previous generation runs the same release"
        );
        assert_eq!(
            rollback(&now, "r2", Some((0, "")), false),
            Err(RollbackRefusal::NoPrevious)
        );
        assert_eq!(
            rollback(&now, "r2", Some((6, "r1")), true),
            Err(RollbackRefusal::AlreadyHeld)
        );
        let gone = Current {
            action: Action::Teardown,
            ..now
        };
        assert_eq!(
            rollback(&gone, "r2", Some((6, "r1")), false),
            Err(RollbackRefusal::TornDown)
        );
        assert_eq!(RollbackRefusal::NoPrevious.code(), "no-previous-release");
    }

    #[test]
    fn a_hold_ends_only_when_git_changes_or_drops_its_environment() {
        let held = BTreeMap::from([
            ("same".to_owned(), "same-1-r2".to_owned()),
            ("changed".to_owned(), "changed-1-r2".to_owned()),
            ("dropped".to_owned(), "dropped-1-r2".to_owned()),
        ]);
        let wanted = [
            desired("same", 1, "r2"),
            desired("changed", 1, "r3"),
            desired("other", 1, "r1"),
        ];
        let (kept, ended) = holds(&wanted, &held);
        assert_eq!(kept.into_iter().collect::<Vec<_>>(), ["same"]);
        assert_eq!(ended, ["changed", "dropped"]);
    }

    #[test]
    fn the_ledgers_words_read_back() {
        for a in [Action::Rollout, Action::Teardown] {
            assert_eq!(Action::parse(a.as_str()), Some(a));
        }
        for s in [Status::InProgress, Status::Done, Status::Failed] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("DONE"), None);
    }
}
