//! Backups: an environment's ended backups and restore drills (newest first, as their agents
//! reported them) with when each volume's restore was last proven; a backup (or a restore
//! drill) now, answered with its job, which the caller follows in the listing; a restore of a
//! snapshot into the volume's next generation, followed through the volume and the rollout.

use super::{Answer, OpError, Ops, wire};
use crate::store::backups::{BackupRefusal, MAX_LISTED};
use crate::store::now_ms;
use operator_proto::backups::{Backups, BackupsQuery, JobAsked, Proven, Restore, Restoring, RunBackup};

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
        let asked = if ask.verify {
            self.ledger.backups().verify_now(env, volume, now_ms()).await?
        } else {
            self.ledger.backups().backup_now(env, volume, now_ms()).await?
        };
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
        let r = self
            .ledger
            .backups()
            .restore_now(env, volume, ask.snapshot.as_deref(), now_ms())
            .await?
            .map_err(|why| refusal(env, volume, why))?;
        tracing::info!(by = %who, environment = %env, volume = %volume, job = %r.job, to = r.to, snapshot = %r.snapshot, "restore asked for");
        self.hub.jobs.notify_waiters();
        Ok(Restoring {
            job: r.job,
            generation: r.to,
            snapshot: r.snapshot,
            node: r.node,
        })
    }
}
