//! Certificates the control plane issues for the hostnames it serves: the rows, the rollouts
//! whose hostnames need them, and the re-publish jobs an issuance queues in the same
//! transaction. SQL only; what is due and what to queue is decided in
//! `reconcile::certificates` and `state_schema::rollout`.

use super::rows::JobState;
use super::{Backend, JobRow, LedgerError};
use sqlx::FromRow;
use state_schema::rollout::Step;

/// A hostname's certificate as the ledger keeps it (`chain` and `key_sealed` are `None` while
/// it has never been issued).
#[derive(Clone, Debug, FromRow)]
pub struct CertificateRow {
    pub hostname: String,
    pub issuer: String,
    pub chain: Option<String>,
    /// Age-encrypted to the control host's own recipient.
    pub key_sealed: Option<String>,
    pub not_before: i64,
    pub not_after: i64,
    pub renew_after: i64,
    pub issued: i64,
    pub failures: i64,
    pub retry_at: i64,
    pub last_error: Option<String>,
    /// When it was last issued (Unix ms; 0 before the first issuance).
    pub issued_at: i64,
}

/// A rollout whose hostnames may need certificates: its environment, generation and spec.
#[derive(Debug, FromRow)]
pub struct Rollout {
    pub environment: String,
    pub generation: i64,
    pub status: String,
    pub step: i64,
    pub spec: String,
}

/// A certificate just issued, to keep.
pub struct Issued<'a> {
    pub hostname: &'a str,
    pub issuer: &'a str,
    pub chain: &'a str,
    pub key_sealed: &'a str,
    pub not_before: i64,
    pub not_after: i64,
    pub renew_after: i64,
}

/// A job's state and its latest result's detail, by key.
#[derive(Debug)]
pub struct JobOutcome {
    pub key: String,
    pub target_node: String,
    pub state: JobState,
    pub detail: Option<String>,
}

const COLUMNS: &str = "hostname, issuer, chain, key_sealed, not_before, not_after, renew_after, issued, failures, retry_at, last_error, issued_at";

impl crate::store::Certificates<'_> {
    /// Every environment's current rollout (in progress or done).
    pub async fn rollouts(&self) -> Result<Vec<Rollout>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT environment, generation, status, step, spec FROM deployments WHERE action = 'rollout' ORDER BY environment",
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    /// One environment's current rollout, if it has one.
    pub async fn rollout_of(&self, environment: &str) -> Result<Option<Rollout>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT environment, generation, status, step, spec FROM deployments WHERE action = 'rollout' AND environment = ?",
        ))
        .bind(environment)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Every certificate row, by hostname.
    pub async fn certificates(&self) -> Result<Vec<CertificateRow>, LedgerError> {
        let q = format!("SELECT {COLUMNS} FROM certificates ORDER BY hostname");
        Ok(sqlx::query_as(self.sql(&q)).fetch_all(&self.pool).await?)
    }

    /// The certificate of `hostname`, when one was issued.
    pub async fn certificate(&self, hostname: &str) -> Result<Option<CertificateRow>, LedgerError> {
        let q = format!("SELECT {COLUMNS} FROM certificates WHERE hostname = ? AND chain IS NOT NULL");
        Ok(sqlx::query_as(self.sql(&q))
            .bind(hostname)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Keeps a certificate issued for a hostname of `environment`, with a
    /// `certificate-issued` event, and when the environment's rollout has published (done, or
    /// at its publish step or past it: its replicas are up) queues in the same transaction the
    /// publishes that hand it to the nodes serving it (a rollout before that step reads the
    /// certificate when its own publishes are leased). The rollout is read inside the
    /// transaction (locked on PostgreSQL): an order takes seconds, and the rollout may have
    /// moved on since it started. Returns the jobs queued.
    /// `republish` says which publishes hand the certificate to the nodes
    /// (`state_schema::rollout::republish_certificate`): the caller's decision.
    pub async fn store_certificate(
        &self,
        c: &Issued<'_>,
        environment: &str,
        now_ms: i64,
        republish: fn(&Rollout, &str, u32) -> Step,
    ) -> Result<usize, LedgerError> {
        let mut tx = self.write_tx().await?;
        let lock = if self.backend() == Backend::Postgres {
            " FOR UPDATE"
        } else {
            ""
        };
        let current: Option<Rollout> = sqlx::query_as(self.sql(&format!(
            "SELECT environment, generation, status, step, spec FROM deployments WHERE action = 'rollout' AND environment = ?{lock}"
        )))
        .bind(environment)
        .fetch_optional(&mut *tx)
        .await?;
        let issued: i64 = sqlx::query_scalar(self.sql(
            "INSERT INTO certificates (hostname, issuer, chain, key_sealed, not_before, not_after, renew_after, issued, failures, retry_at, last_error, updated_at, issued_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, 1, 0, 0, NULL, ?, ?) \
             ON CONFLICT (hostname) DO UPDATE SET issuer = excluded.issuer, chain = excluded.chain, key_sealed = excluded.key_sealed, \
             not_before = excluded.not_before, not_after = excluded.not_after, renew_after = excluded.renew_after, \
             issued = certificates.issued + 1, failures = 0, retry_at = 0, last_error = NULL, updated_at = excluded.updated_at, \
             issued_at = excluded.issued_at \
             RETURNING issued",
        ))
        .bind(c.hostname)
        .bind(c.issuer)
        .bind(c.chain)
        .bind(c.key_sealed)
        .bind(c.not_before)
        .bind(c.not_after)
        .bind(c.renew_after)
        .bind(now_ms)
        .bind(now_ms)
        .fetch_one(&mut *tx)
        .await?;
        let step = match &current {
            Some(rollout) => republish(rollout, c.hostname, u32::try_from(issued).unwrap_or(u32::MAX)),
            None => Vec::new(),
        };
        let jobs: Vec<JobRow<'_>> = step
            .iter()
            .map(|(task, node)| JobRow::new(task, node.as_str(), 5, now_ms, None))
            .collect();
        let added = self.jobs().enqueue_in(&mut tx, &jobs, now_ms).await?;
        self.events()
            .event(
                &mut tx,
                now_ms,
                "certificate-issued",
                c.hostname,
                &format!(
                    "issuer {}, valid until {}, renewed after {}",
                    c.issuer,
                    super::utc(c.not_after),
                    super::utc(c.renew_after)
                ),
            )
            .await?;
        tx.commit().await?;
        Ok(added.len())
    }

    /// Records a failed issuance of `hostname`: its count, when to try again, and why, with a
    /// `certificate-failed` event. A certificate issued before stays (and is served until it
    /// expires).
    pub async fn certificate_failed(
        &self,
        hostname: &str,
        issuer: &str,
        error: &str,
        retry_at: i64,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        sqlx::query(self.sql(
            "INSERT INTO certificates (hostname, issuer, failures, retry_at, last_error, updated_at) VALUES (?, ?, 1, ?, ?, ?) \
             ON CONFLICT (hostname) DO UPDATE SET failures = certificates.failures + 1, retry_at = excluded.retry_at, \
             last_error = excluded.last_error, updated_at = excluded.updated_at",
        ))
        .bind(hostname)
        .bind(issuer)
        .bind(retry_at)
        .bind(error)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
        self.events()
            .event(&mut tx, now_ms, "certificate-failed", hostname, error)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Queues `tasks` (each on its node, three attempts) now; returns their keys, queued now
    /// or before (a task is its key).
    pub async fn enqueue_tasks(
        &self,
        tasks: &[(state_schema::task::Task, String)],
        now_ms: i64,
    ) -> Result<Vec<String>, LedgerError> {
        let rows: Vec<JobRow<'_>> = tasks
            .iter()
            .map(|(task, node)| JobRow::new(task, node.as_str(), 3, now_ms, None))
            .collect();
        let keys = rows.iter().map(|r| r.key.clone()).collect();
        let mut tx = self.write_tx().await?;
        self.jobs().enqueue_in(&mut tx, &rows, now_ms).await?;
        tx.commit().await?;
        Ok(keys)
    }

    /// Where the jobs of `keys` stand (at most 64 keys).
    pub async fn job_outcomes(&self, keys: &[String]) -> Result<Vec<JobOutcome>, LedgerError> {
        let keys = &keys[..keys.len().min(64)];
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let q = format!(
            "SELECT j.key, j.target_node, j.state, (SELECT r.detail FROM job_results r WHERE r.job_id = j.id ORDER BY r.id DESC LIMIT 1) AS detail \
             FROM jobs j WHERE j.key IN ({})",
            vec!["?"; keys.len()].join(", ")
        );
        let mut query = sqlx::query_as::<_, (String, String, String, Option<String>)>(self.sql(&q));
        for k in keys {
            query = query.bind(k);
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.into_iter()
            .map(|(key, target_node, state, detail)| {
                Ok(JobOutcome {
                    state: JobState::parse(&state)
                        .ok_or_else(|| LedgerError::Corrupt(format!("job {key}: state {state:?}")))?,
                    key,
                    target_node,
                    detail,
                })
            })
            .collect()
    }
}
