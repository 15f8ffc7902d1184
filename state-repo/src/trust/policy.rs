//! The signing policy: which commits must be signed, and which principals may make which
//! changes, by path or by consequence. Lives in the daemon's configuration (or `--policy` for
//! the CLI), never in the state repository: a repository cannot vouch for itself.
//!
//! ```yaml
//! mode: strict            # or `head` (default)
//! rules:
//!   - paths: ["environments/production/**"]
//!     principals: ["ops-*"]
//!   - environments: {stage: production}     # any change that reaches a production environment
//!     principals: ["ops-*"]
//! bots:                   # signers limited to moving images (`pl image update`'s key)
//!   - principals: ["image-bot"]
//!     images: ["api", "shop-*"]
//! images:                 # who may sign which projects' images (image-signatures/)
//!   - projects: ["api", "shop-*"]
//!     principals: ["ci-release"]
//!     unsigned: refuse      # the default; `allow` lets unsigned images of these projects run
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

/// Which environments a rule guards. Every field given must match (an empty one matches
/// anything); `names` are globs.
#[derive(Clone, Debug, Default)]
pub struct EnvironmentSelector {
    pub stages: Vec<String>,
    pub names: Vec<String>,
    pub pools: Vec<String>,
    name_matcher: Option<globset::GlobSet>,
}

impl EnvironmentSelector {
    pub fn matches(&self, name: &str, stage: &str, pool: &str) -> bool {
        (self.stages.is_empty() || self.stages.iter().any(|s| s == stage))
            && self.name_matcher.as_ref().is_none_or(|m| m.is_match(name))
            && (self.pools.is_empty() || self.pools.iter().any(|p| p == pool))
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, list) in [("stage", &self.stages), ("names", &self.names), ("pools", &self.pools)] {
            if !list.is_empty() {
                parts.push(format!("{what} {}", list.join("|")));
            }
        }
        parts.join(", ")
    }
}

/// A rule: the principals that alone may change what it guards: paths (globs relative to the
/// state tree's root), environments (by what a change does to them, whichever file caused
/// it), or both.
#[derive(Clone, Debug)]
pub struct Rule {
    /// 1-based, for messages.
    pub index: usize,
    pub paths: Vec<String>,
    pub environments: Option<EnvironmentSelector>,
    pub principals: Vec<String>,
    matcher: globset::GlobSet,
}

impl Rule {
    /// True when the rule guards `path`.
    pub fn matches(&self, path: &str) -> bool {
        self.matcher.is_match(path)
    }

    /// True when the rule guards the environment.
    pub fn matches_environment(&self, name: &str, stage: &str, pool: &str) -> bool {
        self.environments.as_ref().is_some_and(|e| e.matches(name, stage, pool))
    }

    pub fn describe(&self) -> String {
        let mut what = Vec::new();
        if !self.paths.is_empty() {
            what.push(format!("paths {}", self.paths.join(", ")));
        }
        if let Some(e) = &self.environments {
            what.push(format!("environments {}", e.describe()));
        }
        format!(
            "rule {} ({}; principals {})",
            self.index,
            what.join("; "),
            self.principals.join(", ")
        )
    }
}

#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub mode: Mode,
    pub rules: Vec<Rule>,
    /// Who may sign which projects' images (`images:`); see [`super::images`].
    pub images: Vec<ImageRule>,
    /// Signers limited to moving images (`bots:`): `pl image update`'s key.
    pub bots: Vec<BotRule>,
}

/// A bot: principals whose commits may change nothing but the images of the projects it names
/// (a Project's `image`, an Environment's own), whatever path rules would allow them.
#[derive(Clone, Debug)]
pub struct BotRule {
    /// 1-based, for messages.
    pub index: usize,
    pub principals: Vec<String>,
    pub images: Vec<String>,
    matcher: globset::GlobSet,
}

impl BotRule {
    /// Whether it may move `project`'s images.
    pub fn may_update(&self, project: &str) -> bool {
        self.matcher.is_match(project)
    }
}

/// An image rule: the principals whose keys may sign the images of the projects it names
/// (globs), and whether an unsigned image of theirs may run.
#[derive(Clone, Debug)]
pub struct ImageRule {
    /// 1-based, for messages.
    pub index: usize,
    pub projects: Vec<String>,
    pub principals: Vec<String>,
    /// `unsigned: allow`: an image without signatures runs (a signed one is still checked).
    /// The default refuses it.
    pub allow_unsigned: bool,
    matcher: globset::GlobSet,
}

impl ImageRule {
    pub fn matches(&self, project: &str) -> bool {
        self.matcher.is_match(project)
    }
}

impl Policy {
    /// True when some rule guards environments (or limits a bot to images), so judging a
    /// commit must work out what it does.
    pub fn has_environment_rules(&self) -> bool {
        self.rules.iter().any(|r| r.environments.is_some()) || !self.bots.is_empty()
    }
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

/// A string, or a list of strings.
fn one_or_more(n: &Node<'_>, what: &str) -> Result<Vec<String>, PolicyError> {
    match &n.value {
        Value::Str(s) => Ok(vec![s.to_string()]),
        _ => strings(n, what),
    }
}

fn globs(r: &Node<'_>, patterns: &[String]) -> Result<globset::GlobSet, PolicyError> {
    let mut b = globset::GlobSetBuilder::new();
    for p in patterns {
        b.add(
            globset::GlobBuilder::new(p)
                .literal_separator(true)
                .build()
                .map_err(|e| err(r, format!("`{p}` is not a glob: {}", e.kind())))?,
        );
    }
    b.build().map_err(|e| err(r, e.to_string()))
}

fn selector(n: &Node<'_>) -> Result<EnvironmentSelector, PolicyError> {
    let mut sel = EnvironmentSelector::default();
    for (k, v) in fields(n, "`environments`", &["stage", "names", "pools"])? {
        match k {
            "stage" => {
                sel.stages = one_or_more(v, "stage")?;
                if let Some(bad) = sel
                    .stages
                    .iter()
                    .find(|s| !matches!(s.as_str(), "production" | "preview"))
                {
                    return Err(err(v, format!("stage `{bad}` is `production` or `preview`")));
                }
            }
            "names" => {
                sel.names = one_or_more(v, "names")?;
                sel.name_matcher = Some(globs(v, &sel.names)?);
            }
            _ => sel.pools = one_or_more(v, "pools")?,
        }
    }
    if sel.stages.is_empty() && sel.names.is_empty() && sel.pools.is_empty() {
        return Err(err(n, "`environments` needs `stage`, `names` or `pools`"));
    }
    Ok(sel)
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

/// `images:`, a list of `{projects, principals, unsigned}`.
fn image_rules(v: &Node<'_>) -> Result<Vec<ImageRule>, PolicyError> {
    let Value::Seq(rules) = &v.value else {
        return Err(err(v, "`images` must be a list"));
    };
    let mut out = Vec::with_capacity(rules.len());
    for (i, r) in rules.iter().enumerate() {
        let (mut projects, mut principals, mut allow_unsigned) = (None, None, false);
        for (k, rv) in fields(r, "an image rule", &["projects", "principals", "unsigned"])? {
            match k {
                "projects" => projects = Some(one_or_more(rv, "projects")?),
                "principals" => principals = Some(strings(rv, "principals")?),
                _ => {
                    allow_unsigned = match &rv.value {
                        Value::Str(s) if s == "refuse" => false,
                        Value::Str(s) if s == "allow" => true,
                        _ => return Err(err(rv, "`unsigned` is `refuse` (the default) or `allow`")),
                    }
                }
            }
        }
        let (Some(projects), Some(principals)) = (projects, principals) else {
            return Err(err(r, "an image rule needs `projects` and `principals`"));
        };
        out.push(ImageRule {
            index: i + 1,
            matcher: globs(r, &projects)?,
            projects,
            principals,
            allow_unsigned,
        });
    }
    Ok(out)
}

/// `bots:`, a list of `{principals, images}`.
fn bot_rules(v: &Node<'_>) -> Result<Vec<BotRule>, PolicyError> {
    let Value::Seq(rules) = &v.value else {
        return Err(err(v, "`bots` must be a list"));
    };
    let mut out = Vec::with_capacity(rules.len());
    for (i, r) in rules.iter().enumerate() {
        let (mut principals, mut images) = (None, None);
        for (k, rv) in fields(r, "a bot", &["principals", "images"])? {
            match k {
                "principals" => principals = Some(strings(rv, "principals")?),
                _ => images = Some(one_or_more(rv, "images")?),
            }
        }
        let (Some(principals), Some(images)) = (principals, images) else {
            return Err(err(
                r,
                "a bot needs `principals` and `images` (the projects whose images it may move)",
            ));
        };
        out.push(BotRule {
            index: i + 1,
            matcher: globs(r, &images)?,
            principals,
            images,
        });
    }
    Ok(out)
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
    for (key, v) in fields(doc, "the policy", &["mode", "rules", "images", "bots"])? {
        match key {
            "images" => policy.images = image_rules(v)?,
            "bots" => policy.bots = bot_rules(v)?,
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
                    let (mut paths, mut environments, mut principals) = (Vec::new(), None, None);
                    for (k, rv) in fields(r, "a rule", &["paths", "environments", "principals"])? {
                        match k {
                            "paths" => paths = strings(rv, "paths")?,
                            "environments" => environments = Some(selector(rv)?),
                            _ => principals = Some(strings(rv, "principals")?),
                        }
                    }
                    let Some(principals) = principals else {
                        return Err(err(r, "a rule needs `principals`"));
                    };
                    if paths.is_empty() && environments.is_none() {
                        return Err(err(r, "a rule needs `paths` or `environments`"));
                    }
                    policy.rules.push(Rule {
                        index: i + 1,
                        matcher: globs(r, &paths)?,
                        paths,
                        environments,
                        principals,
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

    #[test]
    fn environment_rules() {
        let p = parse(
            "rules:\n  - environments: {stage: production}\n    principals: [ops-*]\n  - environments: {names: [\"shop-*\"], pools: [eu, us]}\n    principals: [shop]\n",
        )
        .expect("valid");
        assert!(p.has_environment_rules());
        assert!(p.rules[0].matches_environment("api-prod", "production", "eu"));
        assert!(!p.rules[0].matches_environment("api-dev", "preview", "eu"));
        assert!(
            !p.rules[0].matches("environments/production/api.yaml"),
            "no paths, no path match"
        );
        assert!(p.rules[1].matches_environment("shop-prod", "production", "us"));
        assert!(
            !p.rules[1].matches_environment("shop-prod", "production", "ap"),
            "every field must match"
        );
        assert!(!p.rules[1].matches_environment("api", "production", "us"));
        assert!(p.rules[1].describe().contains("environments names shop-*, pools eu|us"));
        let e = parse("rules:\n  - environments: {stage: prod}\n    principals: [a]\n").expect_err("bad stage");
        assert!(e.message.contains("`production` or `preview`"), "{}", e.message);
        assert!(parse("rules:\n  - environments: {}\n    principals: [a]\n").is_err());
        assert!(parse("rules:\n  - principals: [a]\n").is_err());
    }
}
