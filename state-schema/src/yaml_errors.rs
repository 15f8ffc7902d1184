//! YAML syntax errors in Pushleft's own words, at the line and column of the mistake.
//!
//! The scanner reports where it gave up, which is often a line after the mistake and in its own
//! terms (`simple key expect ':'` for `replicas 4` reported on the next line). Given the text
//! and the scanner's position, [`explain`] looks for the common mistakes, in this order: a tab
//! in an indentation, a `[` or `{` never closed, a line that is not `key: value`, and an
//! indentation that lines up with nothing above it; anything else keeps the scanner's words
//! with a general hint. [`declared_in_broken`] salvages the kinds and names a file that did
//! not parse declares, so that references to them are not reported as dangling: a file that
//! did not parse is one error, not a cascade.

use crate::diag::Pos;
use crate::model::Kind;
use crate::values::Name;

/// A syntax error as Pushleft says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explained {
    pub pos: Pos,
    pub message: String,
    pub hint: String,
}

/// The leading spaces and tabs of a line, and the rest.
fn indentation(line: &str) -> (&str, &str) {
    let rest = line.trim_start_matches([' ', '\t']);
    (&line[..line.len() - rest.len()], rest)
}

fn is_content(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && !t.starts_with('#') && t != "---" && t != "..."
}

fn at(line: usize, column: usize) -> Pos {
    Pos {
        line: u32::try_from(line).unwrap_or(u32::MAX),
        column: u32::try_from(column).unwrap_or(u32::MAX),
    }
}

/// The part of a line before a comment, outside quotes.
fn code_of(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\'' if !double => single = !single,
            b'"' if !single => double = !double,
            b'#' if !single && !double && (i == 0 || bytes[i - 1] == b' ') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// The innermost `[` or `{` still open at the end of `lines`: its 1-based line and column.
fn unclosed(lines: &[&str]) -> Option<(usize, usize, char)> {
    let mut open: Vec<(usize, usize, char)> = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let (mut single, mut double) = (false, false);
        for (i, c) in code_of(line).char_indices() {
            match c {
                '\'' if !double => single = !single,
                '"' if !single => double = !double,
                '[' | '{' if !single && !double => open.push((n + 1, i + 1, c)),
                ']' | '}' if !single && !double => {
                    open.pop();
                }
                _ => {}
            }
        }
    }
    open.pop()
}

/// Line `number` (1-based), `line`, is not `key: value`.
fn missing_colon(number: usize, line: &str) -> Explained {
    let (indent, rest) = indentation(line);
    let rest = code_of(rest).trim_end();
    let fixed = match rest.split_once(' ') {
        Some((key, value)) => format!("write `{key}: {}`", value.trim_start()),
        None => format!("write `{rest}:` followed by its value"),
    };
    Explained {
        pos: at(number, indent.len() + 1),
        message: format!("`{rest}` is not `key: value`: the `:` after the key is missing"),
        hint: fixed,
    }
}

/// Explains the scanner's error `info` at `pos` (1-based) in `text`.
pub fn explain(text: &str, pos: Pos, info: &str) -> Explained {
    let lines: Vec<&str> = text.lines().collect();
    let here = (pos.line as usize).clamp(1, lines.len().max(1));
    let upto = &lines[..here.min(lines.len())];

    // A tab in an indentation, on this line or the nearest content line above.
    let tabbed = upto
        .iter()
        .enumerate()
        .rev()
        .take(3)
        .find(|(_, l)| indentation(l).0.contains('\t'));
    if let Some((n, line)) = tabbed {
        let column = indentation(line).0.find('\t').unwrap_or(0) + 1;
        return Explained {
            pos: at(n + 1, column),
            message: "a tab in the indentation: YAML indents with spaces only".into(),
            hint: "replace the tab with spaces (as many as the lines around it use)".into(),
        };
    }

    // A `[` or `{` never closed before the point where the scanner gave up.
    // (The scanner may report a position past the last line: everything before it counts.)
    let before: Vec<&str> = lines[..(pos.line as usize).saturating_sub(1).min(lines.len())].to_vec();
    if let Some((line, column, c)) = unclosed(&before) {
        let close = if c == '[' { ']' } else { '}' };
        return Explained {
            pos: at(line, column),
            message: format!("`{c}` opened here is never closed"),
            hint: format!("close it with `{close}` on the same line, or write the list as block items (`- item`)"),
        };
    }

    // A line that is not `key: value` (`replicas 4`): the scanner notices on the next line.
    if (info.contains("':'") || info.contains("expect ':'"))
        && let Some((n, line)) = upto
            .iter()
            .enumerate()
            .rev()
            .find(|(_, l)| is_content(l) && !code_of(l).contains(':') && !l.trim_start().starts_with('-'))
    {
        return missing_colon(n + 1, line);
    }

    // The same mistake as a mapping's first key (`region local` then `nodes:`): the scanner
    // reads both lines as one plain scalar and gives up at the second line's `:`. The line
    // above it, at the same indentation and without a `:`, is the mistake.
    if info.contains("mapping values are not allowed")
        && let Some(reported) = lines.get(here.wrapping_sub(1))
        && let Some((n, line)) = lines[..here - 1].iter().enumerate().rev().find(|(_, l)| is_content(l))
        && !code_of(line).contains(':')
        && !line.trim_start().starts_with('-')
        && indentation(line).0 == indentation(reported).0
    {
        return missing_colon(n + 1, line);
    }

    // An indentation that lines up with nothing above it.
    let line_at = |n: usize| lines.get(n.wrapping_sub(1)).copied().unwrap_or_default();
    let suspect = [here, here.saturating_sub(1)]
        .into_iter()
        .filter(|&n| n >= 1 && is_content(line_at(n)))
        .find(|&n| {
            let depth = indentation(line_at(n)).0.len();
            let above: Vec<&&str> = lines[..n - 1].iter().filter(|l| is_content(l)).collect();
            // A child of the line before it (which opens a mapping) lines up with that.
            let child = above
                .last()
                .is_some_and(|p| code_of(p).trim_end().ends_with(':') && indentation(p).0.len() < depth);
            !child && !above.iter().any(|l| indentation(l).0.len() == depth)
        });
    if let Some(n) = suspect {
        let depth = indentation(line_at(n)).0.len();
        let sibling = lines[..n - 1]
            .iter()
            .rev()
            .filter(|l| is_content(l))
            .map(|l| indentation(l).0.len())
            .min_by_key(|d| d.abs_diff(depth))
            .unwrap_or(0);
        return Explained {
            pos: at(n, depth + 1),
            message: format!("this line is indented {depth} spaces, which lines up with no line above it"),
            hint: format!(
                "indent it {sibling} spaces, as its siblings are (or {} for a child)",
                sibling + 2
            ),
        };
    }

    // A mapping's first key indented deeper than the keys after it (`spec:`, then `    region:`,
    // then `  nodes:`): the scanner gives up at the next key, which is right; the first is not.
    if info.contains("did not find expected key")
        && let Some(reported) = lines.get(here.wrapping_sub(1)).filter(|l| is_content(l))
    {
        let depth = indentation(reported).0.len();
        let parent = lines[..here - 1]
            .iter()
            .enumerate()
            .rev()
            .find(|(_, l)| is_content(l) && indentation(l).0.len() < depth)
            .map(|(i, _)| i);
        let first = lines[parent.map_or(0, |p| p + 1)..here - 1]
            .iter()
            .enumerate()
            .find(|(_, l)| is_content(l))
            .map(|(i, l)| (i + parent.map_or(0, |p| p + 1), *l));
        if let Some((n, line)) = first
            && indentation(line).0.len() > depth
        {
            let key = code_of(reported).trim().split(':').next().unwrap_or_default();
            return Explained {
                pos: at(n + 1, indentation(line).0.len() + 1),
                message: format!(
                    "this line is indented {} spaces, but `{key}` (line {here}) of the same mapping is indented {depth}",
                    indentation(line).0.len()
                ),
                hint: format!("indent the keys of one mapping alike: {depth} spaces here"),
            };
        }
    }

    Explained {
        pos,
        message: format!("not well-formed YAML here ({info})"),
        hint: "check the indentation and the `key: value` form of this line and the ones above".into(),
    }
}

/// The (kind, name) pairs a file that did not parse seems to declare: a top-level `kind:` line,
/// then the first `name:` after it (in `metadata:` or `metadata: {name: …}`), per document.
pub fn declared_in_broken(text: &str) -> Vec<(Kind, Name)> {
    let mut out = Vec::new();
    let mut kind: Option<Kind> = None;
    for line in text.lines() {
        let code = code_of(line).trim_end();
        if code.starts_with("---") {
            kind = None;
            continue;
        }
        if let Some(k) = code.strip_prefix("kind:") {
            kind = Kind::parse(k.trim().trim_matches(['"', '\'']));
            continue;
        }
        let Some(k) = kind else { continue };
        let Some(i) = code.find("name:") else { continue };
        let value = code[i + "name:".len()..]
            .trim()
            .trim_end_matches('}')
            .trim()
            .trim_matches(['"', '\'']);
        let value = value.split([',', ' ']).next().unwrap_or_default();
        if let Ok(name) = Name::new(value) {
            out.push((k, name));
            kind = None;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(line: u32, column: u32) -> Pos {
        Pos { line, column }
    }

    #[test]
    fn a_missing_colon_is_reported_on_its_own_line() {
        let text = "spec:\n  roles:\n    web:\n      replicas 4\n      port: 8080\n";
        let e = explain(text, pos(5, 7), "simple key expect ':'");
        assert_eq!(e.pos, pos(4, 7));
        assert!(e.message.contains("`replicas 4` is not `key: value`"), "{e:?}");
        assert_eq!(e.hint, "write `replicas: 4`");
    }

    /// A NodePool's `region local` as the mapping's first key: the scanner gives up one line
    /// below, at `nodes:`, with another message.
    #[test]
    fn a_missing_colon_on_a_first_key_is_reported_on_its_own_line() {
        let text = "spec:\n  region local\n  nodes:\n    - name: n1\n";
        let e = explain(text, pos(3, 8), "mapping values are not allowed in this context");
        assert_eq!(e.pos, pos(2, 3));
        assert_eq!(e.hint, "write `region: local`");
        // `key: a: b` on one line is not this mistake.
        let text = "spec:\n  image: a: b\n";
        let e = explain(text, pos(2, 10), "mapping values are not allowed in this context");
        assert!(!e.message.contains("is not `key: value`"), "{e:?}");
    }

    /// A mapping's first key indented deeper than the next: the first is the mistake.
    #[test]
    fn an_over_indented_first_key_is_reported_on_its_own_line() {
        let text = "metadata:\n  name: p\nspec:\n    region: local\n  nodes:\n";
        let e = explain(
            text,
            pos(5, 3),
            "while parsing a block mapping, did not find expected key",
        );
        assert_eq!(e.pos, pos(4, 5));
        assert!(e.message.contains("`nodes` (line 5)"), "{e:?}");
    }

    #[test]
    fn a_tab_is_named_where_it_is() {
        let text = "spec:\n\tport: 8080\n";
        let e = explain(
            text,
            pos(2, 2),
            "tabs disallowed within this context (block indentation)",
        );
        assert_eq!(e.pos, pos(2, 1));
        assert!(e.message.contains("tab"), "{e:?}");
    }

    #[test]
    fn an_unclosed_bracket_points_at_its_opening() {
        let text = "spec:\n  command: [\"a\", \"b\"\n  port: 8080\n";
        let e = explain(text, pos(3, 3), "invalid indentation");
        assert_eq!(e.pos, pos(2, 12));
        assert!(e.message.contains("`[` opened here is never closed"), "{e:?}");
        // Brackets in quotes and comments do not count.
        let text = "spec:\n  a: \"[x\" # [\n  b:\n   c: 1\n";
        assert!(
            !explain(text, pos(4, 4), "invalid indentation")
                .message
                .contains("never closed")
        );
    }

    #[test]
    fn a_stray_indentation_names_its_siblings() {
        let text = "spec:\n  roles:\n    web:\n      command: [a]\n     port: 8080\n";
        let e = explain(
            text,
            pos(5, 6),
            "while parsing a block mapping, did not find expected key",
        );
        assert_eq!(e.pos, pos(5, 6));
        assert!(e.message.contains("indented 5 spaces"), "{e:?}");
        assert!(
            e.hint.contains("indent it 6 spaces") || e.hint.contains("indent it 4 spaces"),
            "{e:?}"
        );
    }

    #[test]
    fn names_declared_in_a_broken_file_are_salvaged() {
        let text = "kind: Project\nmetadata:\n  name: hello\nspec:\n  replicas 4\n---\nkind: Environment\nmetadata: {name: hello-production}\n";
        let got: Vec<String> = declared_in_broken(text)
            .into_iter()
            .map(|(k, n)| format!("{}/{n}", k.as_str()))
            .collect();
        assert_eq!(got, ["Project/hello", "Environment/hello-production"]);
    }
}
