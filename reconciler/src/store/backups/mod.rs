//! Backups as the ledger keeps them: each backup of a volume that ended, as its node's agent
//! reported it (the snapshot restic wrote and its sizes, or the reason it failed), the newest
//! [`KEPT_PER_VOLUME`] per volume; an operator's backup now and an admin's restore, queued on
//! the volume's node as the caller decided. What is due on a schedule is `reconcile::backups`'s,
//! and what a lease hands the agent `delivery`'s.

use super::{JobRow, LedgerError, WriteTx};
use sqlx::FromRow;
use state_schema::task::Task;

mod asked;

pub use asked::*;

/// Ended backups kept per volume (older rows go as new ones come; restic's own snapshots are
/// what `keep` governs). Twice the most `keep` allows, so every snapshot restic keeps for a
/// volume is still known here (a restore names only those).
pub const KEPT_PER_VOLUME: i64 = 2 * state_schema::volumes::MAX_KEEP as i64;

/// Most rows one listing answers.
pub const MAX_LISTED: i64 = 1000;

/// What a succeeded backup saved, as the agent reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    pub snapshot: String,
    pub bytes: u64,
    pub data_added: u64,
}

/// One ended backup.
#[derive(Clone, Debug, PartialEq, Eq, FromRow)]
pub struct BackupRow {
    pub environment: String,
    pub volume: String,
    /// The volume's generation it saved.
    pub generation: i64,
    pub node: String,
    pub job_key: String,
    pub finished_at: i64,
    /// `succeeded` or `failed`.
    pub status: String,
    pub snapshot: Option<String>,
    pub bytes: Option<i64>,
    pub data_added: Option<i64>,
    pub reason: String,
}

/// Where a volume's backups stand: when the newest success ended, and how many failed since.
#[derive(Clone, Debug, PartialEq, Eq, FromRow)]
pub struct BackupHealth {
    pub environment: String,
    pub volume: String,
    pub last_success_at: Option<i64>,
    pub failures_since: i64,
    /// When the newest drill that proved a restore of it ended.
    pub last_verified_at: Option<i64>,
}

/// How a backup job ended, for its row.
pub(crate) struct Ended<'a> {
    pub key: &'a str,
    pub node: &'a str,
    pub saved: Option<&'a Saved>,
    /// Empty for a success.
    pub reason: &'a str,
}

impl crate::store::Backups<'_> {
    /// Live deployments whose spec backs up a volume, done rolling out: (generation, spec).
    pub(crate) async fn backup_deployments(&self) -> Result<Vec<(i64, String)>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT d.generation, d.spec FROM deployments d JOIN deployment_uses u ON u.environment = d.environment \
             WHERE d.action = 'rollout' AND d.status = 'done' AND u.backups = 1 ORDER BY d.environment",
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Records a backup job's end (a success with what it saved, or a failure for good), with
    /// its event, in the completion's transaction. A key recorded before is left alone.
    pub(crate) async fn record_backup_in(
        &self,
        tx: &mut WriteTx,
        ended: &Ended<'_>,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let (env, volume, drill) = match state_schema::task::backup_of_key(ended.key) {
            Some((e, v)) => (e, v, false),
            None => match state_schema::task::drill_of_key(ended.key) {
                Some((e, v)) => (e, v, true),
                None => return Ok(()),
            },
        };
        let moving = state_schema::task::is_move_key(ended.key);
        let status = match (drill, ended.saved.is_some()) {
            (false, true) if moving => "moved",
            (false, false) if moving => "move-failed",
            (false, true) => "succeeded",
            (false, false) => "failed",
            (true, true) => "verified",
            (true, false) => "verify-failed",
        };
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let written = sqlx::query(self.sql(
            "INSERT INTO backups (environment, volume, generation, node, job_key, finished_at, status, snapshot, bytes, data_added, reason) \
             VALUES (?, ?, COALESCE((SELECT generation FROM volumes WHERE environment = ? AND volume = ?), 1), ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (job_key) DO NOTHING",
        ))
        .bind(env)
        .bind(volume)
        .bind(env)
        .bind(volume)
        .bind(ended.node)
        .bind(ended.key)
        .bind(now_ms)
        .bind(status)
        .bind(ended.saved.map(|s| s.snapshot.clone()))
        // A drill restores; it reads and adds nothing.
        .bind(ended.saved.filter(|_| !drill).map(|s| as_i64(s.bytes)))
        .bind(ended.saved.filter(|_| !drill).map(|s| as_i64(s.data_added)))
        .bind(ended.reason)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if written == 0 {
            return Ok(());
        }
        sqlx::query(self.sql(
            "DELETE FROM backups WHERE environment = ? AND volume = ? AND id <= \
             (SELECT id FROM backups WHERE environment = ? AND volume = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
        ))
        .bind(env)
        .bind(volume)
        .bind(env)
        .bind(volume)
        .bind(KEPT_PER_VOLUME)
        .execute(&mut **tx)
        .await?;
        if moving {
            // A move's first step: its own events, and the next step.
            return self.volumes().record_move_saved_in(tx, ended, now_ms).await;
        }
        let subject = format!("{env}/{volume}");
        let event = match (drill, ended.saved) {
            (false, Some(s)) => (
                "backup-succeeded".to_owned(),
                subject,
                format!("snapshot {} on {} ({} bytes)", s.snapshot, ended.node, s.bytes),
            ),
            (false, None) => (
                "backup-failed".to_owned(),
                subject,
                format!("on {}: {}", ended.node, ended.reason),
            ),
            (true, Some(s)) => (
                "backup-verified".to_owned(),
                subject,
                format!(
                    "snapshot {} restored and its verify command passed on {}",
                    s.snapshot, ended.node
                ),
            ),
            (true, None) => (
                "backup-verify-failed".to_owned(),
                subject,
                format!("on {}: {}", ended.node, ended.reason),
            ),
        };
        self.events().events_in(tx, now_ms, &[event]).await
    }

    /// A restore's end: when it succeeded, the volume moves to the generation it filled (its
    /// role is then placed again on it: the fleet's signature changed); either way an event.
    pub(crate) async fn record_restore_in(
        &self,
        tx: &mut WriteTx,
        key: &str,
        node: &str,
        succeeded: bool,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let Some((env, volume, to)) = state_schema::task::restore_of_key(key) else {
            return Ok(());
        };
        let to = i64::try_from(to).unwrap_or(i64::MAX);
        let failure = (!succeeded).then_some(reason);
        if self
            .volumes()
            .record_move_restored_in(tx, (env, volume, to), node, failure, now_ms)
            .await?
        {
            return Ok(());
        }
        let subject = format!("{env}/{volume}");
        let event = if succeeded {
            let moved = sqlx::query(
                self.sql("UPDATE volumes SET generation = ? WHERE environment = ? AND volume = ? AND generation = ?"),
            )
            .bind(to)
            .bind(env)
            .bind(volume)
            .bind(to - 1)
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if moved == 0 {
                return Ok(());
            }
            self.deployments()
                .keep_generation_in(tx, (env, volume, to - 1), node, now_ms)
                .await?;
            (
                "volume-restored".to_owned(),
                subject,
                format!("generation {to} on {node}; generation {} kept", to - 1),
            )
        } else {
            (
                "volume-restore-failed".to_owned(),
                subject,
                format!("on {node}: {reason}"),
            )
        };
        self.events().events_in(tx, now_ms, &[event]).await
    }

    /// `environment`'s ended backups, newest first (of one volume when given), at most `limit`.
    pub async fn backups(
        &self,
        environment: &str,
        volume: Option<&str>,
        limit: i64,
    ) -> Result<Vec<BackupRow>, LedgerError> {
        let limit = limit.clamp(1, MAX_LISTED);
        let columns =
            "environment, volume, generation, node, job_key, finished_at, status, snapshot, bytes, data_added, reason";
        let rows = match volume {
            Some(v) => {
                let q = format!(
                    "SELECT {columns} FROM backups WHERE environment = ? AND volume = ? ORDER BY id DESC LIMIT ?"
                );
                sqlx::query_as(self.sql(&q))
                    .bind(environment)
                    .bind(v)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                let q = format!("SELECT {columns} FROM backups WHERE environment = ? ORDER BY id DESC LIMIT ?");
                sqlx::query_as(self.sql(&q))
                    .bind(environment)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        Ok(rows)
    }

    /// Each volume with backups: its newest success and the failures after it.
    pub async fn backup_health(&self) -> Result<Vec<BackupHealth>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT b.environment, b.volume, \
               MAX(CASE WHEN b.status = 'succeeded' THEN b.finished_at END) AS last_success_at, \
               SUM(CASE WHEN b.status = 'failed' AND b.id > COALESCE((SELECT MAX(s.id) FROM backups s WHERE s.environment = b.environment AND s.volume = b.volume AND s.status = 'succeeded'), 0) THEN 1 ELSE 0 END) AS failures_since, \
               MAX(CASE WHEN b.status = 'verified' THEN b.finished_at END) AS last_verified_at \
             FROM backups b GROUP BY b.environment, b.volume ORDER BY b.environment, b.volume",
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    /// `environment`'s volumes whose restore was ever proven by a drill: (volume, when the
    /// newest passing drill ended, the snapshot it proved).
    pub async fn proven(&self, environment: &str) -> Result<Vec<(String, i64, Option<String>)>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT volume, finished_at, snapshot FROM backups b WHERE environment = ? AND status = 'verified' \
             AND id = (SELECT MAX(id) FROM backups s WHERE s.environment = b.environment AND s.volume = b.volume AND s.status = 'verified') \
             ORDER BY volume",
        ))
        .bind(environment)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The node that holds `environment`'s `volume`, if it was ever made, and the node it
    /// moves to while a move is under way.
    pub(crate) async fn volume_node(
        &self,
        environment: &str,
        volume: &str,
    ) -> Result<Option<(String, Option<String>)>, LedgerError> {
        Ok(
            sqlx::query_as(self.sql("SELECT node, moving_to FROM volumes WHERE environment = ? AND volume = ?"))
                .bind(environment)
                .bind(volume)
                .fetch_optional(&self.pool)
                .await?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Ledger;

    #[tokio::test]
    async fn a_drill_is_a_row_of_its_own_that_proves_a_snapshot_and_is_no_backup_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ledger, _) = Ledger::sqlite_in(dir.path()).await;
        let saved = |id: &str| Saved {
            snapshot: id.into(),
            bytes: 0,
            data_added: 0,
        };
        let (first, second) = (saved("abcd1234"), saved("beef5678"));
        for (key, saved, at) in [
            ("backup:shop/pgdata:now1:save", Some(&first), 1000),
            ("drill:shop/pgdata:now2:verify", Some(&first), 2000),
            ("drill:shop/pgdata:now3:verify", Some(&second), 3000),
            ("drill:shop/pgdata:now4:verify", None, 4000),
        ] {
            let mut tx = ledger.write_tx().await.expect("tx");
            let ended = Ended {
                key,
                node: "n1",
                saved,
                reason: "verify-restore-failed: restoring snapshot beef5678: ciphertext verification failed",
            };
            ledger
                .backups()
                .record_backup_in(&mut tx, &ended, at)
                .await
                .expect("record");
            tx.commit().await.expect("commit");
        }
        let statuses: Vec<String> = ledger
            .backups()
            .backups("shop", None, 50)
            .await
            .expect("list")
            .into_iter()
            .map(|r| r.status)
            .collect();
        assert_eq!(statuses, ["verify-failed", "verified", "verified", "succeeded"]);
        let sizes: Vec<Option<i64>> = ledger
            .backups()
            .backups("shop", None, 50)
            .await
            .expect("list")
            .into_iter()
            .map(|r| r.bytes)
            .collect();
        assert_eq!(sizes, [None, None, None, Some(0)], "a drill reads nothing");
        // The newest passing drill proves the restore; a failed drill is no backup failure.
        assert_eq!(
            ledger.backups().proven("shop").await.expect("proven"),
            [("pgdata".to_owned(), 3000, Some("beef5678".to_owned()))]
        );
        let health = ledger.backups().backup_health().await.expect("health");
        assert_eq!((health[0].last_success_at, health[0].failures_since), (Some(1000), 0));
        let events = ledger.events().events_after(0, 100).await.expect("events");
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "backup-succeeded",
                "backup-verified",
                "backup-verified",
                "backup-verify-failed"
            ]
        );
    }

    #[tokio::test]
    async fn a_listing_is_newest_first_of_every_volume_or_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ledger, _) = Ledger::sqlite_in(dir.path()).await;
        let saved = Saved {
            snapshot: "abcd1234".into(),
            bytes: 10,
            data_added: 5,
        };
        for (key, saved) in [
            ("backup:shop/data:now1:save", Some(&saved)),
            ("backup:shop/rows:now2:save", None),
            ("backup:other/data:now3:save", Some(&saved)),
        ] {
            let mut tx = ledger.write_tx().await.expect("tx");
            let ended = Ended {
                key,
                node: "n1",
                saved,
                reason: "backup-command-failed: exited with 3",
            };
            ledger
                .backups()
                .record_backup_in(&mut tx, &ended, 1000)
                .await
                .expect("record");
            tx.commit().await.expect("commit");
        }
        let keys = |rows: Vec<BackupRow>| {
            rows.into_iter()
                .map(|r| format!("{} {}", r.volume, r.status))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(ledger.backups().backups("shop", None, 50).await.expect("list")),
            ["rows failed", "data succeeded"]
        );
        assert_eq!(
            keys(ledger.backups().backups("shop", Some("data"), 50).await.expect("list")),
            ["data succeeded"]
        );
        let health = ledger.backups().backup_health().await.expect("health");
        assert_eq!(health.len(), 3);
        assert_eq!(health[1].volume, "data");
        assert_eq!((health[1].last_success_at, health[1].failures_since), (Some(1000), 0));
        assert_eq!(
            (
                health[2].volume.as_str(),
                health[2].last_success_at,
                health[2].failures_since
            ),
            ("rows", None, 1)
        );
    }
}
