//! Reading a file into objects: YAML documents with positions, each decoded (its spec by
//! `kinds.rs`) and located.

use crate::decode::{self, Ctx, Fields, string};
use crate::diag::{Code, Diagnostic, Pos};
pub use crate::kinds::*;
use crate::kinds::{
    decode_domain, decode_environment, decode_metadata, decode_pool, decode_project, decode_repository, decode_secret,
};
use crate::model::*;
use crate::values::Name;
use crate::yaml::{self, Node};
use std::borrow::Cow;

pub const DOCUMENT_FIELDS: &[&str] = &["apiVersion", "kind", "metadata", "spec"];

/// An object and where its document starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Located {
    pub file: String,
    pub pos: Pos,
    pub object: Object,
    /// Where the fields that other checks point at are (`spec.project`, `spec.replicas.web`),
    /// so cross-object problems get a precise line and column.
    pub positions: Vec<(Cow<'static, str>, Pos)>,
}

impl Located {
    /// The position of a recorded field, or of the document when it was not recorded.
    pub fn pos_of(&self, path: &str) -> Pos {
        self.positions
            .iter()
            .find(|(p, _)| p == path)
            .map_or(self.pos, |(_, pos)| *pos)
    }
}

fn entry<'n, 'a>(node: &'n Node<'a>, key: &str) -> Option<&'n Node<'a>> {
    match &node.value {
        yaml::Value::Map(m) => m
            .iter()
            .find(|(k, _)| matches!(&k.value, yaml::Value::Str(s) if s == key))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// Records the positions of the fields that cross-object checks refer to.
fn record_positions(doc: &Node<'_>) -> Vec<(Cow<'static, str>, Pos)> {
    let mut out = Vec::new();
    if let Some(n) = entry(doc, "metadata").and_then(|m| entry(m, "name")) {
        out.push((Cow::Borrowed("metadata.name"), n.pos));
    }
    let Some(spec) = entry(doc, "spec") else {
        return out;
    };
    for (key, path) in [
        ("image", "spec.image"),
        ("project", "spec.project"),
        ("pool", "spec.pool"),
        ("environment", "spec.environment"),
        ("hostname", "spec.hostname"),
        ("baseDomain", "spec.baseDomain"),
        ("previewDomain", "spec.previewDomain"),
    ] {
        if let Some(n) = entry(spec, key) {
            out.push((Cow::Borrowed(path), n.pos));
        }
    }
    if let Some(n) = entry(spec, "tls").and_then(|t| entry(t, "secret")) {
        out.push((Cow::Borrowed("spec.tls.secret"), n.pos));
    }
    if let Some(n) = entry(spec, "backups").and_then(|t| entry(t, "secret")) {
        out.push((Cow::Borrowed("spec.backups.secret"), n.pos));
    }
    if let Some(n) = entry(spec, "previews").and_then(|p| entry(p, "pool")) {
        out.push((Cow::Borrowed("spec.previews.pool"), n.pos));
    }
    if let Some(yaml::Value::Map(m)) = entry(spec, "replicas").map(|n| &n.value) {
        for (k, _) in m {
            if let yaml::Value::Str(role) = &k.value {
                out.push((Cow::Owned(format!("spec.replicas.{role}")), k.pos));
            }
        }
    }
    // Each volume's name, for the check that one role mounts it.
    if let Some(yaml::Value::Map(roles)) = entry(spec, "roles").map(|n| &n.value) {
        for (k, role) in roles {
            let (yaml::Value::Str(r), Some(yaml::Value::Seq(items))) =
                (&k.value, entry(role, "volumes").map(|n| &n.value))
            else {
                continue;
            };
            for item in items {
                if let Some(
                    n @ &Node {
                        value: yaml::Value::Str(ref name),
                        ..
                    },
                ) = entry(item, "name")
                {
                    out.push((Cow::Owned(format!("spec.roles.{r}.volumes.{name}")), n.pos));
                }
            }
        }
    }
    if let Some(yaml::Value::Seq(items)) = entry(spec, "secrets").map(|n| &n.value) {
        for item in items {
            if let yaml::Value::Str(name) = &item.value {
                out.push((Cow::Owned(format!("spec.secrets.{name}")), item.pos));
            }
        }
    }
    if let Some(yaml::Value::Seq(items)) = entry(spec, "nodes").map(|n| &n.value) {
        for item in items {
            if let Some(
                n @ &Node {
                    value: yaml::Value::Str(ref name),
                    ..
                },
            ) = entry(item, "name")
            {
                out.push((Cow::Owned(format!("spec.nodes.{name}")), n.pos));
                if let Some(a) = entry(item, "address") {
                    out.push((Cow::Owned(format!("spec.nodes.{name}.address")), a.pos));
                }
            }
        }
    }
    out
}

/// The result of reading one file: the objects that decoded cleanly and every problem found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedFile {
    pub path: String,
    pub objects: Vec<Located>,
    /// Kinds and names of documents whose metadata decoded but whose spec did not: they are
    /// reported already, and must not make references to them look dangling.
    pub declared: Vec<(Kind, Name)>,
    pub diagnostics: Vec<Diagnostic>,
    /// A signature file's digest and armored signatures, each with the line it starts on
    /// (`crate::image_signatures`).
    pub signatures: Option<(String, Vec<(u32, String)>)>,
}

/// Reads one state file. Pure and independent of every other file, so callers may run it in
/// parallel and reuse the result for an unchanged blob.
pub fn parse_file(path: &str, bytes: &[u8]) -> ParsedFile {
    if crate::image_signatures::is_signature_path(path) {
        let mut out = ParsedFile {
            path: path.to_owned(),
            ..ParsedFile::default()
        };
        match crate::image_signatures::read_signature_file(path, bytes) {
            Ok(found) => out.signatures = Some(found),
            Err(problem) => out.diagnostics.push(problem),
        }
        return out;
    }
    let mut out = ParsedFile {
        path: path.to_owned(),
        ..ParsedFile::default()
    };
    let docs = match yaml::load_bytes(bytes) {
        Ok(d) => d,
        Err(e) => {
            let text = std::str::from_utf8(bytes).ok();
            let diagnostic = match (e.code, text) {
                // In our words, where the mistake is (the scanner notices later, in its own).
                (Code::YamlSyntax, Some(text)) => {
                    let at = e.pos.unwrap_or(Pos { line: 1, column: 1 });
                    let x = crate::yaml_errors::explain(text, at, &e.message);
                    Diagnostic::error(e.code, path, Some(x.pos), x.message).with_hint(x.hint)
                }
                _ => Diagnostic::error(e.code, path, e.pos, e.message),
            };
            out.diagnostics.push(diagnostic);
            // What the file seems to declare is not reported missing elsewhere: one error for
            // a file that did not load, not a cascade of dangling references.
            out.declared = text.map(crate::yaml_errors::declared_in_broken).unwrap_or_default();
            return out;
        }
    };
    // Sized to the documents: a Vec's first push would reserve four objects, and a state
    // tree is mostly files of one (at 20,000 files that was 18 MB of empty slots).
    out.objects.reserve_exact(docs.len());
    let mut ctx = Ctx {
        file: path,
        diags: &mut out.diagnostics,
    };
    for doc in &docs {
        if let Some(object) = decode_document(&mut ctx, doc, &mut out.declared) {
            out.objects.push(Located {
                file: path.to_owned(),
                pos: doc.pos,
                object,
                positions: record_positions(doc),
            });
        }
    }
    out
}

fn decode_document(ctx: &mut Ctx<'_>, doc: &Node, declared: &mut Vec<(Kind, Name)>) -> Option<Object> {
    let f = Fields::new(ctx, doc, "a document", DOCUMENT_FIELDS)?;
    let api = f
        .require(ctx, "apiVersion", "a document")
        .and_then(|n| string(ctx, n, "`apiVersion`").map(|s| (n, s)));
    if let Some((n, s)) = api
        && s != API_VERSION
    {
        ctx.error_hint(
            Code::UnknownApiVersion,
            n.pos,
            format!("apiVersion `{s}` is not supported"),
            format!("use `{API_VERSION}`"),
        );
        return None;
    }
    let kind_node = f.require(ctx, "kind", "a document")?;
    let kind_str = string(ctx, kind_node, "`kind`")?;
    let Some(kind) = Kind::parse(kind_str) else {
        let names: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        let hint = decode::did_you_mean(kind_str, &names).map_or_else(
            || format!("kinds: {}", names.join(", ")),
            |m| format!("did you mean `{m}`?"),
        );
        ctx.error_hint(
            Code::UnknownKind,
            kind_node.pos,
            format!("unknown kind `{kind_str}`"),
            hint,
        );
        return None;
    };
    let what = kind.as_str();
    let metadata = f
        .require(ctx, "metadata", "a document")
        .and_then(|m| decode_metadata(ctx, m, what));
    let spec = f.require(ctx, "spec", "a document").and_then(|s| {
        let spec_what = format!("{what} spec");
        match kind {
            Kind::Repository => decode_repository(ctx, s, &spec_what).map(Spec::Repository),
            Kind::Project => decode_project(ctx, s, &spec_what).map(Spec::Project),
            Kind::Environment => decode_environment(ctx, s, &spec_what).map(Spec::Environment),
            Kind::Domain => decode_domain(ctx, s, &spec_what).map(Spec::Domain),
            Kind::NodePool => decode_pool(ctx, s, &spec_what).map(Spec::NodePool),
            Kind::Secret => decode_secret(ctx, s, &spec_what).map(Spec::Secret),
        }
    });
    api?;
    let metadata = metadata?;
    if spec.is_none() {
        declared.push((kind, metadata.name.clone()));
    }
    Some(Object { metadata, spec: spec? })
}
