//! A whole desired state: parsed files assembled, checked across objects, and derived.

use crate::diag::{Code, Diagnostic, sort_diagnostics};
use crate::model::*;
use crate::parse::{Located, ParsedFile};
use crate::values::SmallMap;
use crate::values::{Hostname, ImageRef, Invalid, Name, derive_label, flatten_label};
use std::collections::{BTreeMap, BTreeSet};

/// The file at the root of a state tree that holds the `Repository` document.
pub const ROOT_FILE: &str = "pushleft.yaml";

/// Every object of a state tree by kind and name. Built only by [`assemble`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    objects: BTreeMap<(Kind, Name), Located>,
    /// Objects that exist in the files but did not decode (see `ParsedFile::declared`).
    broken: BTreeSet<(Kind, Name)>,
    /// Domain hostnames by environment, derived once in `assemble`.
    domains_by_env: BTreeMap<Name, BTreeSet<Hostname>>,
    /// The Secret each Domain with `tls` names, by its hostname (derived once in `assemble`,
    /// so an environment's certificates are found without a scan of every Domain).
    domain_tls: BTreeMap<Hostname, Name>,
    domain_verification: BTreeMap<Hostname, crate::model::Verification>,
}

impl State {
    /// Objects in plan order: by kind, then name.
    pub fn iter(&self) -> impl Iterator<Item = &Located> {
        self.objects.values()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<&Located> {
        // Names are validated labels; a string that is not one names nothing.
        let n = Name::new(name).ok()?;
        self.objects.get(&(kind, n))
    }

    /// True when some document of the files did not decode (its problems are reported).
    pub fn has_broken(&self) -> bool {
        !self.broken.is_empty()
    }

    /// True when an object of this kind and name is defined, even if it did not decode.
    pub fn declares(&self, kind: Kind, name: &Name) -> bool {
        self.objects.contains_key(&(kind, name.clone())) || self.broken.contains(&(kind, name.clone()))
    }

    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Located> {
        self.objects
            .range((kind, Name::MIN)..)
            .take_while(move |((k, _), _)| *k == kind)
            .map(|(_, v)| v)
    }

    /// This state with its `Repository` document replaced by `repository` (or removed). A
    /// preview branch is deployed under the applied branch's accepted `Repository`, so that a
    /// branch cannot widen its own preview pool, lifetime or domains.
    pub fn with_repository(mut self, repository: Option<Located>) -> State {
        self.objects.retain(|(k, _), _| *k != Kind::Repository);
        if let Some(l) = repository {
            self.objects
                .insert((Kind::Repository, l.object.metadata.name.clone()), l);
        }
        self
    }

    pub fn repository(&self) -> Option<&Repository> {
        self.of_kind(Kind::Repository).find_map(|l| match &l.object.spec {
            Spec::Repository(r) => Some(r),
            _ => None,
        })
    }

    pub fn project(&self, name: &str) -> Option<&Project> {
        match &self.get(Kind::Project, name)?.object.spec {
            Spec::Project(p) => Some(p),
            _ => None,
        }
    }

    pub fn environments(&self) -> impl Iterator<Item = (&Name, &Environment)> {
        self.of_kind(Kind::Environment).filter_map(|l| match &l.object.spec {
            Spec::Environment(e) => Some((l.object.name(), e)),
            _ => None,
        })
    }

    /// The Secret a Domain's `tls` names for `hostname`, if it names one.
    pub fn domain_tls(&self, hostname: &Hostname) -> Option<&Name> {
        self.domain_tls.get(hostname)
    }

    /// How a Domain's ownership is proven, by its hostname.
    pub fn domain_verification(&self, hostname: &Hostname) -> Option<crate::model::Verification> {
        self.domain_verification.get(hostname).copied()
    }

    pub fn domains(&self) -> impl Iterator<Item = (&Name, &Domain)> {
        self.of_kind(Kind::Domain).filter_map(|l| match &l.object.spec {
            Spec::Domain(d) => Some((l.object.name(), d)),
            _ => None,
        })
    }

    pub fn pools(&self) -> impl Iterator<Item = (&Name, &NodePool)> {
        self.of_kind(Kind::NodePool).filter_map(|l| match &l.object.spec {
            Spec::NodePool(p) => Some((l.object.name(), p)),
            _ => None,
        })
    }
}

/// A state with every problem found while building it.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub state: State,
    pub diagnostics: Vec<Diagnostic>,
    pub files: usize,
}

impl Loaded {
    pub fn is_valid(&self) -> bool {
        self.diagnostics.is_empty()
    }
}

/// Assembles parsed files (in any order) into a state and checks everything that spans
/// objects. `extra` carries problems found while reading the tree (symlinks, sizes).
pub fn assemble(files: Vec<ParsedFile>, extra: Vec<Diagnostic>) -> Loaded {
    assemble_with(files, extra, true)
}

/// Assembles some files of a tree (those a change touched) without the checks that need the
/// whole tree (references, hostnames, node names, the Repository's presence). See
/// [`crate::incremental`] for when such a state may be planned.
pub fn assemble_partial(files: Vec<ParsedFile>, extra: Vec<Diagnostic>) -> Loaded {
    assemble_with(files, extra, false)
}

fn assemble_with(mut files: Vec<ParsedFile>, extra: Vec<Diagnostic>, whole: bool) -> Loaded {
    // Order by path so "the first definition" and every message are the same whatever order
    // the caller read the files in.
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut diags = extra;
    let file_count = files.len();
    let root_had_errors = files.iter().any(|f| f.path == ROOT_FILE && !f.diagnostics.is_empty());
    let root_exists = files.iter().any(|f| f.path == ROOT_FILE);
    let mut objects: BTreeMap<(Kind, Name), Located> = BTreeMap::new();
    let mut repos = 0usize;
    let mut broken = BTreeSet::new();
    for file in files {
        diags.extend(file.diagnostics);
        broken.extend(file.declared);
        for loc in file.objects {
            let kind = loc.object.kind();
            if kind == Kind::Repository {
                if loc.file != ROOT_FILE {
                    diags.push(
                        Diagnostic::error(
                            Code::MisplacedRepository,
                            &loc.file,
                            Some(loc.pos),
                            "a Repository document must be in the root `pushleft.yaml`",
                        )
                        .with_hint("move it to `pushleft.yaml`"),
                    );
                    continue;
                }
                repos += 1;
                if repos > 1 {
                    diags.push(Diagnostic::error(
                        Code::DuplicateRepository,
                        &loc.file,
                        Some(loc.pos),
                        "a second Repository document; a state tree has exactly one",
                    ));
                    continue;
                }
            }
            let key = (kind, loc.object.name().clone());
            if let Some(first) = objects.get(&key) {
                diags.push(
                    Diagnostic::error(
                        Code::DuplicateName,
                        &loc.file,
                        Some(loc.pos_of("metadata.name")),
                        format!(
                            "{kind} `{}` is already defined at {}:{}:{}",
                            key.1, first.file, first.pos.line, first.pos.column
                        ),
                    )
                    .with_hint("names are unique per kind across all files"),
                );
                continue;
            }
            objects.insert(key, loc);
        }
    }
    if whole && repos == 0 && !root_had_errors {
        let msg = if root_exists {
            "`pushleft.yaml` has no Repository document"
        } else {
            "the state tree has no `pushleft.yaml`"
        };
        diags.push(
            Diagnostic::error(Code::MissingRepository, ROOT_FILE, None, msg)
                .with_hint("run `pl init` or add a `kind: Repository` document to `pushleft.yaml`"),
        );
    }
    let mut domains_by_env: BTreeMap<Name, BTreeSet<Hostname>> = BTreeMap::new();
    let mut domain_tls: BTreeMap<Hostname, Name> = BTreeMap::new();
    let mut domain_verification = BTreeMap::new();
    for loc in objects.values() {
        if let Spec::Domain(d) = &loc.object.spec {
            domain_verification.insert(d.hostname.clone(), d.verification);
            domains_by_env
                .entry(d.environment.clone())
                .or_default()
                .insert(d.hostname.clone());
            if let Some(tls) = &d.tls {
                domain_tls.insert(d.hostname.clone(), tls.secret.clone());
            }
        }
    }
    let state = State {
        objects,
        broken,
        domains_by_env,
        domain_tls,
        domain_verification,
    };
    if whole {
        check_references(&state, &mut diags);
        check_nodes(&state, &mut diags);
        check_hostnames(&state, &mut diags);
    }
    sort_diagnostics(&mut diags);
    Loaded {
        state,
        diagnostics: diags,
        files: file_count,
    }
}

fn dangling(loc: &Located, path: &str, what: &str, name: &str, known: Vec<&str>) -> Diagnostic {
    dangling_msg(loc, path, format!("{what} `{name}` does not exist"), name, known)
}

fn dangling_msg(loc: &Located, path: &str, message: String, name: &str, known: Vec<&str>) -> Diagnostic {
    let d = Diagnostic::error(Code::DanglingReference, &loc.file, Some(loc.pos_of(path)), message);
    match crate::decode::did_you_mean(name, &known) {
        Some(m) => d.with_hint(format!("did you mean `{m}`?")),
        None if known.is_empty() => d,
        None if known.len() <= 8 => d.with_hint(format!("defined: {}", known.join(", "))),
        None => d,
    }
}

fn names(state: &State, kind: Kind) -> Vec<&str> {
    state.of_kind(kind).map(|l| l.object.name().as_str()).collect()
}

/// `tls.secret` names a Secret that holds a certificate: both `CERT` and `KEY`. (What they
/// hold is ciphertext here; the agent checks the certificate when it serves it.)
fn check_tls_secret(state: &State, loc: &Located, secret: &Name, diags: &mut Vec<Diagnostic>) {
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
fn check_backups(state: &State, loc: &Located, env: &crate::model::Environment, diags: &mut Vec<Diagnostic>) {
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

fn check_references(state: &State, diags: &mut Vec<Diagnostic>) {
    let repo = state.repository();
    for loc in state.iter() {
        match &loc.object.spec {
            Spec::Environment(env) => {
                match state.project(env.project.as_str()) {
                    None if state.declares(Kind::Project, &env.project) => {}
                    None => diags.push(dangling(
                        loc,
                        "spec.project",
                        "project",
                        env.project.as_str(),
                        names(state, Kind::Project),
                    )),
                    Some(project) => {
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
                                        format!(
                                            "role `{role}` is a {} role and has no replicas",
                                            r.workload.kind_name()
                                        ),
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
                }
                if let Some(tls) = &env.tls {
                    check_tls_secret(state, loc, &tls.secret, diags);
                }
                check_backups(state, loc, env, diags);
                if !state.declares(Kind::NodePool, &env.pool) {
                    diags.push(dangling(
                        loc,
                        "spec.pool",
                        "node pool",
                        env.pool.as_str(),
                        names(state, Kind::NodePool),
                    ));
                }
                if env.stage == Stage::Preview
                    && env.hostname.is_none()
                    && repo.is_some_and(|r| r.preview_domain.is_none())
                {
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
            Spec::Project(p) => {
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
                    if !state.declares(Kind::Secret, s) {
                        diags.push(dangling(
                            loc,
                            &format!("spec.secrets.{s}"),
                            "secret",
                            s.as_str(),
                            names(state, Kind::Secret),
                        ));
                    }
                }
            }
            Spec::Domain(d) => {
                if !state.declares(Kind::Environment, &d.environment) {
                    diags.push(dangling(
                        loc,
                        "spec.environment",
                        "environment",
                        d.environment.as_str(),
                        names(state, Kind::Environment),
                    ));
                }
                if let Some(tls) = &d.tls {
                    check_tls_secret(state, loc, &tls.secret, diags);
                }
            }
            Spec::Repository(r) => {
                if let Some(p) = &r.previews
                    && !state.declares(Kind::NodePool, &p.pool)
                {
                    diags.push(dangling(
                        loc,
                        "spec.previews.pool",
                        "node pool",
                        p.pool.as_str(),
                        names(state, Kind::NodePool),
                    ));
                }
            }
            Spec::Secret(secret) => {
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
            Spec::NodePool(_) => {}
        }
    }
}

/// Node names are unique across all pools: a node enrols by name. So are node addresses: the
/// mesh points a peer's endpoint at a node by its address.
fn check_nodes(state: &State, diags: &mut Vec<Diagnostic>) {
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

/// The hostname an environment serves, by the derivation rules (an explicit `hostname` wins).
pub fn environment_hostname(repo: &Repository, env_name: &Name, env: &Environment) -> Result<Hostname, Invalid> {
    if let Some(h) = &env.hostname {
        return Ok(h.clone());
    }
    match env.stage {
        Stage::Production => Hostname::new(&format!("{}.{}", env.project, repo.base_domain)),
        Stage::Preview => match &repo.preview_domain {
            Some(pd) => Hostname::new(&format!("{env_name}.{pd}")),
            None => Err(Invalid {
                message: "no `previewDomain` to derive a preview hostname from".into(),
                hint: None,
            }),
        },
    }
}

/// The environment name and hostname of a preview made from a branch:
/// `<branch>--<project>.<previewDomain>`, the first label flattened and, past 63 characters,
/// cut with a stable hash suffix.
pub fn branch_preview_label(branch: &str, project: &Name) -> String {
    let flat = flatten_label(branch);
    let flat = if flat.is_empty() { "branch".to_owned() } else { flat };
    let label = format!("{flat}--{project}");
    if label.len() <= 63 {
        return label;
    }
    let suffix = format!("--{project}");
    let hashed = derive_label(&format!("{branch}\u{0}{project}"));
    let hash = hashed.rsplit('-').next().unwrap_or("0");
    let room = 63usize.saturating_sub(suffix.len() + hash.len() + 1);
    if room < 1 {
        return derive_label(&label);
    }
    let mut head: String = flat.chars().take(room).collect();
    while head.ends_with('-') {
        head.pop();
    }
    format!("{head}-{hash}{suffix}")
}

pub fn branch_preview_hostname(branch: &str, project: &Name, preview_domain: &Hostname) -> Result<Hostname, Invalid> {
    Hostname::new(&format!("{}.{preview_domain}", branch_preview_label(branch, project)))
}

/// Where an object's hostname comes from: its `hostname` field, else its name (derived).
fn hostname_pos(loc: &Located) -> crate::diag::Pos {
    if loc.positions.iter().any(|(p, _)| p == "spec.hostname") {
        loc.pos_of("spec.hostname")
    } else {
        loc.pos_of("metadata.name")
    }
}

type Owners<'s> = BTreeMap<Hostname, (String, &'s Located)>;

/// Records who serves a hostname; a second claimant gets `hostname-conflict`.
fn claim<'s>(owners: &mut Owners<'s>, host: Hostname, who: String, loc: &'s Located, diags: &mut Vec<Diagnostic>) {
    if let Some((other, oloc)) = owners.get(&host) {
        let p = hostname_pos(oloc);
        diags.push(
            Diagnostic::error(
                Code::HostnameConflict,
                &loc.file,
                Some(hostname_pos(loc)),
                format!(
                    "{who} resolves to `{host}`, which {other} already serves ({}:{}:{})",
                    oloc.file, p.line, p.column
                ),
            )
            .with_hint("set `hostname` on one of the environments, or change the domain"),
        );
    } else {
        owners.insert(host, (who, loc));
    }
}

fn check_hostnames(state: &State, diags: &mut Vec<Diagnostic>) {
    let Some(repo) = state.repository() else {
        return;
    };
    let mut owners: Owners<'_> = BTreeMap::new();
    for loc in state.of_kind(Kind::Environment) {
        let Spec::Environment(env) = &loc.object.spec else {
            continue;
        };
        match environment_hostname(repo, loc.object.name(), env) {
            Ok(h) => claim(
                &mut owners,
                h,
                format!("environment `{}`", loc.object.name()),
                loc,
                diags,
            ),
            Err(inv) if repo.preview_domain.is_some() || env.stage == Stage::Production => {
                let d = Diagnostic::error(
                    Code::InvalidHostname,
                    &loc.file,
                    Some(loc.pos_of("metadata.name")),
                    format!("derived hostname is invalid: {}", inv.message),
                )
                .with_hint("shorten the names or set `hostname`");
                diags.push(d);
            }
            Err(_) => {} // reported as a missing previewDomain
        }
    }
    // The preview zone first: it is usually inside the base zone and the more specific answer.
    let zones: Vec<(&str, &Hostname)> = repo
        .preview_domain
        .as_ref()
        .map(|p| ("previewDomain", p))
        .into_iter()
        .chain(std::iter::once(("baseDomain", &repo.base_domain)))
        .collect();
    for loc in state.of_kind(Kind::Domain) {
        let Spec::Domain(d) = &loc.object.spec else {
            continue;
        };
        if let Some((field, zone)) = zones.iter().find(|(_, z)| d.hostname.is_within(z)) {
            diags.push(
                Diagnostic::error(Code::DomainUnderManagedZone, &loc.file, Some(loc.pos_of("spec.hostname")), format!("`{}` lies under {field} `{zone}`, whose names Pushleft derives", d.hostname))
                    .with_hint("use `hostname` on the Environment for names under the managed zones; Domain is for names you own elsewhere"),
            );
            continue;
        }
        claim(
            &mut owners,
            d.hostname.clone(),
            format!("domain `{}`", loc.object.name()),
            loc,
            diags,
        );
    }
}

/// An environment with everything it inherits resolved: what `pl show` prints under
/// `derived` and what a deployment's generation hashes.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DerivedEnvironment {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Hostname>,
    pub image: ImageRef,
    pub replicas: SmallMap<Name, u32>,
    #[serde(skip_serializing_if = "SmallMap::is_empty")]
    pub env: SmallMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<Hostname>,
}

/// Derives an environment; `None` when its project is missing (already a diagnostic).
pub fn derive_environment(state: &State, name: &Name, env: &Environment) -> Option<DerivedEnvironment> {
    let project = state.project(env.project.as_str())?;
    let hostname = state.repository().and_then(|r| environment_hostname(r, name, env).ok());
    let replicas = project
        .roles
        .iter()
        .filter_map(|(role, r)| {
            r.workload
                .replicas()
                .map(|n| (role.clone(), env.replicas.get(role).copied().unwrap_or(n)))
        })
        .collect();
    let mut vars = project.env.clone();
    vars.extend(env.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let domains = state.domains_by_env.get(name).cloned().unwrap_or_default();
    Some(DerivedEnvironment {
        hostname,
        image: env.image.clone().unwrap_or_else(|| project.image.clone()),
        replicas,
        env: vars,
        domains: domains.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Name {
        Name::new(s).expect("valid name")
    }

    #[test]
    fn branch_previews_get_one_stable_label() {
        assert_eq!(
            branch_preview_label("feature/Login_Page", &name("api")),
            "feature-login-page--api"
        );
        assert_eq!(
            branch_preview_label("fix--double", &name("api")),
            "fix-double--api",
            "runs of separators fold to one"
        );
        assert_eq!(branch_preview_label("///", &name("api")), "branch--api");
        let long = format!("feature/{}", "very-long-branch-name-".repeat(4));
        let a = branch_preview_label(&long, &name("storefront"));
        assert!(a.len() <= 63, "{a} is {} long", a.len());
        assert!(a.ends_with("--storefront"), "{a}");
        assert_eq!(a, branch_preview_label(&long, &name("storefront")), "stable");
        assert_ne!(
            a,
            branch_preview_label(&format!("{long}x"), &name("storefront")),
            "distinct for distinct branches"
        );
        let pd = Hostname::new("preview.example.com").expect("valid");
        let h = branch_preview_hostname(&long, &name("storefront"), &pd).expect("valid hostname");
        assert!(h.as_str().ends_with("--storefront.preview.example.com"));
        // A project name too long to leave room for the branch still yields a valid label.
        let p = name(&"p".repeat(60));
        assert!(Name::new(&branch_preview_label("feature/x", &p)).is_ok());
    }
}
