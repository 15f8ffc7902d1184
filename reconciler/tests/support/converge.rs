//! Drives a reconciler without agents: passes, with every job node `n1` can lease succeeded,
//! until nothing more is queued (at most 20 rounds).

use reconciler::reconcile::Reconciler;
use reconciler::store::{Completion, Outcome, now_ms};
use std::sync::Arc;

pub async fn converge(shared: &Arc<Reconciler>) {
    for _ in 0..20 {
        shared.pass().await.expect("pass");
        let leases = shared
            .ledger
            .jobs()
            .lease("n1", 100, 30_000, now_ms())
            .await
            .expect("lease");
        if leases.is_empty() {
            return;
        }
        let done: Vec<Completion> = leases
            .iter()
            .map(|l| Completion {
                token: l.token.clone(),
                outcome: Outcome::Succeeded,
            })
            .collect();
        let results = shared.ledger.jobs().complete(&done, now_ms()).await.expect("complete");
        assert!(results.iter().all(|r| r.is_ok()), "every completion recorded");
    }
    panic!("did not converge in 20 rounds");
}
