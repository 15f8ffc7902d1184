//! A release's watch in the pass: a generation whose watch a heartbeat failed
//! (`store::watch`) is rolled back at once, as `pl rollback` would (held, by `watch`), with a
//! `rollback-automatic` event saying which replica and what its node saw; a watch whose window
//! passed ends with `watch-passed`.

use crate::store::rollbacks::{CANARY, ROLLING, WATCH};
use crate::store::{Ledger, LedgerError};

impl Ledger {
    /// Rolls back every generation whose watch failed, and ends the watches that passed.
    /// Returns how many rollbacks were asked.
    pub async fn watch_tick(&self, now_ms: i64) -> Result<usize, LedgerError> {
        let mut asked = 0;
        for f in self.deployments().watch_failures().await? {
            let generation = u64::try_from(f.generation).unwrap_or(0);
            // Not switched yet: a canary, when a role declares one (it is the rollout's), or
            // rolling batches.
            let canary = f.spec.roles.values().any(|r| !r.canary.is_empty());
            let (by, what) = match (f.switched, canary) {
                (true, _) => (WATCH, "its watch"),
                (false, true) => (CANARY, "its canary"),
                (false, false) => (ROLLING, "its rolling rollout"),
            };
            let outcome = self
                .deployments()
                .ask_rollback(
                    &f.environment,
                    Some(generation),
                    by,
                    now_ms,
                    state_schema::generations::rollback,
                )
                .await?;
            let mut tx = self.write_tx().await?;
            self.deployments().end_watch(&mut tx, &f.environment).await?;
            let (kind, detail) = match outcome {
                Ok(a) => {
                    asked += 1;
                    (
                        "rollback-automatic",
                        format!(
                            "generation {generation} failed {what}: {}; back to generation {}'s release as generation {}",
                            f.failure, a.to, a.generation
                        ),
                    )
                }
                Err(why) => (
                    "watch-failed",
                    format!(
                        "generation {generation} failed its watch: {}; not rolled back: {}",
                        f.failure,
                        why.code()
                    ),
                ),
            };
            self.events()
                .event(&mut tx, now_ms, kind, &f.environment, &detail)
                .await?;
            tx.commit().await?;
        }
        self.deployments().end_passed_watches(now_ms).await?;
        Ok(asked)
    }
}
