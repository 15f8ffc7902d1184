//! Backups: an environment's ended backups and restore drills (newest first, as their agents
//! reported them) with when each volume's restore was last proven; a backup (or a restore
//! drill) now, answered with its job, which the caller follows in the listing; a restore of a
//! snapshot into the volume's next generation, followed through the volume and the rollout.

use super::{Answer, OpError, Ops, wire};
use crate::store::backups::{AskedJob, MAX_LISTED};
use crate::store::{LedgerError, now_ms};
use operator_proto::backups::{Backups, BackupsQuery, JobAsked, Proven, Restore, Restoring, RunBackup};
use state_schema::deployment::DeploymentSpec;
use state_schema::volume_jobs::{self, Asked, BACKUP_ATTEMPTS, BackupRefusal, Placed, VolumeJob};

/// The live deployment of `environment` among `rows` (the ledger's live deployments that back
/// up volumes: generation, spec), decoded.
pub(crate) fn live_of(rows: Vec<(i64, String)>, environment: &str) -> Option<(u64, DeploymentSpec)> {
    rows.into_iter()
        .filter_map(|(g, spec)| Some((g, serde_json::from_str::<DeploymentSpec>(&spec).ok()?)))
        .find(|(_, s)| s.environment.as_str() == environment)
        .map(|(g, s)| (u64::try_from(g).unwrap_or(0), s))
}

/// Rows a listing answers unless asked for fewer.
pub const DEFAULT_LISTED: i64 = 50;

fn refusal(env: &str, volume: &str, why: BackupRefusal) -> OpError {
    match why {
        BackupRefusal::NoPlan => OpError::not_found(
            "backup-not-planned",
            format!(
                "no live deployment of {env} backs up a volume {volume} (a volume's `backup` and the environment's `backups`)"
            ),
        ),
        BackupRefusal::NotPlaced => OpError::conflict(
            "volume-not-placed",
            format!("{env}'s volume {volume} was not made on any node yet"),
        ),
        BackupRefusal::Going(key) => OpError::conflict("backup-going", format!("{env}/{volume} has one going: {key}")),
        BackupRefusal::Dump => OpError::conflict(
            "restore-of-a-dump",
            format!(
                "{env}/{volume}'s backups are its command's output (a dump to load into the running role), not its files, and its `backup` names no `restore` command to load one: add one (`restore: [pg_restore, --clean, --if-exists, -d, app]`)"
            ),
        ),
        BackupRefusal::Moving(to) => OpError::conflict(
            "volume-moving",
            format!("{env}/{volume} is moving to {to}: ask again once the move ended (`pl volumes`)"),
        ),
        BackupRefusal::NoSnapshot => OpError::not_found(
            "snapshot-unknown",
            format!(
                "no succeeded backup of {env}/{volume} saved that snapshot (or there is none to restore, or the id is not 8-64 lowercase hex digits): `pl backups {env} {volume}` lists the snapshots that can be restored"
            ),
        ),
    }
}

impl Ops {
    /// `GET /v1/backups`.
    pub async fn backups(&self, q: BackupsQuery) -> Answer<Backups> {
        let limit = q.limit.unwrap_or(DEFAULT_LISTED);
        if !(1..=MAX_LISTED).contains(&limit) {
            return Err(OpError::malformed(format!("limit must be 1 to {MAX_LISTED}")));
        }
        let proven = self
            .ledger
            .backups()
            .proven(&q.environment)
            .await?
            .into_iter()
            .filter(|(v, _, _)| q.volume.as_ref().is_none_or(|want| want == v))
            .map(|(volume, at_ms, snapshot)| Proven {
                volume,
                at_ms,
                snapshot,
            })
            .collect();
        let rows = self
            .ledger
            .backups()
            .backups(&q.environment, q.volume.as_deref(), limit)
            .await?;
        Ok(Backups {
            backups: wire::all(rows, wire::backup)?,
            proven,
        })
    }

    /// `POST /v1/backups/run`: a backup now, or (`verify`) a restore drill of the newest
    /// snapshot.
    pub async fn run_backup(&self, who: &str, ask: RunBackup) -> Answer<JobAsked> {
        let (env, volume) = (&ask.environment, &ask.volume);
        let job = if ask.verify {
            VolumeJob::Drill
        } else {
            VolumeJob::Backup
        };
        let asked = self.ask_volume_job(env, volume, job, who).await?;
        match asked {
            Ok(key) => {
                tracing::info!(by = %who, environment = %env, volume = %volume, job = %key, verify = ask.verify, "backup asked for");
                self.hub.jobs.notify_waiters();
                Ok(JobAsked { job: key })
            }
            Err(BackupRefusal::NoPlan) if ask.verify => Err(OpError::not_found(
                "verify-not-planned",
                format!(
                    "no live deployment of {env} verifies the backups of a volume {volume} (a volume's `backup.verify`)"
                ),
            )),
            Err(BackupRefusal::NoSnapshot) if ask.verify => Err(OpError::not_found(
                "snapshot-unknown",
                format!("no succeeded backup of {env}/{volume} to verify yet"),
            )),
            Err(why) => Err(refusal(env, volume, why)),
        }
    }

    /// `POST /v1/restores`.
    pub async fn restore(&self, who: &str, ask: Restore) -> Answer<Restoring> {
        let (env, volume) = (&ask.environment, &ask.volume);
        let (live, placed, snapshots) = self.volume_read(env, volume).await?;
        let live = live.as_ref().map(|(g, s)| (*g, s));
        let restore = volume_jobs::restore(
            live,
            volume,
            placed.as_ref(),
            ask.snapshot.as_deref(),
            &snapshots,
            now_ms(),
        )
        .map_err(|why| refusal(env, volume, why))?;
        let detail = format!(
            "snapshot {} into generation {} on {}",
            restore.snapshot, restore.to, restore.asked.node
        );
        let key = self
            .queue(
                env,
                &restore.asked,
                1,
                ("volume-restore-requested", format!("{env}/{volume}"), detail),
            )
            .await?
            .map_err(|why| refusal(env, volume, why))?;
        let r = Restoring {
            job: key,
            generation: restore.to,
            snapshot: restore.snapshot,
            node: restore.asked.node,
        };
        tracing::info!(by = %who, environment = %env, volume = %volume, job = %r.job, to = r.generation, snapshot = %r.snapshot, "restore asked for");
        self.hub.jobs.notify_waiters();
        Ok(r)
    }

    /// What an ask of `environment`'s `volume` is judged on: its live deployment that backs up
    /// volumes, where the volume is, and the snapshots its succeeded backups saved.
    async fn volume_read(
        &self,
        environment: &str,
        volume: &str,
    ) -> Result<(Option<(u64, DeploymentSpec)>, Option<Placed>, Vec<String>), LedgerError> {
        let backups = self.ledger.backups();
        let live = live_of(backups.backup_deployments().await?, environment);
        let placed = backups
            .placed(environment, volume)
            .await?
            .map(|(node, generation, moving_to)| Placed {
                node,
                generation: u64::try_from(generation).unwrap_or(1),
                moving_to,
            });
        let snapshots = backups.succeeded_snapshots(environment, volume).await?;
        Ok((live, placed, snapshots))
    }

    /// A backup (or a restore drill) of the volume now: judged by `volume_jobs::ask`, queued
    /// unless one still goes. Its job's key, or why not.
    async fn ask_volume_job(
        &self,
        environment: &str,
        volume: &str,
        job: VolumeJob,
        who: &str,
    ) -> Result<Result<String, BackupRefusal>, LedgerError> {
        let (live, placed, snapshots) = self.volume_read(environment, volume).await?;
        let live = live.as_ref().map(|(g, s)| (*g, s));
        let asked = match volume_jobs::ask(job, live, volume, placed.as_ref(), &snapshots, now_ms()) {
            Ok(asked) => asked,
            Err(why) => return Ok(Err(why)),
        };
        // The event names the token that asked, as every operator's ask does.
        let detail = format!("asked now by {who}, on {}", asked.node);
        let event = (job.events().0, format!("{environment}/{volume}"), detail);
        self.queue(environment, &asked, BACKUP_ATTEMPTS, event).await
    }

    /// Writes what was decided: the job, unless one with its prefix still goes.
    async fn queue(
        &self,
        environment: &str,
        asked: &Asked,
        attempts: u32,
        event: (&str, String, String),
    ) -> Result<Result<String, BackupRefusal>, LedgerError> {
        let job = AskedJob {
            task: &asked.task,
            node: &asked.node,
            prefix: &asked.prefix,
            attempts,
            event,
        };
        Ok(self
            .ledger
            .backups()
            .queue_asked(environment, &job, now_ms())
            .await?
            .map_err(BackupRefusal::Going))
    }
}
