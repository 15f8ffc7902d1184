//! Every failure code the agent's source writes (`permanent("…"`, `retryable("…"`, a
//! `("…", Outcome::…)` pair or a `code: "…"` field) is in `agent_proto::codes::FAILURE_CODES`,
//! the closed list the control plane counts failures by: a code missing from it would be
//! counted as `other`.

use std::path::Path;

/// The string literal right after `at` (spaces and newlines skipped), if one starts there.
fn literal_after(text: &str, at: usize) -> Option<&str> {
    let rest = text[at..].trim_start();
    let rest = rest.strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(&rest[..end])
}

fn codes_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for opener in ["permanent(", "retryable(", "code: "] {
        for (i, _) in text.match_indices(opener) {
            if let Some(code) = literal_after(text, i + opener.len())
                && !code.is_empty()
                && code
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                out.push(code.to_owned());
            }
        }
    }
    for (i, _) in text
        .match_indices("Outcome::Permanent)")
        .chain(text.match_indices("Outcome::Retryable)"))
    {
        // `("code", Outcome::…)`: the literal before the comma.
        let before = text[..i].trim_end_matches("agent_proto::").trim_end();
        if let Some(before) = before.strip_suffix(',')
            && let Some(end) = before.rfind('"')
            && let Some(start) = before[..end].rfind('"')
        {
            out.push(before[start + 1..end].to_owned());
        }
    }
    out
}

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            walk(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

#[test]
fn every_failure_code_the_agent_writes_is_in_the_closed_list() {
    let mut files = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    let mut seen = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        for code in codes_in(&text) {
            seen += 1;
            assert!(
                agent_proto::codes::FAILURE_CODES.contains(&code.as_str()),
                "{}: `{code}` is not in agent_proto::codes::FAILURE_CODES",
                f.display()
            );
        }
    }
    assert!(seen > 50, "the scan finds the agent's codes ({seen})");
}

#[test]
fn the_scan_reads_each_way_a_code_is_written() {
    let text = "permanent(\n  \"exit-code\", x) retryable(\"caddy-unavailable\", y) Failure { code: \"health-deadline\", }\n(\"restic-failed\", agent_proto::Outcome::Permanent)";
    assert_eq!(
        codes_in(text),
        ["exit-code", "caddy-unavailable", "health-deadline", "restic-failed"]
    );
}
