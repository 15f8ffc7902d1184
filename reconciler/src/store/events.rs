//! The append-only event stream: writing events in a transaction, reading them after a cursor,
//! and the horizon a cursor may not pass (PostgreSQL commits ids out of order).

use super::{Backend, LedgerError, WriteTx};
use sqlx::FromRow;

#[derive(Clone, Debug, PartialEq, Eq, FromRow)]
pub struct Event {
    pub id: i64,
    pub at_ms: i64,
    pub kind: String,
    pub subject: String,
    pub detail: String,
}

/// How many of the newest events a timeline filter no index serves reads at most.
pub const SCANNED: i64 = 100_000;

/// The generation a deployment event's detail names (`generation 7, …`), as the events are
/// written (docs/reconciler.md, "Events").
pub fn generation_in(detail: &str) -> Option<i64> {
    let rest = detail.strip_prefix("generation ")?;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

impl crate::store::Events<'_> {
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

    /// Records one event on its own: an operator's ask that writes nothing else (a reconcile
    /// asked from the web view, a sign-in).
    pub async fn record(&self, now_ms: i64, kind: &str, subject: &str, detail: &str) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        self.event(&mut tx, now_ms, kind, subject, detail).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Appends events, (kind, subject, detail), in the caller's transaction, many rows a
    /// statement. The one way events are written.
    pub(crate) async fn events_in(
        &self,
        tx: &mut WriteTx,
        now_ms: i64,
        events: &[(String, String, String)],
    ) -> Result<(), LedgerError> {
        if events.is_empty() {
            return Ok(());
        }
        // Counted by kind in the same transaction (`store::tallies`).
        let mut counted: std::collections::BTreeMap<(&str, &str), i64> = std::collections::BTreeMap::new();
        for (kind, _, _) in events.iter().filter(|(k, _, _)| super::tallies::counted_event(k)) {
            *counted.entry((super::tallies::EVENTS, kind.as_str())).or_default() += 1;
        }
        tx.tally(now_ms, &counted);
        if self.backend == super::Backend::Postgres {
            // One statement text for any number of events (see `IdSet`), in their order.
            sqlx::query(self.sql(
                "INSERT INTO events (at, kind, subject, detail) \
                 SELECT ?, e->>0, e->>1, e->>2 FROM json_array_elements(?::json) WITH ORDINALITY AS t(e, n) ORDER BY n",
            ))
            .bind(now_ms)
            .bind(serde_json::to_string(events)?)
            .execute(&mut **tx)
            .await?;
            return Ok(());
        }
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
        Ok(sqlx::query_as(self.sql(
            "SELECT id, at AS at_ms, kind, subject, detail FROM events WHERE id > ? AND id <= ? ORDER BY id LIMIT ?",
        ))
        .bind(cursor)
        .bind(horizon)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Events newest first, before a cursor (`None`: the newest), of one kind and one subject
    /// when named: the web view's timeline. Only ids up to the horizon, as `events_after`, and
    /// among the [`SCANNED`] ids below the cursor: a filter no index serves (a rare kind, a
    /// job's key) reads at most that many a request. Also returns the highest id not looked at
    /// (0 when the scan reached the first event): the next page starts there.
    pub async fn recent(
        &self,
        before: Option<i64>,
        kind: Option<&str>,
        subject: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<Event>, i64), LedgerError> {
        let Some(horizon) = self.event_horizon().await? else {
            return Ok((Vec::new(), 0));
        };
        let top = before.map_or(horizon, |b| (b - 1).min(horizon));
        let floor = (top - SCANNED).max(0);
        let rows = sqlx::query_as(self.sql(
            "SELECT id, at AS at_ms, kind, subject, detail FROM events WHERE id <= ? AND id > ? \
             AND (? = '' OR kind = ?) AND (? = '' OR subject = ?) ORDER BY id DESC LIMIT ?",
        ))
        .bind(top)
        .bind(floor)
        .bind(kind.unwrap_or(""))
        .bind(kind.unwrap_or(""))
        .bind(subject.unwrap_or(""))
        .bind(subject.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok((rows, floor))
    }

    /// One environment's events newest first (what its page lists), through
    /// `events_by_subject` (migration 0030), whose condition the query repeats so both
    /// backends use it: an environment has no event of a single job or lease.
    pub async fn of_environment(&self, environment: &str, limit: u32) -> Result<Vec<Event>, LedgerError> {
        let Some(horizon) = self.event_horizon().await? else {
            return Ok(Vec::new());
        };
        Ok(sqlx::query_as(self.sql(
            "SELECT id, at AS at_ms, kind, subject, detail FROM events WHERE subject = ? AND id <= ? \
             AND kind NOT LIKE 'job-%' AND kind <> 'jobs-leased' AND kind <> 'lease-expired' ORDER BY id DESC LIMIT ?",
        ))
        .bind(environment)
        .bind(horizon)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    /// When each of an environment's newest generations was live on every replica: the
    /// `deployment-rollout-done` events' times and generations, newest first (a rollback's own
    /// generation left out).
    pub async fn lived(&self, environment: &str, limit: u32) -> Result<Vec<(i64, i64)>, LedgerError> {
        let rows: Vec<(i64, String)> = sqlx::query_as(self.sql(
            "SELECT at, detail FROM events WHERE subject = ? AND kind = 'deployment-rollout-done' \
             AND kind NOT LIKE 'job-%' AND kind <> 'jobs-leased' AND kind <> 'lease-expired' ORDER BY id DESC LIMIT ?",
        ))
        .bind(environment)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter(|(_, d)| !d.contains(", a rollback"))
            .filter_map(|(at, d)| Some((generation_in(&d)?, at)))
            .collect())
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
                sqlx::query_scalar(self.sql("SELECT COALESCE(MAX(id), 0) FROM events"))
                    .fetch_one(&self.pool)
                    .await?,
            ));
        }
        // The largest visible id, and every transaction that holds an id now. A transaction
        // takes its id (and with it the lock on that id that `pg_locks` lists at once, unlike a
        // snapshot, which leaves out ids newer than the last one completed) before its first
        // event id; so any event below `max` that is not visible yet belongs to one of these.
        let (max, writers): (i64, String) = sqlx::query_as(self.sql(
            "SELECT COALESCE((SELECT MAX(id) FROM events), 0), \
             (SELECT COALESCE(string_agg(transactionid::text, ','), '') FROM pg_locks \
              WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted)",
        ))
        .fetch_one(&self.pool)
        .await?;
        if writers.is_empty() {
            return Ok(Some(max));
        }
        // Most writers end within milliseconds. A transaction's lock goes only after new
        // snapshots see it committed, so once these locks are gone every id up to `max` is
        // visible (or never will be).
        for wait_ms in [0u64, 1, 2, 5, 10, 20, 50, 100, 200, 500] {
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
            let running: i64 = sqlx::query_scalar(self.sql(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' \
                 AND transactionid::text = ANY(string_to_array(?, ','))",
            ))
            .bind(&writers)
            .fetch_one(&self.pool)
            .await?;
            if running == 0 {
                return Ok(Some(max));
            }
        }
        Ok(None)
    }
}
