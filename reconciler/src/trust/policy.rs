//! The signing policy: which commits must be signed, and which principals may change which
//! paths. Lives in the daemon's configuration (or `--policy` for the CLI), never in the state
//! repository: a repository cannot vouch for itself.
//!
//! ```yaml
//! mode: strict            # or `head` (default)
//! rules:
//!   - paths: ["environments/production/**"]
//!     principals: ["ops-*"]
//! ```

use state_schema::yaml::{Node, Value, load_str};

/// Largest policy file read, in bytes.
pub const MAX_FILE_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// The commit being applied is signed by a trusted key.
    #[default]
    Head,
    /// Every first-parent commit since the last accepted one is signed.
    Strict,
}

/// Paths (globs relative to the state tree's root) that only some principals may change.
#[derive(Clone, Debug)]
pub struct PathRule {
    /// 1-based, for messages.
    pub index: usize,
    pub paths: Vec<String>,
    pub principals: Vec<String>,
    matcher: globset::GlobSet,
}

impl PathRule {
    pub fn matches(&self, path: &str) -> bool {
        self.matcher.is_match(path)
    }

    pub fn describe(&self) -> String {
        format!(
            "rule {} (paths {}; principals {})",
            self.index,
            self.paths.join(", "),
            self.principals.join(", ")
        )
    }
}

#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub mode: Mode,
    pub rules: Vec<PathRule>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("policy {line}:{column}: {message}")]
pub struct PolicyError {
    pub line: u32,
    pub column: u32,
    pub message: String,
}

fn err(n: &Node<'_>, message: impl Into<String>) -> PolicyError {
    PolicyError {
        line: n.pos.line,
        column: n.pos.column,
        message: message.into(),
    }
}

fn strings(n: &Node<'_>, what: &str) -> Result<Vec<String>, PolicyError> {
    let Value::Seq(items) = &n.value else {
        return Err(err(n, format!("`{what}` must be a list of strings")));
    };
    items
        .iter()
        .map(|i| match &i.value {
            Value::Str(s) => Ok(s.to_string()),
            _ => Err(err(i, format!("`{what}` must be a list of strings"))),
        })
        .collect()
}

fn fields<'n>(n: &'n Node<'n>, what: &str, known: &[&str]) -> Result<Vec<(&'n str, &'n Node<'n>)>, PolicyError> {
    let Value::Map(entries) = &n.value else {
        return Err(err(n, format!("{what} must be a mapping")));
    };
    entries
        .iter()
        .map(|(k, v)| match &k.value {
            Value::Str(key) if known.contains(&key.as_ref()) => Ok((key.as_ref(), v)),
            Value::Str(key) => Err(err(
                k,
                format!("unknown field `{key}` in {what}; known: {}", known.join(", ")),
            )),
            _ => Err(err(k, format!("keys of {what} are strings"))),
        })
        .collect()
}

/// Parses a policy file. Every problem is an error: a trust file is not the place to guess.
pub fn parse(text: &str) -> Result<Policy, PolicyError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(PolicyError {
            line: 0,
            column: 0,
            message: "policy file is larger than 1 MiB".into(),
        });
    }
    let docs = load_str(text).map_err(|e| {
        let p = e.pos.unwrap_or_default();
        PolicyError {
            line: p.line,
            column: p.column,
            message: e.message,
        }
    })?;
    let mut policy = Policy::default();
    let Some(doc) = docs.first() else { return Ok(policy) };
    for (key, v) in fields(doc, "the policy", &["mode", "rules"])? {
        match key {
            "mode" => {
                policy.mode = match &v.value {
                    Value::Str(s) if s == "head" => Mode::Head,
                    Value::Str(s) if s == "strict" => Mode::Strict,
                    _ => return Err(err(v, "`mode` is `head` or `strict`")),
                }
            }
            _ => {
                let Value::Seq(rules) = &v.value else {
                    return Err(err(v, "`rules` must be a list"));
                };
                for (i, r) in rules.iter().enumerate() {
                    let mut paths = None;
                    let mut principals = None;
                    for (k, rv) in fields(r, "a rule", &["paths", "principals"])? {
                        match k {
                            "paths" => paths = Some(strings(rv, "paths")?),
                            _ => principals = Some(strings(rv, "principals")?),
                        }
                    }
                    let (Some(paths), Some(principals)) = (paths, principals) else {
                        return Err(err(r, "a rule needs `paths` and `principals`"));
                    };
                    let mut b = globset::GlobSetBuilder::new();
                    for p in &paths {
                        b.add(
                            globset::GlobBuilder::new(p)
                                .literal_separator(true)
                                .build()
                                .map_err(|e| err(r, format!("`{p}` is not a glob: {}", e.kind())))?,
                        );
                    }
                    let matcher = b.build().map_err(|e| err(r, e.to_string()))?;
                    policy.rules.push(PathRule {
                        index: i + 1,
                        paths,
                        principals,
                        matcher,
                    });
                }
            }
        }
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rules_and_refuses_unknown_fields() {
        let p =
            parse("mode: strict\nrules:\n  - paths: [\"environments/production/**\"]\n    principals: [\"ops-*\"]\n")
                .expect("valid");
        assert_eq!(p.mode, Mode::Strict);
        assert!(p.rules[0].matches("environments/production/api.yaml"));
        assert!(!p.rules[0].matches("environments/preview/api.yaml"));
        assert_eq!(parse("mode: loose\n").expect_err("bad mode").line, 1);
        assert!(
            parse("rules:\n  - paths: [a]\n    principal: [b]\n")
                .expect_err("typo")
                .message
                .contains("unknown field `principal`")
        );
        assert!(parse("rules:\n  - paths: [a]\n").is_err());
    }
}
