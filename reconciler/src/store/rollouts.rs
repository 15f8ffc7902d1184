//! A rollout's current step: which rollouts can move (`advanceable`, and when the next pause
//! ends), the step as the advance reads it and writes what `state_schema::rollout::advance`
//! decided (`reconcile::advance`); as `pl rollout promote` reads and ends its wait (the row it
//! is judged on, `advance::promote` decides, and the wait ended on the condition that nothing
//! moved meanwhile; the advance queues the step's jobs), and what a canary's measures
//! reported, for its gates. SQL only.

use super::deployments::action;
use super::rows::{JobState, gen_u64};
use super::{LedgerError, Measure, WriteTx};
use sqlx::FromRow;
use state_schema::deployment::DeploymentSpec;
use state_schema::generations::{Action, Status, StepJobs};
use state_schema::rollout::advance::StepState;

/// See [`advanceable`](crate::store::Deployments::advanceable).
/// When the earliest pause ends (a step that is no longer in progress is set `running`, so
/// `paused` alone names a step in progress).
pub(crate) const NEXT_STEP_DUE: &str = "SELECT MIN(step_due) FROM deployments WHERE step_state = 'paused'";

pub(crate) const ADVANCEABLE: &str = "SELECT d.environment FROM deployments d WHERE d.status = 'in-progress' \
     AND (d.step_state = 'running' OR (d.step_state = 'paused' AND d.step_due <= ?)) AND NOT EXISTS \
     (SELECT 1 FROM jobs j WHERE j.environment = d.environment AND j.generation = d.generation \
      AND j.step = d.step AND j.state IN ('queued', 'leased'))";

#[derive(FromRow)]
struct InProgressRow {
    generation: i64,
    action: String,
    step: i64,
    spec: String,
    retired: String,
    hold: String,
    step_state: String,
    step_due: i64,
}

#[derive(FromRow)]
struct StateCount {
    state: String,
    n: i64,
}

/// An unfinished deployment, for the next step's decision.
pub(crate) struct InProgress {
    pub generation: i64,
    pub action: Action,
    pub step: i64,
    pub spec: DeploymentSpec,
    pub retired: Vec<DeploymentSpec>,
    /// Whether this generation is a rollback's (its hold names it).
    pub rollback: bool,
    /// Whether its current step runs or waits (a pause, a promote).
    pub state: StepState,
}

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

/// What a generation's canary measures reported, one row per step measured (summed over the
/// ingresses that measured it; the slowest p95).
#[derive(Clone, Debug, PartialEq, Eq, FromRow)]
pub struct StepMeasured {
    pub step: i64,
    /// One of the step's tasks (JSON), which names the share it measured.
    pub task: String,
    pub requests: i64,
    pub errors: i64,
    pub p95_micros: Option<i64>,
}

impl crate::store::Deployments<'_> {
    /// Every measured step of `environment`'s generation `generation`, in step order (the web
    /// view's picture of a canary's gates).
    pub async fn generation_measures(
        &self,
        environment: &str,
        generation: i64,
    ) -> Result<Vec<StepMeasured>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT j.step, MIN(j.task) AS task, CAST(SUM(m.requests) AS BIGINT) AS requests, CAST(SUM(m.errors) AS BIGINT) AS errors, \
             MAX(m.p95_micros) AS p95_micros FROM step_measures m JOIN jobs j ON j.id = m.job_id \
             WHERE j.environment = ? AND j.generation = ? GROUP BY j.step ORDER BY j.step",
        ))
        .bind(environment)
        .bind(generation)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Unfinished deployments whose current step has nothing queued or leased: the only ones
    /// that can move. One statement, driven by the unfinished deployments (a lookup in
    /// `jobs_by_step` each), so its cost follows the rollouts under way, not the jobs open:
    /// it runs after every group of completions, and grouping every open job (20,000 in the
    /// fleet bench) each time took a core's share from the writer.
    /// A step that waits is looked at once its pause is over (`now_ms`), or when promoted.
    pub(crate) async fn advanceable(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        Ok(sqlx::query_scalar(self.sql(ADVANCEABLE))
            .bind(now_ms)
            .fetch_all(&self.pool)
            .await?)
    }

    /// When the earliest pause of a step in progress ends: the daemon's loop wakes then. Read
    /// after every settle, through the partial index of paused steps.
    pub async fn next_step_due(&self) -> Result<Option<i64>, LedgerError> {
        Ok(sqlx::query_scalar(self.sql(NEXT_STEP_DUE))
            .fetch_one(&self.pool)
            .await?)
    }

    /// `env`'s deployment, if its rollout or teardown is unfinished.
    pub(crate) async fn in_progress(&self, tx: &mut WriteTx, env: &str) -> Result<Option<InProgress>, LedgerError> {
        let row: Option<InProgressRow> = sqlx::query_as(self.sql(
            "SELECT generation, action, step, spec, retired, hold, step_state, step_due FROM deployments WHERE environment = ? AND status = 'in-progress'",
        ))
        .bind(env)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(r) = row else { return Ok(None) };
        Ok(Some(InProgress {
            generation: r.generation,
            action: action(&r.action)?,
            step: r.step,
            spec: serde_json::from_str(&r.spec)?,
            retired: serde_json::from_str(&r.retired)?,
            rollback: super::rollbacks::Hold::parse(&r.hold)?.is_some_and(|h| gen_u64(r.generation) == h.generation),
            state: StepState::from_row(&r.step_state, r.step_due)
                .ok_or_else(|| LedgerError::Corrupt(format!("a deployment row's step state is {:?}", r.step_state)))?,
        }))
    }

    /// How the jobs of one step of one generation stand: pending (queued or leased) and
    /// broken (failed for good or dead).
    pub(crate) async fn step_jobs(
        &self,
        tx: &mut WriteTx,
        env: &str,
        generation: i64,
        step: i64,
    ) -> Result<StepJobs, LedgerError> {
        let counts: Vec<StateCount> = sqlx::query_as(self.sql(
            "SELECT state, COUNT(*) AS n FROM jobs WHERE environment = ? AND generation = ? AND step = ? GROUP BY state",
        ))
        .bind(env)
        .bind(generation)
        .bind(step)
        .fetch_all(&mut **tx)
        .await?;
        let mut jobs = StepJobs::default();
        for c in counts {
            let n = u64::try_from(c.n).unwrap_or(0);
            let state = JobState::parse(&c.state)
                .ok_or_else(|| LedgerError::Corrupt(format!("a job row's state is {:?}", c.state)))?;
            if state.pending() {
                jobs.pending += n;
            } else if state.broken() {
                jobs.broken += n;
            }
        }
        Ok(jobs)
    }

    /// Whether step `step` of `env`'s generation `generation` has any job (queued ahead of it,
    /// say: `advance::held_with`).
    pub(crate) async fn step_queued(
        &self,
        tx: &mut WriteTx,
        env: &str,
        generation: i64,
        step: i64,
    ) -> Result<bool, LedgerError> {
        let any: Option<i64> = sqlx::query_scalar(
            self.sql("SELECT 1 FROM jobs WHERE environment = ? AND generation = ? AND step = ? LIMIT 1"),
        )
        .bind(env)
        .bind(generation)
        .bind(step)
        .fetch_optional(&mut **tx)
        .await?;
        Ok(any.is_some())
    }

    /// `env`'s deployment stands at `step` with `status`, the step as `state` says.
    pub(crate) async fn set_step(
        &self,
        tx: &mut WriteTx,
        env: &str,
        status: Status,
        step: i64,
        state: StepState,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let q = if status == Status::Done {
            // Done: what it replaced is gone from the nodes.
            "UPDATE deployments SET status = ?, step = ?, step_state = ?, step_due = ?, retired = '[]', updated_at = ? WHERE environment = ?"
        } else {
            "UPDATE deployments SET status = ?, step = ?, step_state = ?, step_due = ?, updated_at = ? WHERE environment = ?"
        };
        sqlx::query(self.sql(q))
            .bind(status.as_str())
            .bind(step)
            .bind(state.as_str())
            .bind(state.due_ms())
            .bind(now_ms)
            .bind(env)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// `env`'s canary gives the new release `weight` percent of the requests.
    pub(crate) async fn set_share(&self, tx: &mut WriteTx, env: &str, weight: u8) -> Result<(), LedgerError> {
        sqlx::query(self.sql("UPDATE deployments SET share = ? WHERE environment = ?"))
            .bind(i64::from(weight))
            .bind(env)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

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
