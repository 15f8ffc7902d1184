//! Custom domains as the ledger keeps them: one row per Domain of a current rollout, its state
//! and what the last DNS check saw; a first proof queues, in the same transaction, the
//! re-publishes that route it. SQL only; the checks and the decisions are in
//! `reconcile::domains` and `state_schema::domains`.

use super::certificates::Rollout;
use super::{Backend, JobRow, LedgerError};
use sqlx::FromRow;
use state_schema::domains::DomainState;
use state_schema::rollout::Step;

/// A domain's row.
#[derive(Clone, Debug, FromRow)]
pub struct DomainRow {
    pub hostname: String,
    pub environment: String,
    pub method: String,
    pub state: String,
    pub ever_verified: i64,
    pub seen: Option<String>,
    pub reason: Option<String>,
    pub checked_at: i64,
    pub next_check_at: i64,
    pub verified_at: i64,
}

/// What one check found.
pub struct Checked<'a> {
    pub hostname: &'a str,
    pub state: DomainState,
    pub seen: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub next_check_at: i64,
    /// The event the check raises (a change of state), with its detail.
    pub event: Option<(&'a str, String)>,
}

const COLUMNS: &str =
    "hostname, environment, method, state, ever_verified, seen, reason, checked_at, next_check_at, verified_at";

impl crate::store::Domains<'_> {
    /// The current rollouts whose spec names Domains (`deployment_uses`), so a fleet without
    /// custom domains parses no spec for them.
    pub async fn rollouts_with_domains(&self) -> Result<Vec<Rollout>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT d.environment, d.generation, d.status, d.step, d.spec FROM deployments d JOIN deployment_uses u ON u.environment = d.environment \
             WHERE d.action = 'rollout' AND u.domains = 1 ORDER BY d.environment",
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Every domain row, by hostname.
    pub async fn domains(&self) -> Result<Vec<DomainRow>, LedgerError> {
        let q = format!("SELECT {COLUMNS} FROM domains ORDER BY hostname");
        Ok(sqlx::query_as(self.sql(&q)).fetch_all(&self.pool).await?)
    }

    /// Makes the rows match `wanted` (hostname, environment, method): new Domains start pending
    /// and due now; a Domain gone from every rollout loses its row; a changed method or
    /// environment starts over. Returns whether anything changed.
    /// `reason`: what a new row says until it is looked up (none configured, say).
    pub async fn sync_domains(
        &self,
        wanted: &[(String, String, String)],
        now_ms: i64,
        reason: Option<&str>,
    ) -> Result<bool, LedgerError> {
        let have = self.domains().await?;
        let same = have.len() == wanted.len()
            && have
                .iter()
                .zip(wanted)
                .all(|(h, (n, e, m))| &h.hostname == n && &h.environment == e && &h.method == m);
        if same {
            return Ok(false);
        }
        let mut tx = self.write_tx().await?;
        for h in &have {
            let keep = wanted
                .iter()
                .any(|(n, e, m)| &h.hostname == n && &h.environment == e && &h.method == m);
            if !keep {
                sqlx::query(self.sql("DELETE FROM domains WHERE hostname = ?"))
                    .bind(&h.hostname)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        for (n, e, m) in wanted {
            if have
                .iter()
                .any(|h| &h.hostname == n && &h.environment == e && &h.method == m)
            {
                continue;
            }
            sqlx::query(self.sql(
                "INSERT INTO domains (hostname, environment, method, state, reason, updated_at) VALUES (?, ?, ?, 'pending', ?, ?)",
            ))
            .bind(n)
            .bind(e)
            .bind(m)
            .bind(reason)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            self.events()
                .event(
                    &mut tx,
                    now_ms,
                    "domain-pending",
                    n,
                    &format!("{m} verification for {e}"),
                )
                .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Keeps a check's outcome. A first proof (`ever_verified` was 0) queues in the same
    /// transaction the publishes that route the domain on every node serving its environment,
    /// when its rollout has published (a rollout before its publish step routes it itself).
    /// Returns the jobs queued.
    /// `republish` says which publishes route a first-proven domain
    /// (`state_schema::rollout::republish_domain`): the caller's decision.
    pub async fn domain_checked(
        &self,
        c: &Checked<'_>,
        now_ms: i64,
        republish: fn(&Rollout, &str) -> Step,
    ) -> Result<usize, LedgerError> {
        let mut tx = self.write_tx().await?;
        let first_proof: Option<(String, i64)> =
            sqlx::query_as(self.sql("SELECT environment, ever_verified FROM domains WHERE hostname = ?"))
                .bind(c.hostname)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((environment, ever)) = first_proof else {
            return Ok(0);
        };
        let verified = c.state == DomainState::Verified;
        sqlx::query(self.sql(
            "UPDATE domains SET state = ?, seen = ?, reason = ?, checked_at = ?, next_check_at = ?, \
             verified_at = CASE WHEN ? AND ever_verified = 0 THEN ? ELSE verified_at END, \
             ever_verified = CASE WHEN ? THEN 1 ELSE ever_verified END, updated_at = ? WHERE hostname = ?",
        ))
        .bind(c.state.as_str())
        .bind(c.seen)
        .bind(c.reason)
        .bind(now_ms)
        .bind(c.next_check_at)
        .bind(verified)
        .bind(now_ms)
        .bind(verified)
        .bind(now_ms)
        .bind(c.hostname)
        .execute(&mut *tx)
        .await?;
        let mut queued = 0;
        if verified && ever == 0 {
            let lock = if self.backend() == Backend::Postgres {
                " FOR UPDATE"
            } else {
                ""
            };
            let current: Option<Rollout> = sqlx::query_as(self.sql(&format!(
                "SELECT environment, generation, status, step, spec FROM deployments WHERE action = 'rollout' AND environment = ?{lock}"
            )))
            .bind(&environment)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(rollout) = &current {
                let step = republish(rollout, c.hostname);
                let jobs: Vec<JobRow<'_>> = step
                    .iter()
                    .map(|(task, node)| JobRow::new(task, node.as_str(), 5, now_ms, None))
                    .collect();
                queued = self.jobs().enqueue_in(&mut tx, &jobs, now_ms).await?.len();
            }
        }
        if let Some((kind, detail)) = &c.event {
            self.events().event(&mut tx, now_ms, kind, c.hostname, detail).await?;
        }
        tx.commit().await?;
        Ok(queued)
    }

    /// Whether `hostname` (a Domain) was ever proven: routed only then.
    pub async fn domain_ever_verified(&self, hostname: &str) -> Result<bool, LedgerError> {
        let ever: Option<i64> = sqlx::query_scalar(self.sql("SELECT ever_verified FROM domains WHERE hostname = ?"))
            .bind(hostname)
            .fetch_optional(&self.pool)
            .await?;
        Ok(ever == Some(1))
    }
}

impl crate::store::Domains<'_> {
    /// The nodes on which a publish of `hostname` in `environment` made at or after `since_ms`
    /// succeeded (a publish made after a certificate was issued carries it).
    pub async fn published_on_since(
        &self,
        hostname: &str,
        environment: &str,
        since_ms: i64,
    ) -> Result<Vec<String>, LedgerError> {
        let pattern = format!("ingress:{environment}/{hostname}:g%:publish%");
        Ok(sqlx::query_scalar(self.sql(
            "SELECT DISTINCT target_node FROM jobs WHERE key LIKE ? AND state = 'succeeded' AND created_at >= ? ORDER BY target_node",
        ))
        .bind(pattern)
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?)
    }
}
