//! Turning judged commits into deployments and jobs, and moving rollouts forward step by step.
//!
//! Each accepted commit is written in one transaction: the revision, the desired objects, the
//! deployments with their generations, the first step's jobs and the events. The plan compares
//! the desired state with what the ledger holds (never with the previous commit), so a replay
//! writes nothing. `advance` is level-triggered: it looks at every unfinished deployment and
//! queues the next step once the current one has succeeded.

use crate::store::rows::MAX_ATTEMPTS;
use crate::store::{JobRow, Ledger, LedgerError};
use sqlx::Row;
use state_repo::revision::Judgement;
use state_schema::canonical::{self, Secrets};
use state_schema::deployment::DeploymentSpec;
use state_schema::desired::{self, Desired};
use state_schema::generations::{self, Action, Current, Next, Scale, Start, Status, StepJobs};
use state_schema::placement::Waiting;
use state_schema::release::Change;
use state_schema::rollout::{self, Step};
use state_schema::values::Name;
use std::collections::{BTreeMap, BTreeSet};

type Tx = crate::store::WriteTx;

/// What applying one commit did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// `false` when the commit was judged before: nothing was written.
    pub recorded: bool,
    pub rollouts: Vec<(String, u64)>,
    pub teardowns: Vec<(String, u64)>,
    /// Deployments scaled at their current generation.
    pub scales: Vec<(String, u64)>,
    pub jobs_queued: usize,
}

/// Which of a branch's deployments that the wanted ones leave out are kept rather than torn
/// down: those named (unplaceable ones, whose commit keeps what runs), or all of them (a
/// re-placement plans only the deployments it moves).
pub(crate) enum Kept<'a> {
    These(&'a BTreeSet<Name>),
    All,
}

impl Kept<'_> {
    fn contains(&self, environment: &str) -> bool {
        match self {
            Kept::These(names) => names.contains(environment),
            Kept::All => true,
        }
    }
}

/// A generation as the ledger stores it.
fn g(generation: u64) -> i64 {
    i64::try_from(generation).unwrap_or(i64::MAX)
}

fn steps_of(
    action: Action,
    env: &Name,
    generation: u64,
    spec: &DeploymentSpec,
    retired: &[DeploymentSpec],
) -> Vec<Step> {
    if action == Action::Teardown {
        let mut running = retired.to_vec();
        running.push(spec.clone());
        rollout::teardown_steps(env, generation, &running)
    } else {
        rollout::rollout_steps(spec, generation, retired)
    }
}

/// The hash of every object's canonical document (secrets as ciphertext), in the state's order.
fn object_hashes(state: &state_schema::state::State) -> Vec<String> {
    state
        .iter()
        .map(|loc| canonical::hash(&canonical::document(&loc.object, Secrets::Ciphertext)))
        .collect()
}

fn gen_u64(g: i64) -> u64 {
    u64::try_from(g).unwrap_or(0)
}

impl Ledger {
    /// Records `j` for `branch` and, when accepted, plans its deployments against the ledger
    /// and writes them with their first jobs, all in one transaction. `preview` names the
    /// branch when it is a preview branch (its environments are derived per project).
    ///
    /// The judged state is taken out of `j` once the objects and deployments are derived from
    /// it: at 10,000 environments it is the largest thing in memory, and the writes that follow
    /// need only the deployments.
    pub async fn apply_revision(
        &self,
        branch: &str,
        preview: bool,
        j: &mut Judgement,
        now_ms: i64,
    ) -> Result<Applied, LedgerError> {
        self.apply(branch, preview, j, now_ms, None).await
    }

    /// Applies again the head of an approved rewrite of the applied branch that was judged and
    /// accepted before (a return to an earlier commit: a rollback by force-push, or `pl up` of
    /// the commit that `pl down`'s teardown revision followed). Its verdict stays the one
    /// recorded; `j`, judged now, must still be accepted. The rewrite over `accepted` is marked
    /// applied, which puts the commit back in force, with a `revision-reapplied` event.
    pub async fn apply_revision_again(
        &self,
        branch: &str,
        j: &mut Judgement,
        accepted: &str,
        now_ms: i64,
    ) -> Result<Applied, LedgerError> {
        if !j.accepted() {
            return Ok(Applied::default());
        }
        self.apply(branch, false, j, now_ms, Some(accepted)).await
    }

    async fn apply(
        &self,
        branch: &str,
        preview: bool,
        j: &mut Judgement,
        now_ms: i64,
        again: Option<&str>,
    ) -> Result<Applied, LedgerError> {
        // The fleet as it is now (reads), then the pure work, before the write transaction
        // opens (on SQLite it holds the one write lock that agents' leases wait on): placement
        // and spec hashes of every deployment, and the hash of every object.
        let mut fleet = if j.accepted() {
            let pools: Vec<_> = j.state.state.pools().map(|(n, p)| (n.clone(), p.clone())).collect();
            Some(self.fleet_view(&pools, now_ms).await?)
        } else {
            None
        };
        let derived = fleet.as_mut().map(|fleet| {
            let (wanted, unplaceable) = desired::deployments(&j.state.state, preview.then_some(branch), fleet);
            // A preview lives `previews.ttlHours` after its branch's last commit. One whose
            // commit is older than that is not rolled out at all (and what runs is torn down).
            let expires = preview.then(|| preview_expiry(j)).flatten();
            (wanted, unplaceable, expires, object_hashes(&j.state.state))
        });
        let mut tx = self.write_tx().await?;
        let revision = match again {
            None => self.record_revision_in(&mut tx, branch, j, now_ms).await?,
            Some(accepted) => {
                let id: Option<i64> = sqlx::query_scalar(
                    self.sql("SELECT id FROM revisions WHERE branch = ? AND sha = ? AND verdict = 'accepted'"),
                )
                .bind(branch)
                .bind(&j.sha)
                .fetch_optional(&mut *tx)
                .await?;
                if id.is_some() {
                    self.rewrite_applied(&mut tx, branch, &j.sha, accepted, now_ms).await?;
                    self.event(
                        &mut tx,
                        now_ms,
                        "revision-reapplied",
                        &format!("{branch}@{}", j.sha),
                        "an approved rewrite returned to this accepted commit",
                    )
                    .await?;
                }
                id
            }
        };
        let Some(revision) = revision else {
            return Ok(Applied::default());
        };
        let mut applied = Applied {
            recorded: true,
            ..Applied::default()
        };
        if let Some((mut wanted, mut unplaceable, expires, hashes)) = derived {
            self.write_objects(&mut tx, branch, j, &hashes, revision).await?;
            drop(std::mem::take(&mut j.state));
            if let Some(at) = expires
                && at <= now_ms
            {
                wanted.clear();
                unplaceable.clear();
                self.event(
                    &mut tx,
                    now_ms,
                    "preview-expired",
                    branch,
                    "the last commit is older than previews.ttlHours",
                )
                .await?;
            }
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
            self.plan_branch(
                &mut tx,
                branch,
                wanted,
                Kept::These(&kept),
                revision,
                now_ms,
                &mut applied,
            )
            .await?;
            if let Some(at) = expires {
                sqlx::query(self.sql("UPDATE deployments SET expires_at = ? WHERE branch = ? AND action = 'rollout'"))
                    .bind(at)
                    .bind(branch)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(applied)
    }

    /// Tears down the previews whose lifetime has run out (`expires_at <= now_ms`). A new
    /// commit to the branch brings them back. Returns the branches torn down.
    pub async fn expire_previews(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        let branches: Vec<String> = sqlx::query(self.sql(
            "SELECT DISTINCT branch FROM deployments WHERE action = 'rollout' AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY branch",
        ))
        .bind(now_ms)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
        for b in &branches {
            let mut tx = self.write_tx().await?;
            let applied = self.teardown_in(&mut tx, b, now_ms).await?;
            if !applied.teardowns.is_empty() {
                self.event(&mut tx, now_ms, "preview-expired", b, "no commit for previews.ttlHours")
                    .await?;
            }
            tx.commit().await?;
        }
        Ok(branches)
    }

    /// Tears down every deployment of a branch that is gone (a deleted preview branch). The
    /// history stays. Returns the teardowns started.
    pub async fn teardown_branch(&self, branch: &str, now_ms: i64) -> Result<Applied, LedgerError> {
        let mut tx = self.write_tx().await?;
        let applied = self.teardown_in(&mut tx, branch, now_ms).await?;
        if !applied.teardowns.is_empty() {
            self.event(&mut tx, now_ms, "branch-deleted", branch, "").await?;
        }
        tx.commit().await?;
        Ok(applied)
    }

    /// Starts a teardown generation for every live deployment of a branch, attributed to the
    /// branch's last accepted revision.
    async fn teardown_in(&self, tx: &mut Tx, branch: &str, now_ms: i64) -> Result<Applied, LedgerError> {
        let revision: Option<i64> = sqlx::query(
            self.sql("SELECT id FROM revisions WHERE branch = ? AND verdict = 'accepted' ORDER BY id DESC LIMIT 1"),
        )
        .bind(branch)
        .fetch_optional(&mut **tx)
        .await?
        .map(|r| r.try_get(0))
        .transpose()?;
        let mut applied = Applied::default();
        if let Some(revision) = revision {
            self.plan_branch(
                tx,
                branch,
                Vec::new(),
                Kept::These(&BTreeSet::new()),
                revision,
                now_ms,
                &mut applied,
            )
            .await?;
        }
        Ok(applied)
    }

    /// Writes the objects whose hash differs from the ledger's (`hashes` in the state's order,
    /// computed before the transaction) and deletes those gone.
    async fn write_objects(
        &self,
        tx: &mut Tx,
        branch: &str,
        j: &Judgement,
        hashes: &[String],
        revision: i64,
    ) -> Result<(), LedgerError> {
        let mut have: BTreeMap<(String, String), String> = BTreeMap::new();
        for r in sqlx::query(self.sql("SELECT kind, name, hash FROM desired_objects WHERE branch = ?"))
            .bind(branch)
            .fetch_all(&mut **tx)
            .await?
        {
            have.insert((r.try_get(0)?, r.try_get(1)?), r.try_get(2)?);
        }
        // Written in chunks as they are rendered, so no more than one chunk of documents is
        // held at a time.
        let mut changed: Vec<(String, String, String, String)> = Vec::with_capacity(100);
        let mut objects = j.state.state.iter().zip(hashes).peekable();
        while let Some((loc, hash)) = objects.next() {
            let key = (
                loc.object.kind().as_str().to_owned(),
                loc.object.metadata.name.as_str().to_owned(),
            );
            if have.remove(&key).as_deref() != Some(hash.as_str()) {
                let doc = canonical::document(&loc.object, Secrets::Ciphertext);
                changed.push((key.0, key.1, hash.clone(), canonical::to_yaml(&doc)));
            }
            if changed.len() < 100 && objects.peek().is_some() {
                continue;
            }
            if changed.is_empty() {
                continue;
            }
            let marks = vec!["(?, ?, ?, ?, ?, ?)"; changed.len()].join(", ");
            let q = format!(
                "INSERT INTO desired_objects (branch, kind, name, hash, document, revision_id) VALUES {marks} \
                 ON CONFLICT (branch, kind, name) DO UPDATE SET hash = excluded.hash, document = excluded.document, revision_id = excluded.revision_id"
            );
            let mut query = sqlx::query(self.sql(&q));
            for (kind, name, hash, doc) in changed.drain(..) {
                query = query
                    .bind(branch.to_owned())
                    .bind(kind)
                    .bind(name)
                    .bind(hash)
                    .bind(doc)
                    .bind(revision);
            }
            query.execute(&mut **tx).await?;
        }
        let gone: Vec<(String, String)> = have.into_keys().collect();
        for chunk in gone.chunks(200) {
            let marks = vec!["(kind = ? AND name = ?)"; chunk.len()].join(" OR ");
            let q = format!("DELETE FROM desired_objects WHERE branch = ? AND ({marks})");
            let mut query = sqlx::query(self.sql(&q)).bind(branch.to_owned());
            for (kind, name) in chunk {
                query = query.bind(kind.clone()).bind(name.clone());
            }
            query.execute(&mut **tx).await?;
        }
        Ok(())
    }

    async fn current_of(&self, tx: &mut Tx, branch: &str) -> Result<BTreeMap<String, Current>, LedgerError> {
        let mut out = BTreeMap::new();
        for r in sqlx::query(
            self.sql("SELECT environment, generation, action, status, spec_hash FROM deployments WHERE branch = ?"),
        )
        .bind(branch)
        .fetch_all(&mut **tx)
        .await?
        {
            let (action, status): (String, String) = (r.try_get(2)?, r.try_get(3)?);
            let (Some(action), Some(status)) = (Action::parse(&action), Status::parse(&status)) else {
                return Err(LedgerError::Corrupt(format!(
                    "a deployment row says {action:?}, {status:?}"
                )));
            };
            let current = Current {
                generation: gen_u64(r.try_get(1)?),
                action,
                status,
                spec_hash: r.try_get(4)?,
            };
            out.insert(r.try_get(0)?, current);
        }
        Ok(out)
    }

    /// The stored spec and retired specs of some deployments.
    async fn specs_of(
        &self,
        tx: &mut Tx,
        envs: &[&str],
    ) -> Result<BTreeMap<String, (DeploymentSpec, Vec<DeploymentSpec>)>, LedgerError> {
        let mut out = BTreeMap::new();
        for chunk in envs.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q = format!("SELECT environment, spec, retired FROM deployments WHERE environment IN ({marks})");
            let mut query = sqlx::query(self.sql(&q));
            for env in chunk {
                query = query.bind(env.to_string());
            }
            for r in query.fetch_all(&mut **tx).await? {
                let spec: String = r.try_get(1)?;
                let retired: String = r.try_get(2)?;
                out.insert(
                    r.try_get(0)?,
                    (serde_json::from_str(&spec)?, serde_json::from_str(&retired)?),
                );
            }
        }
        Ok(out)
    }

    /// Which of `envs` another branch than `branch` deploys already, and that branch.
    async fn owners_of(
        &self,
        tx: &mut Tx,
        branch: &str,
        envs: &[&str],
    ) -> Result<BTreeMap<String, String>, LedgerError> {
        let mut out = BTreeMap::new();
        for chunk in envs.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q =
                format!("SELECT environment, branch FROM deployments WHERE branch <> ? AND environment IN ({marks})");
            let mut query = sqlx::query(self.sql(&q)).bind(branch.to_owned());
            for env in chunk {
                query = query.bind(env.to_string());
            }
            for r in query.fetch_all(&mut **tx).await? {
                out.insert(r.try_get(0)?, r.try_get(1)?);
            }
        }
        Ok(out)
    }

    /// Compares `wanted` with the branch's deployments in the ledger: a new or changed spec gets
    /// a new rollout generation, a deployment no longer wanted (and not in `kept`) a teardown
    /// generation. Everything else is left alone. Writes are batched: a commit that creates a
    /// thousand deployments costs a few dozen statements, not thousands.
    #[allow(clippy::too_many_arguments)]
    async fn plan_branch(
        &self,
        tx: &mut Tx,
        branch: &str,
        wanted: Vec<Desired>,
        kept: Kept<'_>,
        revision: i64,
        now_ms: i64,
        applied: &mut Applied,
    ) -> Result<(), LedgerError> {
        let current = self.current_of(tx, branch).await?;
        // Deployments are written first, then what waits is remembered on them.
        let waits: Vec<(String, Vec<Waiting>)> = wanted
            .iter()
            .map(|d| (d.spec.environment.to_string(), d.waiting.clone()))
            .collect();
        // What changed, first from hashes alone; then specs and owners are read for those only,
        // and the decision is `generations::decide`'s.
        let changes = generations::changes(wanted, current, |env| kept.contains(env));
        // The first branch to deploy a name keeps it.
        let owners = self.owners_of(tx, branch, &changes.new_environments()).await?;
        let specs = self.specs_of(tx, &changes.existing_environments()).await?;
        let decision = generations::decide(changes, &owners, specs);
        let events: Vec<(String, String, String)> = decision
            .conflicts
            .into_iter()
            .map(|(env, owner)| {
                let detail = format!("branch {branch} declares an environment that branch {owner} deploys");
                ("deployment-conflict".to_owned(), env, detail)
            })
            .collect();
        let (starts, scales) = (decision.starts, decision.scales);
        for s in &starts {
            let entry = (s.spec.environment.to_string(), s.generation);
            match s.action {
                Action::Rollout => applied.rollouts.push(entry),
                Action::Teardown => applied.teardowns.push(entry),
            }
        }
        self.events_in(tx, now_ms, &events).await?;
        // Every node a new or scaled generation runs on gets the environment's subnet first.
        let pairs: Vec<(String, String)> = starts
            .iter()
            .filter(|s| s.action == Action::Rollout)
            .map(|s| &s.spec)
            .chain(scales.iter().map(|s| &s.spec))
            .flat_map(|spec| spec.nodes.iter().map(|n| (spec.environment.to_string(), n.to_string())))
            .collect();
        self.ensure_subnets(tx, &pairs, now_ms).await?;
        self.write_scales(tx, &scales, revision, now_ms, applied).await?;
        self.write_starts(tx, branch, &starts, revision, now_ms, applied)
            .await?;
        self.record_waiting(tx, &waits, now_ms).await
    }

    /// Plans only `wanted` (re-placed deployments of `branch`), leaving every other deployment
    /// of the branch alone.
    pub(crate) async fn plan_some(
        &self,
        tx: &mut Tx,
        branch: &str,
        wanted: Vec<Desired>,
        revision: i64,
        now_ms: i64,
        applied: &mut Applied,
    ) -> Result<(), LedgerError> {
        self.plan_branch(tx, branch, wanted, Kept::All, revision, now_ms, applied)
            .await
    }

    /// Scales deployments at their current generation: the stored spec becomes the new one,
    /// and the instance delta is queued at once, in the order it must run: infrastructure on
    /// new nodes, new replicas, their ingress; then ingress leaves nodes, replicas go, and
    /// networks of nodes left behind. Nothing else of the generation runs again.
    async fn write_scales(
        &self,
        tx: &mut Tx,
        scales: &[Scale],
        revision: i64,
        now_ms: i64,
        applied: &mut Applied,
    ) -> Result<(), LedgerError> {
        let mut events: Vec<(String, String, String)> = Vec::new();
        for s in scales {
            let env = s.spec.environment.as_str();
            sqlx::query(self.sql(
                "UPDATE deployments SET spec = ?, spec_hash = ?, revision_id = ?, updated_at = ? WHERE environment = ?",
            ))
            .bind(serde_json::to_string(&s.spec)?)
            .bind(s.spec_hash.clone())
            .bind(revision)
            .bind(now_ms)
            .bind(env.to_owned())
            .execute(&mut **tx)
            .await?;
            let tasks = rollout::scale_tasks(&s.spec, s.generation, &s.change);
            if tasks.is_empty() {
                continue;
            }
            let rows: Vec<JobRow<'_>> = tasks
                .iter()
                .map(|(task, node)| JobRow::scaled(task, node.as_str(), revision, now_ms))
                .collect();
            let added = self.enqueue_in(tx, &rows, now_ms).await?;
            applied.jobs_queued += added.len();
            applied.scales.push((env.to_owned(), s.generation));
            if let Change::Scale { added, removed, .. } = &s.change {
                events.push((
                    "deployment-scaled".into(),
                    env.to_owned(),
                    format!(
                        "generation {}: {} replicas added, {} removed",
                        s.generation,
                        added.len(),
                        removed.len()
                    ),
                ));
            }
        }
        self.events_in(tx, now_ms, &events).await
    }

    /// Starts new generations: cancels what older generations still have queued or leased,
    /// writes the rows and their history, and queues each first step. Batched a hundred
    /// deployments at a time, start to finish, so memory stays bounded however many there are.
    async fn write_starts(
        &self,
        tx: &mut Tx,
        branch: &str,
        starts: &[Start],
        revision: i64,
        now_ms: i64,
        applied: &mut Applied,
    ) -> Result<(), LedgerError> {
        for chunk in starts.chunks(100) {
            let mut events: Vec<(String, String, String)> = Vec::new();
            // Only environments with an earlier generation can have jobs to cancel.
            let existed: Vec<&Start> = chunk.iter().filter(|s| s.existed).collect();
            if !existed.is_empty() {
                let marks = vec!["(environment = ? AND generation < ?)"; existed.len()].join(" OR ");
                let q = format!(
                    "UPDATE jobs SET state = 'cancelled', lease_token = NULL, lease_expires_at = NULL, updated_at = ? \
                     WHERE state IN ('queued', 'leased') AND ({marks}) RETURNING environment"
                );
                let mut query = sqlx::query(self.sql(&q)).bind(now_ms);
                for s in &existed {
                    query = query.bind(s.spec.environment.as_str().to_owned()).bind(g(s.generation));
                }
                let mut cancelled: BTreeMap<String, usize> = BTreeMap::new();
                for r in query.fetch_all(&mut **tx).await? {
                    *cancelled.entry(r.try_get(0)?).or_default() += 1;
                }
                for (env, n) in cancelled {
                    events.push(("jobs-cancelled".into(), env, format!("{n} jobs of older generations")));
                }
            }
            let mut firsts: Vec<(Step, usize)> = Vec::new();
            let marks = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
            let q = format!(
                "INSERT INTO deployments (environment, branch, generation, action, status, step, spec_hash, spec, retired, revision_id, updated_at) \
                 VALUES {marks} \
                 ON CONFLICT (environment) DO UPDATE SET generation = excluded.generation, action = excluded.action, status = excluded.status, \
                 step = excluded.step, spec_hash = excluded.spec_hash, spec = excluded.spec, retired = excluded.retired, \
                 revision_id = excluded.revision_id, updated_at = excluded.updated_at"
            );
            let mut query = sqlx::query(self.sql(&q));
            for s in chunk {
                let steps = steps_of(s.action, &s.spec.environment, s.generation, &s.spec, &s.retired);
                let first = first_step_from(&steps, 0);
                let status = if first.is_some() { "in-progress" } else { "done" };
                let step = first.map_or(steps.len() as i64, |i| i as i64);
                let env = s.spec.environment.as_str();
                events.push((
                    format!("deployment-{}", s.action.as_str()),
                    env.to_owned(),
                    format!("generation {}", s.generation),
                ));
                if let Some(i) = first {
                    firsts.push((steps.into_iter().nth(i).unwrap_or_default(), i));
                }
                query = query
                    .bind(env.to_owned())
                    .bind(branch.to_owned())
                    .bind(g(s.generation))
                    .bind(s.action.as_str())
                    .bind(status)
                    .bind(step)
                    .bind(s.spec_hash.clone())
                    .bind(serde_json::to_string(&s.spec)?)
                    .bind(serde_json::to_string(&s.retired)?)
                    .bind(revision)
                    .bind(now_ms);
            }
            query.execute(&mut **tx).await?;
            let marks = vec!["(?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
            let q = format!(
                "INSERT INTO deployment_generations (environment, generation, branch, action, spec_hash, revision_id, created_at) VALUES {marks}"
            );
            let mut query = sqlx::query(self.sql(&q));
            for s in chunk {
                query = query
                    .bind(s.spec.environment.as_str().to_owned())
                    .bind(g(s.generation))
                    .bind(branch.to_owned())
                    .bind(s.action.as_str())
                    .bind(s.spec_hash.clone())
                    .bind(revision)
                    .bind(now_ms);
            }
            query.execute(&mut **tx).await?;
            let mut rows: Vec<JobRow<'_>> = Vec::new();
            let mut spans = Vec::with_capacity(firsts.len());
            for (step, index) in &firsts {
                let start = rows.len();
                rows.extend(job_rows(step, *index, now_ms));
                spans.push((*index, start..rows.len()));
            }
            let added = self.enqueue_in(tx, &rows, now_ms).await?;
            applied.jobs_queued += added.len();
            for (index, range) in spans {
                // `added` is sorted: the new jobs of this step are one run of it.
                let n = added.partition_point(|&i| i < range.end) - added.partition_point(|&i| i < range.start);
                if n > 0 {
                    let env = rows[range.start].task.environment().as_str().to_owned();
                    events.push(("jobs-queued".into(), env, format!("step {index}: {n} jobs")));
                }
            }
            self.events_in(tx, now_ms, &events).await?;
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
        let rows: Vec<JobRow<'_>> = job_rows(step, index, now_ms).collect();
        let added = self.enqueue_in(tx, &rows, now_ms).await?;
        if !added.is_empty() {
            let detail = format!("step {index}: {} jobs", added.len());
            self.event(tx, now_ms, "jobs-queued", env, &detail).await?;
        }
        Ok(added.len())
    }

    /// Moves every unfinished deployment on: when every job of its current step succeeded, the
    /// next step's jobs are queued (or the deployment is done); when one failed for good or
    /// died, the deployment is failed and waits for a new generation. Returns how many
    /// deployments changed.
    pub async fn advance(&self, now_ms: i64) -> Result<usize, LedgerError> {
        // Only deployments whose current step has nothing queued or leased can move: one query
        // finds them, so a pass over thousands of rollouts waiting on agents costs one statement.
        let envs: Vec<String> = sqlx::query(self.sql(
            "SELECT d.environment FROM deployments d LEFT JOIN \
             (SELECT environment, generation, step FROM jobs WHERE state IN ('queued', 'leased') GROUP BY environment, generation, step) p \
             ON p.environment = d.environment AND p.generation = d.generation AND p.step = d.step \
             WHERE d.status = 'in-progress' AND p.environment IS NULL",
        ))
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
        let mut jobs = StepJobs::default();
        for c in sqlx::query(self.sql(
            "SELECT state, COUNT(*) FROM jobs WHERE environment = ? AND generation = ? AND step = ? GROUP BY state",
        ))
        .bind(env)
        .bind(generation)
        .bind(step)
        .fetch_all(&mut **tx)
        .await?
        {
            let (state, n): (String, i64) = (c.try_get(0)?, c.try_get(1)?);
            let n = u64::try_from(n).unwrap_or(0);
            match state.as_str() {
                "queued" | "leased" => jobs.pending += n,
                "failed" | "dead" => jobs.broken += n,
                _ => {}
            }
        }
        let Some(action) = Action::parse(&action) else {
            return Err(LedgerError::Corrupt(format!("a deployment row says {action:?}")));
        };
        let steps = steps_of(action, &spec.environment, gen_u64(generation), &spec, &retired);
        let update = self.sql("UPDATE deployments SET status = ?, step = ?, updated_at = ? WHERE environment = ?");
        // The decision is `generations::next`'s; what follows writes it.
        match generations::next(usize::try_from(step).unwrap_or(0), jobs, &steps) {
            Next::Wait => return Ok(false),
            Next::Fail => {
                sqlx::query(update)
                    .bind(Status::Failed.as_str())
                    .bind(step)
                    .bind(now_ms)
                    .bind(env)
                    .execute(&mut **tx)
                    .await?;
                let detail = format!("generation {generation}, step {step}");
                self.event(tx, now_ms, "deployment-failed", env, &detail).await?;
            }
            Next::Step(s) => {
                sqlx::query(update)
                    .bind(Status::InProgress.as_str())
                    .bind(s as i64)
                    .bind(now_ms)
                    .bind(env)
                    .execute(&mut **tx)
                    .await?;
                self.queue_step(tx, env, &steps[s], s, now_ms).await?;
            }
            Next::Done(n) => {
                sqlx::query(self.sql(
                    "UPDATE deployments SET status = 'done', step = ?, retired = '[]', updated_at = ? WHERE environment = ?",
                ))
                .bind(n as i64)
                .bind(now_ms)
                .bind(env)
                .execute(&mut **tx)
                .await?;
                if action == Action::Teardown {
                    // Its networks are gone from every node: their subnets are free again.
                    sqlx::query(self.sql("DELETE FROM subnets WHERE environment = ?"))
                        .bind(env)
                        .execute(&mut **tx)
                        .await?;
                }
                let detail = format!("generation {generation}");
                self.event(tx, now_ms, &format!("deployment-{action}-done"), env, &detail)
                    .await?;
            }
        }
        Ok(true)
    }
}

/// When a preview judged by `j` expires: its commit's time plus the repository's
/// `previews.ttlHours`; `None` when the repository declares no previews.
fn preview_expiry(j: &Judgement) -> Option<i64> {
    let hours = i64::from(j.state.state.repository()?.previews.as_ref()?.ttl_hours);
    Some(j.committed_at_ms.saturating_add(hours.saturating_mul(3_600_000)))
}

/// The jobs of step `index`, due now.
fn job_rows(step: &Step, index: usize, now_ms: i64) -> impl Iterator<Item = JobRow<'_>> {
    step.iter()
        .map(move |(task, node)| JobRow::new(task, node.as_str(), MAX_ATTEMPTS, now_ms, Some(index as i64)))
}

/// The first step at or after `from` that has jobs.
fn first_step_from(steps: &[Step], from: usize) -> Option<usize> {
    (from..steps.len()).find(|&i| !steps[i].is_empty())
}
