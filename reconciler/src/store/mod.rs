//! The durable job ledger, on SQLite (one file, WAL; the embedded default) or PostgreSQL (HA
//! and scale), with one code path through sqlx's `Any` driver and the same tests for both.
//!
//! A lease stamps jobs with a lease token and a fencing token that only grows for that job
//! (each lease of it takes the next). Renewals and completions must present both; a stale pair
//! is refused and records nothing. Results and events are append-only, enforced by triggers in the schema.

pub mod backups;
pub mod certificates;
mod complete;
mod cron;
pub(crate) mod deployments;
pub mod domains;
mod drift;
pub mod events;
pub mod fleet;
mod handles;
mod image_refs;
mod image_work;
mod jobs;
pub mod kept;
mod lease;
pub mod mesh;
pub mod moves;
pub mod outbox;
pub mod placement;
pub mod releases;
mod revisions;
pub mod rewrites;
pub mod rollbacks;
pub mod rollouts;
pub mod rows;
mod sealing;
pub mod sessions;
pub mod snapshots;
pub mod tallies;
pub mod views;
pub mod volumes;
pub mod wakes;
pub mod watch;
mod writer;

/// Milliseconds since the Unix epoch: the ledger's unit of time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A ledger time (Unix ms) as people read it in events: `2026-12-05 10:30 UTC`.
pub fn utc(ms: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)) {
        Ok(t) => format!("{} {:02}:{:02} UTC", t.date(), t.hour(), t.minute()),
        Err(_) => format!("{ms} ms after 1970"),
    }
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn ledger_times_read_as_dates() {
        assert_eq!(super::utc(1_799_054_026_071), "2027-01-04 09:13 UTC");
        assert_eq!(super::utc(0), "1970-01-01 00:00 UTC");
    }
}

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use complete::Ends;
pub use events::Event;
pub use handles::{
    Backups, Certificates, Deployments, Domains, Events, Jobs, Nodes, Revisions, Sessions, Views, Volumes,
};
pub(crate) use jobs::JobRow;
pub use jobs::{Completion, Lease, LeaseToken, Measure, NewJob, Outcome, Refused, backoff_ms, job_key};

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
    #[error("a row holds what the ledger never writes: {0}")]
    Corrupt(String),
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
    /// SQLite has one writer: this process's write transactions queue here, in order, instead
    /// of meeting `SQLITE_BUSY` and sleeping in SQLite's busy handler (1, 2, 5, 10… ms).
    writer: Arc<tokio::sync::Mutex<()>>,
    /// The control plane's id, read (or made) once ([`Ledger::control_plane`]).
    control_plane: tokio::sync::OnceCell<String>,
    /// This connection's own name among the replicas that share the ledger (random): what
    /// it announces to them is signed with it, so that it does not wake itself (`wakes`).
    instance: String,
    /// PostgreSQL's address, for the one connection that listens for the other replicas'
    /// wakes (`wakes`). It may hold a password: never logged or shown.
    listen_url: Option<String>,
}

/// A write transaction; on SQLite it holds the process's writer turn until it ends.
pub struct WriteTx {
    tx: sqlx::Transaction<'static, sqlx::Any>,
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    backend: Backend,
    /// What the transaction adds to the metrics' counters, by (family, labels, hour): written
    /// in one statement at commit (`tallies`), so a pass that records thousands of events
    /// pays one upsert, not one per call.
    tallies: BTreeMap<(&'static str, String, i64), i64>,
    /// Who began it and when it got the writer: how long each caller holds SQLite's one writer
    /// is what a fleet's leases wait behind (`PL_LOG=reconciler::store=debug`).
    began: (&'static std::panic::Location<'static>, std::time::Instant),
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

/// Ids in a statement. PostgreSQL takes them as one array parameter (`id = ANY(?::int8[])`),
/// so the statement's text is the same for any number of them and is parsed and planned once
/// per connection; a list of `?` of each length was a new statement to parse, describe and
/// plan, in the group committer's path. SQLite prepares cheaply and takes the list.
pub(crate) enum IdSet {
    Each(Vec<i64>),
    Array(String),
}

impl IdSet {
    /// The condition on `column`.
    pub(crate) fn condition(&self, column: &str) -> String {
        match self {
            IdSet::Each(ids) => format!("{column} IN ({})", vec!["?"; ids.len()].join(", ")),
            IdSet::Array(_) => format!("{column} = ANY(?::int8[])"),
        }
    }

    /// Binds the ids where [`IdSet::condition`] put them.
    pub(crate) fn bind<Q: BindIds>(&self, q: Q) -> Q {
        match self {
            IdSet::Each(ids) => ids.iter().fold(q, |q, id| q.bind_id(*id)),
            IdSet::Array(a) => q.bind_text(a.clone()),
        }
    }
}

/// A statement [`IdSet::bind`] can bind to: a query with rows or without.
pub(crate) trait BindIds: Sized {
    fn bind_id(self, id: i64) -> Self;
    fn bind_text(self, text: String) -> Self;
}

impl<'q> BindIds for sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    fn bind_id(self, id: i64) -> Self {
        self.bind(id)
    }
    fn bind_text(self, text: String) -> Self {
        self.bind(text)
    }
}

impl<'q, O> BindIds for sqlx::query::QueryAs<'q, sqlx::Any, O, sqlx::any::AnyArguments> {
    fn bind_id(self, id: i64) -> Self {
        self.bind(id)
    }
    fn bind_text(self, text: String) -> Self {
        self.bind(text)
    }
}

/// `q` with PostgreSQL's numbered placeholders (`$1`) for `?`; as it is for SQLite.
fn placeholders(backend: Backend, q: &str) -> Cow<'_, str> {
    if backend == Backend::Sqlite {
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

impl WriteTx {
    /// Adds `n` to a counter in `hour` (and its total, at commit).
    pub(super) fn count(&mut self, family: &'static str, labels: &str, hour: i64, n: i64) {
        *self.tallies.entry((family, labels.to_owned(), hour)).or_default() += n;
    }

    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        if !self.tallies.is_empty() {
            let tallies = std::mem::take(&mut self.tallies);
            // Each hour's count, and the totals (hour -1) summed over the transaction's hours.
            let mut totals: BTreeMap<(&str, &str), i64> = BTreeMap::new();
            for ((family, labels, _), n) in &tallies {
                *totals.entry((family, labels.as_str())).or_default() += n;
            }
            let rows: Vec<(&str, &str, i64, i64)> = tallies
                .iter()
                .map(|((f, l, h), n)| (*f, l.as_str(), *h, *n))
                .chain(totals.iter().map(|((f, l), n)| (*f, *l, -1, *n)))
                .collect();
            let marks = vec!["(?, ?, ?, ?)"; rows.len()].join(", ");
            let q = format!(
                "INSERT INTO tallies (family, labels, hour, value) VALUES {marks} \
                 ON CONFLICT (family, labels, hour) DO UPDATE SET value = tallies.value + excluded.value"
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(placeholders(self.backend, &q).into_owned()));
            for (family, labels, hour, n) in rows {
                query = query.bind(family).bind(labels).bind(hour).bind(n);
            }
            query.execute(&mut *self.tx).await?;
        }
        let (at, since) = self.began;
        let committed = self.tx.commit().await;
        tracing::debug!(at = %at, ms = since.elapsed().as_secs_f64() * 1000.0, "write transaction committed");
        committed
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
        let mut instance = [0u8; 8];
        getrandom::fill(&mut instance).map_err(|e| LedgerError::Random(e.to_string()))?;
        Ok(Ledger {
            pool,
            backend,
            sqlite_path,
            writer: Arc::default(),
            control_plane: tokio::sync::OnceCell::new(),
            instance: hex::encode(instance),
            listen_url: (backend == Backend::Postgres).then(|| url.into_owned()),
        })
    }

    /// The control plane's id: 8 hex digits from the OS random source, made by the first daemon
    /// that asks (two asking at once keep the first one written) and the same for every daemon
    /// of this ledger ever after. Every host object an agent makes names it.
    pub async fn control_plane(&self) -> Result<String, LedgerError> {
        self.control_plane_or(None).await
    }

    /// The control plane's id, `preferred` written when the ledger holds none yet (a
    /// configuration that pins its id): the id the ledger holds, for the caller to compare.
    pub async fn control_plane_or(&self, preferred: Option<&str>) -> Result<String, LedgerError> {
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
                let id = match preferred {
                    Some(id) => id.to_owned(),
                    None => {
                        let mut bytes = [0u8; agent_proto::CONTROL_PLANE_ID_LEN / 2];
                        getrandom::fill(&mut bytes).map_err(|e| LedgerError::Random(e.to_string()))?;
                        hex::encode(bytes)
                    }
                };
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

    /// A consistent copy of a SQLite ledger at `dest` while it serves (`VACUUM INTO`: one read
    /// transaction, a compacted file); `dest` must not exist. `Corrupt` on PostgreSQL, whose
    /// copy is `pg_dump`'s (`snapshot`).
    pub async fn copy_into(&self, dest: &std::path::Path) -> Result<(), LedgerError> {
        if self.backend != Backend::Sqlite {
            return Err(LedgerError::Corrupt("a PostgreSQL ledger is copied by pg_dump".into()));
        }
        let dest = dest
            .to_str()
            .ok_or_else(|| LedgerError::Corrupt("the copy's path is not UTF-8".into()))?;
        sqlx::query("VACUUM INTO ?").bind(dest).execute(&self.pool).await?;
        Ok(())
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
    #[track_caller]
    pub(crate) fn write_tx(&self) -> impl Future<Output = Result<WriteTx, sqlx::Error>> + Send + '_ {
        // Taken here, not in the future: `track_caller` names the caller of a plain fn only.
        let at = std::panic::Location::caller();
        async move {
            match self.backend {
                Backend::Sqlite => {
                    let turn = Arc::clone(&self.writer).lock_owned().await;
                    Ok(WriteTx {
                        tx: self.pool.begin_with("BEGIN IMMEDIATE").await?,
                        _turn: Some(turn),
                        backend: Backend::Sqlite,
                        tallies: BTreeMap::new(),
                        began: (at, std::time::Instant::now()),
                    })
                }
                Backend::Postgres => Ok(WriteTx {
                    tx: self.pool.begin().await?,
                    _turn: None,
                    backend: Backend::Postgres,
                    tallies: BTreeMap::new(),
                    began: (at, std::time::Instant::now()),
                }),
            }
        }
    }

    /// A migrated SQLite ledger in `dir`, and its URL (for a second connection), for tests.
    #[cfg(test)]
    pub(crate) async fn sqlite_in(dir: &std::path::Path) -> (Ledger, String) {
        let url = format!("sqlite://{}", dir.join("ledger.db").display());
        let ledger = Ledger::connect(&url, 2).await.expect("ledger");
        ledger.migrate().await.expect("migrate");
        (ledger, url)
    }

    /// `column` is one of the strings of a JSON array bound where this condition stands: one
    /// statement text for any number of them, on both ledgers.
    pub(crate) fn text_in(&self, column: &str) -> String {
        match self.backend {
            Backend::Sqlite => format!("{column} IN (SELECT value FROM json_each(?))"),
            Backend::Postgres => format!("{column} IN (SELECT json_array_elements_text(?::json))"),
        }
    }

    /// A set of ids for `WHERE id …`: see [`IdSet`].
    pub(crate) fn id_set(&self, ids: impl Iterator<Item = i64>) -> IdSet {
        let ids: Vec<i64> = ids.collect();
        match self.backend {
            Backend::Sqlite => IdSet::Each(ids),
            Backend::Postgres => IdSet::Array(format!(
                "{{{}}}",
                ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
            )),
        }
    }

    /// The statement for this backend: `?` placeholders become `$1, $2, …` for PostgreSQL.
    /// Statements are this file's constants; values always go through bind parameters.
    pub(crate) fn sql(&self, q: &str) -> sqlx::SqlStr {
        sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(self.placeholders(q).into_owned()))
    }

    fn placeholders<'q>(&self, q: &'q str) -> Cow<'q, str> {
        placeholders(self.backend, q)
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
        let got: bool = sqlx::query_scalar(self.sql("SELECT pg_try_advisory_lock(?)"))
            .bind(LEADER_LOCK_KEY)
            .fetch_one(&mut conn)
            .await?;
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
