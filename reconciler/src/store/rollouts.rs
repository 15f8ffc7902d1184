//! `pl rollout promote`: a canary waiting out a pause (or waiting for the promote itself) goes
//! on at once. The jobs of its next step are queued already with a `not_before` in the future
//! (`reconcile::deploy::job_rows`); promoting makes them due now. SQL only.

use super::{Ledger, LedgerError};

/// When a job that waits for `pl rollout promote` is due: never, until promoted.
pub const PROMOTE: i64 = i64::MAX / 4;

/// Why a promote is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromoteRefusal {
    UnknownEnvironment,
    /// No rollout of it is in progress.
    NotInProgress,
    /// Its rollout is in progress but nothing of it waits (a step is running).
    NotPaused,
}

impl PromoteRefusal {
    pub fn code(self) -> &'static str {
        match self {
            PromoteRefusal::UnknownEnvironment => "unknown-environment",
            PromoteRefusal::NotInProgress => "not-in-progress",
            PromoteRefusal::NotPaused => "not-paused",
        }
    }
}

/// A promote done: the generation and the step that now runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Promoted {
    pub generation: u64,
    pub step: u64,
}

impl Ledger {
    /// Promotes `environment`'s canary past its pause, by `by`, with a `canary-promoted` event.
    pub async fn promote(
        &self,
        environment: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<Result<Promoted, PromoteRefusal>, LedgerError> {
        let mut tx = self.write_tx().await?;
        let row: Option<(i64, String, i64)> =
            sqlx::query_as(self.sql("SELECT generation, status, step FROM deployments WHERE environment = ?"))
                .bind(environment)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((generation, status, step)) = row else {
            return Ok(Err(PromoteRefusal::UnknownEnvironment));
        };
        if status != "in-progress" {
            return Ok(Err(PromoteRefusal::NotInProgress));
        }
        let promoted = sqlx::query(self.sql(
            "UPDATE jobs SET not_before = ? WHERE environment = ? AND generation = ? AND step = ? \
             AND state = 'queued' AND not_before > ?",
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
            return Ok(Err(PromoteRefusal::NotPaused));
        }
        let detail = format!("generation {generation}: step {step} runs now, promoted by {by}");
        self.event(&mut tx, now_ms, "canary-promoted", environment, &detail)
            .await?;
        tx.commit().await?;
        Ok(Ok(Promoted {
            generation: u64::try_from(generation).unwrap_or(0),
            step: u64::try_from(step).unwrap_or(0),
        }))
    }
}
