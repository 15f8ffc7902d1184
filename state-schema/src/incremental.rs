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

use crate::model::Spec;
use crate::state::State;

/// True when the plan of two partial states (the changed files of base and head) equals the
/// plan of the whole trees.
pub fn is_local(base: &State, head: &State) -> bool {
    if base.has_broken() {
        return false;
    }
    let keys = |s: &State| {
        s.iter()
            .map(|l| (l.object.kind(), l.object.name().clone()))
            .collect::<Vec<_>>()
    };
    if keys(base) != keys(head) {
        // Something was created, deleted or renamed: names and references may change.
        return false;
    }
    base.iter().zip(head.iter()).all(|(b, h)| {
        if b.object == h.object {
            return true;
        }
        match (&b.object.spec, &h.object.spec) {
            (Spec::Environment(x), Spec::Environment(y)) => {
                x.project == y.project
                    && x.stage == y.stage
                    && x.pool == y.pool
                    && x.hostname == y.hostname
                    && x.env == y.env
                    && x.replicas.keys().eq(y.replicas.keys())
                    && (x.image == y.image || (x.image.is_some() && y.image.is_some()))
            }
            (Spec::Domain(x), Spec::Domain(y)) => {
                x.hostname == y.hostname && x.environment == y.environment
            }
            _ => false,
        }
    })
}
