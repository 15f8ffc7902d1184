//! A release's watch in the ledger (`rollout.watchSeconds`): set when a rollout finishes, read
//! for each heartbeat of a node while something is watched (judged by the caller,
//! `ops::agents`, with `state_schema::watch::judge`), its first failure kept on the
//! deployment's row for the pass to roll it back (`reconcile/watch.rs`), and ended when its
//! window passed. SQL only; the caller keeps until when something is watched
//! (`hub::WatchHint`), so that a heartbeat with nothing under watch reads nothing.

use super::{LedgerError, WriteTx};
use sqlx::FromRow;
use state_schema::deployment::DeploymentSpec;
use state_schema::generations::Status;

/// A generation under watch, as a heartbeat is judged against it.
pub struct Watched {
    pub environment: String,
    pub generation: i64,
    pub spec: DeploymentSpec,
    /// When its watch began.
    pub watch_from: i64,
    pub status: Status,
}

#[derive(FromRow)]
struct WatchedRow {
    environment: String,
    generation: i64,
    spec: String,
    watch_from: i64,
    status: String,
}

/// A watch that failed, for the pass.
pub struct Failed {
    pub environment: String,
    pub generation: i64,
    pub failure: String,
    /// Whether its deployment had switched (`done`) when it failed: if not, it failed during
    /// its canary or between its rolling batches, as the caller tells from `spec`.
    pub switched: bool,
    pub spec: DeploymentSpec,
}

/// Until when the ledger's watches run (`i64::MAX` for a canary's): what `hub::WatchHint` holds.
const WATCHED_UNTIL: &str =
    "SELECT MAX(CASE WHEN watch = 'to-switch' THEN ? ELSE watch_until END) FROM deployments WHERE watch <> ''";

impl crate::store::Deployments<'_> {
    /// `environment`'s generation is watched from `from_ms` to `until_ms` (a release's window).
    pub(crate) async fn set_watch(
        &self,
        tx: &mut WriteTx,
        environment: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql(
            "UPDATE deployments SET watch = 'window', watch_from = ?, watch_until = ?, watch_failure = '' WHERE environment = ?",
        ))
        .bind(from_ms)
        .bind(until_ms)
        .bind(environment)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// `environment`'s canary is watched from `from_ms` until its switch (or its rollback).
    pub(crate) async fn watch_to_switch(
        &self,
        tx: &mut WriteTx,
        environment: &str,
        from_ms: i64,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql(
            "UPDATE deployments SET watch = 'to-switch', watch_from = ?, watch_until = 0, watch_failure = '' WHERE environment = ?",
        ))
        .bind(from_ms)
        .bind(environment)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Until when some generation is watched (`i64::MAX` while a canary's is; 0: none).
    pub(crate) async fn watched_until(&self) -> Result<i64, LedgerError> {
        let left: Option<i64> = sqlx::query_scalar(self.sql(WATCHED_UNTIL))
            .bind(i64::MAX)
            .fetch_one(&self.pool)
            .await?;
        Ok(left.unwrap_or(0))
    }

    /// The generations under watch at `at_ms` that have not failed yet, each with its spec and
    /// status: what a heartbeat is judged against (by `ops::agents`).
    pub(crate) async fn watched(&self, at_ms: i64) -> Result<Vec<Watched>, LedgerError> {
        let rows: Vec<WatchedRow> = sqlx::query_as(self.sql(
            "SELECT environment, generation, spec, watch_from, status FROM deployments \
             WHERE watch <> '' AND (watch = 'to-switch' OR watch_until > ?) AND watch_failure = '' \
             AND status IN ('done', 'in-progress')",
        ))
        .bind(at_ms)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                Some(Watched {
                    spec: serde_json::from_str(&r.spec).ok()?,
                    status: Status::parse(&r.status)?,
                    environment: r.environment,
                    generation: r.generation,
                    watch_from: r.watch_from,
                })
            })
            .collect())
    }

    /// Keeps `why` as the first failure of `environment`'s watched generation `generation`;
    /// whether it was the first.
    pub(crate) async fn record_watch_failure(
        &self,
        environment: &str,
        generation: i64,
        why: &str,
    ) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let n = sqlx::query(self.sql(
            "UPDATE deployments SET watch_failure = ? WHERE environment = ? AND generation = ? AND watch <> '' AND watch_failure = ''",
        ))
        .bind(why)
        .bind(environment)
        .bind(generation)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n > 0)
    }

    /// Watches that failed, oldest switch first.
    pub(crate) async fn watch_failures(&self) -> Result<Vec<Failed>, LedgerError> {
        let rows: Vec<(String, i64, String, String, String)> = sqlx::query_as(self.sql(
            "SELECT environment, generation, watch_failure, status, spec FROM deployments WHERE watch <> '' AND watch_failure <> '' ORDER BY watch_from",
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for (environment, generation, failure, status, spec) in rows {
            out.push(Failed {
                environment,
                generation,
                failure,
                switched: Status::parse(&status) == Some(Status::Done),
                spec: serde_json::from_str(&spec)?,
            });
        }
        Ok(out)
    }

    /// Fails the canary of `environment`'s generation `generation` for `why` (a step of it
    /// failed), in `tx`: the pass rolls it back as it does a failed watch.
    pub(crate) async fn fail_canary(
        &self,
        tx: &mut WriteTx,
        environment: &str,
        generation: i64,
        why: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql(
            "UPDATE deployments SET watch_from = CASE WHEN watch <> '' THEN watch_from ELSE ? END, \
             watch = 'to-switch', watch_until = 0, watch_failure = ? WHERE environment = ? AND generation = ? AND watch_failure = ''",
        ))
        .bind(now_ms)
        .bind(why)
        .bind(environment)
        .bind(generation)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// What the newest failed attempt of `environment`'s generation `generation` at `step`
    /// reported (a canary gate's measure, say), at most 500 characters.
    pub(crate) async fn step_failure(
        &self,
        tx: &mut WriteTx,
        environment: &str,
        generation: i64,
        step: i64,
    ) -> Result<Option<String>, LedgerError> {
        let detail: Option<String> = sqlx::query_scalar(self.sql(
            "SELECT r.detail FROM job_results r JOIN jobs j ON j.id = r.job_id \
             WHERE j.environment = ? AND j.generation = ? AND j.step = ? AND r.outcome <> 'succeeded' \
             ORDER BY r.id DESC LIMIT 1",
        ))
        .bind(environment)
        .bind(generation)
        .bind(step)
        .fetch_optional(&mut **tx)
        .await?;
        Ok(detail.map(|d| d.chars().take(500).collect()))
    }

    /// Ends `environment`'s watch (its failure handled), in `tx`.
    pub(crate) async fn end_watch(&self, tx: &mut WriteTx, environment: &str) -> Result<(), LedgerError> {
        sqlx::query(self.sql("UPDATE deployments SET watch = '', watch_until = 0 WHERE environment = ?"))
            .bind(environment)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Ends the watches whose window passed with no failure, each with a `watch-passed` event;
    /// then what heartbeats still need to look at. Returns the environments.
    pub(crate) async fn end_passed_watches(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        let mut tx = self.write_tx().await?;
        let passed: Vec<(String, i64)> = sqlx::query_as(self.sql(
            "UPDATE deployments SET watch = '', watch_until = 0 WHERE watch = 'window' AND watch_until <= ? AND watch_failure = '' \
             RETURNING environment, generation",
        ))
        .bind(now_ms)
        .fetch_all(&mut *tx)
        .await?;
        let events: Vec<(String, String, String)> = passed
            .iter()
            .map(|(env, g)| {
                let detail = format!("generation {g}: every watched replica healthy through its window");
                ("watch-passed".to_owned(), env.clone(), detail)
            })
            .collect();
        self.events().events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok(passed.into_iter().map(|(env, _)| env).collect())
    }
}
