//! Turning judged commits into deployments and jobs, and moving rollouts forward step by step.
//!
//! Each accepted commit is written in one transaction: the revision, the desired objects, the
//! deployments with their generations, the first step's jobs and the events. The plan compares
//! the desired state with what the ledger holds (never with the previous commit), so a replay
//! writes nothing. `advance` is level-triggered: it looks at every unfinished deployment and
//! queues the next step once the current one has succeeded.

use crate::store::deployments::{GenerationRow, ObjectDoc};
use crate::store::rollouts::PROMOTE;
use crate::store::rows::MAX_ATTEMPTS;
use crate::store::rows::gen_u64;
use crate::store::watch::CANARY_UNTIL;
use crate::store::{JobRow, Ledger, LedgerError};
use state_repo::revision::Judgement;
use state_schema::canonical::{self, Secrets};
use state_schema::deployment::DeploymentSpec;
use state_schema::desired::{self, Desired};
use state_schema::generations::{self, Action, Next, Scale, Start, Status};
use state_schema::placement::Waiting;
use state_schema::release::Change;
use state_schema::rollout::{self, Step};
use state_schema::task::{Task, Wait};
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

/// Whether a commit is applied for the first time, again after an approved rewrite back to
/// it (over the accepted commit named), or planned again where it stands (a released hold).
#[derive(Clone, Copy)]
enum Again<'a> {
    No,
    Rewrite(&'a str),
    Replan,
}

fn steps_of(
    action: Action,
    env: &Name,
    generation: u64,
    spec: &DeploymentSpec,
    retired: &[DeploymentSpec],
    rollback: bool,
) -> Vec<Step> {
    if action == Action::Teardown {
        let mut running = retired.to_vec();
        running.push(spec.clone());
        rollout::teardown_steps(env, generation, &running)
    } else if rollback {
        rollout::rollback_steps(spec, generation, retired)
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
        self.apply(branch, preview, j, now_ms, Again::No).await
    }

    /// Plans `branch`'s accepted commit in force (`j`, judged again now) against the ledger
    /// once more: what a released hold needs, since no new commit will come to end it. Its
    /// verdict stays the one recorded; nothing is written when `j` is no longer accepted.
    pub async fn replan(
        &self,
        branch: &str,
        preview: bool,
        j: &mut Judgement,
        now_ms: i64,
    ) -> Result<Applied, LedgerError> {
        if !j.accepted() {
            return Ok(Applied::default());
        }
        self.apply(branch, preview, j, now_ms, Again::Replan).await
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
        self.apply(branch, false, j, now_ms, Again::Rewrite(accepted)).await
    }

    async fn apply(
        &self,
        branch: &str,
        preview: bool,
        j: &mut Judgement,
        now_ms: i64,
        again: Again<'_>,
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
            Again::No => self.record_revision_in(&mut tx, branch, j, now_ms).await?,
            // A released hold: the commit in force, planned again as it stands.
            Again::Replan => self.accepted_revision(&mut tx, branch, &j.sha).await?,
            Again::Rewrite(accepted) => {
                let id = self.accepted_revision(&mut tx, branch, &j.sha).await?;
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
                self.set_expiry(&mut tx, branch, at).await?;
            }
        }
        tx.commit().await?;
        Ok(applied)
    }

    /// Tears down the previews whose lifetime has run out (`expires_at <= now_ms`). A new
    /// commit to the branch brings them back. Returns the branches torn down.
    pub async fn expire_previews(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        let branches = self.expired_branches(now_ms).await?;
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
        let revision = self.last_accepted_id(&mut **tx, branch).await?;
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
        let mut have = self.object_hashes_of(tx, branch).await?;
        // Written in chunks as they are rendered, so no more than one chunk of documents is
        // held at a time.
        let mut changed: Vec<ObjectDoc> = Vec::with_capacity(100);
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
            if changed.len() >= 100 || objects.peek().is_none() {
                self.upsert_objects(tx, branch, revision, &mut changed).await?;
            }
        }
        let gone: Vec<(String, String)> = have.into_keys().collect();
        self.delete_objects(tx, branch, &gone).await
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
        // Holds: a re-placement keeps them; a commit keeps those whose environment Git still
        // wants as it did when the hold began, and ends the others (and released ones).
        let mut wanted = wanted;
        let mut held = BTreeSet::new();
        if !matches!(kept, Kept::All) {
            let holds = self.holds_of(tx, branch).await?;
            let git: BTreeMap<String, String> = holds
                .iter()
                .filter(|(_, h)| !h.released)
                .map(|(env, h)| (env.clone(), h.git_hash.clone()))
                .collect();
            let (keep, ended) = generations::holds(&wanted, &git);
            let released = holds.iter().filter(|(_, h)| h.released).map(|(env, _)| env.clone());
            for (env, why) in ended
                .into_iter()
                .map(|e| (e, "an accepted commit changes it"))
                .chain(released.map(|e| (e, "released: planned from Git again")))
            {
                self.set_hold(tx, &env, "").await?;
                self.event(tx, now_ms, "rollback-hold-ended", &env, why).await?;
            }
            wanted.retain(|d| !keep.contains(d.spec.environment.as_str()));
            held = keep;
        }
        let current = self.current_of(tx, branch).await?;
        // Deployments are written first, then what waits is remembered on them.
        let waits: Vec<(String, Vec<Waiting>)> = wanted
            .iter()
            .map(|d| (d.spec.environment.to_string(), d.waiting.clone()))
            .collect();
        // What changed, first from hashes alone; then specs and owners are read for those only,
        // and the decision is `generations::decide`'s.
        let changes = generations::changes(wanted, current, |env| kept.contains(env) || held.contains(env));
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
        // Volumes are pinned where this placement put their roles (the first time), and a
        // teardown starts their retention: a teardown never removes one.
        for s in &starts {
            match s.action {
                Action::Rollout => self.record_volumes(tx, &s.spec, now_ms).await?,
                Action::Teardown => {
                    self.release_volumes(tx, s.spec.environment.as_str(), now_ms).await?;
                }
            }
        }
        for s in &scales {
            self.record_volumes(tx, &s.spec, now_ms).await?;
        }
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
            let removes = matches!(&s.change, Change::Scale { removed, .. } if !removed.is_empty());
            self.rescale(tx, &s.spec, &s.spec_hash, revision, removes, now_ms)
                .await?;
            // An earlier scale's held removals of what this one puts back go.
            let generation = i64::try_from(s.generation).unwrap_or(i64::MAX);
            let patterns: Vec<String> = rollout::held_conflicts(&s.spec, s.generation, &s.change)
                .iter()
                .map(|(task, node)| format!("{}#r%", crate::store::job_key(task, node.as_str())))
                .collect();
            self.cancel_held_in(tx, env, generation, &patterns, now_ms).await?;
            let (first, then) = rollout::scale_tasks(&s.spec, s.generation, &s.change);
            if first.is_empty() && then.is_empty() {
                continue;
            }
            // What waits for the replicas that replace the ones it removes is queued held, and
            // released when the rest of the scale succeeded (`Ledger::release_scale_in`).
            let rows: Vec<JobRow<'_>> = first
                .iter()
                .map(|(task, node)| JobRow::scaled(task, node.as_str(), revision, now_ms))
                .chain(
                    then.iter()
                        .map(|(task, node)| JobRow::scaled(task, node.as_str(), revision, crate::store::HELD)),
                )
                .collect();
            let added = self.enqueue_in(tx, &rows, now_ms).await?;
            applied.jobs_queued += added.len();
            applied.scales.push((env.to_owned(), s.generation));
            if let Change::Scale {
                added,
                removed,
                certificates_changed,
                ..
            } = &s.change
            {
                if !added.is_empty() || !removed.is_empty() {
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
                for hostname in certificates_changed {
                    events.push((
                        "certificate-rotated".into(),
                        env.to_owned(),
                        format!(
                            "{hostname}: the brought certificate changed in Git; published again at generation {} on every node that serves it, no replica restarted",
                            s.generation
                        ),
                    ));
                }
            }
        }
        self.events_in(tx, now_ms, &events).await
    }

    /// Starts new generations: cancels what older generations still have queued or leased,
    /// writes the rows and their history, and queues each first step. Batched a hundred
    /// deployments at a time, start to finish, so memory stays bounded however many there are.
    pub(super) async fn write_starts(
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
            let existed: Vec<(&str, u64)> = chunk
                .iter()
                .filter(|s| s.existed)
                .map(|s| (s.spec.environment.as_str(), s.generation))
                .collect();
            for (env, n) in self.cancel_older(tx, &existed, now_ms).await? {
                events.push(("jobs-cancelled".into(), env, format!("{n} jobs of older generations")));
            }
            let mut firsts: Vec<(Step, usize)> = Vec::new();
            let mut generations = Vec::with_capacity(chunk.len());
            for s in chunk {
                let steps = steps_of(
                    s.action,
                    &s.spec.environment,
                    s.generation,
                    &s.spec,
                    &s.retired,
                    s.rollback,
                );
                let first = first_step_from(&steps, 0);
                let env = s.spec.environment.as_str();
                // A rollback's generation says so: its commit is the one rolled back, and what
                // reads events (commit statuses) must not take its rollout for that commit's.
                events.push((
                    format!("deployment-{}", s.action.as_str()),
                    env.to_owned(),
                    format!(
                        "generation {}{}",
                        s.generation,
                        if s.rollback { ", a rollback" } else { "" }
                    ),
                ));
                generations.push(GenerationRow {
                    environment: env,
                    generation: s.generation,
                    action: s.action,
                    status: if first.is_some() {
                        Status::InProgress
                    } else {
                        Status::Done
                    },
                    step: first.map_or(steps.len() as i64, |i| i as i64),
                    spec_hash: &s.spec_hash,
                    spec: &s.spec,
                    retired: &s.retired,
                    // `decide` retires the stored spec last.
                    new_release: s.retired.last().is_none_or(|r| r.release_hash != s.spec.release_hash),
                });
                if let Some(i) = first {
                    firsts.push((steps.into_iter().nth(i).unwrap_or_default(), i));
                }
            }
            self.write_generations(tx, branch, revision, &generations, now_ms)
                .await?;
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
        let envs = self.advanceable().await?;
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
        let Some(d) = self.in_progress(tx, env).await? else {
            return Ok(false);
        };
        let (generation, action, step) = (d.generation, d.action, d.step);
        let jobs = self.step_jobs(tx, env, generation, step).await?;
        let steps = steps_of(
            action,
            &d.spec.environment,
            gen_u64(generation),
            &d.spec,
            &d.retired,
            d.rollback,
        );
        let canary = canary_steps(&steps);
        // The decision is `generations::next`'s; what follows writes it.
        match generations::next(usize::try_from(step).unwrap_or(0), jobs, &steps) {
            Next::Wait => return Ok(false),
            Next::Fail => {
                self.set_step(tx, env, Status::Failed, step, now_ms).await?;
                let detail = format!(
                    "generation {generation}, step {step}{}",
                    if d.rollback { ", a rollback" } else { "" }
                );
                self.event(tx, now_ms, "deployment-failed", env, &detail).await?;
                // A canary that sent requests to the new release, or rolling batches that
                // moved requests or stopped old replicas, go back to the old release (the pass
                // rolls it back, held, as a failed watch is).
                let moved = match canary.first() {
                    Some(&(first, _)) => Some((first, "a publish of its canary")),
                    None => rolling_from(&steps).map(|first| (first, "between its rolling batches")),
                };
                if let Some((first, what)) = moved
                    && step >= first as i64
                {
                    let why = match self.step_failure(tx, env, generation, step).await? {
                        Some(d) => format!("step {step} failed ({what}): {d}"),
                        None => format!("step {step} failed ({what})"),
                    };
                    self.fail_canary(tx, env, generation, &why, now_ms).await?;
                }
            }
            Next::Step(s) => {
                self.set_step(tx, env, Status::InProgress, s as i64, now_ms).await?;
                self.queue_step(tx, env, &steps[s], s, now_ms).await?;
                if let Some(&(_, weight)) = canary.iter().find(|(i, _)| *i as i64 == step) {
                    // Its replicas are watched from the first share of requests to the switch.
                    if canary.first().is_some_and(|(i, _)| *i as i64 == step) {
                        self.set_watch(tx, env, now_ms, CANARY_UNTIL).await?;
                    }
                    let next = match steps[s].first().and_then(|(t, _)| t.wait()) {
                        Some(Wait::Seconds(p)) => format!("the next step in {p} s"),
                        Some(Wait::Promote) => "the next step waits for `pl rollout promote`".to_owned(),
                        None => "the next step now".to_owned(),
                    };
                    let detail = format!("generation {generation}: {weight}% of requests on the new release; {next}");
                    self.event(tx, now_ms, "canary-step", env, &detail).await?;
                }
            }
            Next::Done(n) => {
                self.set_step(tx, env, Status::Done, n as i64, now_ms).await?;
                if action == Action::Teardown {
                    // Its networks are gone from every node: their subnets are free again.
                    self.free_subnets(tx, env).await?;
                }
                let mut detail = format!(
                    "generation {generation}{}",
                    if d.rollback { ", a rollback" } else { "" }
                );
                // A new release is watched from its switch (a rollback's generation is not:
                // there is nothing further back to go to).
                if action == Action::Rollout
                    && !d.rollback
                    && let Some(w) = state_schema::watch::window(&d.spec)
                {
                    self.set_watch(tx, env, now_ms, now_ms + i64::from(w) * 1000).await?;
                    detail.push_str(&format!(", watched for {w} s"));
                } else if !canary.is_empty() {
                    self.end_watch(tx, env).await?;
                }
                if !canary.is_empty() {
                    detail.push_str(&format!(", after a canary of {} step(s)", canary.len()));
                }
                if rolling_from(&steps).is_some() {
                    let batches = state_schema::rolling::batch_count(
                        &d.spec,
                        &state_schema::rolling::rolling_of(&d.spec, &d.retired),
                    );
                    detail.push_str(&format!(", rolled in {batches} batch(es)"));
                }
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

/// The jobs of step `index`, due now, or after the pause of the canary step before
/// (`pl rollout promote` makes them due at once).
fn job_rows(step: &Step, index: usize, now_ms: i64) -> impl Iterator<Item = JobRow<'_>> {
    step.iter().map(move |(task, node)| {
        let due = match task.wait() {
            None => now_ms,
            Some(Wait::Seconds(s)) => now_ms.saturating_add(i64::from(s) * 1000),
            Some(Wait::Promote) => PROMOTE,
        };
        JobRow::new(task, node.as_str(), MAX_ATTEMPTS, due, Some(index as i64))
    })
}

/// The canary steps of a rollout: the index of each weighted publish step, and its weight.
fn canary_steps(steps: &[Step]) -> Vec<(usize, u8)> {
    steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            s.iter().find_map(|(t, _)| match t {
                Task::PublishIngress { weight: Some(w), .. } => Some((i, *w)),
                _ => None,
            })
        })
        .collect()
}

/// The first step of rolling batches that moves something off the old release (a rolled
/// publish, or a batch's stop) before the last replicas start: a failure from there on rolls
/// the environment back, as a canary's does. `None` when the rollout does not roll.
fn rolling_from(steps: &[Step]) -> Option<usize> {
    let last_up = steps
        .iter()
        .rposition(|s| s.iter().any(|(t, _)| matches!(t, Task::EnsureApplication { .. })))?;
    steps[..last_up].iter().position(|s| {
        s.iter().any(|(t, _)| {
            matches!(
                t,
                Task::StopApplication { .. } | Task::PublishIngress { rolled: Some(_), .. }
            )
        })
    })
}

/// The first step at or after `from` that has jobs.
fn first_step_from(steps: &[Step], from: usize) -> Option<usize> {
    (from..steps.len()).find(|&i| !steps[i].is_empty())
}
