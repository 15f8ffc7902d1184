//! What an operator asks of a volume now: a backup, a restore drill of its newest snapshot, a
//! restore into its next generation; each queued on the volume's node or refused (why, typed)
//! before anything is written. And which live deployment plans a volume's backups.

use super::*;
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
    /// The volume's backups are a command's output (a dump to load), not its files, and its
    /// backup names no `restore` command to load one.
    Dump,
    /// The volume is moving to this node (`pl volume move`): one thing at a time.
    Moving(String),
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
/// its backups are a command's output with no `restore` command to load them).
pub(crate) fn backed_up(
    rows: Vec<(i64, String)>,
    environment: &str,
    volume: &str,
) -> Option<(u64, DeploymentSpec, bool)> {
    let (g, spec) = rows
        .into_iter()
        .filter_map(|(g, spec)| Some((g, serde_json::from_str::<DeploymentSpec>(&spec).ok()?)))
        .find(|(_, s)| s.environment.as_str() == environment)?;
    spec.backups.as_ref()?;
    let plan = spec
        .roles
        .values()
        .flat_map(|r| r.volumes.iter())
        .find(|v| v.name == volume)?
        .backup
        .as_ref()?;
    let dump = plan.command.is_some() && plan.restore.is_none();
    Some((u64::try_from(g).unwrap_or(0), spec, dump))
}

/// A backup, or a restore drill of one: what a volume's schedules and an operator queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VolumeJob {
    Backup,
    Drill,
}

impl VolumeJob {
    /// The volumes `spec` plans this job for, with its schedule.
    pub(crate) fn planned(self, spec: &DeploymentSpec) -> Vec<(Name, CronSchedule)> {
        match self {
            VolumeJob::Backup => planned(spec),
            VolumeJob::Drill => drills(spec),
        }
    }

    /// The task for one time (Unix seconds), or for an operator's request at that second.
    pub(crate) fn task(
        self,
        environment: &Name,
        volume: &Name,
        generation: u64,
        scheduled: i64,
        on_demand: bool,
    ) -> Task {
        let (environment, volume) = (environment.clone(), volume.clone());
        match self {
            VolumeJob::Backup => Task::BackupVolume {
                environment,
                volume,
                generation,
                scheduled,
                on_demand,
                moving: false,
            },
            VolumeJob::Drill => Task::VerifyBackup {
                environment,
                volume,
                generation,
                scheduled,
                on_demand,
            },
        }
    }

    /// What every key of this job for the volume starts with: one at a time per volume.
    pub(crate) fn key_prefix(self, environment: &Name, volume: &Name) -> String {
        match self {
            VolumeJob::Backup => backup_key_prefix(environment, volume),
            VolumeJob::Drill => drill_key_prefix(environment, volume),
        }
    }

    /// Its schedule's key in `cron_schedules` (a role's name has no `:`).
    pub(crate) fn schedule_key(self, volume: &Name) -> String {
        match self {
            VolumeJob::Backup => format!("volume:{volume}"),
            VolumeJob::Drill => format!("verify:{volume}"),
        }
    }

    /// Its events: queued, skipped.
    pub(crate) fn events(self) -> (&'static str, &'static str) {
        match self {
            VolumeJob::Backup => ("backup-queued", "backup-skipped"),
            VolumeJob::Drill => ("backup-verify-queued", "backup-verify-skipped"),
        }
    }
}

/// The volumes whose backups a spec verifies: (volume, the drill's schedule).
fn drills(spec: &DeploymentSpec) -> Vec<(Name, CronSchedule)> {
    if spec.backups.is_none() {
        return Vec::new();
    }
    spec.roles
        .values()
        .flat_map(|r| r.volumes.iter())
        .filter_map(|v| {
            let verify = v.backup.as_ref()?.verify.as_ref()?;
            Some((Name::new(&v.name).ok()?, CronSchedule::parse(&verify.schedule).ok()?))
        })
        .collect()
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

impl crate::store::Backups<'_> {
    /// Queues a backup of `environment`'s `volume` now (an operator's `pl backup`), on the node
    /// that holds it. Returns its job key.
    pub async fn backup_now(
        &self,
        environment: &str,
        volume: &str,
        now_ms: i64,
    ) -> Result<Result<String, BackupRefusal>, LedgerError> {
        self.volume_job_now(environment, volume, VolumeJob::Backup, now_ms)
            .await
    }

    /// Queues a restore drill of `environment`'s `volume` now (an operator's `pl backup
    /// --verify`), on the node that holds it; refused until a backup of it succeeded. Returns
    /// its job key.
    pub async fn verify_now(
        &self,
        environment: &str,
        volume: &str,
        now_ms: i64,
    ) -> Result<Result<String, BackupRefusal>, LedgerError> {
        self.volume_job_now(environment, volume, VolumeJob::Drill, now_ms).await
    }

    /// A backup (or a restore drill) of the volume asked for now: planned by the live
    /// deployment, on the volume's node, one at a time per volume.
    async fn volume_job_now(
        &self,
        environment: &str,
        volume: &str,
        job: VolumeJob,
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
        let Some((volume, _)) = job.planned(&spec).into_iter().find(|(v, _)| v.as_str() == volume) else {
            return Ok(Err(BackupRefusal::NoPlan));
        };
        let node = match self.volume_node(environment, volume.as_str()).await? {
            None => return Ok(Err(BackupRefusal::NotPlaced)),
            Some((_, Some(to))) => return Ok(Err(BackupRefusal::Moving(to))),
            Some((node, None)) => node,
        };
        if job == VolumeJob::Drill
            && !self
                .backups(environment, Some(volume.as_str()), MAX_LISTED)
                .await?
                .iter()
                .any(|b| b.status == "succeeded")
        {
            return Ok(Err(BackupRefusal::NoSnapshot));
        }
        let generation = u64::try_from(generation).unwrap_or(0);
        let task = job.task(&spec.environment, &volume, generation, now_ms.div_euclid(1000), true);
        let mut tx = self.write_tx().await?;
        if let Some(key) = self
            .jobs()
            .going(&mut tx, environment, &job.key_prefix(&spec.environment, &volume))
            .await?
        {
            return Ok(Err(BackupRefusal::Going(key)));
        }
        let row = JobRow::new(&task, &node, BACKUP_ATTEMPTS, now_ms, None);
        let key = row.key.clone();
        self.jobs()
            .enqueue_in(&mut tx, std::slice::from_ref(&row), now_ms)
            .await?;
        let events = [
            ("job-queued".to_owned(), key.clone(), String::new()),
            (
                job.events().0.to_owned(),
                format!("{environment}/{volume}"),
                format!("asked now, on {node}"),
            ),
        ];
        self.events().events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok(Ok(key))
    }

    /// The snapshots of `environment`'s `volume` that succeeded backups saved, newest first.
    pub async fn succeeded_snapshots(&self, environment: &str, volume: &str) -> Result<Vec<String>, LedgerError> {
        Ok(sqlx::query_scalar(self.sql(
            "SELECT snapshot FROM backups WHERE environment = ? AND volume = ? AND status = 'succeeded' \
             AND snapshot IS NOT NULL ORDER BY id DESC",
        ))
        .bind(environment)
        .bind(volume)
        .fetch_all(&self.pool)
        .await?)
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
            .volumes()
            .await?
            .into_iter()
            .find(|r| r.environment == environment && r.volume == volume)
        else {
            return Ok(Err(BackupRefusal::NotPlaced));
        };
        if let Some(to) = row.moving_to {
            return Ok(Err(BackupRefusal::Moving(to)));
        }
        let snapshot = match snapshot {
            // Only a snapshot a backup of this volume saved (its id, or a prefix restic would
            // take for it and for no other): a job for anything else would fail in restic
            // after making the volume's next generation.
            Some(s) if state_schema::task::is_snapshot_id(s) => {
                let known = self.succeeded_snapshots(environment, volume).await?;
                match known_snapshot(&known, s) {
                    Some(id) => id,
                    None => return Ok(Err(BackupRefusal::NoSnapshot)),
                }
            }
            Some(_) => return Ok(Err(BackupRefusal::NoSnapshot)),
            None => match self
                .backups(environment, Some(volume), MAX_LISTED)
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
            moved: false,
        };
        let mut tx = self.write_tx().await?;
        if let Some(key) = self
            .jobs()
            .going(&mut tx, environment, &format!("vol:{environment}/{volume}:v{to}:"))
            .await?
        {
            return Ok(Err(BackupRefusal::Going(key)));
        }
        let job = JobRow::new(&task, &row.node, 1, now_ms, None);
        let key = job.key.clone();
        self.jobs()
            .enqueue_in(&mut tx, std::slice::from_ref(&job), now_ms)
            .await?;
        let events = [
            ("job-queued".to_owned(), key.clone(), String::new()),
            (
                "volume-restore-requested".to_owned(),
                format!("{environment}/{volume}"),
                format!("snapshot {snapshot} into generation {to} on {}", row.node),
            ),
        ];
        self.events().events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok(Ok(Restoring {
            job: key,
            to,
            snapshot,
            node: row.node,
        }))
    }
}
