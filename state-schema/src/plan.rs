//! The planner: what changes between two desired states, object by object and field by
//! field, plus the consequences a reviewer cares about (computed in `consequences.rs`). Deterministic: the same two states give
//! the same plan, in the same order, on every run and machine.

use crate::canonical::{self, Secrets};
pub use crate::consequences::{Consequences, NodeChange, Progressive, ReplicaChange, RoleRef, RollingRole, Scope};
use crate::model::Kind;
use crate::parse::Located;
use crate::state::State;
use crate::values::Name;
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
    let changed: Vec<crate::consequences::Changed<'_>> = changes
        .iter()
        .map(|c| crate::consequences::Changed {
            kind: c.kind,
            name: &c.name,
        })
        .collect();
    let consequences = crate::consequences::consequences(base, head, &changed, scope);
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
