//! Leases: each hands a node its due jobs under a lease token, each job with its next fencing
//! token (per job, so PostgreSQL's concurrent leases meet only on the jobs they both want);
//! renewals; and completions with the next lease in one transaction, the agent API's group
//! commit.

use super::jobs::{Completion, Lease, LeaseToken, Refused};
use super::{Backend, LedgerError, WriteTx};
use sqlx::FromRow;

/// A job just leased: `RETURNING id, key, task, attempts, fencing_token`.
#[derive(FromRow)]
struct LeasedRecord {
    id: i64,
    key: String,
    task: String,
    attempts: i64,
    fencing_token: i64,
}

/// The same from a group lease, with its request's lease token (which names the request).
#[derive(FromRow)]
struct GroupLeasedRecord {
    #[sqlx(flatten)]
    job: LeasedRecord,
    #[sqlx(rename = "lease_token")]
    token: String,
}

/// A lease from a leased row, under `lease_token`.
fn leased(r: LeasedRecord, lease_token: String, expires_at_ms: i64) -> Result<Lease, LedgerError> {
    Ok(Lease {
        job_id: r.id,
        key: r.key,
        task: serde_json::from_str(&r.task)?,
        attempt: r.attempts,
        token: LeaseToken {
            job_id: r.id,
            lease_token,
            fencing_token: r.fencing_token,
        },
        expires_at_ms,
    })
}

/// 128 bits from the operating system's random source, as hex. A lease token is a
/// capability (with the fencing token it completes a job), so it must not be guessable.
fn new_lease_token() -> Result<String, LedgerError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| LedgerError::Random(e.to_string()))?;
    Ok(hex::encode(bytes))
}

impl crate::store::Jobs<'_> {
    /// Whether a lease for `requests` could hand anything out: a due job of one of their
    /// nodes, or a lease that has run out (its job may be theirs once expired).
    pub(crate) async fn anything_to_lease(
        &self,
        requests: &[(&str, u32, bool)],
        now_ms: i64,
    ) -> Result<bool, LedgerError> {
        let marks = vec!["?"; requests.len()].join(", ");
        let q = format!(
            "SELECT 1 WHERE EXISTS (SELECT 1 FROM jobs WHERE state = 'leased' AND lease_expires_at < ?) \
             OR EXISTS (SELECT 1 FROM jobs WHERE target_node IN ({marks}) AND state = 'queued' AND held = 0 AND not_before <= ?)"
        );
        let mut query = sqlx::query(self.sql(&q)).bind(now_ms);
        for (node, _, _) in requests {
            query = query.bind(*node);
        }
        Ok(query.bind(now_ms).fetch_optional(&self.pool).await?.is_some())
    }

    /// Every node a lease would hand something now: one with a due job, or whose lease ran
    /// out (its job is leased again). One statement for the whole fleet: what wakes the
    /// waiting leases of those nodes only (`ops::lease_wakes`).
    pub async fn nodes_with_work(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        Ok(sqlx::query_scalar(self.sql(NODES_WITH_WORK))
            .bind(now_ms)
            .bind(now_ms)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Leases up to `max` jobs of `node` that are due. All of them share one lease token; each
    /// job's fencing token is newer than any handed out for it before.
    pub async fn lease(&self, node: &str, max: u32, ttl_ms: i64, now_ms: i64) -> Result<Vec<Lease>, LedgerError> {
        Ok(self
            .lease_many(&[(node, max, false)], ttl_ms, now_ms)
            .await?
            .pop()
            .unwrap_or_default())
    }

    /// Leases for several callers in one transaction (one durable commit for all of them: the
    /// group commit that lets many agents' small leases share the disk's fsyncs). Each
    /// `(node, max)` gets its own lease token; each job's fencing token is newer than any
    /// handed out for it before. The answer is in the order of `requests`. A request with
    /// `removals_only` (a draining node) gets only jobs that take something away (stop,
    /// teardown, remove) or save what it holds (a volume's backup): never new work.
    pub async fn lease_many(
        &self,
        requests: &[(&str, u32, bool)],
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<Vec<Lease>>, LedgerError> {
        // Idle agents poll: when none of the callers has a due job and no lease has run out,
        // answer from one read instead of a write transaction (and its fsync).
        if !self.anything_to_lease(requests, now_ms).await? {
            return Ok(vec![Vec::new(); requests.len()]);
        }
        let mut tx = self.write_tx().await?;
        let out = self.lease_many_in(&mut tx, requests, ttl_ms, now_ms).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Completions, then leases, in one transaction: the agent API's group commit, so that a
    /// group of both kinds costs one durable commit, and a lease that comes with completions
    /// sees them. The answers in the order of `completions` and of `requests`, and what the
    /// completions moved on.
    pub async fn complete_and_lease(
        &self,
        completions: &[Completion],
        callers: &[String],
        requests: &[(&str, u32, bool)],
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<(Vec<Result<(), Refused>>, Vec<Vec<Lease>>, super::complete::Ends), LedgerError> {
        let mut ends = super::complete::Ends::default();
        if completions.is_empty() {
            return Ok((Vec::new(), self.lease_many(requests, ttl_ms, now_ms).await?, ends));
        }
        let mut tx = self.write_tx().await?;
        let done = self
            .complete_as_in(&mut tx, completions, callers, now_ms, &mut ends)
            .await?;
        let leased = if requests.is_empty() {
            Vec::new()
        } else {
            self.lease_many_in(&mut tx, requests, ttl_ms, now_ms).await?
        };
        tx.commit().await?;
        Ok((done, leased, ends))
    }

    /// [`Ledger::lease_many`] in the caller's transaction.
    pub(crate) async fn lease_many_in(
        &self,
        tx: &mut WriteTx,
        requests: &[(&str, u32, bool)],
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<Vec<Lease>>, LedgerError> {
        self.expire_in(tx, now_ms).await?;
        let expires = now_ms + ttl_ms;
        let mut out = Vec::with_capacity(requests.len());
        let mut events = Vec::new();
        // A group's leases in one statement (one round trip instead of one per node: on SQLite
        // each was a trip to the connection's thread while the group held the one writer, most
        // of its hold at 3,000 nodes). Not when a node asks twice in one group: its two picks
        // could meet.
        let distinct = requests
            .iter()
            .map(|(n, _, _)| *n)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == requests.len();
        // SQLite's statement reads at most `MAX_LEASE_BATCH` of a node's jobs (what the agent
        // API clamps to); a larger ask (the store's own callers) goes alone.
        let bounded = self.backend == Backend::Postgres
            || requests.iter().all(|(_, max, _)| *max <= agent_proto::MAX_LEASE_BATCH);
        if requests.len() > 1 && distinct && bounded {
            let out = self.lease_group(tx, requests, expires, now_ms).await?;
            for ((node, _, _), leases) in requests.iter().zip(&out) {
                if !leases.is_empty() {
                    events.push((
                        "jobs-leased".to_owned(),
                        (*node).to_owned(),
                        format!("{} jobs", leases.len()),
                    ));
                }
            }
            self.events().events_in(tx, now_ms, &events).await?;
            return Ok(out);
        }
        for (node, max, removals_only) in requests {
            let token = new_lease_token()?;
            let statement = lease_statement(self.backend, *removals_only, *max);
            let rows: Vec<LeasedRecord> = sqlx::query_as(self.sql(&statement))
                .bind(&token)
                .bind(expires)
                .bind(now_ms)
                .bind(*node)
                .bind(now_ms)
                .fetch_all(&mut **tx)
                .await?;
            let mut leases = Vec::with_capacity(rows.len());
            for r in rows {
                leases.push(leased(r, token.clone(), expires)?);
            }
            if !leases.is_empty() {
                let detail = format!("{} jobs", leases.len());
                events.push(("jobs-leased".to_owned(), (*node).to_owned(), detail));
            }
            leases.sort_by_key(|l| l.job_id);
            out.push(leases);
        }
        self.events().events_in(tx, now_ms, &events).await?;
        Ok(out)
    }

    /// Every request of a group leased by one `UPDATE … FROM`: each node's oldest due jobs, up
    /// to its `max`, each request with a lease token of its own. The answers in the order of
    /// `requests`. The requests travel as one JSON parameter, so the statement is the same text
    /// for every group size (parsed and planned once per connection, where a `VALUES` list of
    /// each size was a new statement).
    async fn lease_group(
        &self,
        tx: &mut WriteTx,
        requests: &[(&str, u32, bool)],
        expires: i64,
        now_ms: i64,
    ) -> Result<Vec<Vec<Lease>>, LedgerError> {
        let mut picks = Vec::with_capacity(requests.len());
        let mut by_token = std::collections::HashMap::with_capacity(requests.len());
        for (i, (node, max, removals_only)) in requests.iter().enumerate() {
            let token = new_lease_token()?;
            by_token.insert(token.clone(), i);
            picks.push(serde_json::json!({
                "idx": i,
                "node": node,
                "lim": max,
                "removals": removals_only,
                "token": token,
            }));
        }
        let q = match self.backend {
            Backend::Postgres => GROUP_LEASE_PG.as_str(),
            Backend::Sqlite => GROUP_LEASE_SQLITE.as_str(),
        };
        let query = sqlx::query_as::<_, GroupLeasedRecord>(self.sql(q))
            .bind(expires)
            .bind(now_ms)
            .bind(serde_json::Value::Array(picks).to_string());
        let mut out: Vec<Vec<Lease>> = vec![Vec::new(); requests.len()];
        for r in query.bind(now_ms).fetch_all(&mut **tx).await? {
            // SQLite's RETURNING names only the updated table: the request is the token's.
            let Some(slot) = by_token.get(&r.token).and_then(|i| out.get_mut(*i)) else {
                continue;
            };
            slot.push(leased(r.job, r.token, expires)?);
        }
        for leases in &mut out {
            leases.sort_by_key(|l| l.job_id);
        }
        Ok(out)
    }

    /// Extends leases. A stale token (expired, superseded or completed) is refused.
    pub async fn renew(
        &self,
        tokens: &[LeaseToken],
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<Result<i64, Refused>>, LedgerError> {
        let mut tx = self.write_tx().await?;
        let q = self.sql("UPDATE jobs SET lease_expires_at = ?, updated_at = ? WHERE id = ? AND state = 'leased' AND lease_token = ? AND fencing_token = ? AND lease_expires_at >= ?");
        let mut out = Vec::with_capacity(tokens.len());
        for t in tokens {
            let r = sqlx::query(q.clone())
                .bind(now_ms + ttl_ms)
                .bind(now_ms)
                .bind(t.job_id)
                .bind(&t.lease_token)
                .bind(t.fencing_token)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            out.push(if r.rows_affected() == 1 {
                Ok(now_ms + ttl_ms)
            } else {
                Err(Refused::StaleFencingToken)
            });
        }
        tx.commit().await?;
        Ok(out)
    }
}

/// What only a draining node may lease: the jobs that take its work away.
// A backup (`:save`) is not new work: a draining node keeps a pinned volume's role until it is
// moved, and its backups (what a move is made of) go on.
macro_rules! removal_keys {
    () => {
        "key LIKE '%:stop@%' OR key LIKE '%:teardown@%' OR key LIKE '%:remove@%' OR key LIKE '%:save@%'"
    };
}
const REMOVALS: &str = concat!(" AND (", removal_keys!(), ")");

/// PostgreSQL's group lease: a `LATERAL` pick per request, `FOR UPDATE SKIP LOCKED` so that
/// the other committer's group takes other jobs.
static GROUP_LEASE_PG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE jobs SET state = 'leased', lease_token = picked.token, fencing_token = COALESCE(jobs.fencing_token, 0) + 1, \
         lease_expires_at = ?, attempts = jobs.attempts + 1, updated_at = ? \
         FROM (SELECT j.id, r.token FROM json_to_recordset(?::json) AS r(idx int8, node text, lim int8, removals bool, token text) \
               CROSS JOIN LATERAL (SELECT id FROM jobs WHERE target_node = r.node AND state = 'queued' AND held = 0 AND not_before <= ? \
                 AND (NOT r.removals OR {}) \
                 ORDER BY id LIMIT r.lim FOR UPDATE SKIP LOCKED) j) AS picked \
         WHERE jobs.id = picked.id \
         RETURNING jobs.id, jobs.key, jobs.task, jobs.attempts, jobs.fencing_token, jobs.lease_token",
        removal_keys!()
    )
});

/// SQLite's group lease: a `LIMIT` may not name the request's `max`, so each node's oldest due
/// jobs are read up to the most any request may ask (`MAX_LEASE_BATCH`, through `jobs_queued`),
/// numbered per request, and cut at its `max`. SQLite's write transactions queue, so nothing
/// is locked.
static GROUP_LEASE_SQLITE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE jobs SET state = 'leased', lease_token = picked.token, fencing_token = COALESCE(jobs.fencing_token, 0) + 1, \
         lease_expires_at = ?, attempts = jobs.attempts + 1, updated_at = ? \
         FROM (SELECT id, token FROM (SELECT j.id, r.token, r.lim, ROW_NUMBER() OVER (PARTITION BY r.idx ORDER BY j.id) AS rn \
                 FROM (SELECT json_extract(value, '$.idx') AS idx, json_extract(value, '$.node') AS node, \
                              json_extract(value, '$.lim') AS lim, json_extract(value, '$.removals') AS removals, \
                              json_extract(value, '$.token') AS token FROM json_each(?)) AS r \
                 JOIN jobs j ON j.id IN (SELECT id FROM jobs WHERE target_node = r.node AND state = 'queued' AND held = 0 \
                   AND not_before <= ? AND (r.removals = 0 OR {}) ORDER BY id LIMIT {}) \
               ) WHERE rn <= lim) AS picked \
         WHERE jobs.id = picked.id \
         RETURNING id, key, task, attempts, fencing_token, lease_token",
        removal_keys!(),
        agent_proto::MAX_LEASE_BATCH
    )
});

/// One node's lease: its oldest due jobs, up to `max` (only removals for a draining node).
///
/// Fencing tokens are per job, not from one shared counter: concurrent lease transactions
/// (PostgreSQL) then meet only on the jobs they both want, and `SKIP LOCKED` gives those to
/// one of them. (SQLite's write transactions queue anyway.)
///
/// The limit is written into the statement, not bound: SQLite plans `LIMIT ?` with the bound
/// value and so prepares the statement afresh every time it is bound again (the hottest
/// statement of the agent API, parsed and planned per node per group). The agent API clamps
/// `max` to `MAX_LEASE_BATCH`, so there are a few such statements.
/// [`crate::store::Jobs::nodes_with_work`]'s statement.
const NODES_WITH_WORK: &str = "SELECT target_node FROM jobs WHERE state = 'queued' AND held = 0 AND not_before <= ? \
     UNION SELECT target_node FROM jobs WHERE state = 'leased' AND lease_expires_at < ?";

pub(crate) fn lease_statement(backend: Backend, removals_only: bool, max: u32) -> String {
    let lock = if backend == Backend::Postgres {
        " FOR UPDATE SKIP LOCKED"
    } else {
        ""
    };
    let only = if removals_only { REMOVALS } else { "" };
    format!(
        "UPDATE jobs SET state = 'leased', lease_token = ?, fencing_token = COALESCE(fencing_token, 0) + 1, lease_expires_at = ?, attempts = attempts + 1, updated_at = ? \
         WHERE id IN (SELECT id FROM jobs WHERE target_node = ? AND state = 'queued' AND held = 0 AND not_before <= ?{only} ORDER BY id LIMIT {max}{lock}) \
         RETURNING id, key, task, attempts, fencing_token"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Ledger;

    /// What SQLite's planner does with `sql`: one line per step.
    async fn plan(ledger: &Ledger, sql: &str) -> Vec<String> {
        use sqlx::Row;
        sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
            .fetch_all(&ledger.pool)
            .await
            .expect("plan")
            .iter()
            .map(|r| r.try_get::<String, _>(3).expect("detail"))
            .collect()
    }

    /// The statements every agent request or every settle runs read the open jobs through
    /// their indexes: none reads the whole jobs table (which holds every job ever run) or
    /// sorts a node's queue.
    #[tokio::test]
    async fn hot_statements_read_open_jobs_through_their_indexes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ledger, _) = Ledger::sqlite_in(dir.path()).await;
        let whole_table = |steps: &[String]| {
            steps
                .iter()
                .any(|s| s.starts_with("SCAN jobs") || s.starts_with("SCAN j") || s.contains("TEMP B-TREE"))
        };
        for removals_only in [false, true] {
            let steps = plan(&ledger, &lease_statement(Backend::Sqlite, removals_only, 8)).await;
            assert!(steps.iter().any(|s| s.contains("jobs_queued")), "{steps:?}");
            assert!(!whole_table(&steps), "{steps:?}");
        }
        // A group's leases: each node's queue through `jobs_queued`, at most `MAX_LEASE_BATCH`
        // rows each (the window then sorts those few, not the table).
        let steps = plan(&ledger, &GROUP_LEASE_SQLITE).await;
        assert!(steps.iter().any(|s| s.contains("jobs_queued")), "{steps:?}");
        assert!(
            !steps
                .iter()
                .any(|s| s.starts_with("SCAN jobs") || s.starts_with("SCAN j ")),
            "{steps:?}"
        );
        let steps = plan(&ledger, super::super::jobs::EXPIRE).await;
        assert!(steps.iter().any(|s| s.contains("jobs_leased")), "{steps:?}");
        let steps = plan(&ledger, super::super::rollouts::ADVANCEABLE).await;
        assert!(steps.iter().any(|s| s.contains("jobs_by_step")), "{steps:?}");
        assert!(!whole_table(&steps), "{steps:?}");
        // The lease wakes' look over the fleet: only the open jobs' partial indexes.
        let steps = plan(&ledger, NODES_WITH_WORK).await;
        assert!(steps.iter().any(|s| s.contains("jobs_queued")), "{steps:?}");
        assert!(steps.iter().any(|s| s.contains("jobs_leased")), "{steps:?}");
        assert!(
            steps.iter().all(|s| !s.starts_with("SCAN jobs") || s.contains("USING")),
            "{steps:?}"
        );
        // A set-up's release, in every group with one: its node's few jobs, for the held ones
        // and the earlier steps' alike.
        let release = format!(
            "UPDATE jobs SET held = 0 WHERE id IN ({})",
            super::super::jobs::SET_UP_RELEASED
        );
        let steps = plan(&ledger, &release).await;
        assert_eq!(
            steps.iter().filter(|s| s.contains("jobs_by_node_step")).count(),
            2,
            "{steps:?}"
        );
        assert!(!whole_table(&steps), "{steps:?}");
        // After every settle: the paused steps through their partial index, not every row.
        let steps = plan(&ledger, super::super::rollouts::NEXT_STEP_DUE).await;
        assert!(steps.iter().any(|s| s.contains("deployments_paused")), "{steps:?}");
        ledger.close().await;
    }
}
