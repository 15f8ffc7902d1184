//! What cron roles read and write: the deployments that place one, the newest time handled
//! per role (`cron_schedules`), and whether a role's run still goes. SQL only; what is due is
//! `state_schema::cron`'s, and what is queued `reconcile::cron`'s.

use super::{LedgerError, WriteTx};

impl crate::store::Jobs<'_> {
    /// Deployments whose spec places a cron role, live and done rolling out: (generation, spec
    /// JSON).
    pub(crate) async fn cron_deployments(&self) -> Result<Vec<(i64, String)>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT d.generation, d.spec FROM deployments d JOIN deployment_uses u ON u.environment = d.environment \
             WHERE d.action = 'rollout' AND d.status = 'done' AND u.cron = 1 ORDER BY d.environment",
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    /// The newest scheduled time handled for `env`'s `role` (seconds), if any.
    pub(crate) async fn cron_handled<'e, E>(&self, on: E, env: &str, role: &str) -> Result<Option<i64>, LedgerError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Any>,
    {
        Ok(
            sqlx::query_scalar(
                self.sql("SELECT last_scheduled FROM cron_schedules WHERE environment = ? AND role = ?"),
            )
            .bind(env.to_owned())
            .bind(role.to_owned())
            .fetch_optional(on)
            .await?,
        )
    }

    /// First sight of a role: its schedule counts from `at`, unless another daemon wrote first.
    pub(crate) async fn cron_start(&self, env: &str, role: &str, at: i64) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        sqlx::query(self.sql(
            "INSERT INTO cron_schedules (environment, role, last_scheduled) VALUES (?, ?, ?) ON CONFLICT (environment, role) DO NOTHING",
        ))
        .bind(env.to_owned())
        .bind(role.to_owned())
        .bind(at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The key of a job of `env` whose key starts with `prefix` that is queued or leased.
    pub(crate) async fn going(&self, tx: &mut WriteTx, env: &str, prefix: &str) -> Result<Option<String>, LedgerError> {
        Ok(sqlx::query_scalar(self.sql(
            "SELECT key FROM jobs WHERE environment = ? AND key LIKE ? AND state IN ('queued', 'leased') ORDER BY id LIMIT 1",
        ))
        .bind(env.to_owned())
        .bind(format!("{prefix}%"))
        .fetch_optional(&mut **tx)
        .await?)
    }

    /// `env`'s `role` has handled every time up to `due`.
    pub(crate) async fn cron_handled_up_to(
        &self,
        tx: &mut WriteTx,
        env: &str,
        role: &str,
        due: i64,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql("UPDATE cron_schedules SET last_scheduled = ? WHERE environment = ? AND role = ?"))
            .bind(due)
            .bind(env.to_owned())
            .bind(role.to_owned())
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}
