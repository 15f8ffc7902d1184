//! Volume moves as the ledger keeps them (`pl volume move`): the only way a volume's node
//! changes. A move is three steps, each recorded in the transaction that ends the one before:
//!
//! 1. **Asked** (judged in `ops::volumes` on `move_rows`, started here by `start_move`):
//!    refused before anything is written unless the volume's environment runs a finished
//!    rollout that backs the volume up (the repository carries the data), its node answers,
//!    and placement would run its role on the target (`Fleet::move_lands`). Then `moving_to`
//!    is set and a move's backup
//!    (`BackupVolume { moving }`) is queued on the volume's node: its agent removes the role's
//!    replica (it stays down from here) and saves the volume's files.
//! 2. **Saved** (`record_move_saved_in`): a restore of that snapshot (`RestoreVolume { moved
//!    }`) into the volume's next generation is queued on the target node.
//! 3. **Restored** (`record_restore_in` calls `record_move_restored_in`): the row names the
//!    target and the new generation; the fleet's signature changed, so placement puts the role
//!    there at a new generation of its environment. **Up** (`record_moves_up_in`): the role's
//!    replica healthy on the target ends the move and its downtime.
//!
//! A step that fails for good ends the move (`volume-move-failed`): the volume stays where it
//! was, untouched (a move only reads it), and the drift repair starts the role there again.
//! While a move is under way, that repair leaves the role alone (`moving_roles`).

use super::{JobRow, LedgerError, WriteTx};
use state_schema::task::Task;
use state_schema::values::Name;

/// Why a move is refused (nothing was written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveRefusal {
    /// No such volume.
    Unknown,
    /// Its environment was torn down: nothing runs to move.
    Released,
    /// One is under way already, to this node.
    Moving(String),
    /// It is on that node already.
    AlreadyThere,
    /// No finished rollout of its environment backs it up: a move carries the data through
    /// the volume's backup repository.
    NoBackup,
    /// Its role has other volumes: they live together.
    SharedRole(String),
    /// Its node has not been heard from lately: nothing could stop and save it.
    SourceSilent(String),
    /// Its role would not run on the target: placement's reason.
    Unplaceable(String),
}

impl MoveRefusal {
    /// The stable code of the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            MoveRefusal::Unknown => "volume-unknown",
            MoveRefusal::Released => "volume-released",
            MoveRefusal::Moving(_) => "volume-moving",
            MoveRefusal::AlreadyThere => "volume-already-there",
            MoveRefusal::NoBackup => "move-needs-backup",
            MoveRefusal::SharedRole(_) => "move-shared-role",
            MoveRefusal::SourceSilent(_) => "volume-node-silent",
            MoveRefusal::Unplaceable(_) => "move-target-refused",
        }
    }
}

/// A move asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moving {
    /// The first step's job key.
    pub job: String,
    pub role: String,
    pub from: String,
    pub to: String,
    pub asked_at: i64,
}

impl crate::store::Volumes<'_> {
    /// What a move of `environment`'s `volume` is judged on: every volume's row, and the
    /// finished rollouts that back volumes up (`ops::volumes` judges; nothing is written).
    pub async fn move_rows(&self) -> Result<(Vec<super::volumes::VolumeRow>, Vec<(i64, String)>), LedgerError> {
        Ok((self.volumes().await?, self.backups().backup_deployments().await?))
    }

    /// Starts a move judged already (`ops::volumes`): `environment`'s `volume`, on `from` for
    /// role `role`, goes to `to` through `task` (its backup, `moving`). Refused (nothing
    /// written) when something else of the volume is going, or a move started meanwhile.
    #[allow(clippy::too_many_arguments)] // the move as judged: one call, one transaction
    pub async fn start_move(
        &self,
        environment: &str,
        volume: &str,
        role: &str,
        from: &str,
        to: &str,
        task: &Task,
        now_ms: i64,
    ) -> Result<Result<Moving, MoveRefusal>, LedgerError> {
        let Task::BackupVolume {
            environment: env_name,
            volume: volume_name,
            ..
        } = task
        else {
            return Ok(Err(MoveRefusal::Unknown));
        };
        let going = [
            state_schema::task::backup_key_prefix(env_name, volume_name),
            format!("vol:{environment}/{volume}:"),
        ];
        let mut tx = self.write_tx().await?;
        // Whatever else of the volume is going (a backup, a restore) ends first.
        for prefix in going {
            if let Some(key) = self.jobs().going(&mut tx, environment, &prefix).await? {
                return Ok(Err(MoveRefusal::Moving(format!("{key} first"))));
            }
        }
        let marked = sqlx::query(self.sql(
            "UPDATE volumes SET moving_to = ?, move_asked_at = ?, moved_from = NULL, moved_up_at = NULL, move_failure = NULL \
             WHERE environment = ? AND volume = ? AND moving_to IS NULL AND released_at IS NULL",
        ))
        .bind(to)
        .bind(now_ms)
        .bind(environment)
        .bind(volume)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if marked == 0 {
            return Ok(Err(MoveRefusal::Moving(to.to_owned())));
        }
        let job = JobRow::new(task, from, 3, now_ms, None);
        let key = job.key.clone();
        if self
            .jobs()
            .enqueue_in(&mut tx, std::slice::from_ref(&job), now_ms)
            .await?
            .is_empty()
        {
            // A move of this volume was asked this very second (and ended at once): its job's
            // key is taken, and a move without its job would never end. Nothing is written.
            return Ok(Err(MoveRefusal::Moving(format!("{key}, this same second"))));
        }
        let events = [
            ("job-queued".to_owned(), key.clone(), String::new()),
            (
                "volume-move-requested".to_owned(),
                format!("{environment}/{volume}"),
                format!("from {from} to {to}: {role} stops on {from} while its files are saved"),
            ),
        ];
        self.events().events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok(Ok(Moving {
            job: key,
            role: role.to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
            asked_at: now_ms,
        }))
    }

    /// A move's backup ended (`record_backup_in` recorded its row): saved, the restore on the
    /// target is queued; failed, the move ends.
    pub(crate) async fn record_move_saved_in(
        &self,
        tx: &mut WriteTx,
        ended: &super::backups::Ended<'_>,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let Some((env, volume)) = state_schema::task::backup_of_key(ended.key) else {
            return Ok(());
        };
        let row: Option<(Option<String>, i64)> =
            sqlx::query_as(self.sql("SELECT moving_to, generation FROM volumes WHERE environment = ? AND volume = ?"))
                .bind(env)
                .bind(volume)
                .fetch_optional(&mut **tx)
                .await?;
        let Some((Some(to), generation)) = row else {
            return Ok(());
        };
        let Some(saved) = ended.saved else {
            return self
                .end_move_in(
                    tx,
                    env,
                    volume,
                    &format!("saving it on {} failed: {}", ended.node, ended.reason),
                    now_ms,
                )
                .await;
        };
        let (Ok(environment), Ok(volume_name)) = (Name::new(env), Name::new(volume)) else {
            return Ok(());
        };
        let deployed: Option<i64> = sqlx::query_scalar(
            self.sql("SELECT generation FROM deployments WHERE environment = ? AND action = 'rollout'"),
        )
        .bind(env)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(deployed) = deployed else {
            return self
                .end_move_in(tx, env, volume, "its environment no longer runs", now_ms)
                .await;
        };
        let next = u64::try_from(generation).unwrap_or(1) + 1;
        let task = Task::RestoreVolume {
            environment,
            volume: volume_name,
            generation: u64::try_from(deployed).unwrap_or(0),
            to: next,
            snapshot: saved.snapshot.clone(),
            asked_at: now_ms,
            moved: true,
        };
        let job = JobRow::new(&task, &to, 3, now_ms, None);
        let key = job.key.clone();
        self.jobs().enqueue_in(tx, std::slice::from_ref(&job), now_ms).await?;
        let events = [
            ("job-queued".to_owned(), key, String::new()),
            (
                "volume-move-saved".to_owned(),
                format!("{env}/{volume}"),
                format!(
                    "snapshot {} ({} bytes) on {}: restoring it into generation {next} on {to}",
                    saved.snapshot, saved.bytes, ended.node
                ),
            ),
        ];
        self.events().events_in(tx, now_ms, &events).await
    }

    /// A move's restore ended on `node`: restored, the volume is there at generation `to` and
    /// its role is placed there next; failed, the move ends. Whether the restore was a move's.
    pub(crate) async fn record_move_restored_in(
        &self,
        tx: &mut WriteTx,
        (env, volume, to): (&str, &str, i64),
        node: &str,
        failure: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, LedgerError> {
        let row: Option<(Option<String>, String, String, Option<i64>)> = sqlx::query_as(
            self.sql("SELECT moving_to, node, role, move_asked_at FROM volumes WHERE environment = ? AND volume = ?"),
        )
        .bind(env)
        .bind(volume)
        .fetch_optional(&mut **tx)
        .await?;
        let Some((Some(moving_to), from, role, asked)) = row else {
            return Ok(false);
        };
        if moving_to != node {
            return Ok(false);
        }
        if let Some(reason) = failure {
            self.end_move_in(
                tx,
                env,
                volume,
                &format!("restoring it on {node} failed: {reason}"),
                now_ms,
            )
            .await?;
            return Ok(true);
        }
        sqlx::query(self.sql(
            "UPDATE volumes SET node = ?, generation = ?, moved_from = ?, bytes = NULL, measured_at = 0 \
             WHERE environment = ? AND volume = ? AND generation = ?",
        ))
        .bind(node)
        .bind(to)
        .bind(&from)
        .bind(env)
        .bind(volume)
        .bind(to - 1)
        .execute(&mut **tx)
        .await?;
        self.deployments()
            .keep_generation_in(tx, (env, volume, to - 1), &from, now_ms)
            .await?;
        let mut events = vec![(
            "volume-moved".to_owned(),
            format!("{env}/{volume}"),
            format!(
                "restored into generation {to} on {node} (generation {} kept on {from}); {role} starts there next",
                to - 1
            ),
        )];
        // A role with no replica (a job's volume) has nothing to wait for: the move is done.
        let runs: Option<String> =
            sqlx::query_scalar(self.sql("SELECT spec FROM deployments WHERE environment = ? AND action = 'rollout'"))
                .bind(env)
                .fetch_optional(&mut **tx)
                .await?;
        let has_replica = runs
            .and_then(|s| serde_json::from_str::<state_schema::deployment::DeploymentSpec>(&s).ok())
            .is_some_and(|s| s.replicas.iter().any(|(r, n)| r.as_str() == role && *n > 0));
        if !has_replica {
            sqlx::query(
                self.sql("UPDATE volumes SET moving_to = NULL, moved_up_at = ? WHERE environment = ? AND volume = ?"),
            )
            .bind(now_ms)
            .bind(env)
            .bind(volume)
            .execute(&mut **tx)
            .await?;
            events.push(done_event(env, volume, &role, &from, node, asked, now_ms));
        }
        self.events().events_in(tx, now_ms, &events).await?;
        Ok(true)
    }

    /// Replicas that became healthy (`(environment, role, node)` of succeeded ensures): each
    /// that a restored move waited for ends it, with its downtime.
    pub(crate) async fn record_moves_up_in(
        &self,
        tx: &mut WriteTx,
        up: &[(String, String, String)],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        if up.is_empty() {
            return Ok(());
        }
        let waiting: Vec<(String, String, String, String, String, Option<i64>)> = sqlx::query_as(self.sql(
            "SELECT environment, volume, role, node, moved_from, move_asked_at FROM volumes \
             WHERE moving_to IS NOT NULL AND moving_to = node AND moved_from IS NOT NULL",
        ))
        .fetch_all(&mut **tx)
        .await?;
        let mut events = Vec::new();
        for (env, volume, role, node, from, asked) in waiting {
            if !up.iter().any(|(e, r, n)| *e == env && *r == role && *n == node) {
                continue;
            }
            sqlx::query(
                self.sql("UPDATE volumes SET moving_to = NULL, moved_up_at = ? WHERE environment = ? AND volume = ?"),
            )
            .bind(now_ms)
            .bind(&env)
            .bind(&volume)
            .execute(&mut **tx)
            .await?;
            events.push(done_event(&env, &volume, &role, &from, &node, asked, now_ms));
        }
        self.events().events_in(tx, now_ms, &events).await
    }

    /// Ends a move that failed: the volume stays where it was (a move only read it), and its
    /// role is started there again by the drift repair.
    async fn end_move_in(
        &self,
        tx: &mut WriteTx,
        env: &str,
        volume: &str,
        why: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql(
            "UPDATE volumes SET moving_to = NULL, moved_from = NULL, move_failure = ? WHERE environment = ? AND volume = ?",
        ))
        .bind(why)
        .bind(env)
        .bind(volume)
        .execute(&mut **tx)
        .await?;
        self.events()
            .event(
                tx,
                now_ms,
                "volume-move-failed",
                &format!("{env}/{volume}"),
                &format!("{why}; the volume stays where it was and its role starts there again"),
            )
            .await
    }

    /// `(environment, role)` of every role whose volume is moving: stopped on purpose, so the
    /// drift repair leaves it alone.
    pub(crate) async fn moving_roles(&self) -> Result<Vec<(String, String)>, LedgerError> {
        Ok(sqlx::query_as(
            self.sql("SELECT environment, role FROM volumes WHERE moving_to IS NOT NULL ORDER BY environment, role"),
        )
        .fetch_all(&self.pool)
        .await?)
    }
}

/// The event that ends a move: where the volume is, and how long its role was down (at most:
/// from the ask, before which it ran, to the health check that passed on the new node).
fn done_event(
    env: &str,
    volume: &str,
    role: &str,
    from: &str,
    to: &str,
    asked: Option<i64>,
    now_ms: i64,
) -> (String, String, String) {
    let down = asked.map_or(String::new(), |a| {
        format!("; {role} was down at most {:.1} s", (now_ms - a).max(0) as f64 / 1000.0)
    });
    (
        "volume-move-done".to_owned(),
        format!("{env}/{volume}"),
        format!("on {to} (from {from}){down}"),
    )
}
