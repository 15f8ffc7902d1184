//! Editing a state file in place: replacing one document of a multi-document YAML file, or one
//! scalar value, and leaving every other byte as it was. Pure; callers read and write the file.

/// True for a document separator line: `---` at column 0, alone or followed by blanks or a
/// comment. (`---` inside a block scalar is indented, so it never matches.)
fn is_separator(line: &str) -> bool {
    line.strip_prefix("---")
        .is_some_and(|rest| rest.trim_start().is_empty() || rest.starts_with([' ', '\t']))
}

/// Replaces the document whose first node is on `line` (1-based) with `replacement` (one YAML
/// document without a `---` line). The separators, the other documents and the comments above
/// the document's first line are kept; comments inside the replaced document are not.
pub fn replace_document(text: &str, line: u32, replacement: &str) -> Option<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let target = usize::try_from(line).ok()?.checked_sub(1)?;
    if target >= lines.len() {
        return None;
    }
    // The document runs from after the separator before `line` to the next separator.
    let mut start = (0..target).rev().find(|i| is_separator(lines[*i])).map_or(0, |i| i + 1);
    // Comments and blank lines at the top of the document (a file header, say) stay.
    while start < target && (lines[start].trim().is_empty() || lines[start].trim_start().starts_with('#')) {
        start += 1;
    }
    let end = (target + 1..lines.len())
        .find(|i| is_separator(lines[*i]))
        .unwrap_or(lines.len());
    let mut out = String::with_capacity(text.len() + replacement.len());
    lines[..start].iter().for_each(|l| out.push_str(l));
    out.push_str(replacement);
    if !replacement.ends_with('\n') {
        out.push('\n');
    }
    lines[end..].iter().for_each(|l| out.push_str(l));
    Some(out)
}

/// Replaces the scalar that starts at `pos` (1-based line, and column in characters, as
/// the loader reports a node's position) with `replacement`, written double-quoted, every
/// other byte kept: the file's lines, comments and the rest of its form stay the user's (so a
/// diagnostic about the edited file still points into the file as written). The scalar may be
/// plain (ending at a blank, `,`, `]`, `}` or a comment), single- or double-quoted; `None`
/// when nothing scalar starts there. `replacement` must not hold `"` or `\`.
pub fn replace_scalar(text: &str, pos: crate::diag::Pos, replacement: &str) -> Option<String> {
    if replacement.contains(['"', '\\', '\n']) {
        return None;
    }
    let line_start = if pos.line <= 1 {
        0
    } else {
        text.match_indices('\n').nth(usize::try_from(pos.line).ok()? - 2)?.0 + 1
    };
    let line_end = text[line_start..].find('\n').map_or(text.len(), |i| line_start + i);
    let line = &text[line_start..line_end];
    let at = line
        .char_indices()
        .nth(usize::try_from(pos.column).ok()?.checked_sub(1)?)
        .map(|(i, _)| i)?;
    let rest = &line[at..];
    let len = match rest.chars().next()? {
        '"' => {
            let mut escaped = false;
            1 + rest[1..].char_indices().find_map(|(i, c)| match c {
                '\\' if !escaped => {
                    escaped = true;
                    None
                }
                '"' if !escaped => Some(i + 1),
                _ => {
                    escaped = false;
                    None
                }
            })?
        }
        '\'' => {
            // `''` inside is an escaped quote.
            let b = rest.as_bytes();
            let mut i = 1;
            loop {
                match b.get(i)? {
                    b'\'' if b.get(i + 1) == Some(&b'\'') => i += 2,
                    b'\'' => break i + 1,
                    _ => i += 1,
                }
            }
        }
        c if c.is_whitespace() || "#,[]{}|>".contains(c) => return None,
        _ => rest
            .find(|c: char| c.is_whitespace() || ",]}".contains(c))
            .unwrap_or(rest.len()),
    };
    let start = line_start + at;
    let mut out = String::with_capacity(text.len() + replacement.len() + 2);
    out.push_str(&text[..start]);
    out.push('"');
    out.push_str(replacement);
    out.push('"');
    out.push_str(&text[start + len..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_one_scalar_and_nothing_else() {
        let pos = |line, column| crate::diag::Pos { line, column };
        let text = "spec:\n  image: reg.invalid/a@sha256:00 # pinned\n  roles: {web: {image: 'x''y', port: 1}}\n  b: \"q\\\"r\"\n";
        assert_eq!(
            replace_scalar(text, pos(2, 10), "new@sha256:11").as_deref(),
            Some(
                "spec:\n  image: \"new@sha256:11\" # pinned\n  roles: {web: {image: 'x''y', port: 1}}\n  b: \"q\\\"r\"\n"
            )
        );
        assert_eq!(
            replace_scalar(text, pos(3, 24), "z").as_deref(),
            Some(
                "spec:\n  image: reg.invalid/a@sha256:00 # pinned\n  roles: {web: {image: \"z\", port: 1}}\n  b: \"q\\\"r\"\n"
            )
        );
        assert_eq!(
            replace_scalar(text, pos(4, 6), "z").as_deref(),
            Some(
                "spec:\n  image: reg.invalid/a@sha256:00 # pinned\n  roles: {web: {image: 'x''y', port: 1}}\n  b: \"z\"\n"
            )
        );
        assert_eq!(replace_scalar(text, pos(9, 1), "z"), None, "past the end");
        assert_eq!(replace_scalar(text, pos(2, 3), "with\"quote"), None);
    }

    #[test]
    fn replaces_only_the_target() {
        let text = "# head\na: 1\n---\nb: 2\n# inside\nc: |\n  ---\n  x\n--- # third\nd: 4\n";
        assert_eq!(
            replace_document(text, 4, "b: 9\n").as_deref(),
            Some("# head\na: 1\n---\nb: 9\n--- # third\nd: 4\n")
        );
        assert_eq!(
            replace_document(text, 2, "a: 0").as_deref(),
            Some("# head\na: 0\n---\nb: 2\n# inside\nc: |\n  ---\n  x\n--- # third\nd: 4\n")
        );
        assert_eq!(
            replace_document(text, 10, "d: 5\n").as_deref(),
            Some("# head\na: 1\n---\nb: 2\n# inside\nc: |\n  ---\n  x\n--- # third\nd: 5\n")
        );
        assert_eq!(replace_document(text, 99, "x"), None);
    }
}
