//! The counters metrics are made of (`tallies`, migration 0032): added to in the transaction
//! that records what they count, each as its total and in its UTC hour; the totals read for
//! `/metrics`, the hours of the last day for `pl status`, hours past [`KEPT_HOURS`] deleted.
//! Their rows' layout is here too: the families, a job's task kind read from its key (as
//! `rows` reads other keys), a histogram's bucket; every label from a closed set, no name a
//! user or an agent chooses.

use super::{LedgerError, WriteTx};
use std::collections::BTreeMap;

/// How many hours of counts are kept (8 days: a week's SLO window and a day to spare).
pub const KEPT_HOURS: i64 = 8 * 24;
const HOUR_MS: i64 = 3_600_000;

/// One counter: its family, its labels (`|`-separated values from closed sets), its total
/// (or its count in an hour).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Tally {
    pub family: String,
    pub labels: String,
    pub value: i64,
}

impl WriteTx {
    /// Adds to counters, (family, labels) → how many, in this transaction: their totals and
    /// their counts in `now_ms`'s hour, written when it commits (one statement for all of a
    /// transaction's counts).
    pub(crate) fn tally(&mut self, now_ms: i64, adds: &BTreeMap<(&'static str, &str), i64>) {
        let hour = now_ms.div_euclid(HOUR_MS);
        for ((family, labels), n) in adds {
            self.count(family, labels, hour, *n);
        }
    }

    /// Adds one to a counter in this transaction.
    pub(crate) fn tally_one(&mut self, now_ms: i64, family: &'static str, labels: &str) {
        self.count(family, labels, now_ms.div_euclid(HOUR_MS), 1);
    }
}

impl crate::store::Events<'_> {
    /// Adds one to a counter on its own, right after what it counts was recorded (an
    /// operator's abort, whose rollback ask records it).
    pub async fn tally(&self, now_ms: i64, family: &'static str, labels: &str) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        tx.tally_one(now_ms, family, labels);
        tx.commit().await?;
        Ok(())
    }

    /// Every counter's total.
    pub async fn tallies(&self) -> Result<Vec<Tally>, LedgerError> {
        Ok(sqlx::query_as(
            self.sql("SELECT family, labels, value FROM tallies WHERE hour = -1 ORDER BY family, labels"),
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Every counter's count over the hours since `since_ms`'s (its hour included).
    pub async fn tallies_since(&self, since_ms: i64) -> Result<Vec<Tally>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT family, labels, CAST(SUM(value) AS BIGINT) AS value FROM tallies WHERE hour >= ? \
             GROUP BY family, labels ORDER BY family, labels",
        ))
        .bind(since_ms.div_euclid(HOUR_MS))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Deletes the hours older than [`KEPT_HOURS`] before `now_ms` (the totals stay); how many.
    pub async fn forget_old_hours(&self, now_ms: i64) -> Result<u64, LedgerError> {
        let oldest = now_ms.div_euclid(HOUR_MS) - KEPT_HOURS;
        Ok(
            sqlx::query(self.sql("DELETE FROM tallies WHERE hour >= 0 AND hour < ?"))
                .bind(oldest)
                .execute(&self.pool)
                .await?
                .rows_affected(),
        )
    }
}

/// The families the ledger counts.
pub const EVENTS: &str = "events";
pub const JOBS: &str = "jobs";
pub const COMMIT_TO_LIVE: &str = "commit_to_live";
pub const ROUTE_PUBLICATION: &str = "route_publication";
/// Rollouts of a release by an outcome no event kind says alone: `completed` (a release, not
/// a rollback, done), `gate-failed` (a canary's gates failed it), `aborted` (an operator's).
pub const ROLLOUTS: &str = "rollouts";
/// A histogram's sum (in milliseconds) is counted under its family with this label.
pub const SUM_MS: &str = "sum_ms";

/// Commit to live, in seconds: the SLO's 10 minutes is a bound.
pub const COMMIT_TO_LIVE_BOUNDS: &[u64] = &[15, 30, 60, 120, 300, 600, 1200, 1800, 3600];
/// A route's publication, in seconds: the SLO's 120 s is a bound.
pub const ROUTE_PUBLICATION_BOUNDS: &[u64] = &[1, 2, 5, 10, 30, 60, 120, 300, 600];

/// Every task kind a job's key names (`net-ensure`, `app-ensure`, `ingress-publish`, …), sorted.
pub const JOB_KINDS: &[&str] = &[
    "acme-place",
    "app-ensure",
    "app-stop",
    "app-teardown",
    "backup-save",
    "backup-verify",
    "cron-run",
    "drill-save",
    "drill-verify",
    "env-ensure",
    "fw-apply",
    "ingress-measure",
    "ingress-publish",
    "ingress-remove",
    "net-ensure",
    "net-remove",
    "once-run",
    "routes-ensure",
    "vol-remove",
    "vol-restore",
];

/// The `le` label of the bucket `ms` falls in: the smallest bound at or above it, in
/// seconds, else `+Inf`.
pub fn bucket(ms: i64, bounds: &[u64]) -> String {
    bounds
        .iter()
        .find(|b| ms <= (**b as i64).saturating_mul(1000))
        .map_or("+Inf".to_owned(), |b| b.to_string())
}

/// A job's task kind, from its key (`app:env/web/0:g3:ensure#r1@n1` is `app-ensure`): the part
/// before the first `:` and the verb after the last, without a repair's, a share's or a
/// node's suffix.
/// `other` for a key of no known kind.
pub fn job_kind(key: &str) -> &'static str {
    let prefix = key.split(':').next().unwrap_or_default();
    let verb = key.rsplit(':').next().unwrap_or_default();
    let verb = verb.split(['#', '/', '@']).next().unwrap_or_default();
    let kind = format!("{prefix}-{verb}");
    JOB_KINDS
        .binary_search(&kind.as_str())
        .map_or("other", |i| JOB_KINDS[i])
}

/// Whether an event of `kind` is counted by kind: all but a single job's and a lease's (the
/// jobs are counted by kind, outcome and code instead, and those are most of the events).
pub fn counted_event(kind: &str) -> bool {
    !(kind.starts_with("job-") || kind == "jobs-leased" || kind == "lease-expired")
}

/// A job's counted end: `kind|outcome|code` (`code` is the failure's, from a closed list, or
/// `none` for a success, `other` for a code not in it).
pub fn job_labels(key: &str, outcome: &str, code: Option<&'static str>, failed: bool) -> String {
    let code = match (failed, code) {
        (false, _) => "none",
        (true, Some(c)) => c,
        (true, None) => "other",
    };
    format!("{}|{outcome}|{code}", job_kind(key))
}

/// Whether a job with this key publishes a hostname's routes (its time to success is a route
/// publication's).
pub fn publishes_routes(key: &str) -> bool {
    job_kind(key) == "ingress-publish"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_from_every_key_shape() {
        assert!(JOB_KINDS.windows(2).all(|w| w[0] < w[1]), "sorted");
        for (key, kind) in [
            ("net:shop:g3:ensure", "net-ensure"),
            ("env:shop:g3:ensure@n1", "env-ensure"),
            ("app:shop/web/0:g3:ensure#r2", "app-ensure"),
            ("app:shop/web/0:g3:ensure@n1", "app-ensure"),
            ("ingress:shop/a.example:g3:publish@n2", "ingress-publish"),
            ("app:shop/web/0:g3:teardown", "app-teardown"),
            ("ingress:shop/a.example:g3:publish/w10", "ingress-publish"),
            ("ingress:shop/a.example:g3:publish/b2-out", "ingress-publish"),
            ("ingress:shop/a.example:g3:publish#r1", "ingress-publish"),
            ("ingress:shop/a.example:g3:measure/w10", "ingress-measure"),
            ("cron:shop/nightly:t1700:run", "cron-run"),
            ("backup:shop/db:t1700:save", "backup-save"),
            ("vol:shop/db:v2:t17:restore", "vol-restore"),
            ("acme:shop/a.example:tok:place", "acme-place"),
            ("nonsense", "other"),
            ("app:x:g1:explode", "other"),
        ] {
            assert_eq!(job_kind(key), kind, "{key}");
        }
    }

    #[test]
    fn times_fall_in_the_smallest_bucket_that_holds_them() {
        assert_eq!(bucket(0, COMMIT_TO_LIVE_BOUNDS), "15");
        assert_eq!(bucket(600_000, COMMIT_TO_LIVE_BOUNDS), "600");
        assert_eq!(bucket(600_001, COMMIT_TO_LIVE_BOUNDS), "1200");
        assert_eq!(bucket(9_999_999, COMMIT_TO_LIVE_BOUNDS), "+Inf");
    }

    #[test]
    fn a_jobs_end_is_counted_with_closed_labels() {
        assert_eq!(
            job_labels("app:s/web/0:g1:ensure", "failed", Some("health-deadline"), true),
            "app-ensure|failed|health-deadline"
        );
        assert_eq!(
            job_labels("app:s/web/0:g1:ensure", "failed", None, true),
            "app-ensure|failed|other"
        );
        assert_eq!(
            job_labels("net:s:g1:ensure", "succeeded", None, false),
            "net-ensure|succeeded|none"
        );
        assert!(counted_event("deployment-failed") && !counted_event("job-failed") && !counted_event("jobs-leased"));
        assert!(publishes_routes("ingress:s/h:g1:publish") && !publishes_routes("ingress:s/h:g1:measure/w5"));
    }
}
