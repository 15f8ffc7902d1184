//! What a deployment uses (`DeploymentSpec::uses`) is kept in columns the ledger queries; the
//! ledger's migration filled them from the stored specs' text with the patterns the queries
//! used before. The two must agree on every spec: checked on the example trees, which between
//! them use backups, cron roles and custom domains (each seen at least once, so the
//! check cannot pass on specs that use nothing).

use state_schema::desired::deployments;
use state_schema::placement::Fleet;
use state_schema::state::assemble;
use std::path::Path;

#[path = "support/tree.rs"]
mod tree;

/// The patterns of the queries before the columns (and of migration 0024's fill).
fn by_text(json: &str) -> [bool; 3] {
    [
        json.contains("\"backup\":{") && json.contains("\"backups\":{"),
        json.contains("\"cron\":[["),
        json.contains("\"domains\":["),
    ]
}

#[test]
fn uses_agree_with_the_text_patterns_the_migration_fills_from() {
    let mut seen = [false; 3];
    for tree in [
        "golden/plan/acme-changes/head",
        "golden/plan/progressive/head",
        "examples/app",
    ] {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(tree);
        let loaded = assemble(tree::parsed(&root, true), Vec::new());
        let state = loaded.state;
        let (placed, _) = deployments(&state, None, &mut Fleet::declared(&state));
        assert!(!placed.is_empty(), "{tree} has deployments");
        for d in &placed {
            let json = serde_json::to_string(&d.spec).expect("json");
            let u = d.spec.uses();
            let typed = [u.backups, u.cron, u.domains];
            assert_eq!(typed, by_text(&json), "{tree}: {}", d.spec.environment);
            for (s, t) in seen.iter_mut().zip(typed) {
                *s |= t;
            }
        }
    }
    assert_eq!(seen, [true; 3], "backups, cron, domains: each used by some example");
}
