//! `state-repo` without its `fetch` feature (as `pl` links it) links no SQL, no async runtime
//! and no network client: checked on the dependency graph cargo resolves for it alone.

#[path = "../../tests-support/linked.rs"]
mod linked;

#[test]
fn state_repo_links_no_sql_no_runtime_and_no_network_without_fetch() {
    let crates = linked::linked_crates(env!("CARGO_MANIFEST_DIR"), "state-repo");
    assert!(crates.contains("gix") && crates.contains("ssh-key"), "{crates:?}");
    for banned in ["sqlx", "sqlx-core", "tokio", "reqwest", "hyper", "ureq", "axum"] {
        assert!(!crates.contains(banned), "state-repo links {banned}");
    }
}
