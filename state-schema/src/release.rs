//! What makes a release, and what a change to a deployment is: the one decision behind both
//! `pl plan`'s rollouts and the generations the reconciler writes.
//!
//! A new generation (and with it the release roles, and a replacement of every replica) comes
//! only from what changes the release: the image, variables, roles (command, resources,
//! health, ports; not their replica counts) and secrets' ciphertext, release roles added or
//! gone, or a volume's new generation. Adding or removing replicas, and moving replicas to
//! other nodes (a drain, a lost node), is a scale: the current generation gains or loses
//! instances, and the replicas that stay keep their containers.

use crate::canonical::{self, Secrets};
use crate::deployment::{DeploymentSpec, Instance};
use crate::model::{Environment, Kind};
use crate::state::State;
use crate::values::{Hostname, Name};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// Release hashes of a state's environments. The project's part (roles without replicas, and
/// its secrets' ciphertext) is hashed once per project, so a large state costs one hash per
/// project and one small one per environment.
pub struct Releases<'s> {
    state: &'s State,
    projects: HashMap<Name, Option<String>>,
}

impl<'s> Releases<'s> {
    pub fn new(state: &'s State) -> Self {
        Releases {
            state,
            projects: HashMap::new(),
        }
    }

    fn project_hash(&mut self, name: &Name) -> Option<String> {
        let state = self.state;
        self.projects
            .entry(name.clone())
            .or_insert_with(|| {
                let project = state.project(name.as_str())?;
                let roles: BTreeMap<&Name, Value> = project
                    .roles
                    .iter()
                    .map(|(n, r)| {
                        let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
                        // How many run, and how a release is delivered, are not the release.
                        if let Value::Object(m) = &mut v {
                            m.remove("replicas");
                            m.remove("rollout");
                        }
                        (n, v)
                    })
                    .collect();
                let secrets: BTreeMap<&Name, Option<String>> = project
                    .secrets
                    .iter()
                    .map(|s| {
                        (
                            s,
                            state
                                .get(Kind::Secret, s.as_str())
                                .map(|l| canonical::hash(&canonical::document(&l.object, Secrets::Ciphertext))),
                        )
                    })
                    .collect();
                Some(canonical::hash(&(roles, secrets)))
            })
            .clone()
    }

    /// The hash of everything an environment's release depends on; `None` when its project is
    /// missing. Equal hashes: the same release.
    pub fn release_hash(&mut self, env: &Environment) -> Option<String> {
        let project = self.state.project(env.project.as_str())?;
        let mut vars: BTreeMap<&str, &str> = project.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        vars.extend(env.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let image = env.image.as_ref().unwrap_or(&project.image);
        let project = self.project_hash(&env.project)?;
        Some(canonical::hash(&(image, vars, project)))
    }
}

/// What moving a deployment from `old` to `new` takes.
// A value made and matched once per changed deployment per pass, never stored in bulk: the
// scale's lists stay inline rather than boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing runs differently.
    None,
    /// The same release on the same hostnames: instances are added and removed at the current
    /// generation, with the nodes they bring or leave. A replica that moves is in both lists.
    Scale {
        added: Vec<Instance>,
        removed: Vec<Instance>,
        nodes_added: Vec<Name>,
        nodes_removed: Vec<Name>,
        ingress_added: Vec<Name>,
        ingress_removed: Vec<Name>,
        /// Hostnames (a Domain, say) the environment gains or loses: routes only, so no new
        /// generation (no replica restarts for a name).
        hostnames_added: Vec<Hostname>,
        hostnames_removed: Vec<Hostname>,
        /// Hostnames kept whose brought certificate changed (a Secret's `CERT` and `KEY`
        /// rotated, or `tls.secret` added, changed or removed): published again in place on
        /// every node that serves them, no replica restarted.
        certificates_changed: Vec<Hostname>,
    },
    /// A new generation: a new release, or a change a scale cannot express (release roles
    /// added or gone, a volume's new generation).
    Generation,
}

fn minus<T: Clone + PartialEq>(a: &[T], b: &[T]) -> Vec<T> {
    a.iter().filter(|x| !b.contains(x)).cloned().collect()
}

/// The one decision: what it takes to go from `old` to `new`. `pl plan` prints a rollout for
/// [`Change::Generation`]; the reconciler writes a new generation for it, and instance jobs
/// at the current generation for [`Change::Scale`].
/// Which generation of each volume the roles mount: a restore moves one on, and containers
/// mount a volume when they are made, so that takes a new generation of the deployment.
fn volume_generations(spec: &DeploymentSpec) -> Vec<(&str, u64)> {
    spec.roles
        .values()
        .flat_map(|r| r.volumes.iter().map(|v| (v.name.as_str(), v.generation)))
        .collect()
}

pub fn change(old: &DeploymentSpec, new: &DeploymentSpec) -> Change {
    if old == new {
        return Change::None;
    }
    // Which release roles run, not where: they ran once for this generation already, so a
    // drain of the node they ran on moves nothing that runs.
    let release_roles = |s: &DeploymentSpec| s.release.iter().map(|(role, _)| role.clone()).collect::<Vec<_>>();
    // A deployment that never ran anywhere (every replica waited) starts with a generation,
    // so its release roles run before its first replicas.
    if old.release_hash != new.release_hash
        || old.release_hash.is_empty()
        || old.nodes.is_empty()
        || release_roles(old) != release_roles(new)
        || volume_generations(old) != volume_generations(new)
    {
        return Change::Generation;
    }
    // A replica that moves (a drain, a lost node) is one added where it goes and one removed
    // where it was, at this generation: the replicas that stay keep their containers. Its move
    // count names the new container apart from the old one ([`Instance::moves`]).
    let added: Vec<Instance> = new
        .instances
        .iter()
        .filter(|n| !old.instances.iter().any(|o| o.same_slot(n) && o.node == n.node))
        .cloned()
        .collect();
    let removed: Vec<Instance> = old
        .instances
        .iter()
        .filter(|o| !new.instances.iter().any(|n| o.same_slot(n) && o.node == n.node))
        .cloned()
        .collect();
    let certificate =
        |spec: &DeploymentSpec, h: &Hostname| spec.certificates.iter().find(|(c, _)| c == h).map(|(_, t)| t.clone());
    let certificates_changed = new
        .hostnames
        .iter()
        .filter(|h| old.hostnames.contains(h) && certificate(old, h) != certificate(new, h))
        .cloned()
        .collect();
    Change::Scale {
        added,
        removed,
        certificates_changed,
        nodes_added: minus(&new.nodes, &old.nodes),
        nodes_removed: minus(&old.nodes, &new.nodes),
        ingress_added: minus(&new.ingress_nodes, &old.ingress_nodes),
        ingress_removed: minus(&old.ingress_nodes, &new.ingress_nodes),
        hostnames_added: minus(&new.hostnames, &old.hostnames),
        hostnames_removed: minus(&old.hostnames, &new.hostnames),
    }
}
