//! Loading desired states: list, filter by `include`, read and parse in parallel, assemble.
//!
//! When two sides are loaded together (a plan), a file whose blob is the same on both sides is
//! read and parsed once; a one-file change therefore parses the changed file twice and every
//! other file once.

use crate::source::{Commit, FileEntry, Listing, Rev, SourceError, StateRepo};
use gix::ObjectId;
use rayon::prelude::*;
use state_schema::diag::{Code, Diagnostic};
use state_schema::model::Spec;
use state_schema::parse::{ParsedFile, parse_file};
use state_schema::plan::Scope;
use state_schema::state::{Loaded, ROOT_FILE, assemble, assemble_partial};
use std::collections::HashMap;
use std::sync::Arc;

/// A parsed file and the identity of its content (the Git blob id, computed for files on disk).
struct Parsed {
    key: (String, ObjectId),
    file: Arc<ParsedFile>,
}

fn blob_id(bytes: &[u8]) -> ObjectId {
    // Hashing a byte slice as a blob cannot fail for SHA-1.
    gix::objs::compute_hash(gix::hash::Kind::Sha1, gix::objs::Kind::Blob, bytes).expect("hashing a blob in memory")
}

/// Reads and parses `entries` in parallel, skipping those already parsed in `known`.
fn parse_entries(
    repo: &StateRepo,
    entries: &[FileEntry],
    known: &HashMap<(String, ObjectId), Arc<ParsedFile>>,
) -> Result<Vec<Parsed>, SourceError> {
    entries
        .par_iter()
        .map_init(
            || repo.thread_repo(),
            |thread_repo, entry| {
                if let Some(id) = entry.blob {
                    let key = (entry.path.clone(), id);
                    if let Some(file) = known.get(&key) {
                        return Ok(Parsed {
                            key,
                            file: Arc::clone(file),
                        });
                    }
                }
                let bytes = repo.read(thread_repo.as_ref(), entry)?;
                let id = entry.blob.unwrap_or_else(|| blob_id(&bytes));
                let key = (entry.path.clone(), id);
                if let Some(file) = known.get(&key) {
                    return Ok(Parsed {
                        key,
                        file: Arc::clone(file),
                    });
                }
                Ok(Parsed {
                    file: Arc::new(parse_file(&entry.path, &bytes)),
                    key,
                })
            },
        )
        .collect()
}

/// Applies `Repository.include` from the root file (always read) to the rest of a listing.
fn select(listing: &Listing, root: Option<&ParsedFile>) -> (Vec<FileEntry>, Vec<Diagnostic>) {
    let globs: Vec<String> = root
        .and_then(|r| {
            r.objects.iter().find_map(|l| match &l.object.spec {
                Spec::Repository(repo) => Some(repo.include.clone()),
                _ => None,
            })
        })
        .unwrap_or_default();
    let mut problems = listing.problems.clone();
    if globs.is_empty() {
        return (
            listing.files.iter().filter(|f| f.path != ROOT_FILE).cloned().collect(),
            problems,
        );
    }
    let mut builder = globset::GlobSetBuilder::new();
    for g in &globs {
        // Globs were validated when the root file was decoded.
        if let Ok(glob) = globset::Glob::new(g) {
            builder.add(glob);
        }
    }
    let set = match builder.build() {
        Ok(s) => s,
        Err(e) => {
            problems.push(Diagnostic::error(
                Code::InvalidGlob,
                ROOT_FILE,
                None,
                format!("`include` globs do not build: {e}"),
            ));
            return (Vec::new(), problems);
        }
    };
    let files = listing
        .files
        .iter()
        .filter(|f| f.path != ROOT_FILE && set.is_match(&f.path))
        .cloned()
        .collect();
    (files, problems)
}

struct SideFiles {
    parsed: Vec<Parsed>,
    problems: Vec<Diagnostic>,
}

fn load_side(
    repo: &StateRepo,
    rev: &Rev,
    known: &HashMap<(String, ObjectId), Arc<ParsedFile>>,
) -> Result<SideFiles, SourceError> {
    let listing = repo.list(rev)?;
    let root_entry: Vec<FileEntry> = listing.files.iter().filter(|f| f.path == ROOT_FILE).cloned().collect();
    let mut parsed = parse_entries(repo, &root_entry, known)?;
    let (rest, problems) = select(&listing, parsed.first().map(|p| p.file.as_ref()));
    parsed.extend(parse_entries(repo, &rest, known)?);
    Ok(SideFiles { parsed, problems })
}

fn finish(side: SideFiles) -> Loaded {
    let files = side.parsed.into_iter().map(|p| Arc::unwrap_or_clone(p.file)).collect();
    assemble(files, side.problems)
}

/// Loads one side.
pub fn load(repo: &StateRepo, rev: &Rev) -> Result<Loaded, SourceError> {
    Ok(finish(load_side(repo, rev, &HashMap::new())?))
}

/// The `Repository` document of a commit's root file, if it decodes.
pub fn repository_at(repo: &StateRepo, commit: &Commit) -> Result<Option<state_schema::parse::Located>, SourceError> {
    let Some(entry) = repo.entry_at(commit, ROOT_FILE)? else {
        return Ok(None);
    };
    if entry.size > state_schema::yaml::MAX_FILE_BYTES as u64 {
        return Ok(None);
    }
    let bytes = repo.read(repo.thread_repo().as_ref(), &entry)?;
    Ok(parse_file(ROOT_FILE, &bytes)
        .objects
        .into_iter()
        .find(|l| matches!(l.object.spec, Spec::Repository(_))))
}

/// Files already parsed, by path and blob.
type Known = HashMap<(String, ObjectId), Arc<ParsedFile>>;

/// Loads the two sides of a plan, parsing each distinct file once.
pub fn load_pair(repo: &StateRepo, base: &Rev, head: &Rev) -> Result<(Loaded, Loaded), SourceError> {
    load_pair_with(repo, base, head, Known::new())
}

/// [`load_pair`], reusing files parsed already.
fn load_pair_with(repo: &StateRepo, base: &Rev, head: &Rev, mut known: Known) -> Result<(Loaded, Loaded), SourceError> {
    let head_side = load_side(repo, head, &known)?;
    known.extend(head_side.parsed.iter().map(|p| (p.key.clone(), Arc::clone(&p.file))));
    let base_side = load_side(repo, base, &known)?;
    // Dropping the cache leaves one reference to files only one side has: they move into
    // their state without a copy. Files both sides share are copied once; assembling the two
    // sides in parallel hides that.
    drop(known);
    Ok(rayon::join(|| finish(base_side), || finish(head_side)))
}

/// The two sides of a plan and what they hold.
pub struct PlanInput {
    pub base: Loaded,
    pub head: Loaded,
    pub scope: Scope,
}

/// Loads what a plan needs. Between two commits, the trees are diffed first; when the change
/// is local (see `state_schema::incremental`) only the changed blobs and `pushleft.yaml` are
/// read and parsed. Otherwise, and for a working-tree head, both trees are read whole (reusing
/// what was parsed to find out).
pub fn load_for_plan(repo: &StateRepo, base: &Commit, head: &Rev) -> Result<PlanInput, SourceError> {
    let mut known = Known::new();
    if let Rev::Commit(h) = head {
        match load_local(repo, base, h)? {
            Local::Plan(input) => return Ok(*input),
            Local::Parsed(files) => known = files,
        }
    }
    let (base, head) = load_pair_with(repo, &Rev::Commit(base.clone()), head, known)?;
    Ok(PlanInput {
        base,
        head,
        scope: Scope::Full,
    })
}

/// A local plan, or what was parsed while finding out that the change is not local.
enum Local {
    /// Boxed: two states, against a map of parsed files.
    Plan(Box<PlanInput>),
    Parsed(Known),
}

fn load_local(repo: &StateRepo, base: &Commit, head: &Commit) -> Result<Local, SourceError> {
    let not_local = || Ok(Local::Parsed(Known::new()));
    let diff = repo.diff_commits(base, head)?;
    if !diff.problems.is_empty() || diff.changed.iter().any(|c| c.path == ROOT_FILE) {
        return not_local();
    }
    let Some(root) = repo.entry_at(head, ROOT_FILE)? else {
        return not_local();
    };
    let Some(root_parsed) = parse_entries(repo, std::slice::from_ref(&root), &Known::new())?.pop() else {
        return not_local();
    };
    // `include` applies to changed files as to any other.
    let side_files = |pick: fn(&crate::source::ChangedFile) -> Option<&FileEntry>| {
        let listing = Listing {
            files: diff.changed.iter().filter_map(pick).cloned().collect(),
            problems: Vec::new(),
        };
        select(&listing, Some(&root_parsed.file)).0
    };
    let base_files = side_files(|c| c.base.as_ref());
    let head_files = side_files(|c| c.head.as_ref());
    let mut all = base_files;
    let base_len = all.len();
    all.extend(head_files);
    let mut parsed = parse_entries(repo, &all, &Known::new())?;
    fn refs(files: &[Parsed]) -> Vec<&ParsedFile> {
        files.iter().map(|p| p.file.as_ref()).collect()
    }
    let (b, h) = parsed.split_at(base_len);
    let head_clean = h.iter().all(|p| p.file.diagnostics.is_empty());
    if !head_clean || !state_schema::incremental::is_local_files(&refs(b), &refs(h)) {
        // Keep the parses: the whole-tree load reuses them.
        let mut known: Known = parsed.into_iter().map(|p| (p.key, p.file)).collect();
        known.insert(root_parsed.key, root_parsed.file);
        return Ok(Local::Parsed(known));
    }
    let h = parsed.split_off(base_len);
    // Ours are the only references, so the files move into their states without a copy.
    let root_file = root_parsed.file;
    let side = |files: Vec<Parsed>| {
        let mut v: Vec<ParsedFile> = files.into_iter().map(|p| Arc::unwrap_or_clone(p.file)).collect();
        v.push((*root_file).clone());
        assemble_partial(v, Vec::new())
    };
    let (base_state, head_state) = rayon::join(|| side(parsed), || side(h));
    Ok(Local::Plan(Box::new(PlanInput {
        base: base_state,
        head: head_state,
        scope: Scope::Local,
    })))
}
