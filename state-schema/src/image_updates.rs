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

/// One object whose image may move: a Project's, or an Environment's own, with its policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Updatable {
    /// `project/api` or `environment/api-production`: unambiguous across kinds, and the name
    /// of its branch (`pl-image-update/<label>`).
    pub label: String,
    /// The project whose image it is (an environment's own project).
    pub project: String,
    /// The environment, for an environment's own image.
    pub environment: Option<String>,
    pub file: String,
    /// Where the `image` scalar starts in `file`.
    pub at: crate::diag::Pos,
    pub image: String,
    pub policy: ImageUpdates,
}

/// Every image of `state` with an `imageUpdates` policy, in the state's order.
pub fn updatable(state: &crate::state::State) -> Vec<Updatable> {
    use crate::model::Spec;
    let mut out = Vec::new();
    for loc in state.iter() {
        let name = loc.object.name().to_string();
        let (label, project, environment, image, policy) = match &loc.object.spec {
            Spec::Project(p) => (format!("project/{name}"), name.clone(), None, p.image.as_str(), &p.image_updates),
            Spec::Environment(e) => match &e.image {
                Some(i) => (
                    format!("environment/{name}"),
                    e.project.to_string(),
                    Some(name.clone()),
                    i.as_str(),
                    &e.image_updates,
                ),
                None => continue,
            },
            _ => continue,
        };
        if let Some(policy) = policy {
            out.push(Updatable {
                label,
                project,
                environment,
                file: loc.file.clone(),
                at: loc.pos_of("spec.image"),
                image: image.to_owned(),
                policy: policy.clone(),
            });
        }
    }
    out
}

/// Whether `after` differs from `before` only in images of projects `may` allows: a Project's
/// `image`, or an Environment's own `image` (its project allowed). Otherwise the first other
/// change, in words: what a signer limited to images (the policy's `bots`) may not do.
pub fn only_images(
    before: &crate::state::State,
    after: &crate::state::State,
    may: impl Fn(&str) -> bool,
) -> Result<(), String> {
    use crate::model::{Kind, Spec};
    let before_signatures: Vec<_> = before.all_image_signatures().collect();
    if before_signatures != after.all_image_signatures().collect::<Vec<_>>() {
        return Err("image signatures (`image-signatures/`)".into());
    }
    let mut keys: Vec<(Kind, &str)> = before
        .iter()
        .chain(after.iter())
        .map(|l| (l.object.kind(), l.object.name().as_str()))
        .collect();
    keys.sort();
    keys.dedup();
    for (kind, name) in keys {
        let (b, a) = (before.get(kind, name), after.get(kind, name));
        let (Some(b), Some(a)) = (b, a) else {
            return Err(format!("{kind} {name} (added or removed)"));
        };
        if b.object == a.object {
            continue;
        }
        let mut same = a.object.clone();
        let project = match (&b.object.spec, &mut same.spec) {
            (Spec::Project(was), Spec::Project(now)) => {
                now.image = was.image.clone();
                name.to_owned()
            }
            (Spec::Environment(was), Spec::Environment(now)) => {
                now.image = was.image.clone();
                was.project.to_string()
            }
            _ => return Err(format!("{kind} {name}")),
        };
        if same != b.object {
            return Err(format!("{kind} {name}: more than its image"));
        }
        if !may(&project) {
            return Err(format!(
                "{kind} {name}: the image of project {project}, which it may not update"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
