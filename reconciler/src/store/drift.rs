//! What the drift check reads: the nodes' fresh reports of what runs, the placements of
//! finished rollouts, and the jobs that asked for one replica; and what a repair's success
//! writes in its completion's transaction (routes published again, as
//! `rollout::republish_after_repair` says). SQL only; the comparison and the repairs are
//! `reconcile::drift`'s.

use super::{JobRow, Ledger, LedgerError, WriteTx, rows};
use sqlx::FromRow;
use state_schema::deployment::DeploymentSpec;
use state_schema::rollout;

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

impl Ledger {
    /// The reports of nodes heard from since `since_ms`.
    pub(crate) async fn fresh_reports(&self, since_ms: i64) -> Result<Vec<Report>, LedgerError> {
        Ok(sqlx::query_as(
            self.sql("SELECT name, observed, last_seen FROM nodes WHERE observed IS NOT NULL AND last_seen >= ?"),
        )
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Calls `each` with every finished rollout, a row at a time: at 10,000 environments the
    /// specs together are tens of megabytes, which the daemon need not hold at once.
    pub(crate) async fn each_finished_rollout(&self, mut each: impl FnMut(Finished)) -> Result<(), LedgerError> {
        let mut rows =
            sqlx::query_as::<_, Finished>(self.sql(
                "SELECT environment, generation, spec FROM deployments WHERE action = 'rollout' AND status = 'done'",
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

    /// After a repaired replica succeeded (in the completion's transaction): what
    /// `rollout::republish_after_repair` asks of its environment's routes is queued.
    pub(crate) async fn republish_after_repair(
        &self,
        tx: &mut WriteTx,
        key: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let Some((environment, generation, repair, node)) = rows::repair_of(key) else {
            return Ok(());
        };
        let spec: Option<String> = sqlx::query_scalar(
            self.sql("SELECT spec FROM deployments WHERE environment = ? AND generation = ? AND action = 'rollout'"),
        )
        .bind(environment)
        .bind(i64::try_from(generation).unwrap_or(i64::MAX))
        .fetch_optional(&mut **tx)
        .await?;
        let Some(Ok(spec)) = spec.map(|s| serde_json::from_str::<DeploymentSpec>(&s)) else {
            return Ok(());
        };
        let step = rollout::republish_after_repair(&spec, generation, repair, node);
        let jobs: Vec<JobRow<'_>> = step
            .iter()
            .map(|(task, node)| JobRow::new(task, node.as_str(), 5, now_ms, None))
            .collect();
        self.enqueue_in(tx, &jobs, now_ms).await?;
        Ok(())
    }
}
