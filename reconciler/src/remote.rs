//! A remote state repository: cloned bare into a cache folder and fetched with gix. The
//! branches are what the remote advertised on the last fetch, so a branch deleted there is
//! seen as deleted here.

use gix::ObjectId;
use std::path::Path;
use std::sync::atomic::AtomicBool;

#[derive(Debug, thiserror::Error)]
#[error("fetching {url}: {message}")]
pub struct FetchError {
    pub url: String,
    pub message: String,
}

/// Clones (the first time) or fetches `url` into the bare repository at `dir`, and returns the
/// remote's branches (`refs/heads/*`) by short name with their commits.
pub fn fetch(url: &str, dir: &Path) -> Result<Vec<(String, ObjectId)>, FetchError> {
    let fail = |e: &dyn std::fmt::Display| FetchError {
        url: url.to_owned(),
        message: e.to_string(),
    };
    let interrupt = AtomicBool::new(false);
    let repo = if dir.join("HEAD").is_file() {
        gix::open(dir).map_err(|e| fail(&e))?
    } else {
        std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
        gix::init_bare(dir).map_err(|e| fail(&e))?
    };
    // The remote is given here, not read from the cache's configuration, so the cache holds
    // nothing but objects and refs.
    let remote = repo
        .remote_at(url)
        .map_err(|e| fail(&e))?
        .with_refspecs(["+refs/heads/*:refs/remotes/origin/*"], gix::remote::Direction::Fetch)
        .map_err(|e| fail(&e))?;
    let outcome = remote
        .connect(gix::remote::Direction::Fetch)
        .map_err(|e| fail(&e))?
        .prepare_fetch(gix::progress::Discard, Default::default())
        .map_err(|e| fail(&e))?
        .receive(gix::progress::Discard, &interrupt)
        .map_err(|e| fail(&e))?;
    let mut branches = Vec::new();
    for r in &outcome.ref_map.remote_refs {
        let (name, target, peeled) = r.unpack();
        let Some(short) = name.strip_prefix(b"refs/heads/") else {
            continue;
        };
        if let Some(id) = peeled.or(target) {
            branches.push((String::from_utf8_lossy(short).into_owned(), id.to_owned()));
        }
    }
    branches.sort();
    Ok(branches)
}
