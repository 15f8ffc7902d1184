//! A remote state repository: cloned bare into a cache folder and fetched with gix. The
//! branches are what the remote advertised on the last fetch, so a branch deleted there is
//! seen as deleted here.

use gix::ObjectId;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// A fetch failure. Its URL and message carry no credential: user information and query
/// strings are masked, whatever the transport put in its error text.
#[derive(Debug, thiserror::Error)]
#[error("fetching {url}: {message}")]
pub struct FetchError {
    pub url: String,
    pub message: String,
}

/// The user information (`user:secret@`) and query string of a URL, when it has them: the
/// parts that may carry a credential.
fn credential_parts(url: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        parts.push(userinfo);
    }
    if let Some((_, query)) = url.split_once('?') {
        parts.push(query.split('#').next().unwrap_or(query));
    }
    parts.retain(|p| !p.is_empty());
    parts
}

/// `text` with every credential part of `url` masked.
pub fn redact(text: &str, url: &str) -> String {
    let mut out = text.to_owned();
    for part in credential_parts(url) {
        out = out.replace(part, "***");
    }
    out
}

/// Clones (the first time) or fetches `url` into the bare repository at `dir`, and returns the
/// remote's branches (`refs/heads/*`) by short name with their commits.
pub fn fetch(url: &str, dir: &Path) -> Result<Vec<(String, ObjectId)>, FetchError> {
    let fail = |e: &dyn std::fmt::Display| FetchError {
        url: redact(url, url),
        message: redact(&e.to_string(), url),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show() {
        let url = "https://ghp_S3cret@git.example.com/acme/state.git?access_token=T0ken";
        let shown = redact(&format!("could not reach {url}: refused"), url);
        assert!(!shown.contains("ghp_S3cret") && !shown.contains("T0ken"), "{shown}");
        assert!(shown.contains("git.example.com/acme/state.git"), "{shown}");
        assert_eq!(redact("plain", "ssh://git.example.com/x"), "plain");
        // A real failed fetch (a closed port on loopback): the transport's own error text
        // names the URL, and it comes out masked.
        let dir = tempfile::tempdir().expect("tempdir");
        let url = "https://ghp_S3cret@127.0.0.1:1/acme/state.git?access_token=T0ken";
        let e = fetch(url, &dir.path().join("cache")).expect_err("nothing listens there");
        let shown = e.to_string();
        assert!(!shown.contains("S3cret") && !shown.contains("T0ken"), "{shown}");
        assert!(shown.contains("127.0.0.1"), "{shown}");
    }
}
