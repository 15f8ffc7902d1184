//! A rollout's current step: as `pl rollout promote` reads and ends its wait (the row it is
//! judged on, `state_schema::rollout::advance::promote` decides, and the wait ended on the
//! condition that nothing moved meanwhile; the advance queues the step's jobs), and what a
//! canary's measures reported, for its gates. SQL only.

use super::rows::gen_u64;
use super::{LedgerError, Measure, WriteTx};
use sqlx::FromRow;

/// Where an environment's deployment stands, as a promote or an abort is judged on it.
#[derive(Clone, Debug, FromRow)]
pub struct StepRow {
    pub generation: i64,
    pub action: String,
    pub status: String,
    pub step: i64,
    pub step_state: String,
    pub step_due: i64,
}

#[derive(FromRow)]
struct MeasureRow {
    requests: i64,
    errors: i64,
    p95_micros: Option<i64>,
    logged: i64,
}

impl crate::store::Deployments<'_> {
    /// What the measures of `environment`'s step `step` of generation `generation` reported,
    /// one per job that succeeded.
    pub(crate) async fn step_measures(
        &self,
        tx: &mut WriteTx,
        environment: &str,
        generation: i64,
        step: i64,
    ) -> Result<Vec<Measure>, LedgerError> {
        let rows: Vec<MeasureRow> = sqlx::query_as(self.sql(
            "SELECT m.requests, m.errors, m.p95_micros, m.logged FROM step_measures m JOIN jobs j ON j.id = m.job_id \
             WHERE j.environment = ? AND j.generation = ? AND j.step = ? ORDER BY m.job_id",
        ))
        .bind(environment)
        .bind(generation)
        .bind(step)
        .fetch_all(&mut **tx)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| Measure {
                requests: r.requests,
                errors: r.errors,
                p95_micros: r.p95_micros,
                logged: r.logged != 0,
            })
            .collect())
    }

    /// `environment`'s deployment's current step, if it has a deployment.
    pub async fn step_row(&self, environment: &str) -> Result<Option<StepRow>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT generation, action, status, step, step_state, step_due FROM deployments WHERE environment = ?",
        ))
        .bind(environment)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Ends the wait of `environment`'s step `step` of generation `generation` (a pause or a
    /// promote's) now, by `by`, with a `canary-promoted` event: the next advance queues its
    /// jobs. False when it no longer waits there (it ran, or another generation started).
    pub async fn promote_step(
        &self,
        environment: &str,
        generation: i64,
        step: i64,
        by: &str,
        now_ms: i64,
    ) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let promoted = sqlx::query(self.sql(
            "UPDATE deployments SET step_state = 'paused', step_due = ? WHERE environment = ? AND generation = ? \
             AND step = ? AND status = 'in-progress' \
             AND (step_state = 'awaits-promote' OR (step_state = 'paused' AND step_due > ?))",
        ))
        .bind(now_ms)
        .bind(environment)
        .bind(generation)
        .bind(step)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if promoted == 0 {
            return Ok(false);
        }
        let detail = format!(
            "generation {}: step {step} runs now, promoted by {by}",
            gen_u64(generation)
        );
        self.events()
            .event(&mut tx, now_ms, "canary-promoted", environment, &detail)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}
