//! What follows from a plan's changes, for a reviewer: hostnames served or no longer, replicas
//! changed, roles added and removed, nodes drained, and the environments that roll out (by the
//! reconciler's own `release::change`). Computed once per plan, scoped to what the changes touch.

use crate::deployment::DeploymentSpec;
use crate::desired::Desired;
use crate::model::{Kind, NodeState, Spec};
use crate::release::{Change as DeploymentChange, Releases, change};
use crate::state::State;
use crate::values::{Hostname, Name};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A changed object, as the consequences need it.
pub(crate) struct Changed<'a> {
    pub kind: Kind,
    pub name: &'a Name,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ReplicaChange {
    pub environment: Name,
    pub role: Name,
    pub before: u32,
    pub after: u32,
}

/// A rollout that is more than a switch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progressive {
    pub environment: Name,
    /// A canary's weights, step by step, before the switch.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub canary: Vec<u8>,
    /// Each rolling role: how many replicas a batch replaces, in how many batches.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rolling: Vec<RollingRole>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RollingRole {
    pub role: Name,
    pub batch: u32,
    pub batches: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct RoleRef {
    pub project: Name,
    pub role: Name,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct NodeChange {
    pub pool: Name,
    pub node: Name,
    /// `None` when the node was removed from the pool.
    pub state: Option<NodeState>,
}

/// A hostname whose brought certificate changes: published again in place, no restart.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct CertificateChange {
    pub environment: Name,
    pub hostname: Hostname,
}

/// What follows from the changes, for a reviewer: traffic, capacity and rollouts.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Consequences {
    pub hostnames_added: Vec<Hostname>,
    pub hostnames_removed: Vec<Hostname>,
    pub replicas_changed: Vec<ReplicaChange>,
    pub roles_added: Vec<RoleRef>,
    pub roles_removed: Vec<RoleRef>,
    pub nodes_drained: Vec<NodeChange>,
    /// Environments present on both sides whose release inputs (image, roles, variables,
    /// secrets) changed: each gets a new generation.
    pub rollouts: Vec<Name>,
    /// How each rollout that is more than a switch goes, from the steps the daemon writes
    /// for it (`rollout::rollout_steps`): a canary's weights, rolling batches.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub progressive: Vec<Progressive>,
    /// Replicas the change moves to another node on the nodes Git declares (a drain, a pool
    /// that loses a node) while their release stays: a scale at the current generation
    /// (`release::change`), so the other replicas keep running.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<crate::replacement::Move>,
    /// With a live fleet (`pl plan --fleet`): the replicas re-placement would move on it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replacements: Vec<crate::replacement::Move>,
    /// With a live fleet: environments a rollback holds away from Git (not a change of this
    /// plan; a change of such an environment ends its hold).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<crate::replacement::Held>,
    /// Brought certificates that change without a new release (a Secret's values rotated):
    /// published again in place by the reconciler's own `release::change`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certificates_changed: Vec<CertificateChange>,
    /// Replicas the head asks for that no node has room for (placed as the reconciler places
    /// them: on the capacities Git declares, or with a live fleet on it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unplaced: Vec<crate::placement::Unplaced>,
    /// Whether `replacements`, `held` and `unplaced` come from a live fleet (`pl plan --fleet`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub live_fleet: bool,
}

impl Consequences {
    pub fn is_empty(&self) -> bool {
        self.hostnames_added.is_empty()
            && self.hostnames_removed.is_empty()
            && self.replicas_changed.is_empty()
            && self.roles_added.is_empty()
            && self.roles_removed.is_empty()
            && self.nodes_drained.is_empty()
            && self.rollouts.is_empty()
            && self.replacements.is_empty()
            && self.moved.is_empty()
            && self.certificates_changed.is_empty()
            && self.unplaced.is_empty()
    }
}

/// What the two states given to the planner hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Whole trees.
    Full,
    /// Only the files a change touched, and the change is local (see
    /// [`crate::incremental::is_local`]): consequences come from the changed objects alone.
    Local,
}

/// Every hostname a state serves: derived environment names and domains.
fn hostnames(state: &State) -> BTreeSet<Hostname> {
    hostnames_where(state, |_, _| true)
}

/// The hostnames served by the environments and domains `pick` accepts.
fn hostnames_where(state: &State, pick: impl Fn(Kind, &Name) -> bool) -> BTreeSet<Hostname> {
    let mut out = BTreeSet::new();
    if let Some(repo) = state.repository() {
        for (name, env) in state.environments().filter(|(n, _)| pick(Kind::Environment, n)) {
            if let Ok(h) = crate::state::environment_hostname(repo, name, env) {
                out.insert(h);
            }
        }
    }
    out.extend(
        state
            .domains()
            .filter(|(n, _)| pick(Kind::Domain, n))
            .map(|(_, d)| d.hostname.clone()),
    );
    out
}

/// Hostnames added and removed. Unchanged objects serve the same names on both sides, so a
/// name can only appear or vanish through a changed environment or domain: candidates come
/// from those, and the whole sets are built only to confirm a candidate (a name may also be
/// served by an unchanged object when the base was invalid).
fn hostname_changes(base: &State, head: &State, changes: &[Changed<'_>]) -> (Vec<Hostname>, Vec<Hostname>) {
    if changes.iter().any(|c| c.kind == Kind::Repository) {
        let (hb, hh) = (hostnames(base), hostnames(head));
        return (
            hh.difference(&hb).cloned().collect(),
            hb.difference(&hh).cloned().collect(),
        );
    }
    let changed: BTreeSet<(Kind, &Name)> = changes
        .iter()
        .filter(|c| matches!(c.kind, Kind::Environment | Kind::Domain))
        .map(|c| (c.kind, c.name))
        .collect();
    let pick = |k: Kind, n: &Name| changed.contains(&(k, n));
    let (hb, hh) = (hostnames_where(base, pick), hostnames_where(head, pick));
    let (mut added, mut removed): (Vec<Hostname>, Vec<Hostname>) = (
        hh.difference(&hb).cloned().collect(),
        hb.difference(&hh).cloned().collect(),
    );
    if !added.is_empty() {
        let all_base = hostnames(base);
        added.retain(|h| !all_base.contains(h));
    }
    if !removed.is_empty() {
        let all_head = hostnames(head);
        removed.retain(|h| !all_head.contains(h));
    }
    (added, removed)
}

/// Effective replicas of an environment's long-running roles.
fn effective_replicas<'s>(state: &'s State, env: &'s crate::model::Environment) -> Option<BTreeMap<&'s Name, u32>> {
    let project = state.project(env.project.as_str())?;
    Some(
        project
            .roles
            .iter()
            .filter_map(|(role, r)| {
                r.workload
                    .replicas()
                    .map(|n| (role, env.replicas.get(role).copied().unwrap_or(n)))
            })
            .collect(),
    )
}

/// What a change touches: only environments whose own object or project (or a secret)
/// changed can roll out or rescale; looking only at those keeps a one-object change cheap in
/// a large state. Placement comes from pools, hostnames from the Repository and Domains: a
/// change to any of them can move an environment to a new generation too.
struct Touched<'c> {
    projects: BTreeSet<&'c Name>,
    pools: BTreeSet<&'c Name>,
    environments: BTreeSet<&'c Name>,
    /// A Secret, the Repository or a Domain changed: every environment is looked at.
    everything: bool,
}

impl<'c> Touched<'c> {
    fn of(changes: &[Changed<'c>]) -> Self {
        let names = |kind: Kind| changes.iter().filter(|ch| ch.kind == kind).map(|ch| ch.name).collect();
        Touched {
            projects: names(Kind::Project),
            pools: names(Kind::NodePool),
            environments: names(Kind::Environment),
            everything: changes
                .iter()
                .any(|ch| matches!(ch.kind, Kind::Secret | Kind::Repository | Kind::Domain)),
        }
    }

    fn touches(&self, name: &Name, env: &crate::model::Environment) -> bool {
        self.everything
            || self.environments.contains(name)
            || self.projects.contains(&env.project)
            || self.pools.contains(&env.pool)
    }
}

/// Both trees' deployments, placed whole once some environment needs them.
type PlacedPair = Option<(BTreeMap<Name, Desired>, BTreeMap<Name, Desired>)>;

pub(crate) fn consequences(base: &State, head: &State, changes: &[Changed<'_>], scope: Scope) -> Consequences {
    let mut c = Consequences::default();
    if changes.is_empty() {
        return c;
    }
    (c.hostnames_added, c.hostnames_removed) = hostname_changes(base, head, changes);
    let touched = Touched::of(changes);
    let (mut releases_base, mut releases_head) = (Releases::new(base), Releases::new(head));
    // Placement is shared by every environment of a pool, so both sides are placed whole
    // (once, and only when some environment is touched), as the reconciler places them.
    let mut placed: PlacedPair = None;
    let mut with_roles: PlacedPair = None;
    for (name, env) in head.environments() {
        if !touched.touches(name, env) {
            continue;
        }
        let Some(Spec::Environment(old_env)) = base.get(Kind::Environment, name.as_str()).map(|l| &l.object.spec)
        else {
            continue;
        };
        if scope == Scope::Local {
            local_consequences(&mut c, name, old_env, env);
            continue;
        }
        replica_changes(
            &mut c,
            name,
            effective_replicas(base, old_env),
            effective_replicas(head, env),
        );
        // The reconciler's own decision (`release::change`) on the two deployments; an
        // environment that cannot be placed on one side rolls out when its release changes.
        // A release that changed is a new generation whatever the placement (`change` decides
        // so before it looks at nodes), so placing both whole trees, the costly part of a
        // plan, is left for the environments whose release stayed.
        let released = releases_base.release_hash(old_env) != releases_head.release_hash(env);
        let rollout = released || {
            let (old_placed, new_placed) =
                placed.get_or_insert_with(|| crate::desired::placed_pair_for_change(base, head, None));
            match (old_placed.get(name), new_placed.get(name)) {
                (Some(a), Some(b)) => changed_in_place(&mut c, name, &a.spec, &b.spec),
                _ => false,
            }
        };
        // Replicas that would wait for room, on the nodes Git declares: read from the placement
        // when the plan made it anyway (a change that is no new release, as a scale is: where
        // more replicas are asked for). A new release is a new generation whatever the
        // placement, so it is not placed only for this (at 10,000 environments that doubled
        // the plan's time).
        if let Some((_, new_placed)) = &placed
            && let Some(d) = new_placed.get(name)
        {
            unplaced(&mut c, name, d);
        }
        if rollout {
            c.rollouts.push(name.clone());
            // A canary or rolling batches: both sides placed again with their roles, only for
            // environments whose project declares one.
            let declares = head.project(env.project.as_str()).is_some_and(|p| {
                p.roles.values().any(|r| {
                    r.rollout
                        .as_ref()
                        .is_some_and(|x| !x.steps.is_empty() || x.rolling.is_some())
                })
            });
            if declares {
                let (old_placed, new_placed) =
                    with_roles.get_or_insert_with(|| crate::desired::placed_pair_with_roles(base, head, None));
                if let (Some(a), Some(b)) = (old_placed.get(name), new_placed.get(name))
                    && let Some(p) = progressive(&a.spec, &b.spec)
                {
                    c.progressive.push(p);
                }
            }
        }
    }
    role_changes(&mut c, base, head, &touched.projects);
    node_changes(&mut c, base, head, changes);
    c.replicas_changed.sort();
    c.roles_added.sort();
    c.roles_removed.sort();
    c.nodes_drained.sort();
    c.certificates_changed.sort();
    c.unplaced.sort();
    c
}

/// A local change keeps the project, the overridden roles and the variables, so the
/// overrides are the effective values and only an image override can release.
fn local_consequences(
    c: &mut Consequences,
    name: &Name,
    old_env: &crate::model::Environment,
    env: &crate::model::Environment,
) {
    for (role, after) in &env.replicas {
        if let Some(before) = old_env.replicas.get(role).filter(|b| *b != after) {
            c.replicas_changed.push(ReplicaChange {
                environment: name.clone(),
                role: role.clone(),
                before: *before,
                after: *after,
            });
        }
    }
    if old_env.image != env.image {
        c.rollouts.push(name.clone());
    }
}

/// The roles whose effective replicas changed.
fn replica_changes(
    c: &mut Consequences,
    name: &Name,
    old: Option<BTreeMap<&Name, u32>>,
    new: Option<BTreeMap<&Name, u32>>,
) {
    let (Some(old), Some(new)) = (old, new) else { return };
    for (role, after) in &new {
        if let Some(before) = old.get(role)
            && before != after
        {
            c.replicas_changed.push(ReplicaChange {
                environment: name.clone(),
                role: (*role).clone(),
                before: *before,
                after: *after,
            });
        }
    }
}

/// Whether placing `old` and `new` makes a new generation (`release::change`); a change in
/// place (a scale) adds the replicas it moves and the certificates it hands out again.
fn changed_in_place(c: &mut Consequences, name: &Name, old: &DeploymentSpec, new: &DeploymentSpec) -> bool {
    match change(old, new) {
        DeploymentChange::Generation => true,
        DeploymentChange::Scale {
            certificates_changed,
            added,
            removed,
            ..
        } => {
            for to in &added {
                if let Some(from) = removed.iter().find(|r| r.same_slot(to)) {
                    c.moved.push(crate::replacement::Move {
                        environment: name.clone(),
                        role: to.role.clone(),
                        index: to.index,
                        from: Some(from.node.clone()),
                        to: Some(to.node.clone()),
                        new_generation: false,
                        reason: None,
                    });
                }
            }
            c.certificates_changed
                .extend(certificates_changed.into_iter().map(|hostname| CertificateChange {
                    environment: name.clone(),
                    hostname,
                }));
            false
        }
        DeploymentChange::None => false,
    }
}

/// The replicas of `d` that wait, counted per role and reason.
fn unplaced(c: &mut Consequences, name: &Name, d: &Desired) {
    let mut by: BTreeMap<(&Name, &str), u32> = BTreeMap::new();
    for w in &d.waiting {
        *by.entry((&w.role, w.reason.as_str())).or_default() += 1;
    }
    c.unplaced.extend(
        by.into_iter()
            .map(|((role, reason), waiting)| crate::placement::Unplaced {
                environment: name.clone(),
                role: role.clone(),
                waiting,
                reason: reason.to_owned(),
            }),
    );
}

/// The roles each changed project added and removed.
fn role_changes(c: &mut Consequences, base: &State, head: &State, projects: &BTreeSet<&Name>) {
    for name in projects {
        let roles = |s: &State| {
            s.project(name.as_str())
                .map(|p| p.roles.keys().cloned().collect::<BTreeSet<_>>())
                .unwrap_or_default()
        };
        let (rb, rh) = (roles(base), roles(head));
        let project = (*name).clone();
        c.roles_added.extend(rh.difference(&rb).map(|r| RoleRef {
            project: project.clone(),
            role: r.clone(),
        }));
        c.roles_removed.extend(rb.difference(&rh).map(|r| RoleRef {
            project: project.clone(),
            role: r.clone(),
        }));
    }
}

/// The nodes each changed pool drains, retires or leaves out.
fn node_changes(c: &mut Consequences, base: &State, head: &State, changes: &[Changed<'_>]) {
    for ch in changes.iter().filter(|ch| ch.kind == Kind::NodePool) {
        let nodes = |s: &State| -> BTreeMap<Name, NodeState> {
            s.pools()
                .filter(|(n, _)| *n == ch.name)
                .flat_map(|(_, p)| p.nodes.iter().map(|n| (n.name.clone(), n.state)))
                .collect()
        };
        let (nb, nh) = (nodes(base), nodes(head));
        for (node, before) in &nb {
            match nh.get(node) {
                None => c.nodes_drained.push(NodeChange {
                    pool: ch.name.clone(),
                    node: node.clone(),
                    state: None,
                }),
                Some(after) if after != before && *after != NodeState::Active => c.nodes_drained.push(NodeChange {
                    pool: ch.name.clone(),
                    node: node.clone(),
                    state: Some(*after),
                }),
                _ => {}
            }
        }
    }
}

/// How rolling `old` out to `new` goes beyond a switch, by the decisions the daemon's steps
/// come from (`rollout::canary_of`, then `rolling::rolling_of`); `None` for a switch.
fn progressive(old: &DeploymentSpec, new: &DeploymentSpec) -> Option<Progressive> {
    let retired = std::slice::from_ref(old);
    let canary: Vec<u8> = crate::rollout::canary_of(new, retired)
        .0
        .iter()
        .map(|c| c.weight)
        .collect();
    let rolling: Vec<RollingRole> = match canary.is_empty() {
        false => Vec::new(),
        true => {
            let batches = crate::rolling::rolling_of(new, retired);
            crate::rolling::role_batches(new, &batches)
                .map(|(role, batch, batches)| RollingRole {
                    role: role.clone(),
                    batch,
                    batches,
                })
                .collect()
        }
    };
    (!canary.is_empty() || !rolling.is_empty()).then(|| Progressive {
        environment: new.environment.clone(),
        canary,
        rolling,
    })
}
