//! The job queue: the job, lease and completion types, enqueueing tasks as jobs keyed by what
//! they are, and expiry of leases with backoff. Leasing is `lease.rs`'s, completions
//! `complete.rs`'s.

use super::{LedgerError, WriteTx, rows};
use state_schema::task::Task;

/// The sizes of [`Jobs::release_set_up_in`]'s statements: a group's set-ups in as few
/// statement texts as can hold them.
const RELEASE_SIZES: [usize; 4] = [1, 8, 32, 128];

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
    /// Held until the rest of its scale succeeded (`jobs.held`): queued, never leased.
    pub held: bool,
}

impl<'a> JobRow<'a> {
    /// A job of a scale at revision `revision`: the same instance may be added, removed and
    /// added again at one generation, so the scale's revision is part of what the job is.
    /// `held`: it waits for the rest of the scale (`release_scale_in` makes it due).
    pub fn scaled(task: &'a Task, node: &'a str, revision: i64, now_ms: i64, held: bool) -> Self {
        JobRow {
            key: format!("{}#r{revision}", job_key(task, node)),
            task,
            node,
            max_attempts: rows::MAX_ATTEMPTS,
            not_before_ms: now_ms,
            step: None,
            held,
        }
    }

    /// The job held: queued, never leased, until something makes it due (a scale's rest, or
    /// its node's set-up: `release_set_up_in`).
    pub fn held(self) -> Self {
        JobRow { held: true, ..self }
    }

    pub fn new(task: &'a Task, node: &'a str, max_attempts: u32, not_before_ms: i64, step: Option<i64>) -> Self {
        JobRow {
            key: job_key(task, node),
            task,
            node,
            max_attempts,
            not_before_ms,
            step,
            held: false,
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
    /// A backup succeeded, and this is what it saved.
    Saved(super::backups::Saved),
    /// A canary's measure succeeded, and this is what the ingress saw.
    Measured(Measure),
    /// Worth trying again (a pull failed, Docker hiccuped): back to the queue with backoff.
    Retryable(String),
    /// Will fail the same way until the desired state changes.
    Permanent(String),
}

/// What one ingress measured of a canary's share (the agent's `CanaryMeasure`, as a row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measure {
    pub requests: i64,
    pub errors: i64,
    pub p95_micros: Option<i64>,
    pub logged: bool,
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

/// The held jobs one set-up's success makes due (bound: environment, generation, the set-up's
/// step, node): that node's jobs of the rollout's later steps, once none of its earlier ones
/// is unfinished. Both looks go through `jobs_by_node_step` (a few entries of one node), not
/// `jobs_by_step` (every job of the environment's steps, for each set-up of a group).
pub(crate) const SET_UP_RELEASED: &str = "SELECT j.id FROM jobs j WHERE j.environment = ? AND j.generation = ? AND j.step > ? \
     AND j.target_node = ? AND j.state = 'queued' AND j.held = 1 AND NOT EXISTS \
     (SELECT 1 FROM jobs o WHERE o.environment = j.environment AND o.generation = j.generation \
      AND o.step < j.step AND o.target_node = j.target_node AND o.state <> 'succeeded')";

/// Expired leases back to the queue (or dead when out of attempts). See [`Ledger::expire`].
pub(crate) const EXPIRE: &str = "UPDATE jobs SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END, lease_token = NULL, lease_expires_at = NULL, updated_at = ? WHERE state = 'leased' AND lease_expires_at < ? RETURNING key, state";

impl crate::store::Jobs<'_> {
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
        self.events().events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok(added.len())
    }

    /// Makes the held jobs of the scale at `revision` of `environment` due, once every other job
    /// of that scale succeeded: a move's removals wait for the replicas that replace the ones
    /// they remove (on other nodes, whose jobs nothing else orders). A job of the scale that
    /// failed for good keeps them held: the old replicas serve on, and the failure shows.
    /// Returns how many were released.
    pub(crate) async fn release_scale_in(
        &self,
        tx: &mut WriteTx,
        environment: &str,
        generation: i64,
        revision: i64,
        now_ms: i64,
    ) -> Result<u64, LedgerError> {
        // `…@<node>#r<revision>`: no other key ends so (a repair's `#r` comes before the node).
        let pattern = format!("%#r{revision}");
        let released = sqlx::query(self.sql(
            "UPDATE jobs SET held = 0, not_before = ?, updated_at = ? \
             WHERE environment = ? AND generation = ? AND state = 'queued' AND held = 1 AND key LIKE ? \
             AND NOT EXISTS (SELECT 1 FROM jobs o WHERE o.environment = ? AND o.generation = ? AND o.key LIKE ? \
                             AND o.held = 0 AND o.state <> 'succeeded')",
        ))
        .bind(now_ms)
        .bind(now_ms)
        .bind(environment)
        .bind(generation)
        .bind(&pattern)
        .bind(environment)
        .bind(generation)
        .bind(&pattern)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if released > 0 {
            self.events().events_in(
                tx,
                now_ms,
                &[(
                    "scale-removals-released".to_owned(),
                    environment.to_owned(),
                    format!("generation {generation}: the replicas that replace the moved ones run and are published; {released} removal jobs are due"),
                )],
            )
            .await?;
        }
        Ok(released)
    }

    /// Makes due the held jobs of a rollout's later steps on a node (`advance::held_with`: the
    /// replicas queued with the environment's set-up) once every job of the steps before theirs
    /// on that node succeeded: run for each `(environment, generation, node, step)` whose
    /// set-up of step `step` succeeded there. Returns how many were released.
    pub(crate) async fn release_set_up_in(
        &self,
        tx: &mut WriteTx,
        set_up: &[(&str, i64, &str, i64)],
        now_ms: i64,
    ) -> Result<u64, LedgerError> {
        let mut released = 0;
        let mut rest = set_up;
        while !rest.is_empty() {
            // A few statement texts, not one per count (each is prepared and cached per
            // connection): a chunk is padded with its last set-up, which changes nothing twice.
            let size = RELEASE_SIZES
                .iter()
                .copied()
                .find(|&n| n >= rest.len())
                .unwrap_or(RELEASE_SIZES[RELEASE_SIZES.len() - 1]);
            let (chunk, after) = rest.split_at(size.min(rest.len()));
            rest = after;
            let Some(&last) = chunk.last() else { break };
            // One statement for the group's set-ups: a statement each was a trip to SQLite's
            // connection thread each while the group held the writer.
            let q = format!(
                "UPDATE jobs SET held = 0, not_before = ?, updated_at = ? WHERE id IN ({})",
                vec![SET_UP_RELEASED; size].join(" UNION ALL ")
            );
            let mut query = sqlx::query(self.sql(&q)).bind(now_ms).bind(now_ms);
            for k in 0..size {
                let (environment, generation, node, step) = chunk.get(k).copied().unwrap_or(last);
                query = query.bind(environment).bind(generation).bind(step).bind(node);
            }
            released += query.execute(&mut **tx).await?.rows_affected();
        }
        Ok(released)
    }

    /// Makes due every held job of step `step` of `environment`'s generation `generation`: the
    /// step runs now, so whatever a node's set-up had not released yet (a node with no set-up
    /// of its own in the step before) waits no longer.
    pub(crate) async fn release_step_in(
        &self,
        tx: &mut WriteTx,
        (environment, generation, step): (&str, i64, i64),
        now_ms: i64,
    ) -> Result<u64, LedgerError> {
        Ok(sqlx::query(self.sql(
            "UPDATE jobs SET held = 0, not_before = ?, updated_at = ? \
             WHERE environment = ? AND generation = ? AND step = ? AND state = 'queued' AND held = 1",
        ))
        .bind(now_ms)
        .bind(now_ms)
        .bind(environment)
        .bind(generation)
        .bind(step)
        .execute(&mut **tx)
        .await?
        .rows_affected())
    }

    /// Cancels the queued jobs of `environment`'s generation `generation` in the steps after
    /// `step`, which failed: only the jobs queued ahead with a set-up (`advance::held_with`)
    /// can be there, held or made due by their node's set-up. What a node leased runs to its
    /// end, as the jobs of a failed step do.
    pub(crate) async fn cancel_after_step_in(
        &self,
        tx: &mut WriteTx,
        (environment, generation, step): (&str, i64, i64),
        now_ms: i64,
    ) -> Result<u64, LedgerError> {
        Ok(sqlx::query(self.sql(
            "UPDATE jobs SET state = 'cancelled', updated_at = ? \
             WHERE environment = ? AND generation = ? AND step > ? AND state = 'queued'",
        ))
        .bind(now_ms)
        .bind(environment)
        .bind(generation)
        .bind(step)
        .execute(&mut **tx)
        .await?
        .rows_affected())
    }

    /// Cancels the held jobs of `environment` at `generation` whose keys match `patterns` (SQL
    /// `LIKE`): an earlier scale's removals of what a later one puts back (a replica placed
    /// on the node it was leaving, a node that takes the environment again), which, released
    /// after the later scale's jobs ran, would remove what it made. Returns how many.
    pub(crate) async fn cancel_held_in(
        &self,
        tx: &mut WriteTx,
        environment: &str,
        generation: i64,
        patterns: &[String],
        now_ms: i64,
    ) -> Result<u64, LedgerError> {
        // One statement per scale (up to 500 patterns each, well under either backend's
        // limit on bound values): the environment's jobs at this generation are few.
        let mut cancelled = 0;
        for chunk in patterns.chunks(500) {
            let likes = vec!["key LIKE ?"; chunk.len()].join(" OR ");
            let q = format!(
                "UPDATE jobs SET state = 'cancelled', updated_at = ? \
                 WHERE environment = ? AND generation = ? AND state = 'queued' AND held = 1 AND ({likes})"
            );
            let mut query = sqlx::query(self.sql(&q))
                .bind(now_ms)
                .bind(environment)
                .bind(generation);
            for pattern in chunk {
                query = query.bind(pattern);
            }
            cancelled += query.execute(&mut **tx).await?.rows_affected();
        }
        Ok(cancelled)
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
            let rows = vec!["(?, ?, ?, 'queued', 0, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
            let q = format!(
                "INSERT INTO jobs (key, task, target_node, state, attempts, max_attempts, not_before, created_at, updated_at, environment, generation, step, held) VALUES {rows} ON CONFLICT (key) DO NOTHING RETURNING key"
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
                    .bind(j.step)
                    .bind(i64::from(j.held));
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
        let rows: Vec<(String, String)> = sqlx::query_as(self.sql(EXPIRE))
            .bind(now_ms)
            .bind(now_ms)
            .fetch_all(&mut **tx)
            .await?;
        let n = rows.len();
        let events: Vec<_> = rows
            .into_iter()
            .map(|(key, state)| ("lease-expired".to_owned(), key, state))
            .collect();
        self.events().events_in(tx, now_ms, &events).await?;
        Ok(n)
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
