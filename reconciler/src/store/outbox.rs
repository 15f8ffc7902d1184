//! The outbox: notifications written from the events table (in one transaction with the
//! cursor, so each event is turned into notifications once, whatever restarts) and delivered
//! oldest first per target (`notify.rs`). A row is `pending` until delivered; one a receiver
//! refused for good, that ran out of attempts, or that a full queue could not take is `dead`,
//! with its last error: the dead-letter record (`GET /v1/outbox?state=dead`). SQL only.

use super::LedgerError;
use sqlx::FromRow;

/// Pending rows a target may hold; past it new ones are written dead (`queue-full`), so a
/// receiver that never comes back cannot grow the ledger without bound.
pub const MAX_PENDING: i64 = 10_000;
/// Attempts before a row is dead.
pub const MAX_ATTEMPTS: i64 = 12;
/// The most rows a listing returns.
pub const MAX_LISTED: i64 = 1000;

/// A notification to write.
pub struct NewRow {
    pub target: String,
    pub event_id: i64,
    pub kind: String,
    pub payload: String,
}

/// A row, as delivery and listings read it.
#[derive(Clone, Debug, FromRow)]
pub struct OutboxRow {
    pub id: i64,
    pub target: String,
    pub event_id: i64,
    pub kind: String,
    pub payload: String,
    pub state: String,
    pub attempts: i64,
    pub next_at: i64,
    pub last_error: String,
    pub created_at: i64,
    pub updated_at: i64,
}

const COLUMNS: &str =
    "id, target, event_id, kind, payload, state, attempts, next_at, last_error, created_at, updated_at";

impl crate::store::Events<'_> {
    /// The last event turned into notifications; `None` before the first round.
    pub(crate) async fn outbox_cursor(&self) -> Result<Option<i64>, LedgerError> {
        Ok(
            sqlx::query_scalar(self.sql("SELECT event_id FROM outbox_cursor WHERE name = 'events'"))
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Writes `rows` and moves the cursor to `cursor`, in one transaction. A target already
    /// holding [`MAX_PENDING`] pending rows takes the new ones dead.
    pub(crate) async fn outbox_write(&self, rows: &[NewRow], cursor: i64, now_ms: i64) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        let mut pending: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
        for r in rows {
            if !pending.contains_key(r.target.as_str()) {
                let n: i64 =
                    sqlx::query_scalar(self.sql("SELECT COUNT(*) FROM outbox WHERE state = 'pending' AND target = ?"))
                        .bind(&r.target)
                        .fetch_one(&mut *tx)
                        .await?;
                pending.insert(r.target.as_str(), n);
            }
            let n = pending.entry(r.target.as_str()).or_default();
            let (state, error) = if *n >= MAX_PENDING {
                (
                    "dead",
                    "queue-full: the target's queue held its limit of pending notifications",
                )
            } else {
                *n += 1;
                ("pending", "")
            };
            sqlx::query(self.sql(
                "INSERT INTO outbox (target, event_id, kind, payload, state, attempts, next_at, last_error, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?)",
            ))
            .bind(&r.target)
            .bind(r.event_id)
            .bind(&r.kind)
            .bind(&r.payload)
            .bind(state)
            .bind(now_ms)
            .bind(error)
            .bind(now_ms)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(self.sql(
            "INSERT INTO outbox_cursor (name, event_id) VALUES ('events', ?) \
             ON CONFLICT (name) DO UPDATE SET event_id = excluded.event_id",
        ))
        .bind(cursor)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Each target's oldest pending row, when it is due: a target's rows go in order, so one
    /// that waits for a retry holds the ones behind it.
    pub(crate) async fn outbox_heads(&self, now_ms: i64) -> Result<Vec<OutboxRow>, LedgerError> {
        let q = format!(
            "SELECT {COLUMNS} FROM outbox o WHERE o.state = 'pending' AND o.next_at <= ? AND o.id = \
             (SELECT MIN(p.id) FROM outbox p WHERE p.state = 'pending' AND p.target = o.target)"
        );
        Ok(sqlx::query_as(self.sql(&q)).bind(now_ms).fetch_all(&self.pool).await?)
    }

    /// Row `id` was delivered.
    pub(crate) async fn outbox_delivered(&self, id: i64, now_ms: i64) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        sqlx::query(self.sql(
            "UPDATE outbox SET state = 'delivered', attempts = attempts + 1, last_error = '', updated_at = ? WHERE id = ?",
        ))
        .bind(now_ms)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Row `id` failed with `error`: tried again at `retry_at`, or dead when `None`.
    pub(crate) async fn outbox_failed(
        &self,
        id: i64,
        error: &str,
        retry_at: Option<i64>,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let error: String = error.chars().take(500).collect();
        let mut tx = self.write_tx().await?;
        let q = match retry_at {
            Some(_) => {
                "UPDATE outbox SET attempts = attempts + 1, next_at = ?, last_error = ?, updated_at = ? WHERE id = ?"
            }
            None => {
                "UPDATE outbox SET state = 'dead', attempts = attempts + 1, next_at = ?, last_error = ?, updated_at = ? WHERE id = ?"
            }
        };
        sqlx::query(self.sql(q))
            .bind(retry_at.unwrap_or(now_ms))
            .bind(error)
            .bind(now_ms)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Rows in `state` (all when `None`), newest first, at most `limit`.
    /// When the oldest delivery still pending was made (none: nothing pending), and how many
    /// deliveries are dead letters.
    pub async fn outbox_health(&self) -> Result<(Option<i64>, i64), LedgerError> {
        let oldest: Option<i64> =
            sqlx::query_scalar(self.sql("SELECT created_at FROM outbox WHERE state = 'pending' ORDER BY id LIMIT 1"))
                .fetch_optional(&self.pool)
                .await?;
        let dead: i64 = sqlx::query_scalar(self.sql("SELECT COUNT(*) FROM outbox WHERE state = 'dead'"))
            .fetch_one(&self.pool)
            .await?;
        Ok((oldest, dead))
    }

    pub async fn outbox(&self, state: Option<&str>, limit: i64) -> Result<Vec<OutboxRow>, LedgerError> {
        let limit = limit.clamp(1, MAX_LISTED);
        let rows = match state {
            Some(s) => {
                let q = format!("SELECT {COLUMNS} FROM outbox WHERE state = ? ORDER BY id DESC LIMIT ?");
                sqlx::query_as(self.sql(&q))
                    .bind(s)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                let q = format!("SELECT {COLUMNS} FROM outbox ORDER BY id DESC LIMIT ?");
                sqlx::query_as(self.sql(&q)).bind(limit).fetch_all(&self.pool).await?
            }
        };
        Ok(rows)
    }
}

impl crate::store::Events<'_> {
    /// The commit generation `generation` of `environment` was made from.
    pub(crate) async fn generation_sha(
        &self,
        environment: &str,
        generation: i64,
    ) -> Result<Option<String>, LedgerError> {
        Ok(sqlx::query_scalar(self.sql(
            "SELECT r.sha FROM deployment_generations g JOIN revisions r ON r.id = g.revision_id \
             WHERE g.environment = ? AND g.generation = ?",
        ))
        .bind(environment)
        .bind(generation)
        .fetch_optional(&self.pool)
        .await?)
    }
}
