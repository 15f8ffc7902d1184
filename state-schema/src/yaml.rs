//! A YAML loader that keeps the line and column of every node and enforces Pushleft's input
//! limits (documents per file, nesting depth, alias expansion) while it reads, so a hostile file
//! fails fast with bounded memory instead of being expanded first and measured after.
//!
//! Events come from `saphyr-parser`; the tree is built here so the limits sit in one place.
//! Plain scalars resolve by the YAML 1.2 core schema (`no` is a string, `0o17` an integer).

use crate::diag::{Code, Pos};
use saphyr_parser::{Event, Parser, ScalarStyle, Span};
use std::borrow::Cow;
use std::collections::HashMap;

pub use crate::yaml_input::MAX_LOOKAHEAD;
use crate::yaml_input::{Window, WindowedInput};

/// Largest state file accepted, in bytes.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// Most YAML documents in one file.
pub const MAX_DOCUMENTS: usize = 10_000;
/// Deepest nesting of sequences and mappings.
pub const MAX_DEPTH: usize = 64;
/// Most nodes that aliases may add to one file by expansion ("billion laughs" stop here).
pub const MAX_ALIAS_NODES: usize = 10_000;
/// Most nodes that anchors may hold copies of in one file. An anchor keeps a copy of its node
/// for later aliases, so nested anchors around one large node copy it once per level (60
/// levels around 440,000 scalars once took 1.4 GB); the copies count against this budget.
/// An anchored node larger than [`MAX_ALIAS_NODES`] is not copied at all: no alias could use
/// it within that limit.
pub const MAX_ANCHOR_NODES: usize = 100_000;
/// Most nodes in one file, alias expansions included: bounds what one file costs in memory.
/// 10,000 documents of 25 nodes each fit.
pub const MAX_NODES: usize = 250_000;

/// A node of a loaded document. Scalars borrow from the input where YAML needs no unescaping,
/// which is most of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Node<'a> {
    pub pos: Pos,
    pub value: Value<'a>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Cow<'a, str>),
    Seq(Vec<Node<'a>>),
    Map(Vec<(Node<'a>, Node<'a>)>),
}

impl Value<'_> {
    /// The YAML type's name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a sequence",
            Value::Map(_) => "a mapping",
        }
    }
}

/// Why a file could not be loaded. Loading stops at the first of these.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct LoadError {
    pub code: Code,
    pub pos: Option<Pos>,
    pub message: String,
}

fn pos_of(span: &Span) -> Pos {
    Pos {
        line: u32::try_from(span.start.line()).unwrap_or(u32::MAX),
        column: u32::try_from(span.start.col() + 1).unwrap_or(u32::MAX),
    }
}

/// Checks size and encoding, then loads every document of a file.
pub fn load_bytes(bytes: &[u8]) -> Result<Vec<Node<'_>>, LoadError> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(LoadError {
            code: Code::FileTooLarge,
            pos: None,
            message: format!(
                "file is {} bytes; the limit is {} bytes (1 MiB)",
                bytes.len(),
                MAX_FILE_BYTES
            ),
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let good = &bytes[..e.valid_up_to()];
        // The valid prefix is UTF-8 by construction, so this never falls back.
        let prefix = std::str::from_utf8(good).unwrap_or("");
        let line = prefix.matches('\n').count() + 1;
        let column = prefix.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        LoadError {
            code: Code::InvalidUtf8,
            pos: Some(Pos {
                line: line as u32,
                column: column as u32,
            }),
            message: format!("invalid UTF-8 at byte {}", e.valid_up_to()),
        }
    })?;
    load_str(text)
}

/// A collection being built, with the number of nodes inside it so far (itself included), so
/// an anchor knows its node's size without walking it.
enum Frame<'a> {
    Seq {
        pos: Pos,
        anchor: usize,
        size: usize,
        items: Vec<Node<'a>>,
    },
    Map {
        pos: Pos,
        anchor: usize,
        size: usize,
        entries: Vec<(Node<'a>, Node<'a>)>,
        key: Option<Node<'a>>,
    },
}

/// What an anchor names: a copy of its node and the node's size, or only the size when the
/// node is too large for any alias to expand.
enum Anchored<'a> {
    Copy(Node<'a>, usize),
    TooLarge(usize),
}

struct Builder<'a> {
    nodes: usize,
    stack: Vec<Frame<'a>>,
    anchors: HashMap<usize, Anchored<'a>>,
    alias_nodes: usize,
    anchor_nodes: usize,
    docs: Vec<Node<'a>>,
}

impl<'a> Builder<'a> {
    /// Adds a finished node of `size` nodes to its parent (or as a document), keeping a copy
    /// for `anchor` within the anchor budget.
    fn finish_node(&mut self, node: Node<'a>, anchor: usize, size: usize) -> Result<(), LoadError> {
        if anchor != 0 {
            let entry = if size > MAX_ALIAS_NODES {
                Anchored::TooLarge(size)
            } else {
                self.anchor_nodes = self.anchor_nodes.saturating_add(size);
                if self.anchor_nodes > MAX_ANCHOR_NODES {
                    return Err(LoadError {
                        code: Code::AliasLimit,
                        pos: Some(node.pos),
                        message: format!("anchors copy more than {MAX_ANCHOR_NODES} nodes"),
                    });
                }
                Anchored::Copy(node.clone(), size)
            };
            self.anchors.insert(anchor, entry);
        }
        match self.stack.last_mut() {
            Some(Frame::Seq { items, size: s, .. }) => {
                *s = s.saturating_add(size);
                items.push(node);
            }
            Some(Frame::Map {
                entries, key, size: s, ..
            }) => {
                *s = s.saturating_add(size);
                match key.take() {
                    Some(k) => entries.push((k, node)),
                    None => *key = Some(node),
                }
            }
            None => self.docs.push(node),
        }
        Ok(())
    }
}

fn unsupported_tag(pos: Pos, tag: &str) -> LoadError {
    LoadError {
        code: Code::UnsupportedTag,
        pos: Some(pos),
        message: format!("unsupported tag `{tag}`; only the YAML core schema's tags are allowed"),
    }
}

/// Checks a sequence's or mapping's tag and the nesting depth before it opens.
impl<'a> Builder<'a> {
    /// A scalar, its value resolved by the core schema (an explicit tag outside it refused).
    fn scalar(
        &mut self,
        text: Cow<'a, str>,
        style: ScalarStyle,
        anchor: usize,
        tag: Option<&saphyr_parser::Tag>,
        pos: Pos,
    ) -> Result<(), LoadError> {
        let value = match (tag, style) {
            (Some(t), _) if t.is_yaml_core_schema() => match t.suffix.as_str() {
                "str" => Value::Str(text),
                "null" | "bool" | "int" | "float" => resolve_plain(&text),
                other => return Err(unsupported_tag(pos, &format!("!!{other}"))),
            },
            (Some(t), _) => {
                return Err(unsupported_tag(pos, &format!("{}{}", t.handle, t.suffix)));
            }
            (None, ScalarStyle::Plain) => resolve_plain_cow(text),
            (None, _) => Value::Str(text),
        };
        self.finish_node(Node { pos, value }, anchor, 1)
    }

    /// The end of the open sequence or mapping: finished as a node.
    fn close(&mut self) -> Result<(), LoadError> {
        let (node, anchor, size) = match self.stack.pop() {
            Some(Frame::Seq {
                pos,
                anchor,
                size,
                items,
            }) => (
                Node {
                    pos,
                    value: Value::Seq(items),
                },
                anchor,
                size,
            ),
            Some(Frame::Map {
                pos,
                anchor,
                size,
                entries,
                ..
            }) => (
                Node {
                    pos,
                    value: Value::Map(entries),
                },
                anchor,
                size,
            ),
            None => return Ok(()),
        };
        self.finish_node(node, anchor, size)
    }

    /// An alias: a copy of its anchor's node, counted against the alias budget.
    fn alias(&mut self, id: usize, pos: Pos) -> Result<(), LoadError> {
        let (node, size) = match self.anchors.get(&id) {
            Some(Anchored::Copy(node, size)) => (Some(node), *size),
            Some(Anchored::TooLarge(size)) => (None, *size),
            None => {
                return Err(LoadError {
                    code: Code::YamlSyntax,
                    pos: Some(pos),
                    message: "alias to an unknown anchor".into(),
                });
            }
        };
        self.alias_nodes = self.alias_nodes.saturating_add(size);
        self.nodes = self.nodes.saturating_add(size);
        let (Some(node), false) = (node, self.alias_nodes > MAX_ALIAS_NODES) else {
            return Err(LoadError {
                code: Code::AliasLimit,
                pos: Some(pos),
                message: format!("aliases expand to more than {MAX_ALIAS_NODES} nodes"),
            });
        };
        let mut node = node.clone();
        node.pos = pos;
        self.finish_node(node, 0, size)
    }
}

fn open_collection(b: &Builder<'_>, pos: Pos, tag: Option<&saphyr_parser::Tag>) -> Result<(), LoadError> {
    if let Some(t) = tag
        && !(t.is_yaml_core_schema() && matches!(t.suffix.as_str(), "seq" | "map"))
    {
        return Err(unsupported_tag(pos, &format!("{}{}", t.handle, t.suffix)));
    }
    if b.stack.len() >= MAX_DEPTH {
        return Err(LoadError {
            code: Code::NestingTooDeep,
            pos: Some(pos),
            message: format!("nesting deeper than {MAX_DEPTH} levels"),
        });
    }
    Ok(())
}

/// Resolves a plain scalar by the YAML 1.2 core schema; `None` when it is a string.
fn resolve_non_string(s: &str) -> Option<Value<'static>> {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Some(Value::Null),
        "true" | "True" | "TRUE" => return Some(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Some(Value::Bool(false)),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Some(Value::Float(f64::INFINITY));
        }
        "-.inf" | "-.Inf" | "-.INF" => return Some(Value::Float(f64::NEG_INFINITY)),
        ".nan" | ".NaN" | ".NAN" => return Some(Value::Float(f64::NAN)),
        _ => {}
    }
    if let Some(oct) = s.strip_prefix("0o")
        && !oct.is_empty()
        && oct.bytes().all(|c| (b'0'..=b'7').contains(&c))
        && let Ok(v) = i64::from_str_radix(oct, 8)
    {
        return Some(Value::Int(v));
    }
    if let Some(hex) = s.strip_prefix("0x")
        && !hex.is_empty()
        && hex.bytes().all(|c| c.is_ascii_hexdigit())
        && let Ok(v) = i64::from_str_radix(hex, 16)
    {
        return Some(Value::Int(v));
    }
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if !digits.is_empty()
        && digits.bytes().all(|c| c.is_ascii_digit())
        && let Ok(v) = s.parse::<i64>()
    {
        return Some(Value::Int(v));
    }
    if is_core_float(digits)
        && let Ok(v) = s.parse::<f64>()
    {
        return Some(Value::Float(v));
    }
    None
}

/// Resolves a plain scalar by the YAML 1.2 core schema.
pub fn resolve_plain(s: &str) -> Value<'static> {
    resolve_non_string(s).unwrap_or_else(|| Value::Str(Cow::Owned(s.to_owned())))
}

/// [`resolve_plain`] that keeps a borrowed string borrowed.
fn resolve_plain_cow(s: Cow<'_, str>) -> Value<'_> {
    resolve_non_string(&s).unwrap_or(Value::Str(s))
}

/// `(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?` without the sign.
fn is_core_float(s: &str) -> bool {
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((a, b)) => {
            (!a.is_empty() || !b.is_empty())
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }
        None => !mantissa.is_empty() && mantissa.bytes().all(|c| c.is_ascii_digit()),
    };
    let exp_ok = exp.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|c| c.is_ascii_digit())
    });
    mantissa_ok && exp_ok && (mantissa.contains('.') || exp.is_some())
}

/// Loads every document of a YAML stream. Empty documents are dropped.
pub fn load_str(text: &str) -> Result<Vec<Node<'_>>, LoadError> {
    let mut b = Builder {
        nodes: 0,
        stack: Vec::new(),
        anchors: HashMap::new(),
        alias_nodes: 0,
        anchor_nodes: 0,
        docs: Vec::new(),
    };
    let mut documents = 0usize;
    let window = Window::new();
    let lookahead_error = |at: Option<Pos>| LoadError {
        code: Code::LookaheadLimit,
        pos: at,
        message: format!(
            "the parser would have to read more than {MAX_LOOKAHEAD} characters past the last node here: a single value that long, a run of comments that long, or a flow collection ([…] or {{…}}) that long where a key could start; write long lists as block lists (`- item`)"
        ),
    };
    let mut last = None;
    // A file shorter than the window cannot make the scanner read past it: it takes
    // saphyr-parser's own (faster) input.
    let events: Box<dyn Iterator<Item = Result<(Event<'_>, Span), saphyr_parser::ScanError>>> =
        if text.len() <= MAX_LOOKAHEAD {
            Box::new(Parser::new_from_str(text))
        } else {
            Box::new(Parser::new(WindowedInput::new(text, std::rc::Rc::clone(&window))))
        };
    for item in events {
        let (event, span) = match item {
            Ok(x) => x,
            Err(_) if window.was_cut() => return Err(lookahead_error(last)),
            Err(e) => {
                return Err(LoadError {
                    code: Code::YamlSyntax,
                    pos: Some(Pos {
                        line: e.marker().line() as u32,
                        column: e.marker().col() as u32 + 1,
                    }),
                    message: e.info().to_owned(),
                });
            }
        };
        window.advance(span.end.index());
        let pos = pos_of(&span);
        last = Some(pos);
        b.nodes += match &event {
            Event::Scalar(..) | Event::SequenceStart(..) | Event::MappingStart(..) => 1,
            _ => 0,
        };
        if b.nodes > MAX_NODES {
            return Err(LoadError {
                code: Code::TooManyNodes,
                pos: Some(pos),
                message: format!("more than {MAX_NODES} YAML nodes in one file"),
            });
        }
        match event {
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > MAX_DOCUMENTS {
                    return Err(LoadError {
                        code: Code::TooManyDocuments,
                        pos: Some(pos),
                        message: format!("more than {MAX_DOCUMENTS} documents in one file"),
                    });
                }
            }
            Event::Scalar(text, style, anchor, tag) => b.scalar(text, style, anchor, tag.as_deref(), pos)?,
            Event::SequenceStart(anchor, tag) => {
                open_collection(&b, pos, tag.as_deref())?;
                b.stack.push(Frame::Seq {
                    pos,
                    anchor,
                    size: 1,
                    items: Vec::new(),
                });
            }
            Event::MappingStart(anchor, tag) => {
                open_collection(&b, pos, tag.as_deref())?;
                b.stack.push(Frame::Map {
                    pos,
                    anchor,
                    size: 1,
                    entries: Vec::new(),
                    key: None,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => b.close()?,
            Event::Alias(id) => b.alias(id, pos)?,
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
        }
    }
    // A scanner stopped at the window may end the stream quietly (a block scalar ends at the
    // end of input): what it read is not the file, so it is refused all the same.
    if window.was_cut() {
        return Err(lookahead_error(last));
    }
    b.docs.retain(|d| d.value != Value::Null);
    Ok(b.docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Node<'_> {
        let mut docs = load_str(text).expect("valid yaml");
        assert_eq!(docs.len(), 1);
        docs.remove(0)
    }

    #[test]
    fn keeps_positions() {
        let n = one("a: 1\nb:\n  - x\n");
        let Value::Map(entries) = n.value else { panic!("map") };
        assert_eq!(entries[1].0.pos, Pos { line: 2, column: 1 });
        let Value::Seq(items) = &entries[1].1.value else {
            panic!("seq")
        };
        assert_eq!(items[0].pos, Pos { line: 3, column: 5 });
    }

    #[test]
    fn core_schema_resolution() {
        assert_eq!(resolve_plain("no"), Value::Str("no".into()));
        assert_eq!(resolve_plain("0o17"), Value::Int(15));
        assert_eq!(resolve_plain("0x1F"), Value::Int(31));
        assert_eq!(resolve_plain("-12"), Value::Int(-12));
        assert_eq!(resolve_plain("1.5"), Value::Float(1.5));
        assert_eq!(resolve_plain("1e3"), Value::Float(1000.0));
        assert_eq!(resolve_plain("500m"), Value::Str("500m".into()));
        assert_eq!(resolve_plain("~"), Value::Null);
        assert_eq!(resolve_plain("1.2.3"), Value::Str("1.2.3".into()));
        assert_eq!(
            one("a: '1'").value,
            Value::Map(vec![(
                Node {
                    pos: Pos { line: 1, column: 1 },
                    value: Value::Str("a".into())
                },
                Node {
                    pos: Pos { line: 1, column: 4 },
                    value: Value::Str("1".into())
                },
            )])
        );
    }

    #[test]
    fn billion_laughs_fails_fast() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let prev = i - 1;
            text.push_str(&format!("a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"));
        }
        let err = load_str(&text).expect_err("must refuse");
        assert_eq!(err.code, Code::AliasLimit);
    }

    /// `levels` anchored sequences nested around one sequence of `scalars` scalars, then the
    /// same sequence again through an alias when `alias` is set.
    fn nested_anchors(levels: usize, scalars: usize, alias: bool) -> String {
        let mut text = String::from("a: ");
        for i in 0..levels {
            text.push_str(&format!("&l{i} ["));
        }
        text.push_str(&vec!["x"; scalars].join(","));
        text.push_str(&"]".repeat(levels));
        if alias {
            text.push_str(&format!("\nb: *l{}\n", levels - 1));
        }
        text
    }

    #[test]
    fn nested_anchors_around_a_large_node_are_not_copied() {
        // The shape that once took 1.4 GB: every level is larger than an alias may expand, so
        // no level is copied and the file loads at the cost of its own nodes.
        let text = nested_anchors(60, 50_000, false);
        let docs = load_str(&text).expect("anchors alone are fine");
        assert_eq!(docs.len(), 1);
        // An alias to any of them would exceed the alias budget, and says so.
        let text = nested_anchors(60, 50_000, true);
        assert_eq!(
            load_str(&text).expect_err("alias to a large node").code,
            Code::AliasLimit
        );
    }

    #[test]
    fn anchor_copies_count_against_a_budget() {
        // 60 levels around 9,000 scalars: each level is small enough to alias, so each is
        // copied; 60 copies of 9,000 nodes are past the budget and the file is refused.
        let text = nested_anchors(60, 9_000, false);
        let err = load_str(&text).expect_err("too many copies");
        assert_eq!(err.code, Code::AliasLimit);
        assert!(err.message.contains("anchors copy more than"), "{}", err.message);
        // Ten levels around 900 scalars: about 9,000 copied nodes fit, and an alias still works.
        let text = nested_anchors(10, 900, true);
        let docs = load_str(&text).expect("within budget");
        let Value::Map(entries) = &docs[0].value else {
            panic!("map")
        };
        let Value::Seq(items) = &entries[1].1.value else {
            panic!("seq")
        };
        assert_eq!(items.len(), 900);
    }

    #[test]
    fn the_scanner_reads_only_so_far_ahead() {
        // A flow collection where a key could start makes the scanner keep every token until it
        // ends; past the window, the file is refused instead of buffered.
        let nested = nested_anchors(2, 100_000, false);
        assert!(nested.len() > MAX_LOOKAHEAD);
        let err = load_str(&nested).expect_err("too far ahead");
        assert_eq!(err.code, Code::LookaheadLimit, "{}", err.message);
        // A long value is fine up to the window, whatever the file's size; a longer one is not.
        let long = |n: usize| format!("a: |\n  {}\nb: 1\n", "v".repeat(n));
        let padding: String = (0..20_000).map(|i| format!("p{i}: 1\n")).collect();
        let ok = format!("{padding}{}", long(100_000));
        assert!(ok.len() > MAX_LOOKAHEAD);
        assert!(load_str(&ok).is_ok());
        let err = load_str(&format!("{padding}{}", long(200_000))).expect_err("too long a value");
        assert_eq!(err.code, Code::LookaheadLimit);
        // A long flow list as a plain value (no key can start there) streams: it is fine.
        let flat = format!("a: [{}]\n", vec!["x"; 100_000].join(","));
        assert!(flat.len() > MAX_LOOKAHEAD);
        assert!(load_str(&flat).is_ok());
    }

    #[test]
    fn node_budget() {
        let text = format!("a:\n{}", "- x\n".repeat(MAX_NODES));
        assert_eq!(load_str(&text).expect_err("too many").code, Code::TooManyNodes);
        let text = format!("a:\n{}", "- x\n".repeat(MAX_NODES - 3));
        assert!(load_str(&text).is_ok());
    }

    #[test]
    fn small_aliases_expand() {
        let n = one("base: &b {cpu: 1}\nother: *b\n");
        let Value::Map(entries) = n.value else { panic!("map") };
        assert_eq!(entries[0].1.value, entries[1].1.value);
    }

    #[test]
    fn depth_limit() {
        let text = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(load_str(&text).expect_err("deep").code, Code::NestingTooDeep);
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(load_str(&ok).is_ok());
    }

    #[test]
    fn document_limit() {
        let text = "---\na: 1\n".repeat(MAX_DOCUMENTS + 1);
        assert_eq!(load_str(&text).expect_err("too many").code, Code::TooManyDocuments);
        let text = "---\na: 1\n".repeat(MAX_DOCUMENTS);
        assert_eq!(load_str(&text).expect("at limit").len(), MAX_DOCUMENTS);
    }

    #[test]
    fn size_utf8_tags_syntax() {
        let big = vec![b' '; MAX_FILE_BYTES + 1];
        assert_eq!(load_bytes(&big).expect_err("big").code, Code::FileTooLarge);
        let err = load_bytes(b"a: 1\nb: \xff\n").expect_err("utf8");
        assert_eq!(
            (err.code, err.pos),
            (Code::InvalidUtf8, Some(Pos { line: 2, column: 4 }))
        );
        assert_eq!(load_str("a: !custom x").expect_err("tag").code, Code::UnsupportedTag);
        assert_eq!(
            load_str("a: !!str 1").expect("str tag")[0].value,
            Value::Map(vec![(
                Node {
                    pos: Pos { line: 1, column: 1 },
                    value: Value::Str("a".into())
                },
                Node {
                    pos: Pos { line: 1, column: 4 },
                    value: Value::Str("1".into())
                },
            )])
        );
        let err = load_str("a: [1, 2\nb: 3").expect_err("syntax");
        assert_eq!(err.code, Code::YamlSyntax);
        assert!(err.pos.is_some());
    }
}
