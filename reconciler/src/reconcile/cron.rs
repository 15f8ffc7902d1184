//! Cron roles: the ledger's side of `state_schema::cron`. Each pass, every live deployment's
//! cron roles are checked against the clock: when a scheduled time has come, one run is queued
//! on the role's node (`run-cron`, keyed by the time, so a time runs at most once); times
//! missed while the control plane was down collapse to one run; a time that comes while the
//! role's previous run is still queued or running is skipped, with an event (`cron-skipped`).
//!
//! Level-triggered: the only memory is the newest time handled per role
//! (`cron_schedules`), written in the same transaction as the job or the event.

use crate::store::{JobRow, Ledger, LedgerError};
use state_schema::deployment::DeploymentSpec;
use state_schema::task::{Task, cron_key_prefix};
use state_schema::values::CronSchedule;

/// Attempts of a cron run: a retryable failure (Docker away) retries within its time; a
/// permanent one (the command failed) waits for the next time.
pub const CRON_ATTEMPTS: u32 = 3;

/// What one tick did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CronTick {
    /// Runs queued: `(job key, scheduled time)`.
    pub queued: Vec<(String, i64)>,
    /// Times skipped because a run was still going: `(environment/role, scheduled time)`.
    pub skipped: Vec<(String, i64)>,
}

impl Ledger {
    /// Queues the cron runs that are due at `now_ms`.
    pub async fn cron_tick(&self, now_ms: i64) -> Result<CronTick, LedgerError> {
        let now = now_ms.div_euclid(1000);
        let mut tick = CronTick::default();
        for (generation, spec) in self.jobs().cron_deployments().await? {
            let spec: DeploymentSpec = serde_json::from_str(&spec)?;
            for (role, node) in &spec.cron {
                let Some(schedule) = spec
                    .roles
                    .get(role)
                    .and_then(|r| r.schedule.as_deref())
                    .and_then(|s| CronSchedule::parse(s).ok())
                else {
                    continue;
                };
                self.cron_role(
                    &spec,
                    role,
                    node,
                    u64::try_from(generation).unwrap_or(0),
                    &schedule,
                    now,
                    &mut tick,
                )
                .await?;
            }
        }
        Ok(tick)
    }

    #[allow(clippy::too_many_arguments)]
    async fn cron_role(
        &self,
        spec: &DeploymentSpec,
        role: &state_schema::values::Name,
        node: &state_schema::values::Name,
        generation: u64,
        schedule: &CronSchedule,
        now: i64,
        tick: &mut CronTick,
    ) -> Result<(), LedgerError> {
        let env = spec.environment.as_str();
        let due = Scheduled {
            env,
            key: role.to_string(),
            prefix: cron_key_prefix(&spec.environment, role),
            subject: format!("{env}/{role}"),
            node: node.as_str(),
            queued: "cron-queued",
            skipped: "cron-skipped",
            attempts: CRON_ATTEMPTS,
        };
        let task = |scheduled| Task::RunCron {
            environment: spec.environment.clone(),
            role: role.clone(),
            generation,
            scheduled,
        };
        self.schedule_due(&due, schedule, now, task, tick).await
    }

    /// One schedule at `now`: its first sight starts it; a time that has come queues one job
    /// (`task` of the time), or is skipped with an event while the one before still goes; and
    /// the time is handled, in the same transaction. Cron roles' runs and volumes' backups.
    pub(crate) async fn schedule_due(
        &self,
        s: &Scheduled<'_>,
        schedule: &CronSchedule,
        now: i64,
        task: impl FnOnce(i64) -> Task,
        tick: &mut CronTick,
    ) -> Result<(), LedgerError> {
        let Some(last) = self.jobs().cron_handled(&self.pool, s.env, &s.key).await? else {
            // First sight: the schedule counts from now, not from the epoch.
            return self.jobs().cron_start(s.env, &s.key, now - now.rem_euclid(60)).await;
        };
        let Some(due) = schedule.latest_in(last, now) else {
            return Ok(());
        };
        let mut tx = self.write_tx().await?;
        // Taken again inside the write transaction: another daemon may have handled it.
        let handled = self.jobs().cron_handled(&mut *tx, s.env, &s.key).await?;
        if handled.is_some_and(|h| h >= due) {
            return Ok(());
        }
        let going = self.jobs().going(&mut tx, s.env, &s.prefix).await?;
        let at = state_schema::cron::utc_minute(due);
        match going {
            Some(key) => {
                let detail = format!("{at} skipped: {key} still goes");
                self.events()
                    .events_in(
                        &mut tx,
                        now * 1000,
                        &[(s.skipped.to_owned(), s.subject.clone(), detail)],
                    )
                    .await?;
                tick.skipped.push((s.subject.clone(), due));
            }
            None => {
                let task = task(due);
                let row = JobRow::new(&task, s.node, s.attempts, now * 1000, None);
                let key = row.key.clone();
                let added = self
                    .jobs()
                    .enqueue_in(&mut tx, std::slice::from_ref(&row), now * 1000)
                    .await?;
                if !added.is_empty() {
                    let events = [
                        ("job-queued".to_owned(), key.clone(), String::new()),
                        (s.queued.to_owned(), s.subject.clone(), format!("{at} on {}", s.node)),
                    ];
                    self.events().events_in(&mut tx, now * 1000, &events).await?;
                    tick.queued.push((key, due));
                }
            }
        }
        self.jobs().cron_handled_up_to(&mut tx, s.env, &s.key, due).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// One schedule as [`Ledger::schedule_due`] handles it.
pub(crate) struct Scheduled<'a> {
    pub env: &'a str,
    /// Its row in `cron_schedules`: a cron role's name, or `volume:<name>` for a backup.
    pub key: String,
    /// What its jobs' keys start with: a time that comes while one is queued or leased is
    /// skipped.
    pub prefix: String,
    /// Its events' subject (`<env>/<role>`, `<env>/<volume>`).
    pub subject: String,
    pub node: &'a str,
    /// Its events' kinds when a time is queued, and skipped.
    pub queued: &'static str,
    pub skipped: &'static str,
    pub attempts: u32,
}
