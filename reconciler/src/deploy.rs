//! Turning judged commits into deployments and jobs, and moving rollouts forward step by step.
//!
//! Each accepted commit is written in one transaction: the revision, the desired objects, the
//! deployments with their generations, the first step's jobs and the events. The plan compares
//! the desired state with what the ledger holds (never with the previous commit), so a replay
//! writes nothing. `advance` is level-triggered: it looks at every unfinished deployment and
//! queues the next step once the current one has succeeded.

use crate::ledger::{JobRow, Ledger, LedgerError};
use crate::revision::Judgement;
use sqlx::Row;
use state_schema::canonical::{self, Secrets};
use state_schema::desired::{self, DeploymentSpec, Desired, Step};
use state_schema::values::Name;
use std::collections::{BTreeMap, BTreeSet};

/// How many attempts a job gets before it is dead.
pub const MAX_ATTEMPTS: u32 = 5;

type Tx = sqlx::Transaction<'static, sqlx::Any>;

/// What applying one commit did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// `false` when the commit was judged before: nothing was written.
    pub recorded: bool,
    pub rollouts: Vec<(String, u64)>,
    pub teardowns: Vec<(String, u64)>,
    pub jobs_queued: usize,
}

/// A deployment row as the planner needs it.
struct Row0 {
    branch: String,
    generation: i64,
    action: String,
    spec_hash: String,
    spec: DeploymentSpec,
    retired: Vec<DeploymentSpec>,
}

fn steps_of(action: &str, env: &Name, generation: u64, spec: &DeploymentSpec, retired: &[DeploymentSpec]) -> Vec<Step> {
    if action == "teardown" {
        let mut running = retired.to_vec();
        running.push(spec.clone());
        desired::teardown_steps(env, generation, &running)
    } else {
        desired::rollout_steps(spec, generation, retired)
    }
}

fn gen_u64(g: i64) -> u64 {
    u64::try_from(g).unwrap_or(0)
}

impl Ledger {
    /// Records `j` for `branch` and, when accepted, plans its deployments against the ledger
    /// and writes them with their first jobs, all in one transaction. `preview` names the
    /// branch when it is a preview branch (its environments are derived per project).
    pub async fn apply_revision(
        &self,
        branch: &str,
        preview: bool,
        j: &Judgement,
        now_ms: i64,
    ) -> Result<Applied, LedgerError> {
        let mut tx = self.write_tx().await?;
        let Some(revision) = self.record_revision_in(&mut tx, branch, j, now_ms).await? else {
            return Ok(Applied::default());
        };
        let mut applied = Applied {
            recorded: true,
            ..Applied::default()
        };
        if j.accepted() {
            self.write_objects(&mut tx, branch, j, revision).await?;
            let (wanted, unplaceable) = desired::deployments(&j.state.state, preview.then_some(branch));
            for u in &unplaceable {
                self.event(
                    &mut tx,
                    now_ms,
                    "deployment-unplaceable",
                    u.environment.as_str(),
                    &u.reason,
                )
                .await?;
            }
            let kept: BTreeSet<Name> = unplaceable.into_iter().map(|u| u.environment).collect();
            self.plan_branch(&mut tx, branch, &wanted, &kept, revision, now_ms, &mut applied)
                .await?;
        }
        tx.commit().await?;
        Ok(applied)
    }

    /// Tears down every deployment of a branch that is gone (a deleted preview branch). The
    /// history stays. Returns the teardowns started.
    pub async fn teardown_branch(&self, branch: &str, now_ms: i64) -> Result<Applied, LedgerError> {
        let mut tx = self.write_tx().await?;
        let revision: Option<i64> = sqlx::query(
            self.sql("SELECT id FROM revisions WHERE branch = ? AND verdict = 'accepted' ORDER BY id DESC LIMIT 1"),
        )
        .bind(branch)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| r.try_get(0))
        .transpose()?;
        let mut applied = Applied::default();
        if let Some(revision) = revision {
            self.plan_branch(&mut tx, branch, &[], &BTreeSet::new(), revision, now_ms, &mut applied)
                .await?;
            if !applied.teardowns.is_empty() {
                self.event(&mut tx, now_ms, "branch-deleted", branch, "").await?;
            }
        }
        tx.commit().await?;
        Ok(applied)
    }

    async fn write_objects(&self, tx: &mut Tx, branch: &str, j: &Judgement, revision: i64) -> Result<(), LedgerError> {
        let mut have: BTreeMap<(String, String), String> = BTreeMap::new();
        for r in sqlx::query(self.sql("SELECT kind, name, hash FROM desired_objects WHERE branch = ?"))
            .bind(branch)
            .fetch_all(&mut **tx)
            .await?
        {
            have.insert((r.try_get(0)?, r.try_get(1)?), r.try_get(2)?);
        }
        let upsert = self.sql(
            "INSERT INTO desired_objects (branch, kind, name, hash, document, revision_id) VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (branch, kind, name) DO UPDATE SET hash = excluded.hash, document = excluded.document, revision_id = excluded.revision_id",
        );
        for loc in j.state.state.iter() {
            let doc = canonical::document(&loc.object, Secrets::Ciphertext);
            let hash = canonical::hash(&doc);
            let key = (
                loc.object.kind().as_str().to_owned(),
                loc.object.metadata.name.as_str().to_owned(),
            );
            if have.remove(&key).as_deref() == Some(hash.as_str()) {
                continue;
            }
            sqlx::query(upsert.clone())
                .bind(branch)
                .bind(key.0)
                .bind(key.1)
                .bind(hash)
                .bind(canonical::to_yaml(&doc))
                .bind(revision)
                .execute(&mut **tx)
                .await?;
        }
        let delete = self.sql("DELETE FROM desired_objects WHERE branch = ? AND kind = ? AND name = ?");
        for (kind, name) in have.into_keys() {
            sqlx::query(delete.clone())
                .bind(branch)
                .bind(kind)
                .bind(name)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    async fn rows_of(&self, tx: &mut Tx, branch: &str) -> Result<BTreeMap<String, Row0>, LedgerError> {
        let mut out = BTreeMap::new();
        for r in sqlx::query(self.sql(
            "SELECT environment, branch, generation, action, spec_hash, spec, retired FROM deployments WHERE branch = ?",
        ))
        .bind(branch)
        .fetch_all(&mut **tx)
        .await?
        {
            let spec: String = r.try_get(5)?;
            let retired: String = r.try_get(6)?;
            out.insert(
                r.try_get(0)?,
                Row0 {
                    branch: r.try_get(1)?,
                    generation: r.try_get(2)?,
                    action: r.try_get(3)?,
                    spec_hash: r.try_get(4)?,
                    spec: serde_json::from_str(&spec)?,
                    retired: serde_json::from_str(&retired)?,
                },
            );
        }
        Ok(out)
    }

    /// Compares `wanted` with the branch's deployments in the ledger: a new or changed spec gets
    /// a new rollout generation, a deployment no longer wanted (and not in `kept`) a teardown
    /// generation. Everything else is left alone.
    #[allow(clippy::too_many_arguments)]
    async fn plan_branch(
        &self,
        tx: &mut Tx,
        branch: &str,
        wanted: &[Desired],
        kept: &BTreeSet<Name>,
        revision: i64,
        now_ms: i64,
        applied: &mut Applied,
    ) -> Result<(), LedgerError> {
        let mut rows = self.rows_of(tx, branch).await?;
        for d in wanted {
            let env = d.spec.environment.as_str();
            let row = rows.remove(env);
            if let Some(r) = &row
                && r.action == "rollout"
                && r.spec_hash == d.spec_hash
            {
                continue;
            }
            if row.is_none() {
                // Another branch may own the name already: the first owner keeps it.
                let owner: Option<String> =
                    sqlx::query(self.sql("SELECT branch FROM deployments WHERE environment = ?"))
                        .bind(env)
                        .fetch_optional(&mut **tx)
                        .await?
                        .map(|r| r.try_get(0))
                        .transpose()?;
                if let Some(owner) = owner {
                    let detail = format!("branch {branch} declares an environment that branch {owner} deploys");
                    self.event(tx, now_ms, "deployment-conflict", env, &detail).await?;
                    continue;
                }
            }
            let (generation, retired) = match row {
                Some(r) => {
                    let mut retired = r.retired;
                    if !retired.contains(&r.spec) {
                        retired.push(r.spec);
                    }
                    (gen_u64(r.generation) + 1, retired)
                }
                None => (1, Vec::new()),
            };
            self.start(
                tx,
                branch,
                "rollout",
                &d.spec,
                &d.spec_hash,
                &retired,
                generation,
                revision,
                now_ms,
                applied,
            )
            .await?;
            applied.rollouts.push((env.to_owned(), generation));
        }
        for (env, r) in rows {
            if r.action == "teardown" || kept.contains(env.as_str()) {
                continue;
            }
            let generation = gen_u64(r.generation) + 1;
            debug_assert_eq!(r.branch, branch);
            self.start(
                tx, branch, "teardown", &r.spec, "", &r.retired, generation, revision, now_ms, applied,
            )
            .await?;
            applied.teardowns.push((env, generation));
        }
        Ok(())
    }

    /// Starts generation `generation` of a deployment: cancels what older generations still
    /// have queued or leased, writes the row and its history, and queues the first step.
    #[allow(clippy::too_many_arguments)]
    async fn start(
        &self,
        tx: &mut Tx,
        branch: &str,
        action: &str,
        spec: &DeploymentSpec,
        spec_hash: &str,
        retired: &[DeploymentSpec],
        generation: u64,
        revision: i64,
        now_ms: i64,
        applied: &mut Applied,
    ) -> Result<(), LedgerError> {
        let env = spec.environment.as_str();
        let g = i64::try_from(generation).unwrap_or(i64::MAX);
        let cancelled = sqlx::query(self.sql(
            "UPDATE jobs SET state = 'cancelled', lease_token = NULL, lease_expires_at = NULL, updated_at = ? WHERE environment = ? AND generation < ? AND state IN ('queued', 'leased')",
        ))
        .bind(now_ms)
        .bind(env)
        .bind(g)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if cancelled > 0 {
            let detail = format!("{cancelled} jobs of older generations");
            self.event(tx, now_ms, "jobs-cancelled", env, &detail).await?;
        }
        let steps = steps_of(action, &spec.environment, generation, spec, retired);
        let first = first_step_from(&steps, 0);
        let status = if first.is_some() { "in-progress" } else { "done" };
        let spec_json = serde_json::to_string(spec)?;
        let retired_json = serde_json::to_string(retired)?;
        sqlx::query(self.sql(
            "INSERT INTO deployments (environment, branch, generation, action, status, step, spec_hash, spec, retired, revision_id, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (environment) DO UPDATE SET generation = excluded.generation, action = excluded.action, status = excluded.status, \
             step = excluded.step, spec_hash = excluded.spec_hash, spec = excluded.spec, retired = excluded.retired, \
             revision_id = excluded.revision_id, updated_at = excluded.updated_at",
        ))
        .bind(env)
        .bind(branch)
        .bind(g)
        .bind(action)
        .bind(status)
        .bind(first.map_or(steps.len() as i64, |s| s as i64))
        .bind(spec_hash)
        .bind(spec_json)
        .bind(retired_json)
        .bind(revision)
        .bind(now_ms)
        .execute(&mut **tx)
        .await?;
        sqlx::query(self.sql(
            "INSERT INTO deployment_generations (environment, generation, branch, action, spec_hash, revision_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        ))
        .bind(env)
        .bind(g)
        .bind(branch)
        .bind(action)
        .bind(spec_hash)
        .bind(revision)
        .bind(now_ms)
        .execute(&mut **tx)
        .await?;
        self.event(
            tx,
            now_ms,
            &format!("deployment-{action}"),
            env,
            &format!("generation {generation}"),
        )
        .await?;
        if let Some(s) = first {
            applied.jobs_queued += self.queue_step(tx, env, &steps[s], s, now_ms).await?;
        }
        Ok(())
    }

    async fn queue_step(
        &self,
        tx: &mut Tx,
        env: &str,
        step: &Step,
        index: usize,
        now_ms: i64,
    ) -> Result<usize, LedgerError> {
        let rows: Vec<JobRow<'_>> = step
            .iter()
            .map(|(task, node)| JobRow {
                task,
                node: node.as_str(),
                max_attempts: MAX_ATTEMPTS,
                not_before_ms: now_ms,
                step: Some(index as i64),
            })
            .collect();
        let added = self.enqueue_in(tx, &rows, now_ms).await?;
        if !added.is_empty() {
            let detail = format!("step {index}: {} jobs", added.len());
            self.event(tx, now_ms, "jobs-queued", env, &detail).await?;
        }
        Ok(added.len())
    }

    pub(crate) async fn event(
        &self,
        tx: &mut Tx,
        now_ms: i64,
        kind: &str,
        subject: &str,
        detail: &str,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql("INSERT INTO events (at, kind, subject, detail) VALUES (?, ?, ?, ?)"))
            .bind(now_ms)
            .bind(kind)
            .bind(subject)
            .bind(detail)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Moves every unfinished deployment on: when every job of its current step succeeded, the
    /// next step's jobs are queued (or the deployment is done); when one failed for good or
    /// died, the deployment is failed and waits for a new generation. Returns how many
    /// deployments changed.
    pub async fn advance(&self, now_ms: i64) -> Result<usize, LedgerError> {
        let envs: Vec<String> =
            sqlx::query(self.sql("SELECT environment FROM deployments WHERE status = 'in-progress'"))
                .fetch_all(&self.pool)
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
        let mut changed = 0;
        for env in envs {
            let mut tx = self.write_tx().await?;
            if self.advance_one(&mut tx, &env, now_ms).await? {
                changed += 1;
            }
            tx.commit().await?;
        }
        Ok(changed)
    }

    async fn advance_one(&self, tx: &mut Tx, env: &str, now_ms: i64) -> Result<bool, LedgerError> {
        let Some(r) = sqlx::query(self.sql(
            "SELECT generation, action, step, spec, retired FROM deployments WHERE environment = ? AND status = 'in-progress'",
        ))
        .bind(env)
        .fetch_optional(&mut **tx)
        .await?
        else {
            return Ok(false);
        };
        let generation: i64 = r.try_get(0)?;
        let action: String = r.try_get(1)?;
        let step: i64 = r.try_get(2)?;
        let spec: DeploymentSpec = serde_json::from_str(&r.try_get::<String, _>(3)?)?;
        let retired: Vec<DeploymentSpec> = serde_json::from_str(&r.try_get::<String, _>(4)?)?;
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for c in sqlx::query(self.sql(
            "SELECT state, COUNT(*) FROM jobs WHERE environment = ? AND generation = ? AND step = ? GROUP BY state",
        ))
        .bind(env)
        .bind(generation)
        .bind(step)
        .fetch_all(&mut **tx)
        .await?
        {
            counts.insert(c.try_get(0)?, c.try_get(1)?);
        }
        let pending = ["queued", "leased"]
            .iter()
            .any(|s| counts.get(*s).copied().unwrap_or(0) > 0);
        let broken = ["failed", "dead"]
            .iter()
            .any(|s| counts.get(*s).copied().unwrap_or(0) > 0);
        if pending {
            return Ok(false);
        }
        let update = self.sql("UPDATE deployments SET status = ?, step = ?, updated_at = ? WHERE environment = ?");
        if broken {
            sqlx::query(update)
                .bind("failed")
                .bind(step)
                .bind(now_ms)
                .bind(env)
                .execute(&mut **tx)
                .await?;
            let detail = format!("generation {generation}, step {step}");
            self.event(tx, now_ms, "deployment-failed", env, &detail).await?;
            return Ok(true);
        }
        let environment = spec.environment.clone();
        let steps = steps_of(&action, &environment, gen_u64(generation), &spec, &retired);
        let next = first_step_from(&steps, usize::try_from(step).unwrap_or(0) + 1);
        match next {
            Some(s) => {
                sqlx::query(update)
                    .bind("in-progress")
                    .bind(s as i64)
                    .bind(now_ms)
                    .bind(env)
                    .execute(&mut **tx)
                    .await?;
                self.queue_step(tx, env, &steps[s], s, now_ms).await?;
            }
            None => {
                sqlx::query(self.sql(
                    "UPDATE deployments SET status = 'done', step = ?, retired = '[]', updated_at = ? WHERE environment = ?",
                ))
                .bind(steps.len() as i64)
                .bind(now_ms)
                .bind(env)
                .execute(&mut **tx)
                .await?;
                let detail = format!("generation {generation}");
                self.event(tx, now_ms, &format!("deployment-{action}-done"), env, &detail)
                    .await?;
            }
        }
        Ok(true)
    }
}

/// The first step at or after `from` that has jobs.
fn first_step_from(steps: &[Step], from: usize) -> Option<usize> {
    (from..steps.len()).find(|&i| !steps[i].is_empty())
}
