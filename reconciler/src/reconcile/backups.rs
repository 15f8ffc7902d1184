//! Volume backups: the ledger's side of a volume's `backup.schedule`. Each pass, every live
//! deployment that backs up a volume is checked against the clock like a cron role
//! ([`Ledger::schedule_due`]): when a time has come, one `backup-volume` job is queued on the
//! node that holds the volume (keyed by the time, so a time is saved at most once); times
//! missed while the control plane was down collapse to one; a time that comes while the
//! volume's previous backup still goes is skipped with `backup-skipped`. An operator's
//! `pl backup` queues one at once ([`Ledger::backup_now`]). How each ended is recorded when
//! its agent reports (`store::backups`), and `/metrics` reads [`Hub::backups`] as of the last
//! pass.

use super::cron::{CronTick, Scheduled};
use crate::store::{JobRow, Ledger, LedgerError};
use state_schema::deployment::DeploymentSpec;
use state_schema::task::{Task, backup_key_prefix};
use state_schema::values::{CronSchedule, Name};

/// Attempts of a backup: a retryable failure (the repository unreachable, the container not
/// running yet) retries within its time; then it waits for the next time.
pub const BACKUP_ATTEMPTS: u32 = 3;

/// Why a backup cannot be asked for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackupRefusal {
    /// No live deployment of the environment backs up such a volume.
    NoPlan,
    /// The volume was never made (its role was not placed yet).
    NotPlaced,
    /// One is queued or running already: its key.
    Going(String),
    /// The volume's backups are a command's output (a dump to load), not its files.
    Dump,
    /// No succeeded backup to restore, or the snapshot id is not one.
    NoSnapshot,
}

/// A restore asked for: its job key and the volume generation it fills.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restoring {
    pub job: String,
    pub to: u64,
    pub snapshot: String,
    pub node: String,
}

/// The live deployment of `environment` that backs up `volume`: (generation, spec, whether
/// its backups are a command's output).
fn backed_up(rows: Vec<(i64, String)>, environment: &str, volume: &str) -> Option<(u64, DeploymentSpec, bool)> {
    let (g, spec) = rows
        .into_iter()
        .filter_map(|(g, spec)| Some((g, serde_json::from_str::<DeploymentSpec>(&spec).ok()?)))
        .find(|(_, s)| s.environment.as_str() == environment)?;
    spec.backups.as_ref()?;
    let dump = spec
        .roles
        .values()
        .flat_map(|r| r.volumes.iter())
        .find(|v| v.name == volume)?
        .backup
        .as_ref()?
        .command
        .is_some();
    Some((u64::try_from(g).unwrap_or(0), spec, dump))
}

/// The volumes a spec backs up: (volume, its schedule).
fn planned(spec: &DeploymentSpec) -> Vec<(Name, CronSchedule)> {
    if spec.backups.is_none() {
        return Vec::new();
    }
    spec.roles
        .values()
        .flat_map(|r| r.volumes.iter())
        .filter_map(|v| {
            let b = v.backup.as_ref()?;
            Some((Name::new(&v.name).ok()?, CronSchedule::parse(&b.schedule).ok()?))
        })
        .collect()
}

impl Ledger {
    /// Queues the volume backups that are due at `now_ms`.
    pub async fn backup_tick(&self, now_ms: i64) -> Result<CronTick, LedgerError> {
        let now = now_ms.div_euclid(1000);
        let mut tick = CronTick::default();
        for (generation, spec) in self.backup_deployments().await? {
            let spec: DeploymentSpec = serde_json::from_str(&spec)?;
            let generation = u64::try_from(generation).unwrap_or(0);
            for (volume, schedule) in planned(&spec) {
                let env = spec.environment.as_str();
                let Some(node) = self.volume_node(env, volume.as_str()).await? else {
                    continue; // not made yet: nothing to save
                };
                let due = Scheduled {
                    env,
                    key: format!("volume:{volume}"),
                    prefix: backup_key_prefix(&spec.environment, &volume),
                    subject: format!("{env}/{volume}"),
                    node: &node,
                    queued: "backup-queued",
                    skipped: "backup-skipped",
                    attempts: BACKUP_ATTEMPTS,
                };
                let task = |scheduled| Task::BackupVolume {
                    environment: spec.environment.clone(),
                    volume: volume.clone(),
                    generation,
                    scheduled,
                    on_demand: false,
                };
                self.schedule_due(&due, &schedule, now, task, &mut tick).await?;
            }
        }
        Ok(tick)
    }

    /// Queues a backup of `environment`'s `volume` now (an operator's `pl backup`), on the node
    /// that holds it. Returns its job key.
    pub async fn backup_now(
        &self,
        environment: &str,
        volume: &str,
        now_ms: i64,
    ) -> Result<Result<String, BackupRefusal>, LedgerError> {
        let spec = self
            .backup_deployments()
            .await?
            .into_iter()
            .filter_map(|(g, spec)| Some((g, serde_json::from_str::<DeploymentSpec>(&spec).ok()?)))
            .find(|(_, s)| s.environment.as_str() == environment);
        let Some((generation, spec)) = spec else {
            return Ok(Err(BackupRefusal::NoPlan));
        };
        let Some((volume, _)) = planned(&spec).into_iter().find(|(v, _)| v.as_str() == volume) else {
            return Ok(Err(BackupRefusal::NoPlan));
        };
        let Some(node) = self.volume_node(environment, volume.as_str()).await? else {
            return Ok(Err(BackupRefusal::NotPlaced));
        };
        let task = Task::BackupVolume {
            environment: spec.environment.clone(),
            volume: volume.clone(),
            generation: u64::try_from(generation).unwrap_or(0),
            scheduled: now_ms.div_euclid(1000),
            on_demand: true,
        };
        let mut tx = self.write_tx().await?;
        if let Some(key) = self
            .going(&mut tx, environment, &backup_key_prefix(&spec.environment, &volume))
            .await?
        {
            return Ok(Err(BackupRefusal::Going(key)));
        }
        let row = JobRow::new(&task, &node, BACKUP_ATTEMPTS, now_ms, None);
        let key = row.key.clone();
        self.enqueue_in(&mut tx, std::slice::from_ref(&row), now_ms).await?;
        let events = [
            ("job-queued".to_owned(), key.clone(), String::new()),
            (
                "backup-queued".to_owned(),
                format!("{environment}/{volume}"),
                format!("asked now, on {node}"),
            ),
        ];
        self.events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok(Ok(key))
    }

    /// Queues a restore of `environment`'s `volume` (admin's `pl restore`): `snapshot`, or the
    /// newest one a backup of it succeeded with, into the volume's next generation on the node
    /// that holds it. The volume moves to that generation only once the agent succeeded.
    pub async fn restore_now(
        &self,
        environment: &str,
        volume: &str,
        snapshot: Option<&str>,
        now_ms: i64,
    ) -> Result<Result<Restoring, BackupRefusal>, LedgerError> {
        let Some((generation, spec, dump)) = backed_up(self.backup_deployments().await?, environment, volume) else {
            return Ok(Err(BackupRefusal::NoPlan));
        };
        if dump {
            return Ok(Err(BackupRefusal::Dump));
        }
        let Some(row) = self
            .volumes()
            .await?
            .into_iter()
            .find(|r| r.environment == environment && r.volume == volume)
        else {
            return Ok(Err(BackupRefusal::NotPlaced));
        };
        let snapshot = match snapshot {
            Some(s) if state_schema::task::is_snapshot_id(s) => s.to_owned(),
            Some(_) => return Ok(Err(BackupRefusal::NoSnapshot)),
            None => match self
                .backups(environment, Some(volume), crate::store::backups::MAX_LISTED)
                .await?
                .into_iter()
                .find_map(|b| b.snapshot.filter(|_| b.status == "succeeded"))
            {
                Some(s) => s,
                None => return Ok(Err(BackupRefusal::NoSnapshot)),
            },
        };
        let Ok(volume_name) = Name::new(volume) else {
            return Ok(Err(BackupRefusal::NoPlan));
        };
        let to = u64::try_from(row.generation).unwrap_or(1) + 1;
        let task = Task::RestoreVolume {
            environment: spec.environment.clone(),
            volume: volume_name,
            generation,
            to,
            snapshot: snapshot.clone(),
            asked_at: now_ms,
        };
        let mut tx = self.write_tx().await?;
        if let Some(key) = self
            .going(&mut tx, environment, &format!("vol:{environment}/{volume}:v{to}:"))
            .await?
        {
            return Ok(Err(BackupRefusal::Going(key)));
        }
        let job = JobRow::new(&task, &row.node, 1, now_ms, None);
        let key = job.key.clone();
        self.enqueue_in(&mut tx, std::slice::from_ref(&job), now_ms).await?;
        let events = [
            ("job-queued".to_owned(), key.clone(), String::new()),
            (
                "volume-restore-requested".to_owned(),
                format!("{environment}/{volume}"),
                format!("snapshot {snapshot} into generation {to} on {}", row.node),
            ),
        ];
        self.events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok(Ok(Restoring {
            job: key,
            to,
            snapshot,
            node: row.node,
        }))
    }
}
