//! The planner: what changes between two desired states, object by object and field by
//! field, plus the consequences a reviewer cares about. Deterministic: the same two states give
//! the same plan, in the same order, on every run and machine.

use crate::canonical::{self, Secrets};
use crate::desired::Desired;
use crate::model::{Kind, NodeState, Spec};
use crate::parse::Located;
use crate::release::{Change as DeploymentChange, Releases, change};
use crate::state::State;
use crate::values::{Hostname, Name};
use rayon::prelude::*;
use serde::Serialize;
use serde_json::Value;
use similar::{ChangeTag, TextDiff};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Create,
    Update,
    Delete,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
        }
    }
}

/// One leaf that differs, by dotted path (`spec.roles.web.replicas`; list items that have a
/// `name` are addressed by it: `spec.nodes[n1].state`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FieldChange {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LineTag {
    Hunk,
    Context,
    Insert,
    Delete,
}

/// One line of a unified diff of the canonical YAML (without its newline).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffLine {
    pub tag: LineTag,
    pub text: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change<'a> {
    pub kind: Kind,
    pub name: Name,
    pub action: Action,
    /// The file that defines the object (in head, or in base for a deletion).
    pub file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_hash: Option<String>,
    pub fields: Vec<FieldChange>,
    /// The objects on each side, for [`Change::diff`].
    #[serde(skip)]
    pub before: Option<&'a Located>,
    #[serde(skip)]
    pub after: Option<&'a Located>,
}

impl Change<'_> {
    /// The unified diff of the canonical YAML (secret values fingerprinted), computed on
    /// demand: machine output does not need it, and at ten thousand changes it would be most
    /// of a plan's time and memory.
    pub fn diff(&self) -> Vec<DiffLine> {
        let shown = |l: Option<&Located>| l.map(|l| canonical::document(&l.object, Secrets::Fingerprint));
        // A secret's change is shown whole, so its recipients are always on screen next to
        // the fingerprints of what changed; secrets are small.
        let context = if self.kind == Kind::Secret { usize::MAX / 2 } else { 3 };
        diff_lines(shown(self.before).as_ref(), shown(self.after).as_ref(), context)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ReplicaChange {
    pub environment: Name,
    pub role: Name,
    pub before: u32,
    pub after: u32,
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
    /// With a live fleet (`pl plan --fleet`): the replicas re-placement would move on it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replacements: Vec<crate::replacement::Move>,
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
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub add: usize,
    pub change: usize,
    pub destroy: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Plan<'a> {
    pub summary: Summary,
    pub changes: Vec<Change<'a>>,
    pub consequences: Consequences,
}

impl Plan<'_> {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
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

/// Computes the plan from `base` to `head`, two whole states.
pub fn plan<'a>(base: &'a State, head: &'a State) -> Plan<'a> {
    plan_scoped(base, head, Scope::Full)
}

/// Computes the plan from `base` to `head` as `scope` says they are.
pub fn plan_scoped<'a>(base: &'a State, head: &'a State, scope: Scope) -> Plan<'a> {
    // First pair the objects (a merge of two sorted lists), then describe each pair; the
    // descriptions are independent, so they run in parallel and are collected in order.
    let mut pairs: Vec<(Option<&'a Located>, Option<&'a Located>)> = Vec::new();
    let mut b = base.iter().peekable();
    let mut h = head.iter().peekable();
    loop {
        let order = match (b.peek(), h.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => (x.object.kind(), x.object.name()).cmp(&(y.object.kind(), y.object.name())),
        };
        match order {
            std::cmp::Ordering::Less => pairs.push((b.next(), None)),
            std::cmp::Ordering::Greater => pairs.push((None, h.next())),
            std::cmp::Ordering::Equal => {
                let (x, y) = (b.next(), h.next());
                // Unchanged objects (the common case) cost one comparison of typed values.
                if x.map(|l| &l.object) != y.map(|l| &l.object) {
                    pairs.push((x, y));
                }
            }
        }
    }
    let changes: Vec<Change<'a>> = pairs
        .par_iter()
        .filter_map(|(before, after)| describe(*before, *after))
        .collect();
    let mut summary = Summary::default();
    for c in &changes {
        match c.action {
            Action::Create => summary.add += 1,
            Action::Update => summary.change += 1,
            Action::Delete => summary.destroy += 1,
        }
    }
    let consequences = consequences(base, head, &changes, scope);
    Plan {
        summary,
        changes,
        consequences,
    }
}

/// One changed object: its action, hashes and field-level changes.
fn describe<'a>(before: Option<&'a Located>, after: Option<&'a Located>) -> Option<Change<'a>> {
    let any = after.or(before)?;
    let action = match (before, after) {
        (None, _) => Action::Create,
        (_, None) => Action::Delete,
        _ => Action::Update,
    };
    let (old, before_hash) = shown_and_hash(before);
    let (new, after_hash) = shown_and_hash(after);
    Some(Change {
        kind: any.object.kind(),
        name: any.object.name().clone(),
        action,
        file: any.file.clone(),
        before_hash,
        after_hash,
        fields: field_changes(old.as_ref(), new.as_ref()),
        before,
        after,
    })
}

/// The displayed document and the hash of the stored one (they differ only for secrets).
fn shown_and_hash(loc: Option<&Located>) -> (Option<Value>, Option<String>) {
    let Some(loc) = loc else { return (None, None) };
    let shown = canonical::document(&loc.object, Secrets::Fingerprint);
    let hash = if loc.object.kind() == Kind::Secret {
        canonical::hash(&canonical::document(&loc.object, Secrets::Ciphertext))
    } else {
        canonical::hash(&shown)
    };
    (Some(shown), Some(hash))
}

/// True when a list is addressed item by item through its items' `name`s.
fn named_items(items: &[Value]) -> bool {
    !items.is_empty() && items.iter().all(|i| i.get("name").is_some_and(Value::is_string))
}

fn item_name(v: &Value) -> &str {
    v.get("name").and_then(Value::as_str).unwrap_or_default()
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Every leaf under `v`, for the side of a field diff where the other side is absent.
fn leaves(v: &Value, path: String, before: bool, out: &mut Vec<FieldChange>) {
    match v {
        Value::Object(m) if !m.is_empty() => m.iter().for_each(|(k, c)| leaves(c, join(&path, k), before, out)),
        Value::Array(items) if named_items(items) => items
            .iter()
            .for_each(|i| leaves(i, format!("{path}[{}]", item_name(i)), before, out)),
        leaf => {
            let (b, a) = if before {
                (Some(leaf.clone()), None)
            } else {
                (None, Some(leaf.clone()))
            };
            out.push(FieldChange {
                path,
                before: b,
                after: a,
            });
        }
    }
}

/// Walks two values together and records the leaves that differ; equal subtrees are skipped
/// without building paths for them.
fn diff_values(a: &Value, b: &Value, path: String, out: &mut Vec<FieldChange>) {
    if a == b {
        return;
    }
    match (a, b) {
        (Value::Object(ma), Value::Object(mb)) if !ma.is_empty() && !mb.is_empty() => {
            let keys: BTreeSet<&String> = ma.keys().chain(mb.keys()).collect();
            for k in keys {
                match (ma.get(k), mb.get(k)) {
                    (Some(x), Some(y)) => diff_values(x, y, join(&path, k), out),
                    (Some(x), None) => leaves(x, join(&path, k), true, out),
                    (None, Some(y)) => leaves(y, join(&path, k), false, out),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(ia), Value::Array(ib)) if named_items(ia) && named_items(ib) => {
            let by_name = |items: &'_ [Value]| -> BTreeMap<String, usize> {
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (item_name(v).to_owned(), i))
                    .collect()
            };
            let (na, nb) = (by_name(ia), by_name(ib));
            let names: BTreeSet<&String> = na.keys().chain(nb.keys()).collect();
            for n in names {
                let p = format!("{path}[{n}]");
                match (na.get(n).map(|i| &ia[*i]), nb.get(n).map(|i| &ib[*i])) {
                    (Some(x), Some(y)) => diff_values(x, y, p, out),
                    (Some(x), None) => leaves(x, p, true, out),
                    (None, Some(y)) => leaves(y, p, false, out),
                    (None, None) => {}
                }
            }
        }
        _ => out.push(FieldChange {
            path,
            before: Some(a.clone()),
            after: Some(b.clone()),
        }),
    }
}

fn field_changes(old: Option<&Value>, new: Option<&Value>) -> Vec<FieldChange> {
    let mut out = Vec::new();
    match (old, new) {
        (Some(a), Some(b)) => diff_values(a, b, String::new(), &mut out),
        (Some(a), None) => leaves(a, String::new(), true, &mut out),
        (None, Some(b)) => leaves(b, String::new(), false, &mut out),
        (None, None) => {}
    }
    // Paths sort the same whichever branch produced them.
    out.sort_by(|x, y| x.path.cmp(&y.path));
    out
}

fn diff_lines(old: Option<&Value>, new: Option<&Value>, context: usize) -> Vec<DiffLine> {
    let old_text = old.map(canonical::to_yaml).unwrap_or_default();
    let new_text = new.map(canonical::to_yaml).unwrap_or_default();
    let whole = |text: &str, tag| {
        text.lines()
            .map(|l| DiffLine {
                tag,
                text: l.to_owned(),
            })
            .collect()
    };
    if old.is_none() {
        return whole(&new_text, LineTag::Insert);
    }
    if new.is_none() {
        return whole(&old_text, LineTag::Delete);
    }
    let diff = TextDiff::from_lines(&old_text, &new_text);
    let mut out = Vec::new();
    for hunk in diff.unified_diff().context_radius(context).iter_hunks() {
        out.push(DiffLine {
            tag: LineTag::Hunk,
            text: hunk.header().to_string(),
        });
        for change in hunk.iter_changes() {
            let tag = match change.tag() {
                ChangeTag::Equal => LineTag::Context,
                ChangeTag::Insert => LineTag::Insert,
                ChangeTag::Delete => LineTag::Delete,
            };
            out.push(DiffLine {
                tag,
                text: change.value().trim_end_matches('\n').to_owned(),
            });
        }
    }
    out
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
fn hostname_changes(base: &State, head: &State, changes: &[Change<'_>]) -> (Vec<Hostname>, Vec<Hostname>) {
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
        .map(|c| (c.kind, &c.name))
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

fn consequences(base: &State, head: &State, changes: &[Change<'_>], scope: Scope) -> Consequences {
    let mut c = Consequences::default();
    if changes.is_empty() {
        return c;
    }
    (c.hostnames_added, c.hostnames_removed) = hostname_changes(base, head, changes);

    // Only environments whose own object or project (or a secret) changed can roll out or
    // rescale; looking only at those keeps a one-object change cheap in a large state.
    let changed_projects: BTreeSet<&Name> = changes
        .iter()
        .filter(|ch| ch.kind == Kind::Project)
        .map(|ch| &ch.name)
        .collect();
    let secrets_changed = changes.iter().any(|ch| ch.kind == Kind::Secret);
    // Placement comes from pools, hostnames from the Repository and Domains: a change to any of
    // them can move an environment to a new generation too.
    let changed_pools: BTreeSet<&Name> = changes
        .iter()
        .filter(|ch| ch.kind == Kind::NodePool)
        .map(|ch| &ch.name)
        .collect();
    let everything = changes
        .iter()
        .any(|ch| matches!(ch.kind, Kind::Repository | Kind::Domain));
    let changed_envs: BTreeSet<&Name> = changes
        .iter()
        .filter(|ch| ch.kind == Kind::Environment)
        .map(|ch| &ch.name)
        .collect();
    let (mut releases_base, mut releases_head) = (Releases::new(base), Releases::new(head));
    // Placement is shared by every environment of a pool, so both sides are placed whole
    // (once, and only when some environment is touched), as the reconciler places them.
    let mut placed: Option<(BTreeMap<Name, Desired>, BTreeMap<Name, Desired>)> = None;
    for (name, env) in head.environments() {
        let touched = changed_envs.contains(name)
            || changed_projects.contains(&env.project)
            || changed_pools.contains(&env.pool)
            || secrets_changed
            || everything;
        if !touched {
            continue;
        }
        let Some(Spec::Environment(old_env)) = base.get(Kind::Environment, name.as_str()).map(|l| &l.object.spec)
        else {
            continue;
        };
        if scope == Scope::Local {
            // A local change keeps the project, the overridden roles and the variables, so
            // the overrides are the effective values and only an image override can release.
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
            continue;
        }
        if let (Some(old), Some(new)) = (effective_replicas(base, old_env), effective_replicas(head, env)) {
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
                (Some(a), Some(b)) => change(&a.spec, &b.spec) == DeploymentChange::Generation,
                _ => false,
            }
        };
        if rollout {
            c.rollouts.push(name.clone());
        }
    }
    for name in &changed_projects {
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
    for ch in changes.iter().filter(|ch| ch.kind == Kind::NodePool) {
        let nodes = |s: &State| -> BTreeMap<Name, NodeState> {
            s.pools()
                .filter(|(n, _)| **n == ch.name)
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
    c.replicas_changed.sort();
    c.roles_added.sort();
    c.roles_removed.sort();
    c.nodes_drained.sort();
    c
}
