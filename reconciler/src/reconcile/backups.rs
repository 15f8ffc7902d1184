//! Volume backups: the ledger's side of a volume's `backup.schedule`. Each pass, every live
//! deployment that backs up a volume is checked against the clock like a cron role
//! ([`Ledger::schedule_due`]): when a time has come, one `backup-volume` job is queued on the
//! node that holds the volume (keyed by the time, so a time is saved at most once); times
//! missed while the control plane was down collapse to one; a time that comes while the
//! volume's previous backup still goes is skipped with `backup-skipped`. An operator's
//! `pl backup` queues one at once (`ops::backups`, deciding by `state_schema::volume_jobs::ask`).
//! How each ended is recorded when its agent reports (`store::backups`), and `/metrics` reads
//! [`Hub::backups`] as of the last pass. A backup's `verify.schedule` queues its restore drills (`verify-backup` jobs) the same
//! way, under the schedule key `verify:<volume>`.

use super::cron::{CronTick, Scheduled};
use crate::store::{Ledger, LedgerError};
use state_schema::deployment::DeploymentSpec;
use state_schema::volume_jobs::{BACKUP_ATTEMPTS, VolumeJob};

impl Ledger {
    /// Queues the volume backups that are due at `now_ms`.
    pub async fn backup_tick(&self, now_ms: i64) -> Result<CronTick, LedgerError> {
        let now = now_ms.div_euclid(1000);
        let mut tick = CronTick::default();
        for (generation, spec) in self.backups().backup_deployments().await? {
            let spec: DeploymentSpec = serde_json::from_str(&spec)?;
            let generation = u64::try_from(generation).unwrap_or(0);
            // Backups, then restore drills: each volume's schedule under its own key.
            for job in [VolumeJob::Backup, VolumeJob::Drill] {
                for (volume, schedule) in job.planned(&spec) {
                    let env = spec.environment.as_str();
                    let node = match self.backups().volume_node(env, volume.as_str()).await? {
                        None => continue, // not made yet: nothing to save
                        // Moving: its role is down on purpose; the time waits for the move.
                        Some((_, Some(_))) => continue,
                        Some((node, None)) => node,
                    };
                    let (queued, skipped) = job.events();
                    let due = Scheduled {
                        env,
                        key: job.schedule_key(&volume),
                        prefix: job.key_prefix(&spec.environment, &volume),
                        subject: format!("{env}/{volume}"),
                        node: &node,
                        queued,
                        skipped,
                        attempts: BACKUP_ATTEMPTS,
                    };
                    let task = |scheduled| job.task(&spec.environment, &volume, generation, scheduled, false);
                    self.schedule_due(&due, &schedule, now, task, &mut tick).await?;
                }
            }
        }
        Ok(tick)
    }
}
