//! Read-only views of the ledger for the operator API: the wire rows `pl status`, `pl jobs`,
//! `pl revisions` and the metrics show. Kept apart from the domain types on purpose.

use crate::store::LedgerError;
use serde::Serialize;
use sqlx::FromRow;
use state_schema::generations::Action;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
pub struct RevisionRow {
    pub id: i64,
    pub branch: String,
    pub sha: String,
    pub verdict: String,
    pub principals: Option<String>,
    /// JSON text: a list of `{code, message}`.
    pub reasons: String,
    pub seen_at_ms: i64,
}

#[derive(Clone, Debug, FromRow)]
pub struct JobRow {
    pub id: i64,
    pub key: String,
    pub target_node: String,
    pub state: String,
    pub attempts: i64,
    pub max_attempts: i64,
    pub environment: Option<String>,
    pub generation: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Why a failed or dead job failed: its last attempt's report (null for other states).
    pub reason: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentRow {
    pub environment: String,
    pub branch: String,
    pub generation: i64,
    pub action: String,
    pub status: String,
    pub step: i64,
    pub updated_at_ms: i64,
    /// Replicas Git asks for (every long-running role's `replicas`; none once torn down).
    pub asked: usize,
    /// Replicas this generation places (web and worker roles; none once torn down).
    pub replicas: usize,
    /// Of those, how many their nodes' agents last reported running and healthy at this
    /// generation, where they were placed: what is true on the hosts, not what was asked.
    pub running: usize,
    /// Replicas of the environment agents report running that this generation does not place
    /// there (another generation, or one scaled away): still to go.
    pub stale: usize,
    /// The generation that served before this one (what `pl rollback` goes back to); 0 for none.
    pub previous_generation: i64,
    /// Replicas (and release roles) no node had room for, each with its reason
    /// (`no-capacity`, `no-eligible-node`): asked for and not placed.
    pub waiting: Vec<state_schema::placement::Waiting>,
    /// A rollback's hold: while there is one, the environment differs from Git.
    pub hold: Option<crate::store::rollbacks::Hold>,
    /// How its current step stands (`step_state`, `step_due`): what a canary's standing is
    /// read from (`state_schema::rollout::advance::canary_standing`).
    #[serde(skip)]
    pub step_state: String,
    #[serde(skip)]
    pub step_due: i64,
    /// The percent of requests the new release has from its last canary step done.
    #[serde(skip)]
    pub share: i64,
    /// The commit that made this generation, and who signed it.
    #[serde(skip)]
    pub revision_sha: Option<String>,
    #[serde(skip)]
    pub signer: Option<String>,
    /// Each replica placed, and whether it runs.
    #[serde(skip)]
    pub placed: Vec<PlacedReplica>,
}

/// A revision as stored: its reasons are JSON text.
#[derive(FromRow)]
struct RevisionRecord {
    id: i64,
    branch: String,
    sha: String,
    verdict: String,
    principals: Option<String>,
    reasons: String,
    seen_at: i64,
}

#[derive(FromRow)]
struct DeploymentRecord {
    environment: String,
    branch: String,
    generation: i64,
    action: String,
    status: String,
    step: i64,
    updated_at: i64,
    spec: String,
    previous_generation: i64,
    hold: String,
    waiting: String,
    step_state: String,
    step_due: i64,
    share: i64,
    revision_sha: Option<String>,
    signer: Option<String>,
}

/// One generation of an environment as the ledger made it.
#[derive(Clone, Debug, FromRow)]
pub struct GenerationRow {
    pub generation: i64,
    pub action: String,
    pub created_at_ms: i64,
    pub sha: Option<String>,
    pub signer: Option<String>,
}

/// What the overview narrows deployments to; the default is every one.
#[derive(Clone, Debug, Default)]
pub struct DeploymentFilter {
    /// Names that hold this text ('' for any).
    pub contains: String,
    /// One status (`in-progress`, `done`, `failed`).
    pub status: Option<&'static str>,
    /// Only those a rollback holds.
    pub held: bool,
}

/// One replica a generation places, and whether its node's agent reports it running and
/// healthy there at that generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedReplica {
    pub node: String,
    pub role: String,
    pub index: u32,
    pub running: bool,
}

/// Counts for `pl status` and `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub jobs: BTreeMap<String, i64>,
    pub deployments: BTreeMap<String, i64>,
    pub revisions: BTreeMap<String, i64>,
    /// Age of the oldest job that is due and waiting, in milliseconds.
    pub queue_age_ms: i64,
    pub last_event: i64,
    /// When these were read.
    pub at_ms: i64,
}

impl crate::store::Views<'_> {
    /// Revisions newest first, before the id `before` (a page's `next`).
    pub async fn revisions(
        &self,
        branch: Option<&str>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<RevisionRow>, LedgerError> {
        let q = self.sql(
            "SELECT id, branch, sha, verdict, principals, reasons, seen_at FROM revisions WHERE (? = '' OR branch = ?) AND id < ? ORDER BY id DESC LIMIT ?",
        );
        let b = branch.unwrap_or("");
        let rows: Vec<RevisionRecord> = sqlx::query_as(q)
            .bind(b)
            .bind(b)
            .bind(before.unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| {
                Ok(RevisionRow {
                    id: r.id,
                    branch: r.branch,
                    sha: r.sha,
                    verdict: r.verdict,
                    principals: r.principals,
                    reasons: r.reasons,
                    seen_at_ms: r.seen_at,
                })
            })
            .collect()
    }

    /// Jobs newest first, before the id `before` (a page's `next`).
    pub async fn jobs(
        &self,
        state: Option<&str>,
        environment: Option<&str>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<JobRow>, LedgerError> {
        // One environment's jobs are found through its index (`jobs_by_step` leads with the
        // environment); `? = '' OR environment = ?` would scan every job for a rare one.
        let q = self.sql(if environment.is_some() {
            "SELECT id, key, target_node, state, attempts, max_attempts, environment, generation, \
             updated_at AS updated_at_ms, created_at AS created_at_ms, \
             CASE WHEN state IN ('failed', 'dead') THEN \
               (SELECT r.detail FROM job_results r WHERE r.job_id = jobs.id ORDER BY r.id DESC LIMIT 1) END AS reason \
             FROM jobs WHERE (? = '' OR state = ?) AND environment = ? AND environment = ? AND id < ? ORDER BY id DESC LIMIT ?"
        } else {
            "SELECT id, key, target_node, state, attempts, max_attempts, environment, generation, \
             updated_at AS updated_at_ms, created_at AS created_at_ms, \
             CASE WHEN state IN ('failed', 'dead') THEN \
               (SELECT r.detail FROM job_results r WHERE r.job_id = jobs.id ORDER BY r.id DESC LIMIT 1) END AS reason \
             FROM jobs WHERE (? = '' OR state = ?) AND ? = '' AND ? = '' AND id < ? ORDER BY id DESC LIMIT ?"
        });
        let (s, e) = (state.unwrap_or(""), environment.unwrap_or(""));
        Ok(sqlx::query_as(q)
            .bind(s)
            .bind(s)
            .bind(e)
            .bind(e)
            .bind(before.unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?)
    }

    /// Deployments by environment after `after` (a page's `next`), with what agents heard from
    /// since `now_ms - UNHEALTHY_AFTER_MS` report of their replicas.
    pub async fn deployments(
        &self,
        after: Option<&str>,
        limit: u32,
        now_ms: i64,
    ) -> Result<Vec<DeploymentRow>, LedgerError> {
        self.deployments_where(after, &DeploymentFilter::default(), limit, now_ms)
            .await
    }

    /// A page of deployments by name that match `filter` (the web view's overview).
    pub async fn deployments_where(
        &self,
        after: Option<&str>,
        filter: &DeploymentFilter,
        limit: u32,
        now_ms: i64,
    ) -> Result<Vec<DeploymentRow>, LedgerError> {
        // A name that holds the text, LIKE's wildcards in it taken as themselves.
        let escaped: String = filter
            .contains
            .chars()
            .flat_map(|c| match c {
                '%' | '_' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        let like = format!("%{escaped}%");
        let rows: Vec<DeploymentRecord> = sqlx::query_as(self.sql(
            "SELECT d.environment, d.branch, d.generation, d.action, d.status, d.step, d.updated_at, d.spec, d.previous_generation, \
             d.hold, d.waiting, d.step_state, d.step_due, d.share, r.sha AS revision_sha, r.principals AS signer \
             FROM deployments d LEFT JOIN revisions r ON r.id = d.revision_id WHERE d.environment > ? \
             AND (? = '' OR d.environment LIKE ? ESCAPE '\\') AND (? = '' OR d.status = ?) AND (? = 0 OR d.hold <> '') \
             ORDER BY d.environment LIMIT ?",
        ))
        .bind(after.unwrap_or(""))
        .bind(filter.contains.as_str())
        .bind(like)
        .bind(filter.status.unwrap_or(""))
        .bind(filter.status.unwrap_or(""))
        .bind(i64::from(filter.held))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        self.deployment_rows(rows, now_ms).await
    }

    /// One environment's deployment as [`Ledger::deployments`] shows it; `None` when it has none.
    pub async fn deployment(&self, environment: &str, now_ms: i64) -> Result<Option<DeploymentRow>, LedgerError> {
        let rows: Vec<DeploymentRecord> = sqlx::query_as(self.sql(
            "SELECT d.environment, d.branch, d.generation, d.action, d.status, d.step, d.updated_at, d.spec, d.previous_generation, \
             d.hold, d.waiting, d.step_state, d.step_due, d.share, r.sha AS revision_sha, r.principals AS signer \
             FROM deployments d LEFT JOIN revisions r ON r.id = d.revision_id WHERE d.environment = ?",
        ))
        .bind(environment)
        .fetch_all(&self.pool)
        .await?;
        Ok(self.deployment_rows(rows, now_ms).await?.pop())
    }

    async fn deployment_rows(
        &self,
        rows: Vec<DeploymentRecord>,
        now_ms: i64,
    ) -> Result<Vec<DeploymentRow>, LedgerError> {
        // What agents report, by environment: (node, role, index, generation, healthy).
        let mut seen: BTreeMap<String, Vec<(String, agent_proto::RunningInstance)>> = BTreeMap::new();
        let since = now_ms - state_schema::placement::UNHEALTHY_AFTER_MS;
        for (node, list) in self.nodes().observed_replicas(since).await? {
            for i in list {
                seen.entry(i.environment.clone()).or_default().push((node.clone(), i));
            }
        }
        rows.into_iter()
            .map(|r| {
                let (environment, generation) = (r.environment, r.generation);
                let (placed, asked) = match Action::parse(&r.action) {
                    Some(Action::Rollout) => serde_json::from_str::<crate::store::rows::Placed>(&r.spec)
                        .map(|p| (p.instances, p.replicas.values().map(|n| *n as usize).sum()))
                        .unwrap_or_default(),
                    Some(Action::Teardown) => (Vec::new(), 0),
                    None => {
                        return Err(LedgerError::Corrupt(format!(
                            "a deployment row's action is {:?}",
                            r.action
                        )));
                    }
                };
                let here = seen.get(&environment).map(Vec::as_slice).unwrap_or_default();
                let is_placed = |node: &str, i: &agent_proto::RunningInstance| {
                    i64::try_from(i.generation).is_ok_and(|g| g == generation)
                        && placed
                            .iter()
                            .any(|p| p.node.as_str() == node && p.role.as_str() == i.role && p.index == i.instance)
                };
                let running = here.iter().filter(|(n, i)| i.healthy && is_placed(n, i)).count();
                let placed_replicas = placed
                    .iter()
                    .map(|p| PlacedReplica {
                        node: p.node.to_string(),
                        role: p.role.to_string(),
                        index: p.index,
                        running: here.iter().any(|(n, i)| {
                            i.healthy
                                && n.as_str() == p.node.as_str()
                                && i.role == p.role.as_str()
                                && i.instance == p.index
                                && i64::try_from(i.generation).is_ok_and(|g| g == generation)
                        }),
                    })
                    .collect();
                let stale = here.iter().filter(|(n, i)| i.healthy && !is_placed(n, i)).count();
                Ok(DeploymentRow {
                    environment,
                    branch: r.branch,
                    generation,
                    action: r.action,
                    status: r.status,
                    step: r.step,
                    updated_at_ms: r.updated_at,
                    asked,
                    replicas: placed.len(),
                    running,
                    stale,
                    previous_generation: r.previous_generation,
                    waiting: serde_json::from_str(&r.waiting)
                        .map_err(|e| LedgerError::Corrupt(format!("a deployment's waiting replicas: {e}")))?,
                    hold: crate::store::rollbacks::Hold::parse(&r.hold)?,
                    step_state: r.step_state,
                    step_due: r.step_due,
                    share: r.share,
                    revision_sha: r.revision_sha,
                    signer: r.signer,
                    placed: placed_replicas,
                })
            })
            .collect()
    }

    /// An environment's generations, newest first: each with the commit that made it and its
    /// signer.
    pub async fn generations(&self, environment: &str, limit: u32) -> Result<Vec<GenerationRow>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT g.generation, g.action, g.created_at AS created_at_ms, r.sha, r.principals AS signer \
             FROM deployment_generations g LEFT JOIN revisions r ON r.id = g.revision_id \
             WHERE g.environment = ? ORDER BY g.generation DESC LIMIT ?",
        ))
        .bind(environment)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    /// The newest event a cursor may pass (see [`Ledger::event_horizon`]); 0 when there is
    /// none yet.
    pub async fn last_event_id(&self) -> Result<i64, LedgerError> {
        Ok(self.events().event_horizon().await?.unwrap_or(0))
    }

    pub async fn counts(&self, now_ms: i64) -> Result<Counts, LedgerError> {
        let mut c = Counts {
            at_ms: now_ms,
            ..Counts::default()
        };
        for (sql, into) in [
            ("SELECT state, COUNT(*) FROM jobs GROUP BY state", &mut c.jobs),
            (
                "SELECT action || '-' || status, COUNT(*) FROM deployments GROUP BY action, status",
                &mut c.deployments,
            ),
            (
                "SELECT verdict, COUNT(*) FROM revisions GROUP BY verdict",
                &mut c.revisions,
            ),
        ] {
            into.extend(
                sqlx::query_as::<_, (String, i64)>(self.sql(sql))
                    .fetch_all(&self.pool)
                    .await?,
            );
        }
        let oldest: Option<i64> = sqlx::query_scalar(
            self.sql("SELECT MIN(not_before) FROM jobs WHERE state = 'queued' AND held = 0 AND not_before <= ?"),
        )
        .bind(now_ms)
        .fetch_one(&self.pool)
        .await?;
        c.queue_age_ms = oldest.map_or(0, |o| (now_ms - o).max(0));
        c.last_event = sqlx::query_scalar(self.sql("SELECT COALESCE(MAX(id), 0) FROM events"))
            .fetch_one(&self.pool)
            .await?;
        Ok(c)
    }
}
