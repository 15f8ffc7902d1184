//! Image updates: a Project's (or an Environment's own) `imageUpdates` policy, and the one
//! decision over a registry's tags, pure: which tag is newest under the policy, and whether the
//! image in Git should move to it. `pl image update` (and a watcher, later) reads the tags and
//! digests, calls [`decide`], and writes what it returns as a signed commit.

use serde::Serialize;

/// Most tags one decision looks at (a registry answering more is read no further).
pub const MAX_TAGS: usize = 10_000;

/// How tags matching a pattern are ordered: by the `key` capture group (or the whole tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// As numbers (`build-9` before `build-10`); a key that is not a number is left out.
    Numeric,
    /// As text.
    Alphabetical,
}

/// What an update may pick.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", untagged)]
pub enum Pick {
    /// A semantic-version range (`>=1.4, <2`); tags may start with `v`. Pre-releases only when
    /// the range names one.
    Semver { semver: String },
    /// A regular expression tags must match, newest by `order`.
    Pattern { pattern: String, order: Order },
}

/// Whether the digest in Git may move.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Digests {
    /// The image follows the newest allowed tag's digest (a tag moved to new bytes counts).
    #[default]
    Track,
    /// The digest is pinned: the image is never touched.
    Pin,
}

/// Where an update's commit goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Branch {
    /// A branch of its own (`pl-image-update/<kind>/<name>`), moved on each update: merged by
    /// a person (a pull request).
    #[default]
    Own,
    /// Straight onto the branch checked out (the applied branch, in CI).
    Applied,
}

/// An `imageUpdates` policy, validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageUpdates {
    #[serde(flatten)]
    pub pick: Pick,
    #[serde(skip_serializing_if = "is_default")]
    pub digests: Digests,
    #[serde(skip_serializing_if = "is_default")]
    pub branch: Branch,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// An image reference's repository and tag: `reg:5000/team/api:1.4.2@sha256:…` is
/// (`reg:5000/team/api`, `Some("1.4.2")`); a `:` before the last `/` is a port.
pub fn repository_of(image: &str) -> (&str, Option<&str>) {
    let name = image.split_once('@').map_or(image, |(n, _)| n);
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[slash..].rfind(':') {
        Some(i) => (&name[..slash + i], Some(&name[slash + i + 1..])),
        None => (name, None),
    }
}

/// Whether the policy's pattern or range is well formed: the message when it is not.
pub fn invalid(pick: &Pick) -> Option<String> {
    match pick {
        Pick::Semver { semver } => semver::VersionReq::parse(semver)
            .err()
            .map(|e| format!("`{semver}` is not a semantic-version range: {e}")),
        Pick::Pattern { pattern, .. } => regex::Regex::new(pattern)
            .err()
            .map(|e| format!("`{pattern}` is not a regular expression: {e}")),
    }
}

fn version(tag: &str) -> Option<semver::Version> {
    semver::Version::parse(tag.strip_prefix('v').unwrap_or(tag)).ok()
}

/// The newest of `tags` the policy allows (ties: the first listed). `None` when none is.
pub fn newest<'t>(pick: &Pick, tags: &'t [String]) -> Option<&'t str> {
    let tags = &tags[..tags.len().min(MAX_TAGS)];
    match pick {
        Pick::Semver { semver } => {
            let range = semver::VersionReq::parse(semver).ok()?;
            tags.iter()
                .filter_map(|t| Some((version(t).filter(|v| range.matches(v))?, t)))
                .fold(None, |best: Option<(semver::Version, &String)>, (v, t)| match &best {
                    Some((b, _)) if *b >= v => best,
                    _ => Some((v, t)),
                })
                .map(|(_, t)| t.as_str())
        }
        Pick::Pattern { pattern, order } => {
            let re = regex::Regex::new(pattern).ok()?;
            let key = |t: &'t String| -> Option<&'t str> {
                let c = re.captures(t)?;
                Some(c.name("key").map_or(t.as_str(), |m| m.as_str()))
            };
            let mut best: Option<(&str, &str)> = None;
            for t in tags {
                let Some(k) = key(t) else { continue };
                let better = match (order, best) {
                    (_, None) => true,
                    (Order::Alphabetical, Some((b, _))) => k > b,
                    (Order::Numeric, Some((b, _))) => match (k.parse::<u128>(), b.parse::<u128>()) {
                        (Ok(x), Ok(y)) => x > y,
                        _ => false,
                    },
                };
                if better && (*order == Order::Alphabetical || k.parse::<u128>().is_ok()) {
                    best = Some((k, t));
                }
            }
            best.map(|(_, t)| t)
        }
    }
}

/// What to do with an image in Git.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Move it to `image` (`repository:tag@digest`).
    Update { image: String, tag: String },
    /// It is the newest allowed tag's digest already.
    Current,
    /// The policy pins the digest: never touched.
    Pinned,
    /// No tag of the registry's is allowed by the policy.
    NoTag,
}

/// The decision for `image` (as Git has it) under `policy`, given the newest allowed tag and
/// its digest (`None`: no tag is allowed).
pub fn decide(policy: &ImageUpdates, image: &str, newest: Option<(&str, &str)>) -> Decision {
    if policy.digests == Digests::Pin {
        return Decision::Pinned;
    }
    let Some((tag, digest)) = newest else {
        return Decision::NoTag;
    };
    let (repository, current_tag) = repository_of(image);
    let current_digest = image.split_once('@').map(|(_, d)| d);
    if current_tag == Some(tag) && current_digest == Some(digest) {
        return Decision::Current;
    }
    Decision::Update {
        image: format!("{repository}:{tag}@{digest}"),
        tag: tag.to_owned(),
    }
}

#[cfg(test)]
mod tests;
