//! When a plan may be computed from the changed files alone.
//!
//! A change is *local* when every object it touches keeps every fact another object depends
//! on: names, references, hostnames, overridden roles and variables. Then the objects outside the
//! changed files are the same on both sides, every rule that spans objects gives the same answer
//! for head as for base, and the consequences follow from the changed objects alone. Planning
//! reads only the changed blobs; anything else falls back to reading both trees whole.
//!
//! The base is taken to be valid, as a merged commit is when CI runs `pl validate` on it; a
//! property test holds local plans equal to whole ones.

use crate::model::{Kind, Object, Spec};
use crate::parse::ParsedFile;
use crate::state::State;
use crate::values::Name;
use std::collections::BTreeMap;

type Objects<'a> = BTreeMap<(Kind, &'a Name), &'a Object>;

/// True when the plan of two partial states (the changed files of base and head) equals the
/// plan of the whole trees.
pub fn is_local(base: &State, head: &State) -> bool {
    // A signature file changes the roles of every project whose image it signs: not local.
    if base.has_broken() || head.has_broken() || base.has_image_signatures() || head.has_image_signatures() {
        return false;
    }
    fn objects(s: &State) -> Objects<'_> {
        s.iter()
            .map(|l| ((l.object.kind(), l.object.name()), &l.object))
            .collect()
    }
    same_facts(&objects(base), &objects(head))
}

/// [`is_local`] on the changed files themselves, before any state is built from them.
pub fn is_local_files(base: &[&ParsedFile], head: &[&ParsedFile]) -> bool {
    fn objects<'a>(files: &[&'a ParsedFile]) -> Option<Objects<'a>> {
        let mut map = BTreeMap::new();
        for f in files {
            if !f.declared.is_empty() || crate::image_signatures::is_signature_path(&f.path) {
                return None;
            }
            for l in &f.objects {
                // The same name twice is a duplicate: leave it to the whole-tree checks.
                if map.insert((l.object.kind(), l.object.name()), &l.object).is_some() {
                    return None;
                }
            }
        }
        Some(map)
    }
    match (objects(base), objects(head)) {
        (Some(b), Some(h)) => same_facts(&b, &h),
        _ => false,
    }
}

fn same_facts(base: &Objects<'_>, head: &Objects<'_>) -> bool {
    if !base.keys().eq(head.keys()) {
        // Something was created, deleted or renamed: names and references may change.
        return false;
    }
    base.values().zip(head.values()).all(|(b, h)| {
        if b == h {
            return true;
        }
        match (&b.spec, &h.spec) {
            (Spec::Environment(x), Spec::Environment(y)) => {
                x.project == y.project
                    && x.stage == y.stage
                    && x.pool == y.pool
                    && x.hostname == y.hostname
                    && x.tls == y.tls
                    && x.env == y.env
                    && x.replicas.keys().eq(y.replicas.keys())
                    && (x.image == y.image || (x.image.is_some() && y.image.is_some()))
            }
            (Spec::Domain(x), Spec::Domain(y)) => {
                x.hostname == y.hostname && x.environment == y.environment && x.tls == y.tls
            }
            _ => false,
        }
    })
}
