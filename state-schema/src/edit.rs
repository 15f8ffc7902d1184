//! Editing a state file in place: replacing one document of a multi-document YAML file and
//! leaving every other byte as it was. Pure; callers read and write the file.

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

#[cfg(test)]
mod tests {
    use super::*;

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
