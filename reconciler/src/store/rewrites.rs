//! Rewritten history of the applied branch. A head that does not descend from the branch's
//! last accepted commit (a force-push to an old commit, or to a signed commit from elsewhere)
//! is refused with `history-rewritten` and recorded here once; the last accepted revision stays
//! in force. An admin may approve exactly one such head (`pl revisions approve-rewrite`), which
//! is then judged like any other commit.

use crate::store::LedgerError;
use sqlx::FromRow;

/// The stable code of the refusal.
pub const HISTORY_REWRITTEN: &str = "history-rewritten";

/// Where a rewritten head stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RewriteStatus {
    /// Refused; waits for an admin.
    Pending,
    /// An admin approved it: judge it.
    Approved,
}

/// What approving did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Approval {
    Approved,
    AlreadyApproved,
    /// The daemon has not refused that head as a rewrite.
    NotPending,
}

#[derive(Clone, Debug, FromRow)]
pub struct RewriteRow {
    pub branch: String,
    pub sha: String,
    pub accepted_sha: String,
    pub seen_at_ms: i64,
    pub approved_by: Option<String>,
    pub approved_at_ms: Option<i64>,
}

impl crate::store::Revisions<'_> {
    /// Whether `sha` was refused as a rewrite of `branch` while `accepted` was in force, and
    /// whether it was approved since. The same head over another commit in force is another
    /// rewrite: an approval is for one.
    pub async fn rewrite_status(
        &self,
        branch: &str,
        sha: &str,
        accepted: &str,
    ) -> Result<Option<RewriteStatus>, LedgerError> {
        let row: Option<Option<i64>> = sqlx::query_scalar(
            self.sql("SELECT approved_at FROM history_rewrites WHERE branch = ? AND sha = ? AND accepted_sha = ?"),
        )
        .bind(branch)
        .bind(sha)
        .bind(accepted)
        .fetch_optional(&self.pool)
        .await?;
        let Some(approved) = row else { return Ok(None) };
        Ok(Some(if approved.is_some() {
            RewriteStatus::Approved
        } else {
            RewriteStatus::Pending
        }))
    }

    /// Records the refusal of a rewritten head, with a `revision-rejected` event, once.
    /// Returns `false` when it was recorded before.
    pub async fn record_rewrite(
        &self,
        branch: &str,
        sha: &str,
        accepted: &str,
        now_ms: i64,
    ) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let row = sqlx::query(self.sql(
            "INSERT INTO history_rewrites (branch, sha, accepted_sha, seen_at) VALUES (?, ?, ?, ?) ON CONFLICT (branch, sha, accepted_sha) DO NOTHING RETURNING id",
        ))
        .bind(branch)
        .bind(sha)
        .bind(accepted)
        .bind(now_ms)
        .fetch_optional(&mut *tx)
        .await?;
        if row.is_none() {
            return Ok(false);
        }
        self.events()
            .event(
                &mut tx,
                now_ms,
                "revision-rejected",
                &format!("{branch}@{sha}"),
                HISTORY_REWRITTEN,
            )
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Approves one refused rewrite, naming the admin token, with a `rewrite-approved` event.
    pub async fn approve_rewrite(
        &self,
        branch: &str,
        sha: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<Approval, LedgerError> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(self.sql(
            "UPDATE history_rewrites SET approved_by = ?, approved_at = ? WHERE branch = ? AND sha = ? AND approved_at IS NULL",
        ))
        .bind(by)
        .bind(now_ms)
        .bind(branch)
        .bind(sha)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done == 0 {
            drop(tx);
            let seen = sqlx::query(self.sql("SELECT 1 FROM history_rewrites WHERE branch = ? AND sha = ?"))
                .bind(branch)
                .bind(sha)
                .fetch_optional(&self.pool)
                .await?;
            return Ok(match seen {
                Some(_) => Approval::AlreadyApproved,
                None => Approval::NotPending,
            });
        }
        self.events()
            .event(&mut tx, now_ms, "rewrite-approved", &format!("{branch}@{sha}"), by)
            .await?;
        tx.commit().await?;
        Ok(Approval::Approved)
    }

    /// Marks the approved rewrite of `branch` to `sha` over `accepted` as applied now, in the
    /// caller's transaction: `sha`, judged before, is the commit in force again.
    pub(crate) async fn rewrite_applied(
        &self,
        tx: &mut crate::store::WriteTx,
        branch: &str,
        sha: &str,
        accepted: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql(
            "UPDATE history_rewrites SET applied_at = ? WHERE branch = ? AND sha = ? AND accepted_sha = ? AND approved_at IS NOT NULL",
        ))
        .bind(now_ms)
        .bind(branch)
        .bind(sha)
        .bind(accepted)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Refused rewrites, newest first.
    pub async fn rewrites(&self, limit: u32) -> Result<Vec<RewriteRow>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT branch, sha, accepted_sha, seen_at AS seen_at_ms, approved_by, approved_at AS approved_at_ms \
             FROM history_rewrites ORDER BY id DESC LIMIT ?",
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }
}
