//! What a valid state asks the fleet to run: one deployment per environment (a branch preview
//! makes its own), placed on nodes, with a spec hash that decides generations, and the ordered
//! steps of jobs that roll a generation out or tear one down. Pure: the reconciler compares these
//! values with what its ledger holds and writes the difference.

use crate::canonical;
use crate::deployment::{BackupsSpec, DeploymentSpec, TlsSpec};
use crate::model::{Environment, Kind, Spec, Stage};
use crate::placement::{Fleet, Waiting};
use crate::release::Releases;
use crate::runspec::role_specs;
use crate::state::{State, branch_preview_hostname, branch_preview_label, derive_environment};
use crate::values::SmallMap;
use crate::values::{Hostname, Name};
use serde::Serialize;
use std::collections::BTreeMap;

/// A desired deployment: its spec and the hash that decides whether it needs a new generation,
/// with the replicas that wait for a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub spec: DeploymentSpec,
    pub spec_hash: String,
    pub waiting: Vec<Waiting>,
}

/// Why an environment cannot be deployed. It keeps whatever runs now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unplaceable {
    pub environment: Name,
    pub reason: String,
}

/// The deployments of a valid state, placed on `fleet` (which then holds them). For the branch
/// being applied (`preview: None`) that is one per environment; for a preview branch, one per
/// project, named `<branch>--<project>` and placed in the repository's preview pool.
pub fn deployments(state: &State, preview: Option<&str>, fleet: &mut Fleet) -> (Vec<Desired>, Vec<Unplaceable>) {
    deployments_as(state, preview, fleet, Form::Whole)
}

/// What [`deployments`] keeps of each spec once it is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// Everything, with the spec hash (the reconciler writes it; the policy compares hashes).
    Whole,
    /// What [`crate::release::change`] decides by: no spec hash, and no roles once placed
    /// (their release hash stands for them). At 10,000 environments the roles of two sides
    /// were 220 MB of `pl plan`'s memory and the hashes most of its time.
    Placement,
    /// Roles kept (their resources are held on the next side's fleet), no spec hash.
    Unhashed,
}

fn deployments_as(
    state: &State,
    preview: Option<&str>,
    fleet: &mut Fleet,
    form: Form,
) -> (Vec<Desired>, Vec<Unplaceable>) {
    let envs = Environments::of(state, preview);
    let mut out = Vec::with_capacity(envs.len());
    let mut unplaceable = Vec::new();
    let mut releases = Releases::new(state);
    for (name, env) in envs.iter() {
        match desired(state, name, env, &mut releases, fleet, form) {
            Ok(d) => out.push(d),
            Err(reason) => unplaceable.push(Unplaceable {
                environment: name.clone(),
                reason,
            }),
        }
    }
    (out, unplaceable)
}

/// The environments a state deploys: its own (borrowed: a copy of 10,000 was 4 MB of the
/// daemon's peak), or a preview branch's one per project.
enum Environments<'s> {
    Own(&'s State),
    Preview(Vec<(Name, Environment)>),
}

impl<'s> Environments<'s> {
    fn of(state: &'s State, preview: Option<&str>) -> Self {
        match preview {
            None => Environments::Own(state),
            Some(branch) => Environments::Preview(preview_environments(state, branch)),
        }
    }

    fn len(&self) -> usize {
        match self {
            Environments::Own(s) => s.environments().count(),
            Environments::Preview(v) => v.len(),
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = (&Name, &Environment)> + '_> {
        match self {
            Environments::Own(s) => Box::new(s.environments()),
            Environments::Preview(v) => Box::new(v.iter().map(|(n, e)| (n, e))),
        }
    }
}

/// What a change does to one environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// It appears: its first generation rolls out.
    Rollout,
    /// It disappears: it is torn down.
    Teardown,
    /// It stays, and what it runs changes (a new generation).
    Change,
}

/// An environment a change affects, with what a signing policy selects it by.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Affected {
    pub environment: Name,
    pub stage: Stage,
    pub pool: Name,
    pub effect: Effect,
}

/// What decides whether an environment changes: the spec hash of its deployment, or, when it
/// cannot be placed, everything it derives (so a change to an unplaceable environment still
/// counts: it would roll out as soon as a node appears).
fn fingerprint(state: &State, name: &Name, env: &Environment, placed: &BTreeMap<Name, String>) -> String {
    match placed.get(name) {
        Some(hash) => hash.clone(),
        None => {
            let reason = spec_of(state, name, env, &mut Releases::new(state)).err();
            let project = state.project(env.project.as_str()).map(|p| &p.roles);
            canonical::hash(&(project, derive_environment(state, name, env), reason))
        }
    }
}

/// Both sides of a change placed as the reconciler would: `before` on the fleet Git declares,
/// `after` with `before`'s replicas running (placement is sticky). Returns each side's
/// deployments by environment.
pub fn placed_pair(
    before: &State,
    after: &State,
    preview: Option<&str>,
) -> (BTreeMap<Name, Desired>, BTreeMap<Name, Desired>) {
    placed_pair_as(before, after, preview, Form::Whole)
}

/// [`placed_pair`] for what [`crate::release::change`] decides by (`pl plan`'s rollouts): the
/// same placement, without spec hashes and without roles once placed.
pub fn placed_pair_for_change(
    before: &State,
    after: &State,
    preview: Option<&str>,
) -> (BTreeMap<Name, Desired>, BTreeMap<Name, Desired>) {
    placed_pair_as(before, after, preview, Form::Placement)
}

/// [`placed_pair`] with roles but no spec hashes: what a rollout's steps are computed from
/// (`pl plan`'s canaries and rolling batches).
pub fn placed_pair_with_roles(
    before: &State,
    after: &State,
    preview: Option<&str>,
) -> (BTreeMap<Name, Desired>, BTreeMap<Name, Desired>) {
    placed_pair_as(before, after, preview, Form::Unhashed)
}

fn placed_pair_as(
    before: &State,
    after: &State,
    preview: Option<&str>,
    form: Form,
) -> (BTreeMap<Name, Desired>, BTreeMap<Name, Desired>) {
    // Each `before` deployment is placed with its roles, held on `after`'s fleet with their
    // resources (placement is sticky), and only then cut to `form`: one spec's roles at a
    // time, never a whole side's.
    let mut before_fleet = Fleet::declared(before);
    let mut fleet = Fleet::declared(after);
    let first = if form == Form::Whole {
        Form::Whole
    } else {
        Form::Unhashed
    };
    let mut releases = Releases::new(before);
    let mut old = Vec::new();
    for (name, env) in Environments::of(before, preview).iter() {
        if let Ok(mut d) = desired(before, name, env, &mut releases, &mut before_fleet, first) {
            fleet.hold(&d.spec);
            if form == Form::Placement {
                d.spec.roles = SmallMap::new();
            }
            old.push(d);
        }
    }
    let (new, _) = deployments_as(after, preview, &mut fleet, form);
    let by_env = |v: Vec<Desired>| v.into_iter().map(|d| (d.spec.environment.clone(), d)).collect();
    (by_env(old), by_env(new))
}

/// The environments whose deployment differs between `before` and `after`: the same
/// comparison the reconciler makes to decide generations, so a signing policy that guards an
/// environment sees every change that would reach it, whichever file caused it. An
/// environment is matched by its stage and pool on either side.
pub fn affected_environments(before: &State, after: &State, preview: Option<&str>) -> Vec<Affected> {
    let (old, new) = (Environments::of(before, preview), Environments::of(after, preview));
    let old: BTreeMap<&Name, &Environment> = old.iter().collect();
    let new: BTreeMap<&Name, &Environment> = new.iter().collect();
    let (placed_old, placed_new) = placed_pair(before, after, preview);
    let hashes = |m: BTreeMap<Name, Desired>| -> BTreeMap<Name, String> {
        m.into_iter().map(|(n, d)| (n, d.spec_hash)).collect()
    };
    let (placed_old, placed_new) = (hashes(placed_old), hashes(placed_new));
    let mut out = Vec::new();
    for (name, env) in &new {
        let effect = match old.get(name) {
            None => Some(Effect::Rollout),
            Some(o) if fingerprint(before, name, o, &placed_old) != fingerprint(after, name, env, &placed_new) => {
                Some(Effect::Change)
            }
            Some(_) => None,
        };
        if let Some(effect) = effect {
            out.push(Affected {
                environment: (*name).clone(),
                stage: env.stage,
                pool: env.pool.clone(),
                effect,
            });
            // A change of stage or pool is matched by the old values too.
            if let Some(o) = old.get(name)
                && (o.stage != env.stage || o.pool != env.pool)
            {
                out.push(Affected {
                    environment: (*name).clone(),
                    stage: o.stage,
                    pool: o.pool.clone(),
                    effect,
                });
            }
        }
    }
    for (name, env) in &old {
        if !new.contains_key(name) {
            out.push(Affected {
                environment: (*name).clone(),
                stage: env.stage,
                pool: env.pool.clone(),
                effect: Effect::Teardown,
            });
        }
    }
    out.sort();
    out
}

/// The environments a preview branch gets: one per project, when the repository declares
/// previews and a preview domain.
fn preview_environments(state: &State, branch: &str) -> Vec<(Name, Environment)> {
    let Some(repo) = state.repository() else {
        return Vec::new();
    };
    let (Some(previews), Some(domain)) = (&repo.previews, &repo.preview_domain) else {
        return Vec::new();
    };
    // The repository says which branches may have previews, as well as the daemon's
    // configuration: both must match. (Validation has checked every glob.)
    let matches = previews
        .branches
        .iter()
        .filter_map(|g| globset::Glob::new(g).ok())
        .any(|g| g.compile_matcher().is_match(branch));
    if !matches {
        return Vec::new();
    }
    state
        .of_kind(Kind::Project)
        .filter_map(|loc| {
            let project = loc.object.metadata.name.clone();
            let name = Name::new(&branch_preview_label(branch, &project)).ok()?;
            let hostname = branch_preview_hostname(branch, &project, domain).ok()?;
            Some((
                name,
                Environment {
                    project,
                    stage: Stage::Preview,
                    pool: previews.pool.clone(),
                    replicas: SmallMap::new(),
                    env: SmallMap::new(),
                    image: None,
                    hostname: Some(hostname),
                    tls: None,
                    // A preview's volumes are not backed up: it has no repository.
                    backups: None,
                    image_updates: None,
                },
            ))
        })
        .collect()
}

fn desired(
    state: &State,
    name: &Name,
    env: &Environment,
    releases: &mut Releases<'_>,
    fleet: &mut Fleet,
    form: Form,
) -> Result<Desired, String> {
    let mut spec = spec_of(state, name, env, releases)?;
    // A running environment whose pool has no node left to run on keeps what it runs (moving
    // everything nowhere would stop it). A new one is deployed with every replica waiting, and
    // placed as nodes come.
    if fleet.is_running(name) && !fleet.has_usable(&env.pool) {
        return Err(format!("node pool {} has no active node", env.pool));
    }
    let waiting = fleet.place(&mut spec);
    // The spec holds everything the deployment depends on: the release (its hash covers the
    // roles, variables, image and secrets' ciphertext), placement and hostnames.
    let spec_hash = match form {
        Form::Whole => canonical::hash(&spec),
        Form::Unhashed => String::new(),
        Form::Placement => {
            spec.roles = SmallMap::new();
            String::new()
        }
    };
    Ok(Desired {
        spec,
        spec_hash,
        waiting,
    })
}

/// One environment's deployment spec before placement (what runs, how many, where it may
/// run, hostnames, release hash), or why it cannot be derived. `releases` memoises project
/// hashes across environments. [`Fleet::place`] fills in the nodes.
pub fn spec_of(
    state: &State,
    name: &Name,
    env: &Environment,
    releases: &mut Releases<'_>,
) -> Result<DeploymentSpec, String> {
    state
        .project(env.project.as_str())
        .ok_or_else(|| format!("project {} is not declared", env.project))?;
    let derived =
        derive_environment(state, name, env).ok_or_else(|| format!("project {} is not declared", env.project))?;
    let pool = state
        .pools()
        .find(|(n, _)| *n == &env.pool)
        .map(|(_, p)| p)
        .ok_or_else(|| format!("node pool {} is not declared", env.pool))?;
    let image = derived.image.as_str().to_owned();
    let mut hostnames: Vec<Hostname> = derived.hostname.iter().cloned().collect();
    hostnames.extend(derived.domains.iter().cloned());
    hostnames.sort();
    hostnames.dedup();
    Ok(DeploymentSpec {
        environment: name.clone(),
        project: env.project.clone(),
        instances: Vec::new(),
        release: Vec::new(),
        cron: Vec::new(),
        hostnames,
        nodes: Vec::new(),
        ingress_nodes: Vec::new(),
        release_hash: releases.release_hash(env).unwrap_or_default(),
        pool: Some(env.pool.clone()),
        placement: pool.placement,
        roles: role_specs(state, &env.project, &env.env, &image),
        replicas: derived.replicas.clone(),
        certificates: brought_certificates(state, env, derived.hostname.as_ref(), &derived.domains)?,
        // `derived.domains` is sorted (a set's order); each one's method by its hostname.
        domains: derived
            .domains
            .iter()
            .filter_map(|h| Some((h.clone(), state.domain_verification(h)?)))
            .collect(),
        backups: env.backups.as_ref().map(|b| backups_spec(state, b)).transpose()?,
    })
}

/// The environment's backups repository with its Secret's values as ciphertext (validation has
/// checked that the Secret holds `RESTIC_PASSWORD`; a tree that did not pass it is refused here).
fn backups_spec(state: &State, b: &crate::model::EnvironmentBackups) -> Result<BackupsSpec, String> {
    let Some(Spec::Secret(secret)) = state.get(Kind::Secret, b.secret.as_str()).map(|l| &l.object.spec) else {
        return Err(format!("secret {} is not declared", b.secret));
    };
    if !secret.data.contains_key(crate::volumes::RESTIC_PASSWORD) {
        return Err(format!("secret {} has no RESTIC_PASSWORD", b.secret));
    }
    Ok(BackupsSpec {
        repository: b.repository.clone(),
        secret: b.secret.clone(),
        values: secret
            .data
            .iter()
            .map(|(k, c)| (k.to_string(), c.armored().to_owned()))
            .collect(),
    })
}

/// The certificates people bring for the environment's hostnames: its own `tls.secret` for its
/// hostname, each of its Domains' for theirs (with the environment's HSTS choice).
fn brought_certificates(
    state: &State,
    env: &Environment,
    hostname: Option<&Hostname>,
    domains: &[Hostname],
) -> Result<Vec<(Hostname, TlsSpec)>, String> {
    let hsts = env.tls.as_ref().is_some_and(|t| t.hsts);
    let mut out = Vec::new();
    if let (Some(tls), Some(h)) = (&env.tls, hostname) {
        out.push((h.clone(), tls_spec(state, &tls.secret, hsts)?));
    }
    for d in domains {
        if let Some(secret) = state.domain_tls(d) {
            out.push((d.clone(), tls_spec(state, secret, hsts)?));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The certificate a Secret holds, as ciphertext (validation has checked that the Secret
/// exists and holds both keys; a tree that did not pass it is refused here by name).
fn tls_spec(state: &State, secret_name: &Name, hsts: bool) -> Result<TlsSpec, String> {
    let Some(Spec::Secret(secret)) = state.get(Kind::Secret, secret_name.as_str()).map(|l| &l.object.spec) else {
        return Err(format!("secret {secret_name} is not declared"));
    };
    let value = |key: &str| {
        secret
            .data
            .get(key)
            .map(|c| c.armored().to_owned())
            .ok_or_else(|| format!("secret {secret_name} has no {key}"))
    };
    Ok(TlsSpec {
        secret: secret_name.clone(),
        cert: value("CERT")?,
        key: value("KEY")?,
        hsts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_file;
    use crate::rollout::*;
    use crate::state::assemble;
    use crate::task::Task;

    const TREE: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata: {name: t}\nspec: {baseDomain: example.com, previewDomain: preview.example.com, previews: {branches: ['feature/*'], pool: main, ttlHours: 24}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n    - {name: n1, capacity: {cpu: \"2\", memory: 4Gi}}\n    - {name: n2, capacity: {cpu: \"2\", memory: 4Gi}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {name: api}\nspec:\n  image: registry.example.invalid/api@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n  roles:\n    web: {kind: web, port: 8080, health: {path: /healthz}, replicas: 3}\n    migrate: {kind: release}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: api-production}\nspec: {project: api, stage: production, pool: main}\n";

    fn state(text: &str) -> State {
        let (root, rest) = text.split_once("---\n").expect("two parts");
        let files = vec![
            parse_file("pushleft.yaml", root.as_bytes()),
            parse_file("state.yaml", rest.as_bytes()),
        ];
        let loaded = assemble(files, Vec::new());
        assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
        loaded.state
    }

    fn placed(s: &State) -> (Vec<Desired>, Vec<Unplaceable>) {
        deployments(s, None, &mut Fleet::declared(s))
    }

    #[test]
    fn a_node_may_say_its_mesh_address_and_only_as_an_ip() {
        let with = TREE.replace("- {name: n2, capacity:", "- {name: n2, address: 203.0.113.5, capacity:");
        let s = state(&with);
        let nodes: Vec<Option<core::net::IpAddr>> =
            s.pools().flat_map(|(_, p)| p.nodes.iter().map(|n| n.address)).collect();
        assert_eq!(nodes, [None, Some("203.0.113.5".parse().expect("ip"))]);
        let bad = TREE.replace(
            "- {name: n2, capacity:",
            "- {name: n2, address: n2.example.invalid, capacity:",
        );
        let (root, rest) = bad.split_once("---\n").expect("two parts");
        let loaded = assemble(
            vec![
                parse_file("pushleft.yaml", root.as_bytes()),
                parse_file("state.yaml", rest.as_bytes()),
            ],
            Vec::new(),
        );
        let d = &loaded.diagnostics[0];
        assert_eq!(
            (d.code.as_str(), d.line, d.column),
            ("invalid-value", Some(8), Some(27)),
            "{d:?}"
        );
        assert!(d.message.contains("not an IP address"), "{}", d.message);
    }

    #[test]
    fn places_spreads_and_hashes_deterministically() {
        let s = state(TREE);
        let (d, bad) = deployments(&s, None, &mut Fleet::declared(&s));
        assert!(bad.is_empty());
        assert_eq!(d.len(), 1);
        let spec = &d[0].spec;
        let nodes: Vec<&str> = spec.instances.iter().map(|i| i.node.as_str()).collect();
        assert_eq!(nodes, ["n1", "n2", "n1"], "round-robin in name order");
        assert_eq!(spec.release.len(), 1);
        assert_eq!(
            spec.hostnames[0].as_str(),
            "api.example.com",
            "production takes the project name"
        );
        assert_eq!(
            deployments(&s, None, &mut Fleet::declared(&s)).0,
            d,
            "same state, same deployments"
        );
        let scaled = state(&TREE.replace("replicas: 3", "replicas: 2"));
        assert_ne!(
            deployments(&scaled, None, &mut Fleet::declared(&scaled)).0[0].spec_hash,
            d[0].spec_hash
        );
    }

    #[test]
    fn a_preview_branch_gets_one_environment_per_project() {
        let s = state(TREE);
        let (d, _) = deployments(&s, Some("feature/login"), &mut Fleet::declared(&s));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].spec.environment.as_str(), "feature-login--api");
        assert_eq!(
            d[0].spec.hostnames[0].as_str(),
            "feature-login--api.preview.example.com"
        );
    }

    #[test]
    fn brought_certificates_go_to_their_own_hostnames() {
        const ARMOR: &str = "      -----BEGIN AGE ENCRYPTED FILE-----\n      YWdlLWVuY3J5cHRpb24ub3JnL3YxCi0+IFgyNTUxOSBIZjdXcHJtMXQ2cUNOdHJ0\n      V3pyMm01bXFLYmRVNEpRamNweDJTSlpmTjJjCkhVOVBVcWhnVTc2S1l1VGMxWEl6\n      d3BOcDZ1TTdkYVdHditDTkdkMiszcDgKLS0tIGJXMmhqRXBkZEVxbGxDU2pVbzhn\n      MFJubWx5d3NET3JDVnJXRTNmc3BhNEkKRIUIQO/9pOAdSw0FAIQ37tli9MmXZiAk\n      rbwg10OG0JKnYiRsMINUcHpZqXw=\n      -----END AGE ENCRYPTED FILE-----\n";
        let r = "age13pqu6kq73rw4fyl73m3pdqdkh8vx66fv6wh2lz4k7x8pet20ysqs7u409k";
        let secret = |name: &str| {
            format!(
                "---\napiVersion: pushleft.dev/v1alpha1\nkind: Secret\nmetadata: {{name: {name}}}\nspec:\n  recipients: [{r}]\n  data:\n    CERT: |\n{ARMOR}    KEY: |\n{ARMOR}"
            )
        };
        let tree = TREE
            .replace(
                "previews: {branches: ['feature/*'], pool: main, ttlHours: 24}}",
                &format!("previews: {{branches: ['feature/*'], pool: main, ttlHours: 24}}, controlRecipient: {r}}}"),
            )
            .replace(
                "spec: {project: api, stage: production, pool: main}\n",
                "spec: {project: api, stage: production, pool: main, tls: {secret: own, hsts: true}}\n",
            )
            + &secret("own")
            + &secret("theirs")
            + "---\napiVersion: pushleft.dev/v1alpha1\nkind: Domain\nmetadata: {name: shop}\nspec: {hostname: shop.example.org, environment: api-production, tls: {secret: theirs}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Domain\nmetadata: {name: plain}\nspec: {hostname: plain.example.org, environment: api-production}\n";
        let (running, _) = placed(&state(&tree));
        let spec = &running[0].spec;
        let brought: Vec<(&str, &str, bool)> = spec
            .certificates
            .iter()
            .map(|(h, t)| (h.as_str(), t.secret.as_str(), t.hsts))
            .collect();
        assert_eq!(
            brought,
            [("api.example.com", "own", true), ("shop.example.org", "theirs", true)]
        );
        assert!(spec.certificate("plain.example.org").is_none(), "issued or plain HTTP");
        assert!(
            spec.certificate("api.example.com")
                .is_some_and(|t| t.key.contains("BEGIN AGE"))
        );
    }

    #[test]
    fn the_publish_step_publishes_and_a_certificate_republish_goes_to_every_serving_node() {
        let (running, _) = placed(&state(TREE));
        let spec = running[0].spec.clone();
        let steps = rollout_steps(&spec, 2, &[]);
        assert!(!steps[PUBLISH_STEP].is_empty());
        assert!(
            steps[PUBLISH_STEP]
                .iter()
                .all(|(t, _)| matches!(t, Task::PublishIngress { .. }))
        );
        let again = republish_certificate(&spec, 2, "api.example.com", 3);
        let mut nodes: Vec<&str> = again.iter().map(|(_, n)| n.as_str()).collect();
        nodes.sort();
        let mut serving: Vec<&str> = spec.ingress_nodes.iter().map(|n| n.as_str()).collect();
        serving.sort();
        assert_eq!(nodes, serving);
        assert!(again.iter().all(|(t, _)| {
            t.idempotency_key()
                .ends_with(&format!("publish#r{}", CERTIFICATE_REPUBLISH + 3))
        }));
        assert!(republish_certificate(&spec, 2, "other.example.com", 3).is_empty());
    }

    #[test]
    fn a_drained_node_hands_its_replicas_over_and_keeps_nothing() {
        let (running, _) = placed(&state(TREE));
        let old = running[0].spec.clone();
        assert!(old.instances.iter().any(|i| i.node.as_str() == "n1"));
        let drained = state(&TREE.replace("{name: n1, capacity", "{name: n1, state: draining, capacity"));
        let new = placed(&drained).0.remove(0).spec;
        assert!(new.instances.iter().all(|i| i.node.as_str() == "n2"));
        let steps = rollout_steps(&new, 2, std::slice::from_ref(&old));
        let on = |step: &Step, node: &str| -> Vec<String> {
            step.iter()
                .filter(|(_, n)| n.as_str() == node)
                .map(|(t, _)| t.idempotency_key())
                .collect()
        };
        assert!(
            steps[2].iter().all(|(_, n)| n.as_str() == "n2"),
            "new replicas on n2 first"
        );
        // n1, last: its route, then its replicas removed (not kept stopped: they live on n2
        // now), then its network.
        let n1 = on(&steps[4], "n1");
        assert!(n1[0].starts_with("ingress:") && n1[0].ends_with(":remove"), "{n1:?}");
        assert!(n1[1..n1.len() - 1].iter().all(|k| k.ends_with(":teardown")), "{n1:?}");
        assert!(n1[n1.len() - 1].starts_with("net:"), "{n1:?}");
    }

    #[test]
    fn a_drain_moves_the_drained_node_s_replicas_and_leaves_the_others_running() {
        let s = state(TREE);
        let old = deployments(&s, None, &mut Fleet::declared(&s)).0.remove(0).spec;
        let on = |spec: &DeploymentSpec, node: &str| -> Vec<crate::deployment::Instance> {
            spec.instances
                .iter()
                .filter(|i| i.node.as_str() == node)
                .cloned()
                .collect()
        };
        let (leaving, staying) = (on(&old, "n1"), on(&old, "n2"));
        assert!(!leaving.is_empty() && !staying.is_empty(), "{:?}", old.instances);
        let drained = state(&TREE.replace("{name: n1, capacity", "{name: n1, state: draining, capacity"));
        let mut fleet = Fleet::declared(&drained);
        fleet.hold(&old);
        let new = deployments(&drained, None, &mut fleet).0.remove(0).spec;
        // The replicas on n2 are the same replicas (not moved); n1's went to n2, once each.
        for i in &staying {
            assert!(new.instances.contains(i), "{i:?} stays as it was: {:?}", new.instances);
        }
        for i in &leaving {
            let moved = new.instances.iter().find(|n| n.same_slot(i)).expect("placed");
            assert_eq!((moved.node.as_str(), moved.moves), ("n2", 1), "{moved:?}");
        }
        // A scale at the same generation: the staying replicas are in no job.
        let change = crate::release::change(&old, &new);
        let crate::release::Change::Scale { added, removed, .. } = &change else {
            panic!("a drain is a scale: {change:?}");
        };
        assert_eq!((added.len(), removed.len()), (leaving.len(), leaving.len()));
        let (now, after) = scale_tasks(&new, 1, &change);
        let keys = |step: &Step| -> Vec<String> {
            step.iter()
                .map(|(t, n)| format!("{}@{n}", t.idempotency_key()))
                .collect()
        };
        let (now, after) = (keys(&now), keys(&after));
        for i in &staying {
            let slot = format!("app:api-production/{}/{}:", i.role, i.index);
            assert!(
                !now.iter().chain(&after).any(|k| k.starts_with(&slot)),
                "{slot} untouched: {now:?} {after:?}"
            );
        }
        // First the new replicas on n2 and n2's routes; only once they succeeded, n1's route,
        // replicas and network go.
        assert!(now.iter().all(|k| k.ends_with("@n2")), "{now:?}");
        assert!(
            now.iter().any(|k| k.contains(":ensure@")) && now.iter().any(|k| k.contains(":publish@")),
            "{now:?}"
        );
        assert!(after.iter().all(|k| k.ends_with("@n1")), "{after:?}");
        assert!(
            after[0].starts_with("ingress:") && after[0].contains(":remove@"),
            "{after:?}"
        );
        assert!(after[after.len() - 1].starts_with("net:"), "{after:?}");
        assert_eq!(after.iter().filter(|k| k.contains(":teardown@")).count(), leaving.len());
    }

    #[test]
    fn a_pool_without_active_nodes_keeps_what_runs_and_new_environments_wait() {
        let (running, _) = placed(&state(TREE));
        let drained = state(&TREE.replace(
            "    - {name: n1, capacity: {cpu: \"2\", memory: 4Gi}}\n    - {name: n2, capacity: {cpu: \"2\", memory: 4Gi}}\n",
            "    - {name: n1, state: draining, capacity: {cpu: \"2\", memory: 4Gi}}\n",
        ));
        let (d, bad) = placed(&drained);
        assert!(bad.is_empty());
        assert!(d[0].spec.instances.is_empty());
        assert_eq!(d[0].waiting.len(), 4, "three replicas and the release role");
        assert!(d[0].waiting.iter().all(|w| w.reason == "no-eligible-node"));
        let mut fleet = Fleet::declared(&drained);
        fleet.hold(&running[0].spec);
        let (d, bad) = deployments(&drained, None, &mut fleet);
        assert!(d.is_empty());
        assert_eq!(bad[0].reason, "node pool main has no active node");
    }

    #[test]
    fn a_hostname_gained_or_lost_is_routes_only_not_a_new_generation() {
        let domain = "---\napiVersion: pushleft.dev/v1alpha1\nkind: Domain\nmetadata: {name: shop}\nspec: {hostname: shop.example.org, environment: api-production, verification: cname}\n";
        let without = placed(&state(TREE)).0.remove(0).spec;
        let with = placed(&state(&format!("{TREE}{domain}"))).0.remove(0).spec;
        assert_eq!(with.domain("shop.example.org"), Some(crate::model::Verification::Cname));
        assert_eq!(with.own_hostname().map(|h| h.as_str()), Some("api.example.com"));
        let keys = |old: &DeploymentSpec, new: &DeploymentSpec| -> Vec<String> {
            let change = crate::release::change(old, new);
            assert!(matches!(change, crate::release::Change::Scale { .. }), "{change:?}");
            let (now, after) = scale_tasks(new, 1, &change);
            assert!(after.is_empty(), "nothing waits: {after:?}");
            now.iter()
                .map(|(t, n)| format!("{}@{n}", t.idempotency_key()))
                .collect()
        };
        // Published, then taken out, on both serving nodes; nothing else.
        assert_eq!(
            keys(&without, &with),
            [
                "ingress:api-production/shop.example.org:g1:publish@n1",
                "ingress:api-production/shop.example.org:g1:publish@n2"
            ]
        );
        assert_eq!(
            keys(&with, &without),
            [
                "ingress:api-production/shop.example.org:g1:remove@n1",
                "ingress:api-production/shop.example.org:g1:remove@n2"
            ]
        );
    }

    #[test]
    fn a_scale_publishes_again_where_web_replicas_change_before_any_goes() {
        let keys = |from: &str, to: &str| -> Vec<String> {
            let old = placed(&state(&TREE.replace("replicas: 3", from))).0.remove(0).spec;
            let new = placed(&state(&TREE.replace("replicas: 3", to))).0.remove(0).spec;
            let change = crate::release::change(&old, &new);
            assert!(matches!(change, crate::release::Change::Scale { .. }), "{from} to {to}");
            let (now, after) = scale_tasks(&new, 1, &change);
            assert!(after.is_empty(), "nothing waits: {after:?}");
            now.iter()
                .map(|(t, n)| format!("{}@{n}", t.idempotency_key()))
                .collect()
        };
        // Three to two: n1 keeps serving with one replica fewer: its upstreams first.
        assert_eq!(
            keys("replicas: 3", "replicas: 2"),
            [
                "ingress:api-production/api.example.com:g1:publish@n1",
                "app:api-production/web/2:g1:teardown@n1",
            ]
        );
        // Two to three: the new replica on n1, then n1's upstreams.
        assert_eq!(
            keys("replicas: 2", "replicas: 3"),
            [
                "app:api-production/web/2:g1:ensure@n1",
                "ingress:api-production/api.example.com:g1:publish@n1",
            ]
        );
    }

    #[test]
    fn an_older_agent_gets_the_set_up_as_the_three_tasks_it_knows() {
        let s = state(TREE);
        let spec = deployments(&s, None, &mut Fleet::declared(&s)).0.remove(0).spec;
        let steps = rollout_steps(&spec, 1, &[]);
        let keys = |step: &Step| -> Vec<String> {
            step.iter()
                .map(|(t, n)| format!("{}@{n}", t.idempotency_key()))
                .collect()
        };
        assert_eq!(
            keys(&steps[0]),
            ["env:api-production:g1:ensure@n1", "env:api-production:g1:ensure@n2"]
        );
        // n1's agent predates the one task: its set-up is split, in place; n2's is left.
        let older = |n: &crate::values::Name| n.as_str() == "n1";
        assert_eq!(
            keys(&for_agents(steps[0].clone(), older)),
            [
                "net:api-production:g1:ensure@n1",
                "fw:api-production:g1:apply@n1",
                "routes:api-production:g1:ensure@n1",
                "env:api-production:g1:ensure@n2",
            ]
        );
        // A step that sets nothing up is what it was, for any agent.
        assert!(!sets_up(&steps[2]));
        assert_eq!(for_agents(steps[2].clone(), |_| true), steps[2]);
    }

    #[test]
    fn rollout_then_cleanup_and_teardown_run_in_order() {
        let s = state(TREE);
        let old = deployments(&s, None, &mut Fleet::declared(&s)).0.remove(0).spec;
        let new = placed(&state(&TREE.replace("replicas: 3", "replicas: 1")))
            .0
            .remove(0)
            .spec;
        let steps = rollout_steps(&new, 2, std::slice::from_ref(&old));
        assert_eq!(steps.len(), 5);
        assert_eq!(steps[0].len(), 1, "one set-up on n1: its network, firewall and routes");
        assert_eq!(
            steps[0][0].0.idempotency_key(),
            "env:api-production:g2:ensure",
            "{:?}",
            steps[0]
        );
        assert!(matches!(steps[1][0].0, Task::RunOnce { generation: 2, .. }));
        assert_eq!(steps[2].len(), 1);
        let keys: Vec<String> = steps[4]
            .iter()
            .map(|(t, n)| format!("{}@{n}", t.idempotency_key()))
            .collect();
        // On each node the route goes first, then the replicas, then the network.
        assert_eq!(
            keys,
            [
                "ingress:api-production/api.example.com:g2:remove@n2",
                "app:api-production/web/0:g2:stop@n1",
                "app:api-production/web/1:g2:teardown@n2",
                "app:api-production/web/2:g2:teardown@n1",
                "net:api-production:g2:remove@n2",
            ]
        );
        let down = teardown_steps(&old.environment, 3, std::slice::from_ref(&old));
        assert!(matches!(down[0][0].0, Task::RemoveIngress { .. }), "routes first");
        assert!(
            matches!(down[1][0].0, Task::TeardownApplication { .. }),
            "then containers"
        );
        assert!(matches!(down[2][0].0, Task::RemoveNetwork { .. }), "then networks");
        assert_eq!(down[2].len(), 2, "on both nodes");
    }
}
