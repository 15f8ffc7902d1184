//! The agent links what it uses: the protocol crate and the secrets crate, never the control
//! plane's repository side (gix), its store (sqlx) or its domain types. Checked on the
//! dependency graph cargo resolves for `pl-agent` alone.

#[path = "../../tests-support/linked.rs"]
mod linked;

#[test]
fn the_agent_links_no_git_no_sql_and_no_domain_types() {
    let crates = linked::linked_crates(env!("CARGO_MANIFEST_DIR"), "pushleft-agent");
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
