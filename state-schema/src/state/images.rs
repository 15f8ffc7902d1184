//! The images of a state that `imageUpdates` policies may move, and whether one state differs
//! from another only in such images (what a signer limited to images, the policy's `bots`,
//! may change). The decision over a registry's tags is `crate::image_updates`.

use super::State;
use crate::diag::Pos;
use crate::image_updates::ImageUpdates;
use crate::model::{Kind, Spec};

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
    pub at: Pos,
    pub image: String,
    pub policy: ImageUpdates,
}

/// Every image of `state` with an `imageUpdates` policy, in the state's order.
pub fn updatable(state: &State) -> Vec<Updatable> {
    let mut out = Vec::new();
    for loc in state.iter() {
        let name = loc.object.name().to_string();
        let (label, project, environment, image, policy) = match &loc.object.spec {
            Spec::Project(p) => (
                format!("project/{name}"),
                name.clone(),
                None,
                p.image.as_str(),
                &p.image_updates,
            ),
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
pub fn only_images(before: &State, after: &State, may: impl Fn(&str) -> bool) -> Result<(), String> {
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
