//! The crates a package links: its normal dependencies as cargo resolves them for it alone
//! (`cargo tree -e normal`, offline, from the lock file). Shared by the dependency tests of
//! `cli`, `agent`, `state-repo` and `state-schema` through `#[path]`.

use std::collections::BTreeSet;

pub fn linked_crates(manifest_dir: &str, package: &str) -> BTreeSet<String> {
    let o = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            package,
            "-e",
            "normal",
            "--prefix",
            "none",
            "--locked",
            "--offline",
        ])
        .current_dir(manifest_dir)
        .output()
        .expect("cargo tree runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split(' ').next().map(str::to_owned))
        .collect()
}
