//! The agent links what it uses: the protocol crate and the secrets crate, never the control
//! plane's repository side (gix), its store (sqlx) or its domain types. Checked on the
//! dependency graph cargo resolves for `pl-agent` alone.

#[test]
fn the_agent_links_no_git_no_sql_and_no_domain_types() {
    let o = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "pushleft-agent",
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
    assert!(
        crates.contains("agent-proto") && crates.contains("pushleft-secrets") && crates.contains("bollard"),
        "{crates:?}"
    );
    for banned in [
        "gix",
        "state-repo",
        "state-schema",
        "sqlx",
        "sqlx-core",
        "libsqlite3-sys",
        "reconciler",
        "axum",
    ] {
        assert!(!crates.contains(banned), "the agent links {banned}");
    }
}
