//! The rules across objects: every reference resolves (to a name the problem lists the known
//! ones of), a TLS or backups Secret holds what it must, nodes are unique and well placed.

use super::*;
use crate::model::{
    Domain as DomainSpec, Environment as EnvironmentSpec, Project as ProjectSpec, Repository as RepositorySpec,
    Secret as SecretSpec,
};

pub(super) fn dangling(loc: &Located, path: &str, what: &str, name: &str, known: Vec<&str>) -> Diagnostic {
    dangling_msg(loc, path, format!("{what} `{name}` does not exist"), name, known)
}

pub(super) fn dangling_msg(loc: &Located, path: &str, message: String, name: &str, known: Vec<&str>) -> Diagnostic {
    let d = Diagnostic::error(Code::DanglingReference, &loc.file, Some(loc.pos_of(path)), message);
    match crate::decode::did_you_mean(name, &known) {
        Some(m) => d.with_hint(format!("did you mean `{m}`?")),
        None if known.is_empty() => d,
        None if known.len() <= 8 => d.with_hint(format!("defined: {}", known.join(", "))),
        None => d,
    }
}

/// Says `name` (at `path`) dangles unless a `kind` of that name is declared (one that failed
/// to decode counts: its own problem is said already).
fn must_declare(
    state: &State,
    loc: &Located,
    (kind, what): (Kind, &str),
    path: &str,
    name: &Name,
    diags: &mut Vec<Diagnostic>,
) {
    if !state.declares(kind, name) {
        diags.push(dangling(loc, path, what, name.as_str(), names(state, kind)));
    }
}

pub(super) fn names(state: &State, kind: Kind) -> Vec<&str> {
    state.of_kind(kind).map(|l| l.object.name().as_str()).collect()
}

/// `tls.secret` names a Secret that holds a certificate: both `CERT` and `KEY`. (What they
/// hold is ciphertext here; the agent checks the certificate when it serves it.)
pub(super) fn check_tls_secret(state: &State, loc: &Located, secret: &Name, diags: &mut Vec<Diagnostic>) {
    match state.get(Kind::Secret, secret.as_str()).map(|l| &l.object.spec) {
        Some(Spec::Secret(s)) => {
            let missing: Vec<&str> = ["CERT", "KEY"]
                .into_iter()
                .filter(|k| !s.data.contains_key(*k))
                .collect();
            if !missing.is_empty() {
                diags.push(
                    Diagnostic::error(
                        Code::TlsSecretIncomplete,
                        &loc.file,
                        Some(loc.pos_of("spec.tls.secret")),
                        format!("secret `{secret}` has no {}", missing.join(" and no ")),
                    )
                    .with_hint(
                        "a certificate's Secret holds CERT (the PEM chain, leaf first) and KEY (its PEM private key)",
                    ),
                );
            }
        }
        _ if state.declares(Kind::Secret, secret) => {}
        _ => diags.push(dangling(
            loc,
            "spec.tls.secret",
            "secret",
            secret.as_str(),
            names(state, Kind::Secret),
        )),
    }
}

/// An environment whose project backs up a volume names a repository, and the Secret it names
/// holds the repository's password.
pub(super) fn check_backups(
    state: &State,
    loc: &Located,
    env: &crate::model::Environment,
    diags: &mut Vec<Diagnostic>,
) {
    let Some(b) = &env.backups else {
        let backed_up = state.project(env.project.as_str()).and_then(|p| {
            p.roles
                .iter()
                .find_map(|(role, r)| r.volumes.iter().find(|v| v.backup.is_some()).map(|v| (role, &v.name)))
        });
        if let Some((role, volume)) = backed_up {
            diags.push(
                Diagnostic::error(
                    Code::BackupRepositoryMissing,
                    &loc.file,
                    Some(loc.pos_of("metadata.name")),
                    format!(
                        "project `{}` backs up volume `{volume}` of role `{role}`, and this environment names no repository",
                        env.project
                    ),
                )
                .with_hint("add `backups: {repository: /var/backups/pushleft/<env>, secret: <a Secret with RESTIC_PASSWORD>}`"),
            );
        }
        return;
    };
    match state.get(Kind::Secret, b.secret.as_str()).map(|l| &l.object.spec) {
        Some(Spec::Secret(s)) if !s.data.contains_key(crate::volumes::RESTIC_PASSWORD) => diags.push(
            Diagnostic::error(
                Code::BackupSecretIncomplete,
                &loc.file,
                Some(loc.pos_of("spec.backups.secret")),
                format!("secret `{}` has no RESTIC_PASSWORD", b.secret),
            )
            .with_hint(
                "the backups Secret holds RESTIC_PASSWORD, and what the backend needs besides (AWS_ACCESS_KEY_ID, ...)",
            ),
        ),
        Some(_) => {}
        None if state.declares(Kind::Secret, &b.secret) => {}
        None => diags.push(dangling(
            loc,
            "spec.backups.secret",
            "secret",
            b.secret.as_str(),
            names(state, Kind::Secret),
        )),
    }
}

pub(super) fn check_references(state: &State, diags: &mut Vec<Diagnostic>) {
    let repo = state.repository();
    for loc in state.iter() {
        match &loc.object.spec {
            Spec::Environment(env) => check_environment(state, repo, loc, env, diags),
            Spec::Project(p) => check_project(state, loc, p, diags),
            Spec::Domain(d) => check_domain(state, loc, d, diags),
            Spec::Repository(r) => check_repository(state, loc, r, diags),
            Spec::Secret(secret) => check_secret(repo, loc, secret, diags),
            Spec::NodePool(_) => {}
        }
    }
}

/// An Environment's project and the roles it sets replicas of, its TLS secret, backups, pool
/// and preview hostname.
fn check_environment(
    state: &State,
    repo: Option<&RepositorySpec>,
    loc: &Located,
    env: &EnvironmentSpec,
    diags: &mut Vec<Diagnostic>,
) {
    match state.project(env.project.as_str()) {
        None if state.declares(Kind::Project, &env.project) => {}
        None => diags.push(dangling(
            loc,
            "spec.project",
            "project",
            env.project.as_str(),
            names(state, Kind::Project),
        )),
        Some(project) => check_replicas(loc, env, project, diags),
    }
    if let Some(tls) = &env.tls {
        check_tls_secret(state, loc, &tls.secret, diags);
    }
    check_backups(state, loc, env, diags);
    must_declare(state, loc, (Kind::NodePool, "node pool"), "spec.pool", &env.pool, diags);
    if env.stage == Stage::Preview && env.hostname.is_none() && repo.is_some_and(|r| r.preview_domain.is_none()) {
        diags.push(
            Diagnostic::error(
                Code::MissingField,
                &loc.file,
                Some(loc.pos),
                "a preview environment needs `previewDomain` in the Repository spec, or its own `hostname`",
            )
            .with_hint("set `previewDomain` in pushleft.yaml"),
        );
    }
}

/// The roles an Environment sets replicas of: its project's, running replicas, one writer.
fn check_replicas(loc: &Located, env: &EnvironmentSpec, project: &ProjectSpec, diags: &mut Vec<Diagnostic>) {
    for role in env.replicas.keys() {
        let path = format!("spec.replicas.{role}");
        match project.roles.get(role) {
            None => {
                let known = project.roles.keys().map(Name::as_str).collect();
                diags.push(dangling_msg(
                    loc,
                    &path,
                    format!("project `{}` has no role `{role}`", env.project),
                    role.as_str(),
                    known,
                ));
            }
            Some(r) if r.workload.replicas().is_none() => diags.push(
                Diagnostic::error(
                    Code::FieldNotAllowed,
                    &loc.file,
                    Some(loc.pos_of(&path)),
                    format!("role `{role}` is a {} role and has no replicas", r.workload.kind_name()),
                )
                .with_hint("only web and worker roles run replicas"),
            ),
            Some(r)
                if env.replicas.get(role).is_some_and(|n| *n > 1)
                    && (!r.volumes.is_empty() || r.workload == Workload::Service {}) =>
            {
                diags.push(
                    Diagnostic::error(
                        Code::VolumeOneWriter,
                        &loc.file,
                        Some(loc.pos_of(&path)),
                        format!(
                            "role `{role}` runs one instance (a {} role{}); it cannot have more replicas",
                            r.workload.kind_name(),
                            if r.volumes.is_empty() { "" } else { " with volumes" }
                        ),
                    )
                    .with_hint("a volume has one writer: set 0 or 1"),
                )
            }
            Some(_) => {}
        }
    }
}

/// A Project's volumes (one writer each) and the Secrets it names.
fn check_project(state: &State, loc: &Located, p: &ProjectSpec, diags: &mut Vec<Diagnostic>) {
    // A volume belongs to the environment and has one writer: one role mounts it.
    let mut owner: BTreeMap<&Name, &Name> = BTreeMap::new();
    for (role, r) in p.roles.iter() {
        for v in &r.volumes {
            if let Some(first) = owner.insert(&v.name, role) {
                diags.push(
                    Diagnostic::error(
                        Code::InvalidVolume,
                        &loc.file,
                        Some(loc.pos_of(&format!("spec.roles.{role}.volumes.{}", v.name))),
                        format!("volume `{}` is mounted by roles `{first}` and `{role}`", v.name),
                    )
                    .with_hint("a volume has one writer: give each role its own volume"),
                );
            }
        }
    }
    for s in &p.secrets {
        must_declare(
            state,
            loc,
            (Kind::Secret, "secret"),
            &format!("spec.secrets.{s}"),
            s,
            diags,
        );
    }
}

/// A Domain's environment and TLS secret.
fn check_domain(state: &State, loc: &Located, d: &DomainSpec, diags: &mut Vec<Diagnostic>) {
    must_declare(
        state,
        loc,
        (Kind::Environment, "environment"),
        "spec.environment",
        &d.environment,
        diags,
    );
    if let Some(tls) = &d.tls {
        check_tls_secret(state, loc, &tls.secret, diags);
    }
}

/// The Repository's previews pool.
fn check_repository(state: &State, loc: &Located, r: &RepositorySpec, diags: &mut Vec<Diagnostic>) {
    if let Some(p) = &r.previews {
        must_declare(
            state,
            loc,
            (Kind::NodePool, "node pool"),
            "spec.previews.pool",
            &p.pool,
            diags,
        );
    }
}

/// A Secret lists the control host's recipient, or no Secret can be delivered.
fn check_secret(repo: Option<&RepositorySpec>, loc: &Located, secret: &SecretSpec, diags: &mut Vec<Diagnostic>) {
    if let Some(repo) = repo {
        let listed = repo
            .control_recipient
            .as_ref()
            .is_some_and(|c| secret.recipients.iter().any(|r| r.trim() == c.trim()));
        if !listed {
            let (msg, hint) = match &repo.control_recipient {
                None => (
                    "the Repository has no `controlRecipient`, so no Secret can be delivered",
                    "set `spec.controlRecipient` in pushleft.yaml to the control host's age recipient",
                ),
                Some(_) => (
                    "the Secret does not list the Repository's `controlRecipient`",
                    "run `pl secret recipients NAME --add <controlRecipient>`",
                ),
            };
            diags.push(
                Diagnostic::error(
                    Code::SecretControlKeyMissing,
                    &loc.file,
                    Some(loc.pos_of("metadata.name")),
                    msg,
                )
                .with_hint(hint),
            );
        }
    }
}

/// Node names are unique across all pools: a node enrols by name. So are node addresses: the
/// mesh points a peer's endpoint at a node by its address.
pub(super) fn check_nodes(state: &State, diags: &mut Vec<Diagnostic>) {
    let mut seen: BTreeMap<&str, (&str, &Located)> = BTreeMap::new();
    let mut addresses: BTreeMap<core::net::IpAddr, (&str, &Located)> = BTreeMap::new();
    for loc in state.of_kind(Kind::NodePool) {
        let Spec::NodePool(pool) = &loc.object.spec else {
            continue;
        };
        for node in &pool.nodes {
            let path = format!("spec.nodes.{}", node.name);
            if let Some(ip) = node.address {
                let at = format!("{path}.address");
                if let Some((other_node, other)) = addresses.get(&ip) {
                    let there = other.pos_of(&format!("spec.nodes.{other_node}.address"));
                    diags.push(
                        Diagnostic::error(
                            Code::DuplicateAddress,
                            &loc.file,
                            Some(loc.pos_of(&at)),
                            format!(
                                "node `{}` has the address {ip} of node `{other_node}` ({}:{}:{})",
                                node.name, other.file, there.line, there.column
                            ),
                        )
                        .with_hint("each node needs an address of its own: the mesh reaches a node by it"),
                    );
                } else {
                    addresses.insert(ip, (node.name.as_str(), loc));
                }
            }
            if let Some((other_pool, other)) = seen.get(node.name.as_str()) {
                diags.push(
                    Diagnostic::error(
                        Code::DuplicateName,
                        &loc.file,
                        Some(loc.pos_of(&path)),
                        format!(
                            "node `{}` is already declared in pool `{other_pool}` ({}:{}:{})",
                            node.name,
                            other.file,
                            other.pos_of(&path).line,
                            other.pos_of(&path).column
                        ),
                    )
                    .with_hint("node names are unique across all pools"),
                );
            } else {
                seen.insert(node.name.as_str(), (loc.object.name().as_str(), loc));
            }
        }
    }
}
