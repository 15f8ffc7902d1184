//! A whole desired state: parsed files assembled, checked across objects, and derived.

use crate::diag::{Code, Diagnostic, sort_diagnostics};
use crate::model::*;
use crate::parse::{Located, ParsedFile};
use crate::values::SmallMap;
use crate::values::{Hostname, ImageRef, Invalid, Name, derive_label, flatten_label};
use std::collections::{BTreeMap, BTreeSet};

mod checks;
mod hostnames;
pub mod images;

use checks::*;
use hostnames::*;
pub use hostnames::{
    DerivedEnvironment, branch_preview_hostname, branch_preview_label, derive_environment, environment_hostname,
};

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
    /// Armored image signatures by manifest digest (`image-signatures/`), in file order, each
    /// with the line its block starts on.
    image_signatures: BTreeMap<String, Vec<(u32, String)>>,
}

impl State {
    /// Objects in plan order: by kind, then name.
    pub fn iter(&self) -> impl Iterator<Item = &Located> {
        self.objects.values()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// The armored signatures the tree holds for an image's manifest digest (none: empty).
    pub fn image_signatures(&self, digest: &str) -> Vec<String> {
        self.image_signatures
            .get(digest)
            .map(|s| s.iter().map(|(_, b)| b.clone()).collect())
            .unwrap_or_default()
    }

    pub fn has_image_signatures(&self) -> bool {
        !self.image_signatures.is_empty()
    }

    /// Every digest the tree holds signatures for, with them and their lines.
    pub fn all_image_signatures(&self) -> impl Iterator<Item = (&str, &[(u32, String)])> {
        self.image_signatures.iter().map(|(d, s)| (d.as_str(), s.as_slice()))
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

/// A Repository document counts when it is the first, in the root `pushleft.yaml`; otherwise
/// the problem is said and it is left out.
fn one_repository(loc: &Located, repos: &mut usize, diags: &mut Vec<Diagnostic>) -> bool {
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
        return false;
    }
    *repos += 1;
    if *repos > 1 {
        diags.push(Diagnostic::error(
            Code::DuplicateRepository,
            &loc.file,
            Some(loc.pos),
            "a second Repository document; a state tree has exactly one",
        ));
        return false;
    }
    true
}

/// The Domains' indexes a state keeps: hostnames by environment, each hostname's TLS secret
/// and how it is proven.
#[allow(clippy::type_complexity)]
fn domain_indexes(
    objects: &BTreeMap<(Kind, Name), Located>,
) -> (
    BTreeMap<Name, BTreeSet<Hostname>>,
    BTreeMap<Hostname, Name>,
    BTreeMap<Hostname, Verification>,
) {
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
    (domains_by_env, domain_tls, domain_verification)
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
    let mut image_signatures = BTreeMap::new();
    for file in files {
        diags.extend(file.diagnostics);
        if let Some((digest, signatures)) = file.signatures {
            // One file per digest: its name says which, so two cannot collide.
            image_signatures.insert(digest, signatures);
        }
        broken.extend(file.declared);
        for loc in file.objects {
            let kind = loc.object.kind();
            if kind == Kind::Repository && !one_repository(&loc, &mut repos, &mut diags) {
                continue;
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
    let (domains_by_env, domain_tls, domain_verification) = domain_indexes(&objects);
    let state = State {
        objects,
        broken,
        domains_by_env,
        domain_tls,
        domain_verification,
        image_signatures,
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
