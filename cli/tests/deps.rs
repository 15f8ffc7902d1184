//! `pl` links no SQL, no async runtime and no server: the daemon's stack stays in
//! `reconciler`. Checked on the dependency graph cargo resolves for `pl` alone.

#[test]
fn pl_links_no_sql_and_no_async_runtime() {
    let o = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "pushleft-cli",
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
    assert!(crates.contains("state-repo") && crates.contains("gix"), "{crates:?}");
    for banned in [
        "sqlx",
        "sqlx-core",
        "libsqlite3-sys",
        "tokio",
        "axum",
        "hyper",
        "reqwest",
        "reconciler",
    ] {
        assert!(!crates.contains(banned), "pl links {banned}");
    }
}
