//! A synthetic repository of any size (`state_schema::synthetic`) and the configuration a
//! bench's reconciler reads it with: shared by the reconcile and web view benches.
#![allow(dead_code)]

use crate::repo_support::Repo;
use reconciler::config::Config;
use state_schema::synthetic::{Params, generate};
use std::path::Path;

pub fn shared_config(dir: &Path, repo: &Path, url: &str) -> Config {
    let text = format!(
        "[source]\npath = {repo:?}\n\n[trust]\nallowed_signers = \"allowed_signers\"\n\n[ledger]\nurl = {url:?}\n\n[api]\nlisten = \"127.0.0.1:0\"\ntls_cert = \"x\"\ntls_key = \"x\"\n"
    );
    let p = dir.join("bench.toml");
    std::fs::write(&p, text).expect("config");
    Config::load(&p).expect("config")
}

/// A repository whose `base` commit has the pools, projects and root of a synthetic
/// `n`-environment tree and whose `head` adds the environments. Both signed.
pub fn synthetic_repo(dir: &Path, n: usize) -> (Repo, String, String) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    let files = generate(&Params::new(n));
    for (path, text) in files
        .iter()
        .filter(|(p, _)| !p.starts_with("environments/") && !p.starts_with("domains/"))
    {
        repo.write(path, text);
    }
    let base = repo.commit("base", true);
    for (path, text) in &files {
        repo.write(path, text);
    }
    let head = repo.commit("environments", true);
    repo.git(&["update-ref", "refs/heads/main", &base]);
    repo.git(&["checkout", "-q", "--detach", &base]);
    (repo, base, head)
}
