//! `state-repo` without its `fetch` feature (as `pl` links it) links no SQL, no async runtime
//! and no network client: checked on the dependency graph cargo resolves for it alone.

#[test]
fn state_repo_links_no_sql_no_runtime_and_no_network_without_fetch() {
    let o = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "state-repo",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--locked",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tree = String::from_utf8_lossy(&o.stdout);
    let crates: std::collections::BTreeSet<&str> = tree.lines().filter_map(|l| l.split(' ').next()).collect();
    assert!(crates.contains("gix") && crates.contains("ssh-key"), "{crates:?}");
    for banned in ["sqlx", "sqlx-core", "tokio", "reqwest", "hyper", "ureq", "axum"] {
        assert!(!crates.contains(banned), "state-repo links {banned}");
    }
}
