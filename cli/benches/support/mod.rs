//! Helpers shared by the CLI's benchmark binaries.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `pl` built in the same profile as the benchmark, next to its dependencies.
pub fn pl_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let pl = exe.parent().and_then(Path::parent).expect("target dir").join("pl");
    assert!(
        pl.exists(),
        "build pl first: cargo build --profile bench --bin pl ({})",
        pl.display()
    );
    pl
}

/// Runs git in `dir` without user or system config, under a fixed identity.
pub fn git(dir: &Path, args: &[&str]) -> String {
    // No automatic gc: one running in the background after a large commit makes the bench's
    // own `git gc` fail ("gc is already running").
    let o = Command::new("git")
        .current_dir(dir)
        .args(["-c", "gc.auto=0"])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@pushleft.invalid")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@pushleft.invalid")
        .output()
        .expect("git runs");
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}
