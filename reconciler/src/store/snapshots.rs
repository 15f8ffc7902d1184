//! Scheduled snapshots taken (`snapshots`, migration 0033): each attempt recorded with its
//! archive's path and size or its error; the newest read for `/metrics` and the schedule. SQL
//! only.

use super::LedgerError;

impl crate::store::Backups<'_> {
    /// Records one snapshot attempt: `error` empty for a success.
    pub async fn record_snapshot(&self, taken_at: i64, path: &str, bytes: i64, error: &str) -> Result<(), LedgerError> {
        sqlx::query(self.sql("INSERT INTO snapshots (taken_at, path, bytes, error) VALUES (?, ?, ?, ?)"))
            .bind(taken_at)
            .bind(path)
            .bind(bytes)
            .bind(error)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// When the newest successful snapshot was taken, when the newest attempt was, and how
    /// many attempts there were.
    pub async fn snapshot_health(&self) -> Result<(Option<i64>, Option<i64>, i64), LedgerError> {
        Ok(sqlx::query_as(
            self.sql("SELECT MAX(CASE WHEN error = '' THEN taken_at END), MAX(taken_at), COUNT(*) FROM snapshots"),
        )
        .fetch_one(&self.pool)
        .await?)
    }
}
