//! The job queue: enqueueing tasks as jobs keyed by what they are, leases with fencing tokens,
//! renewals, completions (set-based, each refused alone when stale or another node's), expiry
//! with backoff.

use super::rows::JobState;
use super::{Backend, Ledger, LedgerError, WriteTx, rows};
use sqlx::FromRow;
use state_schema::task::Task;

/// A job to add. Its idempotency key comes from the task.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub task: Task,
    pub target_node: String,
    pub max_attempts: u32,
    pub not_before_ms: i64,
}

/// A job's ledger key: its task's idempotency key on its node. A task is what the job is; the
/// same task on two nodes (an environment's network, say) is two jobs.
pub fn job_key(task: &Task, node: &str) -> String {
    format!("{}@{node}", task.idempotency_key())
}

/// A job as `enqueue_in` writes it.
pub(crate) struct JobRow<'a> {
    pub task: &'a Task,
    pub node: &'a str,
    /// `job_key(task, node)`, made once.
    pub key: String,
    pub max_attempts: u32,
    pub not_before_ms: i64,
    pub step: Option<i64>,
}

impl<'a> JobRow<'a> {
    /// A job of a scale at revision `revision`: the same instance may be added, removed and
    /// added again at one generation, so the scale's revision is part of what the job is.
    pub fn scaled(task: &'a Task, node: &'a str, revision: i64, now_ms: i64) -> Self {
        JobRow {
            key: format!("{}#r{revision}", job_key(task, node)),
            task,
            node,
            max_attempts: rows::MAX_ATTEMPTS,
            not_before_ms: now_ms,
            step: None,
        }
    }

    pub fn new(task: &'a Task, node: &'a str, max_attempts: u32, not_before_ms: i64, step: Option<i64>) -> Self {
        JobRow {
            key: job_key(task, node),
            task,
            node,
            max_attempts,
            not_before_ms,
            step,
        }
    }
}

/// A leased job, as handed to an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub job_id: i64,
    pub key: String,
    pub task: Task,
    pub attempt: i64,
    pub token: LeaseToken,
    pub expires_at_ms: i64,
}

/// What a renewal or completion must present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseToken {
    pub job_id: i64,
    pub lease_token: String,
    pub fencing_token: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// Worth trying again (a pull failed, Docker hiccuped): back to the queue with backoff.
    Retryable(String),
    /// Will fail the same way until the desired state changes.
    Permanent(String),
}

#[derive(Clone, Debug)]
pub struct Completion {
    pub token: LeaseToken,
    pub outcome: Outcome,
}

/// A refused renewal or completion. Nothing was recorded for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    StaleFencingToken,
    /// The job is targeted at another node than the caller.
    NotYourJob,
}

impl Refused {
    pub fn code(self) -> &'static str {
        match self {
            Refused::StaleFencingToken => "stale-fencing-token",
            Refused::NotYourJob => "not-your-job",
        }
    }
}

/// Backoff before attempt `attempts + 1`: doubling from 1 s to at most 5 min, plus up to 1 s
/// of jitter derived from the job, so retries of many jobs do not arrive together.
pub fn backoff_ms(job_id: i64, attempts: i64) -> i64 {
    let base = 1000i64.saturating_mul(1i64 << attempts.clamp(0, 20)).min(300_000);
    let jitter = (job_id
        .wrapping_mul(0x9E37_79B9)
        .wrapping_add(attempts.wrapping_mul(7919)))
    .rem_euclid(1000);
    base + jitter
}

/// A job just leased: `RETURNING id, key, task, attempts, fencing_token`.
#[derive(FromRow)]
struct LeasedRecord {
    id: i64,
    key: String,
    task: String,
    attempts: i64,
    fencing_token: i64,
}

/// The same from a group lease, with the request it answers and that request's token.
#[derive(FromRow)]
struct GroupLeasedRecord {
    #[sqlx(flatten)]
    job: LeasedRecord,
    idx: i64,
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

/// A leased job as `complete` finds it, locked for the rest of the transaction.
#[derive(FromRow)]
struct LiveLease {
    id: i64,
    target_node: String,
    /// 1 when the lease is live (leased, not expired), else 0.
    live: i64,
    attempts: i64,
    max_attempts: i64,
    key: String,
    lease_token: Option<String>,
    fencing_token: Option<i64>,
}

/// What one batch of completions writes.
#[derive(Default)]
struct Recorded<'c> {
    /// Job ids by their new state (all but retries, which each get their own `not_before`).
    by_state: std::collections::BTreeMap<JobState, Vec<i64>>,
    retries: Vec<(i64, i64)>,
    /// (job, fencing token, outcome, detail)
    results: Vec<(i64, i64, &'c str, String)>,
    /// (kind, subject, detail)
    events: Vec<(String, String, String)>,
}

impl Ledger {
    /// Adds jobs; a job whose key exists already is left as it is. Returns how many were new.
    pub async fn enqueue(&self, jobs: &[NewJob], now_ms: i64) -> Result<usize, LedgerError> {
        let mut tx = self.write_tx().await?;
        let rows: Vec<JobRow<'_>> = jobs
            .iter()
            .map(|j| JobRow::new(&j.task, &j.target_node, j.max_attempts, j.not_before_ms, None))
            .collect();
        let added = self.enqueue_in(&mut tx, &rows, now_ms).await?;
        let events: Vec<_> = added
            .iter()
            .map(|&i| ("job-queued".to_owned(), rows[i].key.clone(), String::new()))
            .collect();
        self.events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok(added.len())
    }

    /// Inserts jobs in the caller's transaction, many rows a statement; a key that exists is
    /// left as it is. Returns the indices (into `jobs`) of the ones that were new.
    pub(crate) async fn enqueue_in(
        &self,
        tx: &mut WriteTx,
        jobs: &[JobRow<'_>],
        now_ms: i64,
    ) -> Result<Vec<usize>, LedgerError> {
        let mut added = Vec::new();
        for (c, chunk) in jobs.chunks(200).enumerate() {
            let rows = vec!["(?, ?, ?, 'queued', 0, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
            let q = format!(
                "INSERT INTO jobs (key, task, target_node, state, attempts, max_attempts, not_before, created_at, updated_at, environment, generation, step) VALUES {rows} ON CONFLICT (key) DO NOTHING RETURNING key"
            );
            let mut query = sqlx::query_scalar::<_, String>(self.sql(&q));
            for j in chunk {
                let generation = i64::try_from(j.task.generation()).unwrap_or(i64::MAX);
                query = query
                    .bind(j.key.clone())
                    .bind(serde_json::to_string(j.task)?)
                    .bind(j.node.to_owned())
                    .bind(i64::from(j.max_attempts.max(1)))
                    .bind(j.not_before_ms)
                    .bind(now_ms)
                    .bind(now_ms)
                    .bind(j.task.environment().as_str().to_owned())
                    .bind(generation)
                    .bind(j.step);
            }
            let index: std::collections::HashMap<&str, usize> = chunk
                .iter()
                .enumerate()
                .map(|(i, j)| (j.key.as_str(), c * 200 + i))
                .collect();
            for key in query.fetch_all(&mut **tx).await? {
                added.extend(index.get(key.as_str()));
            }
        }
        added.sort_unstable();
        Ok(added)
    }

    /// Puts leases that expired back in the queue (or marks them dead when their attempts are
    /// used up). Level-triggered: every lease runs it first, in the same transaction.
    pub async fn expire(&self, now_ms: i64) -> Result<usize, LedgerError> {
        // Usually nothing has run out: one read, and no write transaction.
        let any = sqlx::query(self.sql("SELECT 1 FROM jobs WHERE state = 'leased' AND lease_expires_at < ? LIMIT 1"))
            .bind(now_ms)
            .fetch_optional(&self.pool)
            .await?;
        if any.is_none() {
            return Ok(0);
        }
        let mut tx = self.write_tx().await?;
        let n = self.expire_in(&mut tx, now_ms).await?;
        tx.commit().await?;
        Ok(n)
    }

    pub(crate) async fn expire_in(&self, tx: &mut WriteTx, now_ms: i64) -> Result<usize, LedgerError> {
        let rows: Vec<(String, String)> = sqlx::query_as(self.sql(
            "UPDATE jobs SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END, lease_token = NULL, lease_expires_at = NULL, updated_at = ? WHERE state = 'leased' AND lease_expires_at < ? RETURNING key, state",
        ))
        .bind(now_ms)
        .bind(now_ms)
        .fetch_all(&mut **tx)
        .await?;
        let n = rows.len();
        let events: Vec<_> = rows
            .into_iter()
            .map(|(key, state)| ("lease-expired".to_owned(), key, state))
            .collect();
        self.events_in(tx, now_ms, &events).await?;
        Ok(n)
    }

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
             OR EXISTS (SELECT 1 FROM jobs WHERE target_node IN ({marks}) AND state = 'queued' AND not_before <= ?)"
        );
        let mut query = sqlx::query(self.sql(&q)).bind(now_ms);
        for (node, _, _) in requests {
            query = query.bind(*node);
        }
        Ok(query.bind(now_ms).fetch_optional(&self.pool).await?.is_some())
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
    /// teardown, remove): never new work.
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
    /// sees them. The answers in the order of `completions` and of `requests`.
    pub async fn complete_and_lease(
        &self,
        completions: &[Completion],
        callers: &[String],
        requests: &[(&str, u32, bool)],
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<(Vec<Result<(), Refused>>, Vec<Vec<Lease>>), LedgerError> {
        if completions.is_empty() {
            return Ok((Vec::new(), self.lease_many(requests, ttl_ms, now_ms).await?));
        }
        let mut tx = self.write_tx().await?;
        let done = self.complete_as_in(&mut tx, completions, callers, now_ms).await?;
        let leased = if requests.is_empty() {
            Vec::new()
        } else {
            self.lease_many_in(&mut tx, requests, ttl_ms, now_ms).await?
        };
        tx.commit().await?;
        Ok((done, leased))
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
        // Fencing tokens are per job, not from one shared counter: concurrent lease
        // transactions (PostgreSQL) then meet only on the jobs they both want, and `SKIP
        // LOCKED` gives those to one of them. (SQLite's write transactions queue anyway.)
        let lock = if self.backend == Backend::Postgres {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let q = |only: &str| {
            format!(
                "UPDATE jobs SET state = 'leased', lease_token = ?, fencing_token = COALESCE(fencing_token, 0) + 1, lease_expires_at = ?, attempts = attempts + 1, updated_at = ? \
                 WHERE id IN (SELECT id FROM jobs WHERE target_node = ? AND state = 'queued' AND not_before <= ?{only} ORDER BY id LIMIT ?{lock}) \
                 RETURNING id, key, task, attempts, fencing_token"
            )
        };
        let (q_all, q_removals) = (
            q(""),
            q(" AND (key LIKE '%:stop@%' OR key LIKE '%:teardown@%' OR key LIKE '%:remove@%')"),
        );
        let expires = now_ms + ttl_ms;
        let mut out = Vec::with_capacity(requests.len());
        let mut events = Vec::new();
        // PostgreSQL: a group's leases in one statement (one round trip instead of one per
        // node). Not when a node asks twice in one group: its two picks could meet.
        let distinct = requests
            .iter()
            .map(|(n, _, _)| *n)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == requests.len();
        if self.backend == Backend::Postgres && requests.len() > 1 && distinct {
            let out = self.lease_group_pg(tx, requests, expires, now_ms).await?;
            for ((node, _, _), leases) in requests.iter().zip(&out) {
                if !leases.is_empty() {
                    events.push((
                        "jobs-leased".to_owned(),
                        (*node).to_owned(),
                        format!("{} jobs", leases.len()),
                    ));
                }
            }
            self.events_in(tx, now_ms, &events).await?;
            return Ok(out);
        }
        for (node, max, removals_only) in requests {
            let token = new_lease_token()?;
            let rows: Vec<LeasedRecord> = sqlx::query_as(self.sql(if *removals_only { &q_removals } else { &q_all }))
                .bind(&token)
                .bind(expires)
                .bind(now_ms)
                .bind(*node)
                .bind(now_ms)
                .bind(i64::from(*max))
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
        self.events_in(tx, now_ms, &events).await?;
        Ok(out)
    }

    /// PostgreSQL: every request of a group leased by one `UPDATE … FROM (VALUES …) CROSS JOIN
    /// LATERAL (… FOR UPDATE SKIP LOCKED)`: each node's oldest due jobs, up to its `max`, each
    /// request with a lease token of its own. The answers in the order of `requests`.
    async fn lease_group_pg(
        &self,
        tx: &mut WriteTx,
        requests: &[(&str, u32, bool)],
        expires: i64,
        now_ms: i64,
    ) -> Result<Vec<Vec<Lease>>, LedgerError> {
        let rows = vec!["(?::int8, ?::text, ?::int8, ?::bool, ?::text)"; requests.len()].join(", ");
        let q = format!(
            "UPDATE jobs SET state = 'leased', lease_token = picked.token, fencing_token = COALESCE(jobs.fencing_token, 0) + 1, \
             lease_expires_at = ?, attempts = jobs.attempts + 1, updated_at = ? \
             FROM (SELECT j.id, r.idx, r.token FROM (VALUES {rows}) AS r(idx, node, lim, removals, token) \
                   CROSS JOIN LATERAL (SELECT id FROM jobs WHERE target_node = r.node AND state = 'queued' AND not_before <= ? \
                     AND (NOT r.removals OR key LIKE '%:stop@%' OR key LIKE '%:teardown@%' OR key LIKE '%:remove@%') \
                     ORDER BY id LIMIT r.lim FOR UPDATE SKIP LOCKED) j) AS picked \
             WHERE jobs.id = picked.id \
             RETURNING jobs.id, jobs.key, jobs.task, jobs.attempts, jobs.fencing_token, picked.idx, picked.token"
        );
        let mut query = sqlx::query_as::<_, GroupLeasedRecord>(self.sql(&q))
            .bind(expires)
            .bind(now_ms);
        for (i, (node, max, removals_only)) in requests.iter().enumerate() {
            query = query
                .bind(i as i64)
                .bind(*node)
                .bind(i64::from(*max))
                .bind(*removals_only)
                .bind(new_lease_token()?);
        }
        let mut out: Vec<Vec<Lease>> = vec![Vec::new(); requests.len()];
        for r in query.bind(now_ms).fetch_all(&mut **tx).await? {
            let Some(slot) = usize::try_from(r.idx).ok().and_then(|i| out.get_mut(i)) else {
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

    /// Records outcomes. A stale token is refused and records nothing: no result, no event,
    /// no state change. Set-based: a batch costs a few statements, not a few per job.
    pub async fn complete(
        &self,
        completions: &[Completion],
        now_ms: i64,
    ) -> Result<Vec<Result<(), Refused>>, LedgerError> {
        self.complete_as(completions, &[], now_ms).await
    }

    /// [`Ledger::complete`], each completion made by the node in `callers` at its index (none
    /// given: no check): a job targeted at another node is refused with `NotYourJob`, in the
    /// same transaction that records the others, and records nothing.
    pub async fn complete_as(
        &self,
        completions: &[Completion],
        callers: &[String],
        now_ms: i64,
    ) -> Result<Vec<Result<(), Refused>>, LedgerError> {
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.write_tx().await?;
        let out = self.complete_as_in(&mut tx, completions, callers, now_ms).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// [`Ledger::complete_as`] in the caller's transaction.
    pub(crate) async fn complete_as_in(
        &self,
        tx: &mut WriteTx,
        completions: &[Completion],
        callers: &[String],
        now_ms: i64,
    ) -> Result<Vec<Result<(), Refused>>, LedgerError> {
        let mut out = vec![Err(Refused::StaleFencingToken); completions.len()];
        for chunk_start in (0..completions.len()).step_by(500) {
            let chunk = &completions[chunk_start..(chunk_start + 500).min(completions.len())];
            // The live leases among the batch, locked until commit.
            let marks = vec!["?"; chunk.len()].join(", ");
            let lock = if self.backend == Backend::Postgres {
                " FOR UPDATE"
            } else {
                ""
            };
            let q = format!(
                "SELECT id, attempts, max_attempts, key, lease_token, fencing_token, target_node, \
                 CASE WHEN state = 'leased' AND lease_expires_at >= ? THEN 1 ELSE 0 END AS live FROM jobs WHERE id IN ({marks}){lock}"
            );
            let mut query = sqlx::query_as::<_, LiveLease>(self.sql(&q)).bind(now_ms);
            for c in chunk {
                query = query.bind(c.token.job_id);
            }
            let mut live: std::collections::HashMap<i64, LiveLease> = std::collections::HashMap::new();
            let mut owners: std::collections::HashMap<i64, String> = std::collections::HashMap::new();
            for mut r in query.fetch_all(&mut **tx).await? {
                owners.insert(r.id, std::mem::take(&mut r.target_node));
                if r.live == 1 {
                    live.insert(r.id, r);
                }
            }
            let mut rec = Recorded::default();
            let mut repaired: Vec<String> = Vec::new();
            for (i, c) in chunk.iter().enumerate() {
                let t = &c.token;
                if let (Some(caller), Some(owner)) = (callers.get(chunk_start + i), owners.get(&t.job_id))
                    && caller != owner
                {
                    out[chunk_start + i] = Err(Refused::NotYourJob);
                    continue;
                }
                let Some(LiveLease {
                    attempts,
                    max_attempts,
                    key,
                    lease_token: token,
                    fencing_token: fencing,
                    ..
                }) = live.remove(&t.job_id)
                else {
                    continue;
                };
                if token.as_deref() != Some(t.lease_token.as_str()) || fencing != Some(t.fencing_token) {
                    continue;
                }
                let (state, outcome, detail) = match &c.outcome {
                    Outcome::Succeeded => (JobState::Succeeded, "succeeded", String::new()),
                    Outcome::Retryable(d) if attempts >= max_attempts => (JobState::Dead, "retryable", d.clone()),
                    Outcome::Retryable(d) => {
                        rec.retries.push((t.job_id, now_ms + backoff_ms(t.job_id, attempts)));
                        (JobState::Queued, "retryable", d.clone())
                    }
                    Outcome::Permanent(d) => (JobState::Failed, "permanent", d.clone()),
                };
                if state != JobState::Queued {
                    rec.by_state.entry(state).or_default().push(t.job_id);
                }
                rec.results.push((t.job_id, t.fencing_token, outcome, detail.clone()));
                if state == JobState::Succeeded && rows::is_repair(&key) {
                    // `app:<env>/…@<node>`: the environment's event, as the agent's repairs are.
                    let env = key
                        .trim_start_matches("app:")
                        .split('/')
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    let node = key.rsplit('@').next().unwrap_or_default();
                    let what = format!("{node}: replica {key} was gone from its node: made again");
                    rec.events.push(("drift-repaired".to_owned(), env, what));
                    repaired.push(key.clone());
                }
                rec.events.push((format!("job-{}", state.as_str()), key, detail));
                out[chunk_start + i] = Ok(());
            }
            for (state, ids) in &rec.by_state {
                let marks = vec!["?"; ids.len()].join(", ");
                let q = format!(
                    "UPDATE jobs SET state = ?, lease_token = NULL, lease_expires_at = NULL, updated_at = ? WHERE id IN ({marks})"
                );
                let mut query = sqlx::query(self.sql(&q)).bind(state.as_str()).bind(now_ms);
                for id in ids {
                    query = query.bind(*id);
                }
                query.execute(&mut **tx).await?;
            }
            for key in &repaired {
                self.republish_after_repair(tx, key, now_ms).await?;
            }
            for (id, not_before) in &rec.retries {
                sqlx::query(self.sql("UPDATE jobs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL, not_before = ?, updated_at = ? WHERE id = ?"))
                    .bind(*not_before)
                    .bind(now_ms)
                    .bind(*id)
                    .execute(&mut **tx)
                    .await?;
            }
            if !rec.results.is_empty() {
                let rows = vec!["(?, ?, ?, ?, ?)"; rec.results.len()].join(", ");
                let mut query = sqlx::query(self.sql(&format!(
                    "INSERT INTO job_results (job_id, fencing_token, outcome, detail, at) VALUES {rows}"
                )));
                for (id, fencing, outcome, detail) in &rec.results {
                    query = query
                        .bind(*id)
                        .bind(*fencing)
                        .bind(*outcome)
                        .bind(detail.clone())
                        .bind(now_ms);
                }
                query.execute(&mut **tx).await?;
                self.events_in(tx, now_ms, &rec.events).await?;
            }
        }
        Ok(out)
    }

    /// A job's state and attempts, by key.
    pub async fn job(&self, key: &str) -> Result<Option<(String, i64)>, LedgerError> {
        Ok(
            sqlx::query_as(self.sql("SELECT state, attempts FROM jobs WHERE key = ?"))
                .bind(key)
                .fetch_optional(&self.pool)
                .await?,
        )
    }
}
