//! Reading a state tree: from a Git revision with gix, or from the working tree on disk.
//!
//! Both sides list the same files (`*.yaml`/`*.yml` outside hidden folders), enforce the same
//! limits before reading a byte, and refuse symlinks and non-regular files, so a tree that
//! validates on disk validates the same once committed.

use gix::ObjectId;
use gix::objs::tree::EntryKind;
use state_schema::diag::{Code, Diagnostic};
use std::path::{Path, PathBuf};

/// Most YAML files in one state tree.
pub const MAX_FILES: usize = 100_000;
/// Most bytes of YAML in one state tree.
pub const MAX_TREE_BYTES: u64 = 256 << 20;
/// Deepest nesting of folders in a state tree. Walks stop here, so a hostile tree of a
/// million nested folders is refused instead of overflowing a thread's stack.
pub const MAX_TREE_DEPTH: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: no such directory")]
    NoDirectory { path: PathBuf },
    #[error("{path} is not inside a Git repository, so revisions cannot be read")]
    NotARepository { path: PathBuf },
    #[error("revision `{spec}` not found")]
    RevisionNotFound {
        spec: String,
        #[source]
        source: gix::Error,
    },
    #[error("`{spec}` is not a commit")]
    NotACommit { spec: String },
    #[error("reading {what} from Git")]
    Git {
        what: String,
        #[source]
        source: gix::Error,
    },
    #[error("{message}")]
    Range { message: String },
    #[error("`{path}` nests folders deeper than {MAX_TREE_DEPTH} levels")]
    TooDeep { path: String },
    #[error("reading {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn git(what: impl Into<String>) -> impl FnOnce(gix::Error) -> SourceError {
    let what = what.into();
    move |source| SourceError::Git { what, source }
}

/// A revision resolved to a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    /// What the user wrote (`main`, `HEAD~1`, a sha).
    pub spec: String,
    pub id: ObjectId,
}

/// Which side of the tree to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rev {
    /// The files on disk, committed or not.
    WorkTree,
    Commit(Commit),
}

/// One YAML file of a state tree, not yet read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    /// Relative to the state tree's root, `/`-separated.
    pub path: String,
    /// The blob, for files listed from a commit.
    pub blob: Option<ObjectId>,
    pub size: u64,
}

/// The files of a tree and the problems found while listing it.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    pub files: Vec<FileEntry>,
    pub problems: Vec<Diagnostic>,
}

/// A state tree: a directory, and the Git repository around it when there is one.
pub struct StateRepo {
    root: PathBuf,
    repo: Option<gix::ThreadSafeRepository>,
    /// Path of `root` inside the repository's work tree (`""` at the top, else ending in `/`).
    prefix: String,
}

/// Whether a file of the tree (its path from the tree's root) is read: YAML anywhere, and
/// signature files under `image-signatures/`.
pub fn is_state_file(path: &str) -> bool {
    path.ends_with(".yaml") || path.ends_with(".yml") || state_schema::image_signatures::is_signature_path(path)
}

impl StateRepo {
    /// Opens the state tree at `dir`. A directory outside Git can still be read from disk.
    pub fn open(dir: &Path) -> Result<Self, SourceError> {
        if !dir.is_dir() {
            return Err(SourceError::NoDirectory { path: dir.to_owned() });
        }
        let root = dir.canonicalize().map_err(|source| SourceError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let Ok(repo) = gix::discover(&root) else {
            return Ok(StateRepo {
                root,
                repo: None,
                prefix: String::new(),
            });
        };
        let prefix = repo
            .workdir()
            .and_then(|w| w.canonicalize().ok())
            .and_then(|w| root.strip_prefix(w).ok().map(Path::to_owned))
            .map(|rel| {
                let s = rel.to_string_lossy().replace('\\', "/");
                if s.is_empty() { s } else { format!("{s}/") }
            })
            .unwrap_or_default();
        Ok(StateRepo {
            root,
            repo: Some(repo.into_sync()),
            prefix,
        })
    }

    /// The tree's folder inside its repository's work tree (`""` at the top, else ending in
    /// `/`): what a tree path is prefixed with to name the file in a commit.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn repo(&self) -> Result<gix::Repository, SourceError> {
        match &self.repo {
            Some(r) => Ok(r.to_thread_local()),
            None => Err(SourceError::NotARepository {
                path: self.root.clone(),
            }),
        }
    }

    /// Resolves any revision gix understands (`main`, `origin/main`, `HEAD~1`, a sha) to a commit.
    pub fn resolve(&self, spec: &str) -> Result<Commit, SourceError> {
        let repo = self.repo()?;
        let id = repo
            .rev_parse_single(spec)
            .map_err(|source| SourceError::RevisionNotFound {
                spec: spec.to_owned(),
                source,
            })?;
        let object = id.object().map_err(git(format!("object of `{spec}`")))?;
        let commit = object
            .peel_to_commit()
            .map_err(|_| SourceError::NotACommit { spec: spec.to_owned() })?;
        Ok(Commit {
            spec: spec.to_owned(),
            id: commit.id,
        })
    }

    /// The local branches (`refs/heads/*`) and the commits they point at, by short name.
    pub fn branches(&self) -> Result<Vec<(String, ObjectId)>, SourceError> {
        let repo = self.repo()?;
        let platform = repo.references().map_err(git("the references"))?;
        let mut out = Vec::new();
        for r in platform.local_branches().map_err(git("the branches"))? {
            let mut r = r.map_err(git("a branch"))?;
            let name = r.name().shorten().to_string();
            let Ok(commit) = r.peel_to_commit() else {
                continue; // a branch that points at no commit is nothing to apply
            };
            out.push((name, commit.id));
        }
        out.sort();
        Ok(out)
    }

    /// The Git directory (where refs live), for watching.
    pub fn git_dir(&self) -> Option<PathBuf> {
        self.repo.as_ref().map(|r| r.to_thread_local().git_dir().to_owned())
    }

    /// The best common ancestor of two commits, if they have one.
    pub fn merge_base(&self, a: ObjectId, b: ObjectId) -> Result<Option<ObjectId>, SourceError> {
        let repo = self.repo()?;
        let base = repo.merge_base(a, b).map_err(git("the merge base"))?;
        Ok(base.map(|id| id.detach()))
    }

    /// Lists the YAML files of one side.
    pub fn list(&self, rev: &Rev) -> Result<Listing, SourceError> {
        let mut listing = Listing::default();
        match rev {
            Rev::WorkTree => walk_dir(&self.root, "", &mut listing)?,
            Rev::Commit(c) => self.walk_commit(c, &mut listing)?,
        }
        listing.files.sort_by(|a, b| a.path.cmp(&b.path));
        check_totals(&mut listing);
        Ok(listing)
    }

    fn walk_commit(&self, c: &Commit, listing: &mut Listing) -> Result<(), SourceError> {
        let repo = self.repo()?;
        match self.state_tree_of(&repo, c.id)? {
            Some(tree) => walk_tree(&repo, &tree, "", listing),
            // The folder does not exist at this revision: an empty state.
            None => Ok(()),
        }
    }

    /// Reads one file. A working-tree file that grew past the limit since it was listed is read
    /// only up to one byte past the limit, so parsing refuses it without loading it whole.
    pub fn read(&self, repo: Option<&gix::Repository>, entry: &FileEntry) -> Result<Vec<u8>, SourceError> {
        match (entry.blob, repo) {
            (Some(id), Some(repo)) => {
                let mut blob = repo.find_blob(id).map_err(git(entry.path.clone()))?;
                Ok(blob.take_data())
            }
            (Some(_), None) => Err(SourceError::NotARepository {
                path: self.root.clone(),
            }),
            (None, _) => {
                use std::io::Read;
                let path = self.root.join(&entry.path);
                let mut bytes = Vec::new();
                std::fs::File::open(&path)
                    .and_then(|f| {
                        f.take(state_schema::yaml::MAX_FILE_BYTES as u64 + 1)
                            .read_to_end(&mut bytes)
                    })
                    .map_err(|source| SourceError::Io { path, source })?;
                Ok(bytes)
            }
        }
    }

    /// A repository handle for the current thread (readers keep one per thread).
    pub fn thread_repo(&self) -> Option<gix::Repository> {
        // No object cache: every blob is read once, and copying each into a cache costs more
        // than it saves; gix's pack delta cache still serves delta bases.
        self.repo.as_ref().map(gix::ThreadSafeRepository::to_thread_local)
    }
}

fn symlink_problem(path: &str) -> Diagnostic {
    Diagnostic::error(
        Code::SymlinkInTree,
        path,
        None,
        "symbolic links are not allowed in a state tree",
    )
    .with_hint("commit the file itself; a link could point outside the reviewed tree")
}

fn submodule_problem(path: &str) -> Diagnostic {
    Diagnostic::error(Code::NotARegularFile, path, None, "a submodule inside the state tree")
}

fn too_large(path: &str, size: u64) -> Diagnostic {
    Diagnostic::error(
        Code::FileTooLarge,
        path,
        None,
        format!(
            "file is {size} bytes; the limit is {} bytes (1 MiB)",
            state_schema::yaml::MAX_FILE_BYTES
        ),
    )
    .with_hint("split it into several files")
}

fn too_deep(path: &str) -> Diagnostic {
    Diagnostic::error(
        Code::TreeTooDeep,
        path,
        None,
        format!("folders nest deeper than {MAX_TREE_DEPTH} levels here; nothing below is read"),
    )
    .with_hint("flatten the folder structure")
}

/// The number of folders a `/`-terminated directory prefix names.
fn depth_of(dir: &str) -> usize {
    dir.matches('/').count()
}

fn push_file(listing: &mut Listing, path: String, blob: Option<ObjectId>, size: u64) {
    if size > state_schema::yaml::MAX_FILE_BYTES as u64 {
        listing.problems.push(too_large(&path, size));
    } else {
        listing.files.push(FileEntry { path, blob, size });
    }
}

fn walk_tree(
    repo: &gix::Repository,
    tree: &gix::Tree<'_>,
    dir: &str,
    listing: &mut Listing,
) -> Result<(), SourceError> {
    for entry in tree.iter() {
        let entry = entry.map_err(git(format!("tree entries of `{dir}`")))?;
        let name = String::from_utf8_lossy(entry.filename()).into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = format!("{dir}{name}");
        match entry.kind() {
            EntryKind::Tree if depth_of(dir) + 1 > MAX_TREE_DEPTH => listing.problems.push(too_deep(&path)),
            EntryKind::Tree => {
                let sub = repo.find_tree(entry.object_id()).map_err(git(path.clone()))?;
                walk_tree(repo, &sub, &format!("{path}/"), listing)?;
            }
            EntryKind::Link => listing.problems.push(symlink_problem(&path)),
            EntryKind::Commit => listing.problems.push(submodule_problem(&path)),
            EntryKind::Blob | EntryKind::BlobExecutable => {
                if !is_state_file(&path) {
                    continue;
                }
                if std::str::from_utf8(entry.filename()).is_err() {
                    listing.problems.push(Diagnostic::error(
                        Code::InvalidUtf8,
                        &path,
                        None,
                        "file name is not valid UTF-8",
                    ));
                    continue;
                }
                // The header gives the size without inflating the blob.
                let header = repo.find_header(entry.object_id()).map_err(git(path.clone()))?;
                push_file(listing, path, Some(entry.object_id()), header.size());
            }
        }
    }
    Ok(())
}

fn walk_dir(root: &Path, dir: &str, listing: &mut Listing) -> Result<(), SourceError> {
    let full = root.join(dir);
    let read = std::fs::read_dir(&full).map_err(|source| SourceError::Io {
        path: full.clone(),
        source,
    })?;
    let mut entries: Vec<std::fs::DirEntry> = read.collect::<Result<_, _>>().map_err(|source| SourceError::Io {
        path: full.clone(),
        source,
    })?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let name_os = entry.file_name();
        let Some(name) = name_os.to_str() else {
            listing.problems.push(Diagnostic::error(
                Code::InvalidUtf8,
                &format!("{dir}{}", name_os.to_string_lossy()),
                None,
                "file name is not valid UTF-8",
            ));
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let path = format!("{dir}{name}");
        let meta = std::fs::symlink_metadata(entry.path()).map_err(|source| SourceError::Io {
            path: entry.path(),
            source,
        })?;
        let ft = meta.file_type();
        if ft.is_symlink() {
            listing.problems.push(symlink_problem(&path));
        } else if ft.is_dir() && depth_of(dir) + 1 > MAX_TREE_DEPTH {
            listing.problems.push(too_deep(&path));
        } else if ft.is_dir() {
            walk_dir(root, &format!("{path}/"), listing)?;
        } else if !ft.is_file() {
            listing.problems.push(Diagnostic::error(
                Code::NotARegularFile,
                &path,
                None,
                "not a regular file (a device, socket or FIFO)",
            ));
        } else if is_state_file(&path) {
            push_file(listing, path, None, meta.len());
        }
    }
    Ok(())
}

fn check_totals(listing: &mut Listing) {
    if listing.files.len() > MAX_FILES {
        listing.problems.push(Diagnostic::error(
            Code::TooManyFiles,
            ".",
            None,
            format!("{} YAML files; the limit is {MAX_FILES}", listing.files.len()),
        ));
        listing.files.clear();
        return;
    }
    let total: u64 = listing.files.iter().map(|f| f.size).sum();
    if total > MAX_TREE_BYTES {
        listing.problems.push(Diagnostic::error(
            Code::TreeTooLarge,
            ".",
            None,
            format!("{total} bytes of YAML; the limit is {MAX_TREE_BYTES}"),
        ));
        listing.files.clear();
    }
}

/// A state file that differs between two commits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedFile {
    pub path: String,
    pub base: Option<FileEntry>,
    pub head: Option<FileEntry>,
}

/// What differs between two commits' state trees. Identical subtrees are never entered, so
/// the cost follows the size of the change, not of the tree.
#[derive(Clone, Debug, Default)]
pub struct TreeDiff {
    pub changed: Vec<ChangedFile>,
    /// Symlinks, submodules and oversized files in the head's changed parts.
    pub problems: Vec<Diagnostic>,
}

impl StateRepo {
    /// The state tree (the folder `pl` was pointed at) in a commit, if it exists there.
    pub(crate) fn state_tree_of<'r>(
        &self,
        repo: &'r gix::Repository,
        id: ObjectId,
    ) -> Result<Option<gix::Tree<'r>>, SourceError> {
        let commit = repo.find_commit(id).map_err(git(format!("commit {id}")))?;
        let tree = commit.tree().map_err(git(format!("tree of {id}")))?;
        if self.prefix.is_empty() {
            return Ok(Some(tree));
        }
        let entry = tree
            .lookup_entry_by_path(self.prefix.trim_end_matches('/'))
            .map_err(git("the state tree's folder"))?;
        match entry {
            Some(e) if e.mode().is_tree() => Ok(Some(
                repo.find_tree(e.object_id()).map_err(git("the state tree's folder"))?,
            )),
            _ => Ok(None),
        }
    }

    /// One file of a commit's state tree, if it exists there.
    pub fn entry_at(&self, c: &Commit, path: &str) -> Result<Option<FileEntry>, SourceError> {
        let repo = self.repo()?;
        let Some(tree) = self.state_tree_of(&repo, c.id)? else {
            return Ok(None);
        };
        let entry = tree.lookup_entry_by_path(path).map_err(git(path.to_owned()))?;
        match entry {
            Some(e) if matches!(e.mode().kind(), EntryKind::Blob | EntryKind::BlobExecutable) => {
                Ok(Some(file_entry(&repo, path, e.object_id())?))
            }
            _ => Ok(None),
        }
    }

    /// The state files that differ between two commits.
    pub fn diff_commits(&self, base: &Commit, head: &Commit) -> Result<TreeDiff, SourceError> {
        let repo = self.repo()?;
        let (a, b) = (self.state_tree_of(&repo, base.id)?, self.state_tree_of(&repo, head.id)?);
        let mut out = TreeDiff::default();
        diff_trees(&repo, a.as_ref(), b.as_ref(), &mut out)?;
        out.changed.sort_by(|x, y| x.path.cmp(&y.path));
        Ok(out)
    }
}

/// A tree entry: its kind and object.
pub(crate) type TreeEntry = (EntryKind, ObjectId);

type EntryMap = std::collections::BTreeMap<String, TreeEntry>;

/// What [`walk_tree_diff`] calls for each differing name: `(path, name, before, after)`.
pub(crate) type TreeDiffVisitor<'v> =
    dyn FnMut(&str, &str, Option<&TreeEntry>, Option<&TreeEntry>) -> Result<(), SourceError> + 'v;

fn entries(tree: Option<&gix::Tree<'_>>, dir: &str, hidden: bool) -> Result<EntryMap, SourceError> {
    let mut map = EntryMap::new();
    if let Some(t) = tree {
        for e in t.iter() {
            let e = e.map_err(git(format!("tree entries of `{dir}`")))?;
            let name = String::from_utf8_lossy(e.filename()).into_owned();
            if hidden || !name.starts_with('.') {
                map.insert(name, (e.kind(), e.object_id()));
            }
        }
    }
    Ok(map)
}

/// Walks two trees together without entering identical subtrees. For every name whose entry
/// differs, `visit(path, name, before, after)` runs (either side may be absent or a tree);
/// subtrees that differ are walked into. `hidden` includes names starting with `.`.
pub(crate) fn walk_tree_diff(
    repo: &gix::Repository,
    a: Option<&gix::Tree<'_>>,
    b: Option<&gix::Tree<'_>>,
    dir: &str,
    hidden: bool,
    visit: &mut TreeDiffVisitor<'_>,
) -> Result<(), SourceError> {
    let (ea, eb) = (entries(a, dir, hidden)?, entries(b, dir, hidden)?);
    let names: std::collections::BTreeSet<&String> = ea.keys().chain(eb.keys()).collect();
    for name in names {
        let (x, y) = (ea.get(name), eb.get(name));
        if x == y {
            continue;
        }
        let path = format!("{dir}{name}");
        let sub = |e: Option<&TreeEntry>| -> Result<Option<gix::Tree<'_>>, SourceError> {
            match e {
                Some((EntryKind::Tree, id)) => Ok(Some(repo.find_tree(*id).map_err(git(path.clone()))?)),
                _ => Ok(None),
            }
        };
        let (ta, tb) = (sub(x)?, sub(y)?);
        if (ta.is_some() || tb.is_some()) && depth_of(dir) + 1 > MAX_TREE_DEPTH {
            return Err(SourceError::TooDeep { path });
        }
        if ta.is_some() || tb.is_some() {
            walk_tree_diff(repo, ta.as_ref(), tb.as_ref(), &format!("{path}/"), hidden, visit)?;
        }
        visit(&path, name, x, y)?;
    }
    Ok(())
}

fn file_entry(repo: &gix::Repository, path: &str, id: ObjectId) -> Result<FileEntry, SourceError> {
    let header = repo.find_header(id).map_err(git(path.to_owned()))?;
    Ok(FileEntry {
        path: path.to_owned(),
        blob: Some(id),
        size: header.size(),
    })
}

fn diff_trees(
    repo: &gix::Repository,
    a: Option<&gix::Tree<'_>>,
    b: Option<&gix::Tree<'_>>,
    out: &mut TreeDiff,
) -> Result<(), SourceError> {
    walk_tree_diff(repo, a, b, "", false, &mut |path, _name, x, y| {
        let is_blob = |e: Option<&TreeEntry>| matches!(e, Some((EntryKind::Blob | EntryKind::BlobExecutable, _)));
        match y {
            Some((EntryKind::Link, _)) => out.problems.push(symlink_problem(path)),
            Some((EntryKind::Commit, _)) => out.problems.push(submodule_problem(path)),
            _ => {}
        }
        if !is_state_file(path) || !(is_blob(x) || is_blob(y)) {
            return Ok(());
        }
        let base = match x {
            Some((EntryKind::Blob | EntryKind::BlobExecutable, id)) => Some(file_entry(repo, path, *id)?),
            _ => None,
        };
        let head = match y {
            Some((EntryKind::Blob | EntryKind::BlobExecutable, id)) => {
                let e = file_entry(repo, path, *id)?;
                if e.size > state_schema::yaml::MAX_FILE_BYTES as u64 {
                    out.problems.push(too_large(path, e.size));
                    None
                } else {
                    Some(e)
                }
            }
            _ => None,
        };
        out.changed.push(ChangedFile {
            path: path.to_owned(),
            base,
            head,
        });
        Ok(())
    })
}
