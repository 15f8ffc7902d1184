//! Helpers for decoding spanned YAML into typed values while collecting every problem.
//!
//! A decoder returns `None` after reporting; callers decode every field before combining the
//! results, so one run reports all problems of a document, not the first.

use crate::diag::{Code, Diagnostic, Pos};
use crate::values::Invalid;
use crate::values::SmallMap;
use crate::yaml::{Node, Value};

/// Where diagnostics for one file go.
pub(crate) struct Ctx<'a> {
    pub file: &'a str,
    pub diags: &'a mut Vec<Diagnostic>,
}

impl Ctx<'_> {
    pub fn error(&mut self, code: Code, pos: Pos, message: impl Into<String>) {
        self.diags.push(Diagnostic::error(code, self.file, Some(pos), message));
    }

    pub fn error_hint(&mut self, code: Code, pos: Pos, message: impl Into<String>, hint: impl Into<String>) {
        self.diags
            .push(Diagnostic::error(code, self.file, Some(pos), message).with_hint(hint));
    }

    pub fn invalid(&mut self, code: Code, pos: Pos, inv: Invalid) {
        let d = Diagnostic::error(code, self.file, Some(pos), inv.message);
        self.diags.push(match inv.hint {
            Some(h) => d.with_hint(h),
            None => d,
        });
    }

    pub fn wrong_type(&mut self, node: &Node<'_>, what: &str, expected: &str) {
        let hint = match (&node.value, expected) {
            (Value::Str(s), "an integer") if s.trim().parse::<i64>().is_ok() => Some("remove the quotes".to_owned()),
            (Value::Str(s), "a boolean") if matches!(s.as_ref(), "yes" | "no" | "on" | "off" | "y" | "n") => {
                Some("write `true` or `false`".to_owned())
            }
            (Value::Int(_) | Value::Float(_) | Value::Bool(_), "a string") => Some("quote the value".to_owned()),
            _ => None,
        };
        let msg = format!("{what} must be {expected}, found {}", node.value.type_name());
        match hint {
            Some(h) => self.error_hint(Code::WrongType, node.pos, msg, h),
            None => self.error(Code::WrongType, node.pos, msg),
        }
    }
}

/// Normalises a field name for "did you mean": case, `_` and `-` do not matter.
fn fold(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The known name closest to `given`, if one is close enough to be a likely typo.
pub(crate) fn did_you_mean<'k>(given: &str, known: &[&'k str]) -> Option<&'k str> {
    let g = fold(given);
    if let Some(k) = known.iter().find(|k| fold(k) == g) {
        return Some(k);
    }
    if g.len() >= 3
        && let Some(k) = known.iter().find(|k| fold(k).starts_with(&g))
    {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (levenshtein(&g, &fold(k)), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4) && *d < k.len())
        .min()
        .map(|(_, k)| k)
}

/// The fields of one mapping, checked against the names a kind allows.
pub(crate) struct Fields<'n> {
    entries: Vec<(&'n str, &'n Node<'n>)>,
    pub pos: Pos,
}

impl<'n> Fields<'n> {
    /// Reports a non-mapping, non-string keys, duplicate keys and unknown fields, then gives
    /// access to the known ones.
    pub fn new(ctx: &mut Ctx<'_>, node: &'n Node<'n>, what: &str, known: &[&str]) -> Option<Self> {
        let Value::Map(map) = &node.value else {
            ctx.wrong_type(node, what, "a mapping");
            return None;
        };
        let mut entries: Vec<(&'n str, &'n Node<'n>)> = Vec::with_capacity(map.len());
        for (k, v) in map {
            let Value::Str(key) = &k.value else {
                ctx.wrong_type(k, &format!("a key of {what}"), "a string");
                continue;
            };
            if entries.iter().any(|(e, _)| *e == key.as_ref()) {
                ctx.error(Code::DuplicateKey, k.pos, format!("`{key}` appears twice in {what}"));
                continue;
            }
            if !known.contains(&key.as_ref()) {
                let msg = format!("unknown field `{key}` in {what}");
                if key.as_ref() == "<<" {
                    ctx.error_hint(
                        Code::UnknownField,
                        k.pos,
                        msg,
                        "YAML merge keys are not supported; repeat the fields or use an alias for the whole value",
                    );
                } else if let Some(s) = did_you_mean(key.as_ref(), known) {
                    ctx.error_hint(Code::UnknownField, k.pos, msg, format!("did you mean `{s}`?"));
                } else {
                    ctx.error_hint(
                        Code::UnknownField,
                        k.pos,
                        msg,
                        format!("known fields: {}", known.join(", ")),
                    );
                }
                continue;
            }
            entries.push((key.as_ref(), v));
        }
        Some(Fields { entries, pos: node.pos })
    }

    /// The value of a field, `None` when absent. A null value counts as absent.
    pub fn get(&self, name: &str) -> Option<&'n Node<'n>> {
        self.entries
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .filter(|v| v.value != Value::Null)
    }

    /// The value of a required field; reports `missing-field` when absent.
    pub fn require(&self, ctx: &mut Ctx<'_>, name: &str, what: &str) -> Option<&'n Node<'n>> {
        let v = self.get(name);
        if v.is_none() {
            ctx.error(Code::MissingField, self.pos, format!("{what} needs `{name}`"));
        }
        v
    }
}

pub(crate) fn string<'n>(ctx: &mut Ctx<'_>, node: &'n Node<'_>, what: &str) -> Option<&'n str> {
    match &node.value {
        Value::Str(s) => Some(s.as_ref()),
        _ => {
            ctx.wrong_type(node, what, "a string");
            None
        }
    }
}

pub(crate) fn boolean(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<bool> {
    match &node.value {
        Value::Bool(b) => Some(*b),
        _ => {
            ctx.wrong_type(node, what, "a boolean");
            None
        }
    }
}

/// An integer within `lo..=hi`.
pub(crate) fn int_in(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str, lo: i64, hi: i64) -> Option<i64> {
    match &node.value {
        Value::Int(v) if (lo..=hi).contains(v) => Some(*v),
        Value::Int(v) => {
            ctx.error(
                Code::OutOfRange,
                node.pos,
                format!("{what} is {v}; it must be {lo}-{hi}"),
            );
            None
        }
        _ => {
            ctx.wrong_type(node, what, "an integer");
            None
        }
    }
}

pub(crate) fn u32_in(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str, lo: u32, hi: u32) -> Option<u32> {
    int_in(ctx, node, what, i64::from(lo), i64::from(hi)).and_then(|v| u32::try_from(v).ok())
}

/// One of a fixed set of strings.
pub(crate) fn one_of<T: Copy>(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str, options: &[(&str, T)]) -> Option<T> {
    let s = string(ctx, node, what)?;
    if let Some((_, v)) = options.iter().find(|(k, _)| *k == s) {
        return Some(*v);
    }
    let names: Vec<&str> = options.iter().map(|(k, _)| *k).collect();
    let msg = format!("{what} is `{s}`; it must be one of {}", names.join(", "));
    match did_you_mean(s, &names) {
        Some(m) => ctx.error_hint(Code::InvalidValue, node.pos, msg, format!("did you mean `{m}`?")),
        None => ctx.error(Code::InvalidValue, node.pos, msg),
    }
    None
}

pub(crate) fn seq<'n, 'a>(ctx: &mut Ctx<'_>, node: &'n Node<'a>, what: &str) -> Option<&'n [Node<'a>]> {
    match &node.value {
        Value::Seq(items) => Some(items),
        _ => {
            ctx.wrong_type(node, what, "a sequence");
            None
        }
    }
}

/// A sequence of strings; all items are checked.
pub(crate) fn strings(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Vec<String>> {
    let items = seq(ctx, node, what)?;
    let mut out = Some(Vec::with_capacity(items.len()));
    for item in items {
        match (string(ctx, item, &format!("an item of {what}")), out.as_mut()) {
            (Some(s), Some(v)) => v.push(s.to_owned()),
            _ => out = None,
        }
    }
    out
}

/// A mapping of string keys to values decoded by `each`; every entry is checked.
pub(crate) fn map_of<T>(
    ctx: &mut Ctx<'_>,
    node: &Node<'_>,
    what: &str,
    mut each: impl FnMut(&mut Ctx<'_>, &Node<'_>, &str) -> Option<T>,
) -> Option<SmallMap<String, T>> {
    let Value::Map(map) = &node.value else {
        ctx.wrong_type(node, what, "a mapping");
        return None;
    };
    let mut out = Some(SmallMap::new());
    for (k, v) in map {
        let Value::Str(key) = &k.value else {
            ctx.wrong_type(k, &format!("a key of {what}"), "a string");
            out = None;
            continue;
        };
        if out.as_ref().is_some_and(|o| o.contains_key(key.as_ref())) {
            ctx.error(Code::DuplicateKey, k.pos, format!("`{key}` appears twice in {what}"));
            out = None;
            continue;
        }
        match (each(ctx, v, key), out.as_mut()) {
            (Some(val), Some(o)) => {
                o.insert(key.to_string(), val);
            }
            _ => out = None,
        }
    }
    out
}

/// Runs a validating constructor, reporting its refusal with `code`.
pub(crate) fn checked<T>(
    ctx: &mut Ctx<'_>,
    node: &Node<'_>,
    what: &str,
    code: Code,
    make: impl FnOnce(&str) -> Result<T, Invalid>,
) -> Option<T> {
    let s = string(ctx, node, what)?;
    match make(s) {
        Ok(v) => Some(v),
        Err(inv) => {
            ctx.invalid(code, node.pos, inv);
            None
        }
    }
}

/// A CPU quantity may be written as a bare number of cores (`cpu: 2`) as well as a string.
pub(crate) fn quantity_text(node: &Node<'_>) -> Option<String> {
    match &node.value {
        Value::Str(s) => Some(s.to_string()),
        Value::Int(i) => Some(i.to_string()),
        Value::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions() {
        let known = ["replicas", "image", "baseDomain", "env"];
        assert_eq!(did_you_mean("replica", &known), Some("replicas"));
        assert_eq!(did_you_mean("base_domain", &known), Some("baseDomain"));
        assert_eq!(did_you_mean("imgae", &known), Some("image"));
        assert_eq!(did_you_mean("zzzzzzzz", &known), None);
        assert_eq!(did_you_mean("x", &known), None);
    }
}
