//! Rebuilding from Git with no ledger (docs/operations.md, the DR table). A control plane that
//! re-admits nodes (`control.readmit_nodes`) and starts on a ledger with no live deployment
//! waits before it plans: commits are judged and recorded with their objects, so the nodes
//! they declare come back by their certificates (`ops::agents::readmit`) and report what they
//! run and their networks' subnets (kept as the ledger's meanwhile). Once every node the
//! accepted state declares has been heard from, or `control.readmit_wait_seconds` have passed,
//! each branch's commit in force is planned with what the nodes run: an environment whose
//! replicas run the spec Git asks for keeps their generation (`generations::decide`), so its
//! agents adopt them and none restarts.

use super::deploy::{Again, Applied};
use crate::reconcile::{DaemonError, Reconciler};
use crate::store::now_ms;
use crate::store::{Ledger, LedgerError};
use state_repo::revision::Judgement;
use state_schema::declared::{self, Declared};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Not looked at yet: the first pass decides.
pub(crate) const UNCHECKED: i64 = -1;
/// No rebuild (or it is over).
pub(crate) const OFF: i64 = 0;

/// The decision, pure: whether a rebuild's wait is over at `now_ms` (until `until_ms`), given
/// what the accepted state declares of each node and which nodes have been heard from. A
/// state that declares no node yet (nothing accepted) waits for the deadline.
pub fn wait_over(
    declared: &std::collections::HashMap<String, Declared>,
    heard: &dyn Fn(&str) -> bool,
    now_ms: i64,
    until_ms: i64,
) -> bool {
    let expected: Vec<&String> = declared
        .iter()
        .filter(|(_, d)| matches!(d, Declared::Yes { .. } | Declared::Draining { .. }))
        .map(|(n, _)| n)
        .collect();
    now_ms >= until_ms || (!expected.is_empty() && expected.iter().all(|n| heard(n)))
}

impl Ledger {
    /// Records `j` for `branch` with its objects (the nodes it declares, for re-admission) and
    /// plans none of its deployments: a rebuilt control plane's wait for its nodes' reports.
    pub async fn apply_revision_held(
        &self,
        branch: &str,
        preview: bool,
        j: &mut Judgement,
        now_ms: i64,
        lost_after_ms: i64,
    ) -> Result<Applied, LedgerError> {
        self.apply(branch, preview, j, (now_ms, lost_after_ms), Again::Held)
            .await
    }

    /// Plans `branch`'s accepted commit in force (`j`, judged again now) with what the nodes
    /// report running: the end of a rebuild's wait. New environments start at the
    /// generations their replicas run (`generations::decide`); nothing is written when `j` is
    /// no longer accepted.
    pub async fn adopt(
        &self,
        branch: &str,
        preview: bool,
        j: &mut Judgement,
        now_ms: i64,
        lost_after_ms: i64,
    ) -> Result<Applied, LedgerError> {
        if !j.accepted() {
            return Ok(Applied::default());
        }
        self.apply(branch, preview, j, (now_ms, lost_after_ms), Again::Adopt)
            .await
    }
}

impl Reconciler {
    /// Whether commits are recorded without planning their deployments now (a rebuild waits).
    pub(crate) fn rebuild_waiting(&self) -> bool {
        self.rebuild_until_ms.load(Ordering::Relaxed) > OFF
    }

    /// The first pass's look: a control plane that re-admits nodes, on a ledger with no live
    /// deployment, starts its wait.
    pub(crate) async fn rebuild_begin(&self) -> Result<(), DaemonError> {
        if self.rebuild_until_ms.load(Ordering::Relaxed) != UNCHECKED {
            return Ok(());
        }
        let control = &self.config.control;
        let fresh = control.readmit_nodes && self.ledger.revisions().deployed_branches().await?.is_empty();
        let until = match fresh {
            true => now_ms().saturating_add(control.readmit_wait_seconds.saturating_mul(1000)),
            false => OFF,
        };
        if fresh {
            tracing::warn!(
                wait_seconds = control.readmit_wait_seconds,
                "rebuilding without a ledger: deployments wait for the nodes Git declares to report"
            );
            self.hub.rebuilding.store(true, Ordering::Relaxed);
        }
        self.rebuild_until_ms.store(until, Ordering::Relaxed);
        Ok(())
    }

    /// Ends a rebuild's wait when it is over ([`wait_over`]): every branch's commit in force
    /// planned with what the nodes run. Returns the rollouts started.
    pub(crate) async fn rebuild_end(self: &Arc<Self>) -> Result<usize, DaemonError> {
        let until = self.rebuild_until_ms.load(Ordering::Relaxed);
        if until <= OFF {
            return Ok(0);
        }
        let pools = self.ledger.applied_pools(&self.config.source.branch).await?;
        let declared = declared::declared_nodes(&pools);
        let seen = self.ledger.nodes().seen_nodes().await?;
        let heard = |n: &str| seen.get(n).is_some_and(|s| s.last_seen.is_some());
        let now = now_ms();
        if !wait_over(&declared, &heard, now, until) {
            return Ok(0);
        }
        let mut branches = self.ledger.revisions().accepted_branches().await?;
        // The applied branch first: previews are derived under its accepted state.
        branches.sort_by_key(|b| *b != self.config.source.branch);
        let mut started = 0;
        for branch in branches {
            let Some((mut judgement, preview)) = self.judged_in_force(&branch).await? else {
                continue;
            };
            let applied = self
                .ledger
                .adopt(
                    &branch,
                    preview,
                    &mut judgement,
                    now_ms(),
                    self.config.control.lost_after_ms(),
                )
                .await?;
            started += applied.rollouts.len();
        }
        let missing: Vec<&String> = declared.keys().filter(|n| !heard(n)).collect();
        tracing::warn!(rollouts = started, ?missing, "rebuild planned with what the nodes run");
        self.ledger
            .events()
            .record(
                now,
                "rebuild-planned",
                &self.config.source.branch,
                &format!(
                    "{started} deployments planned from what the nodes run; not heard from: {}",
                    missing.len()
                ),
            )
            .await?;
        self.hub.rebuilding.store(false, Ordering::Relaxed);
        self.rebuild_until_ms.store(OFF, Ordering::Relaxed);
        Ok(started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_wait_ends_when_every_declared_node_is_heard_from_or_at_its_deadline() {
        let yes = |p: &str| Declared::Yes { pool: p.into() };
        let declared = HashMap::from([
            ("n1".to_owned(), yes("main")),
            ("n2".to_owned(), Declared::Draining { pool: "main".into() }),
            ("old".to_owned(), Declared::Retired),
        ]);
        let only_n1 = |n: &str| n == "n1";
        let both = |n: &str| n == "n1" || n == "n2";
        assert!(!wait_over(&declared, &only_n1, 1_000, 2_000), "n2 not heard from yet");
        assert!(
            wait_over(&declared, &both, 1_000, 2_000),
            "a retired node is not waited for"
        );
        assert!(wait_over(&declared, &only_n1, 2_000, 2_000), "the deadline");
        assert!(
            !wait_over(&HashMap::new(), &both, 1_000, 2_000),
            "nothing declared yet: wait"
        );
    }
}
