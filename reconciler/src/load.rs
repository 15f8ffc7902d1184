//! Loading desired states: list, filter by `include`, read and parse in parallel, assemble.
//!
//! When two sides are loaded together (a plan), a file whose blob is the same on both sides is
//! read and parsed once; a one-file change therefore parses the changed file twice and every
//! other file once.

use crate::source::{FileEntry, Listing, Rev, SourceError, StateRepo};
use gix::ObjectId;
use rayon::prelude::*;
use state_schema::diag::{Code, Diagnostic};
use state_schema::model::Spec;
use state_schema::parse::{ParsedFile, parse_file};
use state_schema::state::{Loaded, ROOT_FILE, assemble};
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
fn parse_entries(repo: &StateRepo, entries: &[FileEntry], known: &HashMap<(String, ObjectId), Arc<ParsedFile>>) -> Result<Vec<Parsed>, SourceError> {
    entries
        .par_iter()
        .map_init(
            || repo.thread_repo(),
            |thread_repo, entry| {
                if let Some(id) = entry.blob {
                    let key = (entry.path.clone(), id);
                    if let Some(file) = known.get(&key) {
                        return Ok(Parsed { key, file: Arc::clone(file) });
                    }
                }
                let bytes = repo.read(thread_repo.as_ref(), entry)?;
                let id = entry.blob.unwrap_or_else(|| blob_id(&bytes));
                let key = (entry.path.clone(), id);
                if let Some(file) = known.get(&key) {
                    return Ok(Parsed { key, file: Arc::clone(file) });
                }
                Ok(Parsed { file: Arc::new(parse_file(&entry.path, &bytes)), key })
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
        return (listing.files.iter().filter(|f| f.path != ROOT_FILE).cloned().collect(), problems);
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
            problems.push(Diagnostic::error(Code::InvalidGlob, ROOT_FILE, None, format!("`include` globs do not build: {e}")));
            return (Vec::new(), problems);
        }
    };
    let files = listing.files.iter().filter(|f| f.path != ROOT_FILE && set.is_match(&f.path)).cloned().collect();
    (files, problems)
}

struct SideFiles {
    parsed: Vec<Parsed>,
    problems: Vec<Diagnostic>,
}

fn load_side(repo: &StateRepo, rev: &Rev, known: &HashMap<(String, ObjectId), Arc<ParsedFile>>) -> Result<SideFiles, SourceError> {
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

/// Loads the two sides of a plan, parsing each distinct file once.
pub fn load_pair(repo: &StateRepo, base: &Rev, head: &Rev) -> Result<(Loaded, Loaded), SourceError> {
    let head_side = load_side(repo, head, &HashMap::new())?;
    let known: HashMap<(String, ObjectId), Arc<ParsedFile>> = head_side.parsed.iter().map(|p| (p.key.clone(), Arc::clone(&p.file))).collect();
    let base_side = load_side(repo, base, &known)?;
    drop(known);
    Ok((finish(base_side), finish(head_side)))
}
