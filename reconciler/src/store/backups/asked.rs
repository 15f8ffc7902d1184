//! What an operator asks of a volume now (a backup, a restore drill, a restore), as the ledger
//! writes it: the job queued on the volume's node with its events in one transaction, unless
//! one of the same kind still goes for that volume. Whether it is asked at all is decided by
//! the caller (`state_schema::volume_jobs`, through `ops::backups`); this is rows only.

use super::*;

/// A job the caller decided to queue for an operator, with what its events say.
pub struct AskedJob<'a> {
    pub task: &'a Task,
    pub node: &'a str,
    /// One at a time per volume: a queued or leased job whose key starts with this refuses it.
    pub prefix: &'a str,
    pub attempts: u32,
    /// The event besides `job-queued`: (kind, subject, detail).
    pub event: (&'a str, String, String),
}

impl crate::store::Backups<'_> {
    /// Queues `asked` in one transaction, unless a job with its prefix is queued or leased in
    /// `environment`: then nothing is written and that job's key is returned as `Err`.
    pub async fn queue_asked(
        &self,
        environment: &str,
        asked: &AskedJob<'_>,
        now_ms: i64,
    ) -> Result<Result<String, String>, LedgerError> {
        let mut tx = self.write_tx().await?;
        if let Some(key) = self.jobs().going(&mut tx, environment, asked.prefix).await? {
            return Ok(Err(key));
        }
        let row = JobRow::new(asked.task, asked.node, asked.attempts, now_ms, None);
        let key = row.key.clone();
        self.jobs()
            .enqueue_in(&mut tx, std::slice::from_ref(&row), now_ms)
            .await?;
        let (kind, subject, detail) = &asked.event;
        let events = [
            ("job-queued".to_owned(), key.clone(), String::new()),
            ((*kind).to_owned(), subject.clone(), detail.clone()),
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

    /// Where `environment`'s `volume` is: (node, generation, the node it moves to).
    pub async fn placed(
        &self,
        environment: &str,
        volume: &str,
    ) -> Result<Option<(String, i64, Option<String>)>, LedgerError> {
        Ok(sqlx::query_as(
            self.sql("SELECT node, generation, moving_to FROM volumes WHERE environment = ? AND volume = ?"),
        )
        .bind(environment)
        .bind(volume)
        .fetch_optional(&self.pool)
        .await?)
    }
}
