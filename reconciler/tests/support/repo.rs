//! A state repository made with the `git` CLI for the daemon tests: a fixed identity, an SSH
//! key made by `ssh-keygen`, and signed or unsigned commits.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub const ROOT: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata: {name: t}\nspec: {baseDomain: example.com, previewDomain: preview.example.com, previews: {branches: ['feature/*'], pool: main, ttlHours: 24}}\n";
pub const POOL: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n    - {name: n1, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n2, capacity: {cpu: \"4\", memory: 8Gi}}\n";
pub const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

pub fn project(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: {name}}}\nspec:\n  image: registry.example.invalid/{name}@{DIGEST}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}, replicas: {replicas}}}\n"
    )
}

pub fn environment(name: &str, project: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {{name: {name}}}\nspec: {{project: {project}, stage: production, pool: main}}\n"
    )
}

pub struct Repo {
    pub dir: PathBuf,
    pub key: PathBuf,
    /// The allowed-signers line for the key.
    pub signers: String,
}

pub fn git(dir: &Path, args: &[&str]) -> String {
    git_with(dir, args, &[])
}

/// `git` with extra environment variables (a committer date, say).
pub fn git_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let o = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@pushleft.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@pushleft.invalid")
        .envs(env.iter().copied())
        .output()
        .expect("git runs");
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// A new SSH key made by `ssh-keygen` at `path`; returns its public key line.
pub fn new_key(path: &Path) -> String {
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "t", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen");
    assert!(o.status.success());
    std::fs::read_to_string(path.with_extension("pub")).expect("pub")
}

impl Repo {
    /// A new repository on `main` with a root document and a pool, not yet committed.
    pub fn new(parent: &Path) -> Repo {
        let key = parent.join("key");
        let o = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "ops", "-f"])
            .arg(&key)
            .output()
            .expect("ssh-keygen");
        assert!(o.status.success());
        let public = std::fs::read_to_string(key.with_extension("pub")).expect("pub");
        let dir = parent.join("state");
        std::fs::create_dir_all(&dir).expect("mkdir");
        git(&dir, &["init", "-q", "-b", "main"]);
        let r = Repo {
            dir,
            key,
            signers: format!("ops-alice {public}"),
        };
        r.write("pushleft.yaml", ROOT);
        r.write("pools/main.yaml", POOL);
        r
    }

    pub fn write(&self, file: &str, text: &str) {
        let p = self.dir.join(file);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    pub fn remove(&self, file: &str) {
        std::fs::remove_file(self.dir.join(file)).expect("rm");
    }

    /// Commits everything; returns the new commit's sha.
    pub fn commit(&self, message: &str, signed: bool) -> String {
        self.commit_with(message, signed, &[])
    }

    /// A signed commit of everything, dated `date` (author and committer).
    pub fn commit_dated(&self, message: &str, date: &str) -> String {
        self.commit_with(
            message,
            true,
            &[("GIT_COMMITTER_DATE", date), ("GIT_AUTHOR_DATE", date)],
        )
    }

    /// A commit of everything signed with another key (see [`new_key`]).
    pub fn commit_signed_by(&self, message: &str, key: &Path) -> String {
        self.commit_by(message, Some(key), &[])
    }

    fn commit_with(&self, message: &str, signed: bool, env: &[(&str, &str)]) -> String {
        self.commit_by(message, signed.then_some(self.key.as_path()), env)
    }

    fn commit_by(&self, message: &str, key: Option<&Path>, env: &[(&str, &str)]) -> String {
        git(&self.dir, &["add", "-A"]);
        let signing = format!("user.signingKey={}", key.unwrap_or(&self.key).display());
        let signed = key.is_some();
        let mut args = vec![
            "-c",
            "gpg.format=ssh",
            "-c",
            &signing,
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            message,
        ];
        if signed {
            args.push("-S");
        }
        git_with(&self.dir, &args, env);
        git(&self.dir, &["rev-parse", "HEAD"])
    }

    pub fn git(&self, args: &[&str]) -> String {
        git(&self.dir, args)
    }
}
