//! How a task ended, as the agent reports it: success with a short note, or a failure that is
//! permanent (it would fail the same way again: a missed health deadline, an exit code, an
//! image that does not exist, an object that is not ours) or retryable (Docker or a registry
//! unavailable), with a stable code and a bounded detail (a log tail).

use agent_proto::Outcome;

/// Largest detail a result carries (the control plane's limit).
pub const MAX_DETAIL: usize = agent_proto::MAX_DETAIL_BYTES;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub outcome: Outcome,
    pub code: &'static str,
    pub detail: String,
}

pub fn permanent(code: &'static str, detail: impl Into<String>) -> Failure {
    Failure {
        outcome: Outcome::Permanent,
        code,
        detail: detail.into(),
    }
}

pub fn retryable(code: &'static str, detail: impl Into<String>) -> Failure {
    Failure {
        outcome: Outcome::Retryable,
        code,
        detail: detail.into(),
    }
}

/// `code: detail`, cut to the control plane's limit at a character boundary (the end of a
/// log tail is what matters, so the front is cut). Control characters other than newlines and
/// tabs are left out: terminal colours mean nothing in a report, and JSON writes each as six
/// bytes, so a report stays within twice its length on the wire (see
/// [`crate::lease_loop`]'s request budget).
pub fn report(code: &str, detail: &str) -> String {
    let detail: std::borrow::Cow<'_, str> = if detail.chars().any(unprintable) {
        detail.chars().filter(|c| !unprintable(*c)).collect::<String>().into()
    } else {
        detail.into()
    };
    let full = format!("{code}: {detail}");
    if full.len() <= MAX_DETAIL {
        return full;
    }
    let mut start = full.len() - (MAX_DETAIL - code.len() - 6);
    while !full.is_char_boundary(start) {
        start += 1;
    }
    format!("{code}: …{}", &full[start..])
}

fn unprintable(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_bounded_and_keep_the_end() {
        let long = format!("{}THE END", "é".repeat(20_000));
        let r = report("exit-code", &long);
        assert!(r.len() <= MAX_DETAIL, "{}", r.len());
        assert!(r.starts_with("exit-code: …"));
        assert!(r.ends_with("THE END"));
        assert_eq!(report("x", "short"), "x: short");
        assert_eq!(report("x", "\u{1b}[31mred\r\n\tend"), "x: [31mred\n\tend");
    }
}
