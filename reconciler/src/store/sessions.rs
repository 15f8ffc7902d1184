//! The web view's sessions and one-time sign-in links, as rows: ids and codes only as their
//! SHA-256 (the caller hashes), each with its expiry. What a session may do is not here: the
//! token it names is judged against the configuration on every request (`http::ui`).

use crate::store::LedgerError;
use sqlx::FromRow;

/// A live session: the token it came from.
#[derive(Clone, Debug, PartialEq, Eq, FromRow)]
pub struct SessionRow {
    pub token_hash: String,
    pub token_name: String,
    pub expires_at: i64,
}

impl crate::store::Sessions<'_> {
    /// Records a new session; also forgets sessions and links that ended a day ago.
    pub async fn open_session(
        &self,
        id_hash: &str,
        token_hash: &str,
        token_name: &str,
        now_ms: i64,
        expires_ms: i64,
    ) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        let day_ago = now_ms - 86_400_000;
        sqlx::query(self.sql("DELETE FROM ui_sessions WHERE expires_at < ?"))
            .bind(day_ago)
            .execute(&mut *tx)
            .await?;
        sqlx::query(self.sql("DELETE FROM ui_links WHERE expires_at < ?"))
            .bind(day_ago)
            .execute(&mut *tx)
            .await?;
        sqlx::query(self.sql(
            "INSERT INTO ui_sessions (id_hash, token_hash, token_name, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
        ))
        .bind(id_hash)
        .bind(token_hash)
        .bind(token_name)
        .bind(now_ms)
        .bind(expires_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The session with this id hash, unless it expired or was revoked.
    pub async fn session(&self, id_hash: &str, now_ms: i64) -> Result<Option<SessionRow>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT token_hash, token_name, expires_at FROM ui_sessions WHERE id_hash = ? AND expires_at > ? AND revoked_at IS NULL",
        ))
        .bind(id_hash)
        .bind(now_ms)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Ends a session (signing out). Returns whether it was live.
    pub async fn revoke_session(&self, id_hash: &str, now_ms: i64) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let done =
            sqlx::query(self.sql("UPDATE ui_sessions SET revoked_at = ? WHERE id_hash = ? AND revoked_at IS NULL"))
                .bind(now_ms)
                .bind(id_hash)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        tx.commit().await?;
        Ok(done > 0)
    }

    /// Ends every session of a token (`pl ui --sign-out-all`). Returns how many were live.
    pub async fn revoke_sessions_of(&self, token_hash: &str, now_ms: i64) -> Result<u64, LedgerError> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(self.sql(
            "UPDATE ui_sessions SET revoked_at = ? WHERE token_hash = ? AND revoked_at IS NULL AND expires_at > ?",
        ))
        .bind(now_ms)
        .bind(token_hash)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(done)
    }

    /// Records a one-time sign-in link's code hash for a token.
    pub async fn add_link(
        &self,
        code_hash: &str,
        token_hash: &str,
        token_name: &str,
        expires_ms: i64,
    ) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        sqlx::query(
            self.sql("INSERT INTO ui_links (code_hash, token_hash, token_name, expires_at) VALUES (?, ?, ?, ?)"),
        )
        .bind(code_hash)
        .bind(token_hash)
        .bind(token_name)
        .bind(expires_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Uses a link once: the token it signs in as, or `None` when it is unknown, used or
    /// expired. One conditional write, so two redeemers of one link cannot both succeed.
    pub async fn use_link(&self, code_hash: &str, now_ms: i64) -> Result<Option<(String, String)>, LedgerError> {
        let mut tx = self.write_tx().await?;
        let row: Option<(String, String)> = sqlx::query_as(self.sql(
            "UPDATE ui_links SET used_at = ? WHERE code_hash = ? AND used_at IS NULL AND expires_at > ? RETURNING token_hash, token_name",
        ))
        .bind(now_ms)
        .bind(code_hash)
        .bind(now_ms)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row)
    }
}
