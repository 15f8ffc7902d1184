//! The durable job ledger, on SQLite (one file, WAL; the embedded default) or PostgreSQL (HA
//! and scale), with one code path through sqlx's `Any` driver and the same tests for both.
//!
//! A lease stamps jobs with a lease token and a fencing token that only grows for that job
//! (each lease of it takes the next). Renewals and completions must present both; a stale pair
//! is refused and records nothing. Results and events are append-only, enforced by triggers in the schema.

pub mod delivery;
pub mod fleet;
pub mod group;
pub mod rewrites;
pub mod rows;
pub mod views;

/// Milliseconds since the Unix epoch: the ledger's unit of time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};
use state_schema::task::Task;
use std::borrow::Cow;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger URL must start with sqlite: or postgres:")]
    Url,
    #[error("ledger database")]
    Db(#[from] sqlx::Error),
    #[error("ledger migrations")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("a stored task does not decode")]
    Task(#[from] serde_json::Error),
    #[error("the leader lock file beside the SQLite ledger")]
    LeaderFile(#[source] std::io::Error),
    #[error("the operating system's random source failed: {0}")]
    Random(String),
}

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub id: i64,
    pub at_ms: i64,
    pub kind: String,
    pub subject: String,
    pub detail: String,
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

/// 128 bits from the operating system's random source, as hex. A lease token is a
/// capability (with the fencing token it completes a job), so it must not be guessable.
fn new_lease_token() -> Result<String, LedgerError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| LedgerError::Random(e.to_string()))?;
    Ok(hex::encode(bytes))
}

/// A leased job as `complete` finds it, locked for the rest of the transaction.
struct LiveLease {
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
    by_state: std::collections::BTreeMap<&'static str, Vec<i64>>,
    retries: Vec<(i64, i64)>,
    /// (job, fencing token, outcome, detail)
    results: Vec<(i64, i64, &'c str, String)>,
    /// (kind, subject, detail)
    events: Vec<(String, String, String)>,
}

/// The advisory-lock key of the leader: "pushleft" in ASCII.
const LEADER_LOCK_KEY: i64 = 0x7075_7368_6c65_6674;

/// Held while this daemon leads.
pub struct LeaderLock {
    conn: Option<sqlx::AnyConnection>,
    /// SQLite: an exclusive lock on `<ledger file>.leader`, released when the process ends.
    _file: Option<std::fs::File>,
}

impl LeaderLock {
    /// Whether the lock is still held: its connection still answers. A restarted PostgreSQL
    /// ends the session and with it the lock, so the daemon must take it again.
    pub async fn still_held(&mut self) -> bool {
        match &mut self.conn {
            None => true, // a file lock lasts as long as the process
            Some(c) => sqlx::query("SELECT 1").fetch_one(&mut *c).await.is_ok(),
        }
    }
}

pub struct Ledger {
    pub(crate) pool: AnyPool,
    backend: Backend,
    /// The database file, for SQLite.
    sqlite_path: Option<std::path::PathBuf>,
    /// Silence after which a node is lost and its replicas are placed elsewhere.
    lost_after_ms: std::sync::atomic::AtomicI64,
    /// SQLite has one writer: this process's write transactions queue here, in order, instead
    /// of meeting `SQLITE_BUSY` and sleeping in SQLite's busy handler (1, 2, 5, 10… ms).
    writer: Arc<tokio::sync::Mutex<()>>,
    /// The control plane's id, read (or made) once ([`Ledger::control_plane`]).
    control_plane: tokio::sync::OnceCell<String>,
    /// A heartbeat left out a replica its node reported before ([`crate::reconcile::drift`]); and when
    /// drift was last looked at in full.
    pub(crate) drift_suspected: std::sync::atomic::AtomicBool,
    pub(crate) drift_checked_ms: std::sync::atomic::AtomicI64,
}

/// A write transaction; on SQLite it holds the process's writer turn until it ends.
pub struct WriteTx {
    tx: sqlx::Transaction<'static, sqlx::Any>,
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// Like a transaction, a write transaction is the connection it runs on (`&mut *tx`).
impl std::ops::Deref for WriteTx {
    type Target = sqlx::AnyConnection;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl WriteTx {
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

impl Ledger {
    /// Connects: `sqlite:///path/ledger.db` (created if missing) or `postgres://…`.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, LedgerError> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(LedgerError::Url);
        };
        let sqlite_path = (backend == Backend::Sqlite)
            .then(|| {
                let rest = url.trim_start_matches("sqlite:").trim_start_matches("//");
                let path = rest.split('?').next().unwrap_or("");
                (!path.is_empty() && path != ":memory:").then(|| std::path::PathBuf::from(path))
            })
            .flatten();
        let url: Cow<'_, str> = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                Cow::Owned(format!("{url}{}mode=rwc", if url.contains('?') { '&' } else { '?' }))
            }
            _ => Cow::Borrowed(url),
        };
        let options = AnyPoolOptions::new()
            .max_connections(max_connections)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // WAL for concurrent readers; full fsync on commit (durable); wait on
                        // locks instead of failing; enforce foreign keys.
                        sqlx::query("PRAGMA journal_mode = WAL").execute(&mut *conn).await?;
                        sqlx::query("PRAGMA synchronous = FULL").execute(&mut *conn).await?;
                        sqlx::query("PRAGMA busy_timeout = 10000").execute(&mut *conn).await?;
                        sqlx::query("PRAGMA foreign_keys = ON").execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            });
        let pool = options.connect(&url).await?;
        Ok(Ledger {
            pool,
            backend,
            sqlite_path,
            lost_after_ms: std::sync::atomic::AtomicI64::new(state_schema::placement::LOST_AFTER_MS),
            writer: Arc::default(),
            control_plane: tokio::sync::OnceCell::new(),
            drift_suspected: std::sync::atomic::AtomicBool::new(true),
            drift_checked_ms: std::sync::atomic::AtomicI64::new(0),
        })
    }

    /// The control plane's id: 8 hex digits from the OS random source, made by the first daemon
    /// that asks (two asking at once keep the first one written) and the same for every daemon
    /// of this ledger ever after. Every host object an agent makes names it.
    pub async fn control_plane(&self) -> Result<String, LedgerError> {
        self.control_plane
            .get_or_try_init(|| async {
                let read = || async {
                    sqlx::query_scalar::<_, String>(self.sql("SELECT id FROM control_plane WHERE singleton = 1"))
                        .fetch_optional(&self.pool)
                        .await
                };
                if let Some(id) = read().await? {
                    return Ok(id);
                }
                let mut bytes = [0u8; agent_proto::CONTROL_PLANE_ID_LEN / 2];
                getrandom::fill(&mut bytes).map_err(|e| LedgerError::Random(e.to_string()))?;
                let id = hex::encode(bytes);
                let mut tx = self.write_tx().await?;
                sqlx::query(
                    self.sql(
                        "INSERT INTO control_plane (singleton, id) VALUES (1, ?) ON CONFLICT (singleton) DO NOTHING",
                    ),
                )
                .bind(&id)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                read()
                    .await?
                    .ok_or(LedgerError::Random("the control plane's id was not kept".into()))
            })
            .await
            .cloned()
    }

    /// How long a node may be silent before its replicas are placed elsewhere (the daemon's
    /// `control.lost_after_seconds`; 300 s by default).
    pub fn set_lost_after_ms(&self, ms: i64) {
        self.lost_after_ms.store(
            ms.max(state_schema::placement::UNHEALTHY_AFTER_MS),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub fn lost_after_ms(&self) -> i64 {
        self.lost_after_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Applies the migrations of the backend (`migrations/sqlite`, `migrations/postgres`).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        match self.backend {
            Backend::Sqlite => sqlx::migrate!("../migrations/sqlite").run(&self.pool).await?,
            Backend::Postgres => sqlx::migrate!("../migrations/postgres").run(&self.pool).await?,
        }
        Ok(())
    }

    /// A transaction that writes. SQLite's takes the write lock at once (`BEGIN IMMEDIATE`):
    /// a deferred one that reads first cannot wait for the lock when it later writes, and
    /// fails with "database is locked" under concurrency.
    pub(crate) async fn write_tx(&self) -> Result<WriteTx, sqlx::Error> {
        match self.backend {
            Backend::Sqlite => {
                let turn = Arc::clone(&self.writer).lock_owned().await;
                Ok(WriteTx {
                    tx: self.pool.begin_with("BEGIN IMMEDIATE").await?,
                    _turn: Some(turn),
                })
            }
            Backend::Postgres => Ok(WriteTx {
                tx: self.pool.begin().await?,
                _turn: None,
            }),
        }
    }

    /// The statement for this backend: `?` placeholders become `$1, $2, …` for PostgreSQL.
    /// Statements are this file's constants; values always go through bind parameters.
    pub(crate) fn sql(&self, q: &str) -> sqlx::SqlStr {
        sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(self.placeholders(q).into_owned()))
    }

    fn placeholders<'q>(&self, q: &'q str) -> Cow<'q, str> {
        if self.backend == Backend::Sqlite {
            return Cow::Borrowed(q);
        }
        let mut out = String::with_capacity(q.len() + 8);
        let mut n = 0;
        for c in q.chars() {
            if c == '?' {
                n += 1;
                out.push_str(&format!("${n}"));
            } else {
                out.push(c);
            }
        }
        Cow::Owned(out)
    }

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
            let mut query = sqlx::query(self.sql(&q));
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
            for r in query.fetch_all(&mut **tx).await? {
                let key: String = r.try_get(0)?;
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

    async fn expire_in(&self, tx: &mut WriteTx, now_ms: i64) -> Result<usize, LedgerError> {
        let rows = sqlx::query(self.sql(
            "UPDATE jobs SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END, lease_token = NULL, lease_expires_at = NULL, updated_at = ? WHERE state = 'leased' AND lease_expires_at < ? RETURNING key, state",
        ))
        .bind(now_ms)
        .bind(now_ms)
        .fetch_all(&mut **tx)
        .await?;
        let events = rows
            .iter()
            .map(|r| Ok(("lease-expired".to_owned(), r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        self.events_in(tx, now_ms, &events).await?;
        Ok(rows.len())
    }

    /// Whether a lease for `requests` could hand anything out: a due job of one of their
    /// nodes, or a lease that has run out (its job may be theirs once expired).
    async fn anything_to_lease(&self, requests: &[(&str, u32, bool)], now_ms: i64) -> Result<bool, LedgerError> {
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
    async fn lease_many_in(
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
        for (node, max, removals_only) in requests {
            let token = new_lease_token()?;
            let rows = sqlx::query(self.sql(if *removals_only { &q_removals } else { &q_all }))
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
                let task: String = r.try_get(2)?;
                leases.push(Lease {
                    job_id: r.try_get(0)?,
                    key: r.try_get(1)?,
                    task: serde_json::from_str(&task)?,
                    attempt: r.try_get(3)?,
                    token: LeaseToken {
                        job_id: r.try_get(0)?,
                        lease_token: token.clone(),
                        fencing_token: r.try_get(4)?,
                    },
                    expires_at_ms: expires,
                });
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
    async fn complete_as_in(
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
                "SELECT id, attempts, max_attempts, key, lease_token, fencing_token, target_node, state = 'leased' AND lease_expires_at >= ? FROM jobs WHERE id IN ({marks}){lock}"
            );
            let mut query = sqlx::query(self.sql(&q)).bind(now_ms);
            for c in chunk {
                query = query.bind(c.token.job_id);
            }
            let mut live: std::collections::HashMap<i64, LiveLease> = std::collections::HashMap::new();
            let mut owners: std::collections::HashMap<i64, String> = std::collections::HashMap::new();
            for r in query.fetch_all(&mut **tx).await? {
                let id: i64 = r.try_get(0)?;
                owners.insert(id, r.try_get(6)?);
                // A boolean comes back as an integer from SQLite and a bool from PostgreSQL.
                let is_live = r
                    .try_get::<bool, _>(7)
                    .or_else(|_| r.try_get::<i64, _>(7).map(|n| n != 0))?;
                if !is_live {
                    continue;
                }
                let lease = LiveLease {
                    attempts: r.try_get(1)?,
                    max_attempts: r.try_get(2)?,
                    key: r.try_get(3)?,
                    lease_token: r.try_get(4)?,
                    fencing_token: r.try_get(5)?,
                };
                live.insert(id, lease);
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
                }) = live.remove(&t.job_id)
                else {
                    continue;
                };
                if token.as_deref() != Some(t.lease_token.as_str()) || fencing != Some(t.fencing_token) {
                    continue;
                }
                let (state, outcome, detail) = match &c.outcome {
                    Outcome::Succeeded => ("succeeded", "succeeded", String::new()),
                    Outcome::Retryable(d) if attempts >= max_attempts => ("dead", "retryable", d.clone()),
                    Outcome::Retryable(d) => {
                        rec.retries.push((t.job_id, now_ms + backoff_ms(t.job_id, attempts)));
                        ("queued", "retryable", d.clone())
                    }
                    Outcome::Permanent(d) => ("failed", "permanent", d.clone()),
                };
                if state != "queued" {
                    rec.by_state.entry(state).or_default().push(t.job_id);
                }
                rec.results.push((t.job_id, t.fencing_token, outcome, detail.clone()));
                if state == "succeeded" && rows::is_repair(&key) {
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
                rec.events.push((format!("job-{state}"), key, detail));
                out[chunk_start + i] = Ok(());
            }
            for (state, ids) in &rec.by_state {
                let marks = vec!["?"; ids.len()].join(", ");
                let q = format!(
                    "UPDATE jobs SET state = ?, lease_token = NULL, lease_expires_at = NULL, updated_at = ? WHERE id IN ({marks})"
                );
                let mut query = sqlx::query(self.sql(&q)).bind(*state).bind(now_ms);
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

    /// Appends one event in the caller's transaction.
    pub(crate) async fn event(
        &self,
        tx: &mut WriteTx,
        now_ms: i64,
        kind: &str,
        subject: &str,
        detail: &str,
    ) -> Result<(), LedgerError> {
        self.events_in(tx, now_ms, &[(kind.to_owned(), subject.to_owned(), detail.to_owned())])
            .await
    }

    /// Appends events, (kind, subject, detail), in the caller's transaction, many rows a
    /// statement. The one way events are written.
    pub(crate) async fn events_in(
        &self,
        tx: &mut WriteTx,
        now_ms: i64,
        events: &[(String, String, String)],
    ) -> Result<(), LedgerError> {
        for chunk in events.chunks(200) {
            let marks = vec!["(?, ?, ?, ?)"; chunk.len()].join(", ");
            let q = format!("INSERT INTO events (at, kind, subject, detail) VALUES {marks}");
            let mut query = sqlx::query(self.sql(&q));
            for (kind, subject, detail) in chunk {
                query = query
                    .bind(now_ms)
                    .bind(kind.clone())
                    .bind(subject.clone())
                    .bind(detail.clone());
            }
            query.execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Events after a cursor, oldest first.
    /// Events after a cursor, oldest first, up to the [`Self::event_horizon`]: a cursor never
    /// passes an event whose transaction may still commit.
    pub async fn events_after(&self, cursor: i64, limit: u32) -> Result<Vec<Event>, LedgerError> {
        let Some(horizon) = self.event_horizon().await? else {
            return Ok(Vec::new());
        };
        let rows = sqlx::query(
            self.sql("SELECT id, at, kind, subject, detail FROM events WHERE id > ? AND id <= ? ORDER BY id LIMIT ?"),
        )
        .bind(cursor)
        .bind(horizon)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Event {
                    id: r.try_get(0)?,
                    at_ms: r.try_get(1)?,
                    kind: r.try_get(2)?,
                    subject: r.try_get(3)?,
                    detail: r.try_get(4)?,
                })
            })
            .collect()
    }

    /// The largest event id below which no event can still appear, or `None` when writers that
    /// may hold lower ids are still running after a short wait.
    ///
    /// SQLite has one writer at a time: ids commit in order, and the largest is the horizon.
    /// On PostgreSQL, ids are taken at insert and commit in any order. The horizon is the
    /// largest visible id, once every transaction that held a transaction id at that moment has
    /// ended: any lower id not yet visible belongs to one of them (a writer takes its
    /// transaction id before its event ids; `migrations/postgres/0006_event_cursor.sql`).
    pub async fn event_horizon(&self) -> Result<Option<i64>, LedgerError> {
        if self.backend == Backend::Sqlite {
            return Ok(Some(
                sqlx::query(self.sql("SELECT COALESCE(MAX(id), 0) FROM events"))
                    .fetch_one(&self.pool)
                    .await?
                    .try_get(0)?,
            ));
        }
        // The largest visible id, and every transaction that holds an id now. A transaction
        // takes its id (and with it the lock on that id that `pg_locks` lists at once, unlike a
        // snapshot, which leaves out ids newer than the last one completed) before its first
        // event id; so any event below `max` that is not visible yet belongs to one of these.
        let row = sqlx::query(self.sql(
            "SELECT COALESCE((SELECT MAX(id) FROM events), 0), \
             (SELECT COALESCE(string_agg(transactionid::text, ','), '') FROM pg_locks \
              WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted)",
        ))
        .fetch_one(&self.pool)
        .await?;
        let (max, writers): (i64, String) = (row.try_get(0)?, row.try_get(1)?);
        if writers.is_empty() {
            return Ok(Some(max));
        }
        // Most writers end within milliseconds. A transaction's lock goes only after new
        // snapshots see it committed, so once these locks are gone every id up to `max` is
        // visible (or never will be).
        for wait_ms in [0u64, 1, 2, 5, 10, 20, 50, 100, 200, 500] {
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
            let running: i64 = sqlx::query(self.sql(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' \
                 AND transactionid::text = ANY(string_to_array(?, ','))",
            ))
            .bind(&writers)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
            if running == 0 {
                return Ok(Some(max));
            }
        }
        Ok(None)
    }

    /// A job's state and attempts, by key.
    pub async fn job(&self, key: &str) -> Result<Option<(String, i64)>, LedgerError> {
        let row = sqlx::query(self.sql("SELECT state, attempts FROM jobs WHERE key = ?"))
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }

    /// Records the judgement of a commit of `branch`, with an event, in one transaction.
    /// Returns `false` (and writes nothing) when that commit was judged before.
    pub async fn record_revision(
        &self,
        branch: &str,
        j: &state_repo::revision::Judgement,
        now_ms: i64,
    ) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let id = self.record_revision_in(&mut tx, branch, j, now_ms).await?;
        tx.commit().await?;
        Ok(id.is_some())
    }

    /// Records a judgement in the caller's transaction; `None` when it was judged before.
    pub(crate) async fn record_revision_in(
        &self,
        tx: &mut WriteTx,
        branch: &str,
        j: &state_repo::revision::Judgement,
        now_ms: i64,
    ) -> Result<Option<i64>, LedgerError> {
        let verdict = if j.accepted() { "accepted" } else { "rejected" };
        let reasons = serde_json::to_string(&j.reasons)?;
        let row = sqlx::query(self.sql(
            "INSERT INTO revisions (sha, branch, verdict, principals, fingerprint, reasons, seen_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sha, branch) DO NOTHING RETURNING id",
        ))
        .bind(&j.sha)
        .bind(branch)
        .bind(verdict)
        .bind(j.principals.clone())
        .bind(j.fingerprint.clone())
        .bind(&reasons)
        .bind(now_ms)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let detail = if j.accepted() {
            j.principals.clone().unwrap_or_default()
        } else {
            j.reasons.iter().map(|x| x.code.as_str()).collect::<Vec<_>>().join(",")
        };
        let subject = format!("{branch}@{}", j.sha);
        self.event(tx, now_ms, &format!("revision-{verdict}"), &subject, &detail)
            .await?;
        Ok(Some(row.try_get(0)?))
    }

    /// The newest accepted commit of a branch: the one in force.
    pub async fn last_accepted(&self, branch: &str) -> Result<Option<String>, LedgerError> {
        self.branch_position(branch, "AND verdict = 'accepted'").await
    }

    /// The newest of `branch`'s revisions (those `filter` keeps) and of its approved rewrites
    /// applied again: a return to an earlier accepted commit puts that commit back in force.
    /// Two indexed reads of one row each, however long the history.
    async fn branch_position(&self, branch: &str, filter: &str) -> Result<Option<String>, LedgerError> {
        let q = format!("SELECT sha, seen_at FROM revisions WHERE branch = ? {filter} ORDER BY id DESC LIMIT 1");
        let judged = sqlx::query(self.sql(&q))
            .bind(branch)
            .fetch_optional(&self.pool)
            .await?;
        let again = sqlx::query(self.sql(
            "SELECT sha, applied_at FROM history_rewrites WHERE branch = ? AND applied_at IS NOT NULL \
             ORDER BY applied_at DESC, id DESC LIMIT 1",
        ))
        .bind(branch)
        .fetch_optional(&self.pool)
        .await?;
        let read = |r: Option<sqlx::any::AnyRow>| -> Result<Option<(String, i64)>, LedgerError> {
            r.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
        };
        Ok(match (read(judged)?, read(again)?) {
            (Some((sha, seen)), Some((again_sha, applied))) => Some(if applied >= seen { again_sha } else { sha }),
            (one, other) => one.or(other).map(|(sha, _)| sha),
        })
    }

    /// A judged commit's verdict and reason codes.
    pub async fn revision(&self, branch: &str, sha: &str) -> Result<Option<(String, Vec<String>)>, LedgerError> {
        let row = sqlx::query(self.sql("SELECT verdict, reasons FROM revisions WHERE branch = ? AND sha = ?"))
            .bind(branch)
            .bind(sha)
            .fetch_optional(&self.pool)
            .await?;
        let Some(r) = row else { return Ok(None) };
        let reasons: Vec<serde_json::Value> = serde_json::from_str(&r.try_get::<String, _>(1)?)?;
        Ok(Some((
            r.try_get(0)?,
            reasons
                .iter()
                .filter_map(|v| v["code"].as_str().map(str::to_owned))
                .collect(),
        )))
    }

    /// The newest commit of a branch judged at all, accepted or not.
    pub async fn last_judged(&self, branch: &str) -> Result<Option<String>, LedgerError> {
        self.branch_position(branch, "").await
    }

    /// Branches with deployments that are not torn down.
    pub async fn deployed_branches(&self) -> Result<Vec<String>, LedgerError> {
        let rows =
            sqlx::query(self.sql("SELECT DISTINCT branch FROM deployments WHERE action = 'rollout' ORDER BY branch"))
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| r.try_get(0).map_err(LedgerError::from)).collect()
    }

    /// Checks that the ledger answers.
    pub async fn ping(&self) -> Result<(), LedgerError> {
        sqlx::query(self.sql("SELECT 1")).fetch_one(&self.pool).await?;
        Ok(())
    }

    /// Tries to become the one daemon that reconciles. PostgreSQL: a session advisory lock on
    /// a connection of its own, held until that connection ends (a killed daemon's ends with
    /// it). SQLite: an exclusive lock on the file `<ledger>.leader` beside the database, held
    /// until the process ends, so a second daemon on the same file stands by.
    pub async fn try_lead(&self) -> Result<Option<LeaderLock>, LedgerError> {
        if self.backend == Backend::Sqlite {
            let Some(db) = &self.sqlite_path else {
                return Ok(Some(LeaderLock {
                    conn: None,
                    _file: None,
                }));
            };
            let mut name = db.clone().into_os_string();
            name.push(".leader");
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&name)
                .map_err(LedgerError::LeaderFile)?;
            return match file.try_lock() {
                Ok(()) => Ok(Some(LeaderLock {
                    conn: None,
                    _file: Some(file),
                })),
                Err(std::fs::TryLockError::WouldBlock) => Ok(None),
                Err(std::fs::TryLockError::Error(e)) => Err(LedgerError::LeaderFile(e)),
            };
        }
        let mut conn = self.pool.acquire().await?.detach();
        let got: bool = sqlx::query(self.sql("SELECT pg_try_advisory_lock(?)"))
            .bind(LEADER_LOCK_KEY)
            .fetch_one(&mut conn)
            .await?
            .try_get(0)?;
        Ok(got.then_some(LeaderLock {
            conn: Some(conn),
            _file: None,
        }))
    }

    /// Runs raw SQL (tests use it to show that history cannot be rewritten).
    pub async fn execute_raw(&self, sql: &str) -> Result<u64, LedgerError> {
        Ok(sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}
