//! Hostnames: each environment's own, a preview branch's, every hostname claimed once across
//! environments and Domains, and what an environment derives from its project and repository.

use super::*;

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
pub(super) fn hostname_pos(loc: &Located) -> crate::diag::Pos {
    if loc.positions.iter().any(|(p, _)| p == "spec.hostname") {
        loc.pos_of("spec.hostname")
    } else {
        loc.pos_of("metadata.name")
    }
}

pub(super) type Owners<'s> = BTreeMap<Hostname, (String, &'s Located)>;

/// Records who serves a hostname; a second claimant gets `hostname-conflict`.
pub(super) fn claim<'s>(
    owners: &mut Owners<'s>,
    host: Hostname,
    who: String,
    loc: &'s Located,
    diags: &mut Vec<Diagnostic>,
) {
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

pub(super) fn check_hostnames(state: &State, diags: &mut Vec<Diagnostic>) {
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
