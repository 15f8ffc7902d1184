//! The planner: what changes between two desired states, object by object and field by
//! field, plus the consequences a reviewer cares about. Deterministic: the same two states give
//! the same plan, in the same order, on every run and machine.

use crate::canonical::{self, Secrets};
use crate::model::{Kind, NodeState, Spec};
use crate::state::{State, derive_environment};
use crate::values::{Hostname, Name};
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
pub struct Change {
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
    #[serde(skip)]
    pub diff: Vec<DiffLine>,
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
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub add: usize,
    pub change: usize,
    pub destroy: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Plan {
    pub summary: Summary,
    pub changes: Vec<Change>,
    pub consequences: Consequences,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// Computes the plan from `base` to `head`.
pub fn plan(base: &State, head: &State) -> Plan {
    let mut changes = Vec::new();
    let mut summary = Summary::default();
    let mut b = base.iter().peekable();
    let mut h = head.iter().peekable();
    loop {
        let order = match (b.peek(), h.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => (x.object.kind(), x.object.name()).cmp(&(y.object.kind(), y.object.name())),
        };
        let (before, after) = match order {
            std::cmp::Ordering::Less => (b.next(), None),
            std::cmp::Ordering::Greater => (None, h.next()),
            std::cmp::Ordering::Equal => {
                let (x, y) = (b.next(), h.next());
                // Unchanged objects (the common case) cost one comparison of typed values.
                if x.map(|l| &l.object) == y.map(|l| &l.object) {
                    continue;
                }
                (x, y)
            }
        };
        let Some(any) = after.or(before) else { break };
        let action = match (before, after) {
            (None, _) => Action::Create,
            (_, None) => Action::Delete,
            _ => Action::Update,
        };
        match action {
            Action::Create => summary.add += 1,
            Action::Update => summary.change += 1,
            Action::Delete => summary.destroy += 1,
        }
        let shown = |l: Option<&crate::parse::Located>| l.map(|l| canonical::document(&l.object, Secrets::Fingerprint));
        let hashed = |l: Option<&crate::parse::Located>| l.map(|l| canonical::hash(&canonical::document(&l.object, Secrets::Ciphertext)));
        let (old, new) = (shown(before), shown(after));
        changes.push(Change {
            kind: any.object.kind(),
            name: any.object.name().clone(),
            action,
            file: any.file.clone(),
            before_hash: hashed(before),
            after_hash: hashed(after),
            fields: field_changes(old.as_ref(), new.as_ref()),
            diff: diff_lines(old.as_ref(), new.as_ref()),
        });
    }
    let consequences = consequences(base, head, &changes);
    Plan { summary, changes, consequences }
}

fn flatten(v: &Value, path: &str, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                flatten(child, &p, out);
            }
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(|i| i.get("name").is_some_and(Value::is_string)) => {
            for item in items {
                let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
                flatten(item, &format!("{path}[{name}]"), out);
            }
        }
        leaf => {
            out.insert(path.to_owned(), leaf.clone());
        }
    }
}

fn field_changes(old: Option<&Value>, new: Option<&Value>) -> Vec<FieldChange> {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    if let Some(o) = old {
        flatten(o, "", &mut a);
    }
    if let Some(n) = new {
        flatten(n, "", &mut b);
    }
    let paths: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    paths
        .into_iter()
        .filter(|p| a.get(*p) != b.get(*p))
        .map(|p| FieldChange { path: p.clone(), before: a.get(p).cloned(), after: b.get(p).cloned() })
        .collect()
}

fn diff_lines(old: Option<&Value>, new: Option<&Value>) -> Vec<DiffLine> {
    let old_text = old.map(canonical::to_yaml).unwrap_or_default();
    let new_text = new.map(canonical::to_yaml).unwrap_or_default();
    let whole = |text: &str, tag| text.lines().map(|l| DiffLine { tag, text: l.to_owned() }).collect();
    if old.is_none() {
        return whole(&new_text, LineTag::Insert);
    }
    if new.is_none() {
        return whole(&old_text, LineTag::Delete);
    }
    let diff = TextDiff::from_lines(&old_text, &new_text);
    let mut out = Vec::new();
    for hunk in diff.unified_diff().context_radius(3).iter_hunks() {
        out.push(DiffLine { tag: LineTag::Hunk, text: hunk.header().to_string() });
        for change in hunk.iter_changes() {
            let tag = match change.tag() {
                ChangeTag::Equal => LineTag::Context,
                ChangeTag::Insert => LineTag::Insert,
                ChangeTag::Delete => LineTag::Delete,
            };
            out.push(DiffLine { tag, text: change.value().trim_end_matches('\n').to_owned() });
        }
    }
    out
}

/// Every hostname a state serves: derived environment names and domains.
fn hostnames(state: &State) -> BTreeSet<Hostname> {
    let mut out = BTreeSet::new();
    if let Some(repo) = state.repository() {
        for (name, env) in state.environments() {
            if let Ok(h) = crate::state::environment_hostname(repo, name, env) {
                out.insert(h);
            }
        }
    }
    out.extend(state.domains().map(|(_, d)| d.hostname.clone()));
    out
}

/// The inputs of an environment's release: a change here means a new generation.
fn release_hash(state: &State, name: &Name) -> Option<String> {
    let Spec::Environment(env) = &state.get(Kind::Environment, name.as_str())?.object.spec else { return None };
    let derived = derive_environment(state, name, env)?;
    let project = state.project(env.project.as_str())?;
    let roles: BTreeMap<&Name, Value> = project
        .roles
        .iter()
        .map(|(n, r)| {
            let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut v {
                m.remove("replicas");
            }
            (n, v)
        })
        .collect();
    let secrets: BTreeMap<&Name, Option<String>> = project
        .secrets
        .iter()
        .map(|s| (s, state.get(Kind::Secret, s.as_str()).map(|l| canonical::hash(&canonical::document(&l.object, Secrets::Ciphertext)))))
        .collect();
    let v = serde_json::json!({ "image": derived.image, "env": derived.env, "roles": roles, "secrets": secrets });
    Some(canonical::hash(&v))
}

fn consequences(base: &State, head: &State, changes: &[Change]) -> Consequences {
    let mut c = Consequences::default();
    if changes.is_empty() {
        return c;
    }
    let (hb, hh) = (hostnames(base), hostnames(head));
    c.hostnames_added = hh.difference(&hb).cloned().collect();
    c.hostnames_removed = hb.difference(&hh).cloned().collect();

    // Only environments whose own object or project (or a secret) changed can roll out or
    // rescale; looking only at those keeps a one-object change cheap in a large state.
    let changed_projects: BTreeSet<&Name> = changes.iter().filter(|ch| ch.kind == Kind::Project).map(|ch| &ch.name).collect();
    let secrets_changed = changes.iter().any(|ch| ch.kind == Kind::Secret);
    let changed_envs: BTreeSet<&Name> = changes.iter().filter(|ch| ch.kind == Kind::Environment).map(|ch| &ch.name).collect();
    for (name, env) in head.environments() {
        let touched = changed_envs.contains(name) || changed_projects.contains(&env.project) || secrets_changed;
        if !touched {
            continue;
        }
        let Some(Spec::Environment(old_env)) = base.get(Kind::Environment, name.as_str()).map(|l| &l.object.spec) else { continue };
        if let (Some(old), Some(new)) = (derive_environment(base, name, old_env), derive_environment(head, name, env)) {
            for (role, after) in &new.replicas {
                if let Some(before) = old.replicas.get(role) {
                    if before != after {
                        c.replicas_changed.push(ReplicaChange { environment: name.clone(), role: role.clone(), before: *before, after: *after });
                    }
                }
            }
        }
        if release_hash(base, name) != release_hash(head, name) {
            c.rollouts.push(name.clone());
        }
    }
    for name in &changed_projects {
        let roles = |s: &State| s.project(name.as_str()).map(|p| p.roles.keys().cloned().collect::<BTreeSet<_>>()).unwrap_or_default();
        let (rb, rh) = (roles(base), roles(head));
        let project = (*name).clone();
        c.roles_added.extend(rh.difference(&rb).map(|r| RoleRef { project: project.clone(), role: r.clone() }));
        c.roles_removed.extend(rb.difference(&rh).map(|r| RoleRef { project: project.clone(), role: r.clone() }));
    }
    for ch in changes.iter().filter(|ch| ch.kind == Kind::NodePool) {
        let nodes = |s: &State| -> BTreeMap<Name, NodeState> {
            s.pools().filter(|(n, _)| **n == ch.name).flat_map(|(_, p)| p.nodes.iter().map(|n| (n.name.clone(), n.state))).collect()
        };
        let (nb, nh) = (nodes(base), nodes(head));
        for (node, before) in &nb {
            match nh.get(node) {
                None => c.nodes_drained.push(NodeChange { pool: ch.name.clone(), node: node.clone(), state: None }),
                Some(after) if after != before && *after != NodeState::Active => {
                    c.nodes_drained.push(NodeChange { pool: ch.name.clone(), node: node.clone(), state: Some(*after) })
                }
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
