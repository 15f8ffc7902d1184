//! Each release's commit-to-live (`releases_live`): written with the release's
//! `deployment-rollout-done` (and counted in its histogram's tallies), read by the web view's
//! fleet-wide picture over days. SQL only.

use super::tallies as tally;
use super::{LedgerError, WriteTx};
use sqlx::FromRow;
use std::collections::BTreeMap;

/// A release live on every replica: when its generation was made and when it was live.
#[derive(Clone, Debug, FromRow, PartialEq, Eq)]
pub struct ReleaseLive {
    pub environment: String,
    pub generation: i64,
    pub made_at: i64,
    pub live_at: i64,
}

impl crate::store::Deployments<'_> {
    /// Records `environment`'s generation `generation` live at `now_ms`, in the transaction
    /// that records it done (once: a second record of the same release changes nothing).
    pub(crate) async fn record_live(
        &self,
        tx: &mut WriteTx,
        environment: &str,
        generation: i64,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let written = sqlx::query(self.sql(
            "INSERT INTO releases_live (environment, generation, made_at, live_at) \
             SELECT environment, generation, created_at, ? FROM deployment_generations \
             WHERE environment = ? AND generation = ? ON CONFLICT DO NOTHING",
        ))
        .bind(now_ms)
        .bind(environment)
        .bind(generation)
        .execute(&mut **tx)
        .await?;
        if written.rows_affected() == 1 {
            // Its histogram's bucket and sum (`store::tallies`), once per release.
            let made: i64 = sqlx::query_scalar(
                self.sql("SELECT made_at FROM releases_live WHERE environment = ? AND generation = ?"),
            )
            .bind(environment)
            .bind(generation)
            .fetch_one(&mut **tx)
            .await?;
            let ms = (now_ms - made).max(0);
            let le = tally::bucket(ms, tally::COMMIT_TO_LIVE_BOUNDS);
            let adds = BTreeMap::from([
                ((tally::COMMIT_TO_LIVE, le.as_str()), 1),
                ((tally::COMMIT_TO_LIVE, tally::SUM_MS), ms),
            ]);
            tx.tally(now_ms, &adds);
        }
        Ok(())
    }

    /// How long each release live since `since_ms` took (live at, ms from commit to live),
    /// newest first, at most `limit`: two integers a row, for a picture over days.
    pub async fn live_times_since(&self, since_ms: i64, limit: u32) -> Result<Vec<(i64, i64)>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT live_at, live_at - made_at FROM releases_live WHERE live_at >= ? ORDER BY live_at DESC LIMIT ?",
        ))
        .bind(since_ms)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    /// The `limit` slowest releases live since `since_ms`, slowest first.
    pub async fn slowest_since(&self, since_ms: i64, limit: u32) -> Result<Vec<ReleaseLive>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT environment, generation, made_at, live_at FROM releases_live WHERE live_at >= ? \
             ORDER BY live_at - made_at DESC, environment LIMIT ?",
        ))
        .bind(since_ms)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }
}
