//! Canonical form: one value per object with defaults filled in and keys in a fixed order,
//! rendered as YAML by a small emitter of our own so the bytes never depend on a library's
//! formatting choices. Hashes are SHA-256 of the canonical JSON.

use crate::model::{API_VERSION, Object, Spec};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// What a canonical value shows of secret data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secrets {
    /// The armoured ciphertext, as stored (for hashing and round trips).
    Ciphertext,
    /// A fingerprint of the ciphertext only (for plans, diffs and `pl show`).
    Fingerprint,
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    // Every model type serialises to JSON: string keys, no non-finite floats.
    serde_json::to_value(v).expect("model types serialise to JSON")
}

/// The canonical document of an object: `apiVersion`, `kind`, `metadata`, `spec`.
pub fn document(obj: &Object, secrets: Secrets) -> Value {
    let spec = match &obj.spec {
        Spec::Repository(s) => to_value(s),
        Spec::NodePool(s) => to_value(s),
        Spec::Project(s) => to_value(s),
        Spec::Environment(s) => to_value(s),
        Spec::Domain(s) => to_value(s),
        Spec::Secret(s) => {
            let mut v = to_value(s);
            if secrets == Secrets::Fingerprint {
                let data: Map<String, Value> = s
                    .data
                    .iter()
                    .map(|(k, c)| (k.clone(), Value::String(format!("(encrypted {})", c.fingerprint()))))
                    .collect();
                v["data"] = Value::Object(data);
            }
            v
        }
    };
    json!({
        "apiVersion": API_VERSION,
        "kind": obj.kind().as_str(),
        "metadata": to_value(&obj.metadata),
        "spec": spec,
    })
}

/// Feeds serialised bytes straight into the hash, so hashing builds no buffer.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `sha256:<hex>` of a value's JSON bytes.
pub fn hash<T: serde::Serialize + ?Sized>(v: &T) -> String {
    let mut w = HashWriter(Sha256::new());
    serde_json::to_writer(&mut w, v).expect("model values always serialise to JSON");
    let d = w.0.finalize();
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    s.push_str(&hex::encode(d));
    s
}

/// Renders a value as block YAML, keys in the value's order.
pub fn to_yaml(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Object(m) if !m.is_empty() => emit_map(&mut out, m, 0),
        Value::Array(a) if !a.is_empty() => emit_seq(&mut out, a, 0),
        scalar => {
            out.push_str(&scalar_text(scalar, 0));
            out.push('\n');
        }
    }
    out
}

fn indent(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn is_collection(v: &Value) -> bool {
    matches!(v, Value::Object(m) if !m.is_empty()) || matches!(v, Value::Array(a) if !a.is_empty())
}

fn emit_map(out: &mut String, m: &Map<String, Value>, ind: usize) {
    let mut first = true;
    for (k, v) in m {
        if !first {
            indent(out, ind);
        }
        first = false;
        out.push_str(&string_text(k, ind));
        out.push(':');
        emit_value_after_key(out, v, ind);
    }
}

fn emit_value_after_key(out: &mut String, v: &Value, ind: usize) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            indent(out, ind + 2);
            emit_map(out, m, ind + 2);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            indent(out, ind + 2);
            emit_seq(out, a, ind + 2);
        }
        scalar => {
            out.push(' ');
            out.push_str(&scalar_text(scalar, ind + 2));
            out.push('\n');
        }
    }
}

fn emit_seq(out: &mut String, a: &[Value], ind: usize) {
    let mut first = true;
    for item in a {
        if !first {
            indent(out, ind);
        }
        first = false;
        out.push_str("- ");
        match item {
            Value::Object(m) if !m.is_empty() => emit_map(out, m, ind + 2),
            Value::Array(inner) if !inner.is_empty() => emit_seq(out, inner, ind + 2),
            scalar => {
                debug_assert!(!is_collection(scalar));
                out.push_str(&scalar_text(scalar, ind + 2));
                out.push('\n');
            }
        }
    }
}

fn scalar_text(v: &Value, ind: usize) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string_text(s, ind),
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
    }
}

/// A string plain when YAML would read it back as the same string, a literal block for
/// multi-line text, double-quoted (JSON escapes are valid YAML) otherwise.
fn string_text(s: &str, ind: usize) -> String {
    if plain_safe(s) {
        return s.to_owned();
    }
    if literal_safe(s) {
        let (body, chomp) = match s.strip_suffix('\n') {
            Some(b) => (b, ""),
            None => (s, "-"),
        };
        let mut out = format!("|{chomp}");
        for line in body.split('\n') {
            out.push('\n');
            if !line.is_empty() {
                indent(&mut out, ind);
                out.push_str(line);
            }
        }
        return out;
    }
    serde_json::to_string(s).expect("strings always serialise")
}

fn plain_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if "-?:,[]{}#&*!|>'\"%@`~ \t".contains(first) && !(first == '-' && s.len() > 1 && !s[1..].starts_with(' ')) {
        return false;
    }
    if s.ends_with([' ', ':', '\t']) || s.contains(": ") || s.contains(" #") || s.contains(['\n', '\r', '\t']) {
        return false;
    }
    if s.chars().any(|c| c.is_control() || c == '\u{feff}') {
        return false;
    }
    if s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    // Flow indicators are harmless in block context but confuse readers; quote them.
    !s.contains([',', '[', ']', '{', '}']) && matches!(crate::yaml::resolve_plain(s), crate::yaml::Value::Str(_))
}

fn literal_safe(s: &str) -> bool {
    s.contains('\n')
        && !s.starts_with([' ', '\n'])
        && !s.ends_with("\n\n")
        && !s.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{feff}')
        && !s.split('\n').any(|l| l.ends_with(' '))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml;

    /// The string YAML reads back from the emitted document, or a description of what else.
    fn roundtrip(s: &str) -> Result<String, String> {
        let doc = to_yaml(&json!({ "k": s }));
        let nodes = yaml::load_str(&doc).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let yaml::Value::Map(m) = &nodes[0].value else {
            panic!("map")
        };
        match &m[0].1.value {
            yaml::Value::Str(v) => Ok(v.to_string()),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn strings_read_back_as_written() {
        for s in [
            "plain",
            "true",
            "no",
            "1",
            "1.5",
            "",
            " lead",
            "trail ",
            "a: b",
            "a #b",
            "#x",
            "-",
            "- x",
            "-x",
            "null",
            "~",
            "line1\nline2\n",
            "line1\nline2",
            "x\n\n",
            "quote\"s",
            "tab\there",
            "é",
            "[x]",
            "{x}",
            "*a",
            "&a",
            "!t",
            "%p",
            "@a",
            "`b",
            "a,b",
            "---",
            "...",
            "0o17",
            "/healthz",
            "*/15 * * * *",
            "ghcr.io/a/b@sha256:00",
        ] {
            assert_eq!(roundtrip(s), Ok(s.to_owned()), "{s:?}");
        }
    }

    #[test]
    fn nested_layout() {
        let v = json!({"a": {"b": [1, {"c": "d", "e": []}], "f": {}}, "g": null});
        assert_eq!(
            to_yaml(&v),
            "a:\n  b:\n    - 1\n    - c: d\n      e: []\n  f: {}\ng: null\n"
        );
    }
}
