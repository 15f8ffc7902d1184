//! What the drift check reads: the nodes' fresh reports of what runs, the placements of
//! finished rollouts, and the jobs that asked for one replica; a repair's success, kept in
//! its completion's transaction (`repaired`) until the pass publishes its environment's routes
//! again. SQL only; the comparison, the repairs and what is published again are
//! `reconcile::drift`'s.

use super::{LedgerError, WriteTx, rows};
use sqlx::FromRow;
use state_schema::deployment::DeploymentSpec;

/// A node's last report of what runs there.
#[derive(FromRow)]
pub(crate) struct Report {
    pub name: String,
    /// JSON: the agent's `RunningInstance`s.
    pub observed: String,
    pub last_seen: i64,
}

/// A finished rollout's placement.
#[derive(FromRow)]
pub(crate) struct Finished {
    pub environment: String,
    pub generation: i64,
    pub spec: String,
    /// When the rollout last changed (it finished, or a scale at its generation did).
    pub updated_at: i64,
}

/// A job that asked for a replica (its first ask or a repair).
#[derive(FromRow)]
pub(crate) struct Ask {
    pub key: String,
    pub task: String,
    pub state: String,
    pub updated_at: i64,
}

impl Ask {
    /// Queued or leased: not yet ended.
    pub(crate) fn pending(&self) -> bool {
        rows::JobState::parse(&self.state).is_some_and(rows::JobState::pending)
    }
}

impl crate::store::Jobs<'_> {
    /// The reports of nodes heard from since `since_ms`.
    pub(crate) async fn fresh_reports(&self, since_ms: i64) -> Result<Vec<Report>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT name, observed, last_seen FROM nodes WHERE observed IS NOT NULL AND last_seen + beat_grace_ms >= ?",
        ))
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Calls `each` with every finished rollout, a row at a time: at 10,000 environments the
    /// specs together are tens of megabytes, which the daemon need not hold at once.
    pub(crate) async fn each_finished_rollout(&self, mut each: impl FnMut(Finished)) -> Result<(), LedgerError> {
        let mut rows =
            sqlx::query_as::<_, Finished>(self.sql(
                "SELECT environment, generation, spec, updated_at FROM deployments WHERE action = 'rollout' AND status = 'done'",
            ))
            .fetch(&self.pool);
        while let Some(r) = futures_util::TryStreamExt::try_next(&mut rows).await? {
            each(r);
        }
        Ok(())
    }

    /// The jobs of `env`'s generation on `node` whose key starts with `prefix`.
    pub(crate) async fn asks(
        &self,
        env: &str,
        generation: i64,
        node: &str,
        prefix: &str,
    ) -> Result<Vec<Ask>, LedgerError> {
        let asks: Vec<Ask> = sqlx::query_as(self.sql(
            "SELECT key, task, state, updated_at FROM jobs WHERE environment = ? AND generation = ? AND target_node = ? AND key LIKE ?",
        ))
        .bind(env)
        .bind(generation)
        .bind(node)
        .bind(format!("{prefix}%"))
        .fetch_all(&self.pool)
        .await?;
        // `prefix` as a LIKE pattern may match other keys (`_` is a wildcard there).
        Ok(asks.into_iter().filter(|a| a.key.starts_with(prefix)).collect())
    }

    /// Repairs that succeeded (their job keys), kept in the completion's transaction for the
    /// pass to publish their routes again.
    pub(crate) async fn mark_repaired_in(
        &self,
        tx: &mut WriteTx,
        keys: &[String],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        for key in keys {
            sqlx::query(self.sql("INSERT INTO repaired (job_key, at) VALUES (?, ?) ON CONFLICT (job_key) DO NOTHING"))
                .bind(key)
                .bind(now_ms)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    /// Up to `limit` repairs whose routes wait to be published again, oldest first.
    pub(crate) async fn repaired(&self, limit: i64) -> Result<Vec<String>, LedgerError> {
        Ok(
            sqlx::query_scalar(self.sql("SELECT job_key FROM repaired ORDER BY at, job_key LIMIT ?"))
                .bind(limit)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// A repair's routes were published again (or there is nothing left to publish): taken
    /// off the list, in `tx`. Whether it was still there (another daemon may have taken it).
    pub(crate) async fn forget_repaired_in(&self, tx: &mut WriteTx, key: &str) -> Result<bool, LedgerError> {
        let n = sqlx::query(self.sql("DELETE FROM repaired WHERE job_key = ?"))
            .bind(key)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    /// The spec of `environment`'s generation `generation`, in `tx`, while it is the current
    /// rollout.
    pub(crate) async fn rollout_spec_in(
        &self,
        tx: &mut WriteTx,
        environment: &str,
        generation: u64,
    ) -> Result<Option<DeploymentSpec>, LedgerError> {
        let spec: Option<String> = sqlx::query_scalar(
            self.sql("SELECT spec FROM deployments WHERE environment = ? AND generation = ? AND action = 'rollout'"),
        )
        .bind(environment)
        .bind(i64::try_from(generation).unwrap_or(i64::MAX))
        .fetch_optional(&mut **tx)
        .await?;
        Ok(spec.and_then(|s| serde_json::from_str(&s).ok()))
    }
}
