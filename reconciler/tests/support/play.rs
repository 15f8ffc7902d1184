//! Plays a node's agent through the ledger, for the daemon-process tests that need jobs
//! done without a real agent (`alerts.rs`, `snapshot.rs`): one round leases what the node can
//! and completes each job with the outcome the test picks for its key.

use reconciler::store::{Completion, Ledger, Outcome, now_ms};

/// Leases up to 100 of `node`'s jobs and completes each with `outcome(key)`; how many it did.
pub async fn round(ledger: &Ledger, node: &str, outcome: &dyn Fn(&str) -> Outcome) -> usize {
    let leases = ledger.jobs().lease(node, 100, 30_000, now_ms()).await.expect("lease");
    let ends: Vec<Completion> = leases
        .iter()
        .map(|l| Completion {
            token: l.token.clone(),
            outcome: outcome(&l.key),
        })
        .collect();
    if !ends.is_empty() {
        ledger.jobs().complete(&ends, now_ms()).await.expect("complete");
    }
    ends.len()
}
