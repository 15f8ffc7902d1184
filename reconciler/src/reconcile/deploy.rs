//! Turning judged commits into deployments and jobs (moving rollouts forward: `advance.rs`).
//!
//! Each accepted commit is written in one transaction: the revision, the desired objects, the
//! deployments with their generations, the first step's jobs and the events. The plan compares
//! the desired state with what the ledger holds (never with the previous commit), so a replay
//! writes nothing. `advance` is level-triggered: it looks at every unfinished deployment and
//! queues the next step once the current one has succeeded.

use crate::store::deployments::{GenerationRow, ObjectDoc};
use crate::store::{JobRow, Ledger, LedgerError};
use state_repo::revision::Judgement;
use state_schema::canonical::{self, Secrets};
use state_schema::desired::{self, Desired};
use state_schema::generations::{self, Action, Start, Status};
use state_schema::placement::Waiting;
use state_schema::rollout::Step;
use state_schema::values::Name;
use std::collections::{BTreeMap, BTreeSet};

type Tx = crate::store::WriteTx;

use super::advance::{job_rows, queued_words};
use state_schema::rollout::advance::{Rollout, first_step_from};

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
pub(super) enum Again<'a> {
    No,
    Rewrite(&'a str),
    Replan,
    /// Recorded with its objects, its deployments not planned: a control plane rebuilt
    /// without its ledger waits for its nodes' reports first (`reconcile::rebuild`).
    Held,
    /// Planned where it stands, new environments adopted at the generations the nodes run
    /// (`generations::decide`): the end of a rebuild's wait.
    Adopt,
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
        lost_after_ms: i64,
    ) -> Result<Applied, LedgerError> {
        self.apply(branch, preview, j, (now_ms, lost_after_ms), Again::No).await
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
        lost_after_ms: i64,
    ) -> Result<Applied, LedgerError> {
        if !j.accepted() {
            return Ok(Applied::default());
        }
        self.apply(branch, preview, j, (now_ms, lost_after_ms), Again::Replan)
            .await
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
        lost_after_ms: i64,
    ) -> Result<Applied, LedgerError> {
        if !j.accepted() {
            return Ok(Applied::default());
        }
        self.apply(branch, false, j, (now_ms, lost_after_ms), Again::Rewrite(accepted))
            .await
    }

    pub(super) async fn apply(
        &self,
        branch: &str,
        preview: bool,
        j: &mut Judgement,
        // Now, and how long a node may be silent before placement leaves it out.
        (now_ms, lost_after_ms): (i64, i64),
        again: Again<'_>,
    ) -> Result<Applied, LedgerError> {
        // The fleet as it is now (reads), then the pure work, before the write transaction
        // opens (on SQLite it holds the one write lock that agents' leases wait on): placement
        // and spec hashes of every deployment, and the hash of every object.
        let mut fleet = if j.accepted() {
            let pools: Vec<_> = j.state.state.pools().map(|(n, p)| (n.clone(), p.clone())).collect();
            Some(state_schema::replacement::fleet_of(
                &pools,
                &self.nodes().fleet_rows(lost_after_ms).await?,
                now_ms,
            ))
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
        // What the nodes run, for a rebuild's adoption only (read before the write lock).
        let adopted = match again {
            Again::Adopt => {
                let reports = self.nodes().observed_replicas(0).await?;
                generations::adoptable(
                    reports
                        .values()
                        .flatten()
                        .map(|i| (i.environment.as_str(), i.generation, i.spec_hash.as_deref())),
                )
            }
            _ => generations::Adopted::new(),
        };
        let mut tx = self.write_tx().await?;
        let revision = self.revision_row(&mut tx, branch, j, again, now_ms).await?;
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
                self.events()
                    .event(
                        &mut tx,
                        now_ms,
                        "preview-expired",
                        branch,
                        "the last commit is older than previews.ttlHours",
                    )
                    .await?;
            }
            for u in &unplaceable {
                self.events()
                    .event(
                        &mut tx,
                        now_ms,
                        "deployment-unplaceable",
                        u.environment.as_str(),
                        &u.reason,
                    )
                    .await?;
            }
            let kept: BTreeSet<Name> = unplaceable.into_iter().map(|u| u.environment).collect();
            if !matches!(again, Again::Held) {
                self.plan_branch(
                    &mut tx,
                    branch,
                    wanted,
                    (Kept::These(&kept), &adopted),
                    revision,
                    now_ms,
                    &mut applied,
                )
                .await?;
            }
            if let Some(at) = expires {
                self.deployments().set_expiry(&mut tx, branch, at).await?;
            }
        }
        tx.commit().await?;
        Ok(applied)
    }

    /// The revision's row a commit is applied under: recorded now, or (a released hold, an
    /// approved rewrite back to it) the accepted one it already has. `None`: nothing to apply.
    async fn revision_row(
        &self,
        tx: &mut crate::store::WriteTx,
        branch: &str,
        j: &Judgement,
        again: Again<'_>,
        now_ms: i64,
    ) -> Result<Option<i64>, LedgerError> {
        match again {
            Again::No | Again::Held => self.revisions().record_revision_in(tx, branch, j, now_ms).await,
            // A released hold, a rebuild's end: the commit in force, planned again as it stands.
            Again::Replan | Again::Adopt => self.deployments().accepted_revision(tx, branch, &j.sha).await,
            Again::Rewrite(accepted) => {
                let id = self.deployments().accepted_revision(tx, branch, &j.sha).await?;
                if id.is_some() {
                    self.revisions()
                        .rewrite_applied(tx, branch, &j.sha, accepted, now_ms)
                        .await?;
                    self.events()
                        .event(
                            tx,
                            now_ms,
                            "revision-reapplied",
                            &format!("{branch}@{}", j.sha),
                            "an approved rewrite returned to this accepted commit",
                        )
                        .await?;
                }
                Ok(id)
            }
        }
    }

    /// Tears down the previews whose lifetime has run out (`expires_at <= now_ms`). A new
    /// commit to the branch brings them back. Returns the branches torn down.
    pub async fn expire_previews(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        let branches = self.deployments().expired_branches(now_ms).await?;
        for b in &branches {
            let mut tx = self.write_tx().await?;
            let applied = self.teardown_in(&mut tx, b, now_ms).await?;
            if !applied.teardowns.is_empty() {
                self.events()
                    .event(&mut tx, now_ms, "preview-expired", b, "no commit for previews.ttlHours")
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
            self.events()
                .event(&mut tx, now_ms, "branch-deleted", branch, "")
                .await?;
        }
        tx.commit().await?;
        Ok(applied)
    }

    /// Starts a teardown generation for every live deployment of a branch, attributed to the
    /// branch's last accepted revision.
    async fn teardown_in(&self, tx: &mut Tx, branch: &str, now_ms: i64) -> Result<Applied, LedgerError> {
        let revision = self.deployments().last_accepted_id(&mut **tx, branch).await?;
        let mut applied = Applied::default();
        if let Some(revision) = revision {
            self.plan_branch(
                tx,
                branch,
                Vec::new(),
                (Kept::These(&BTreeSet::new()), &generations::Adopted::new()),
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
        let mut have = self.deployments().object_hashes_of(tx, branch).await?;
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
                self.deployments()
                    .upsert_objects(tx, branch, revision, &mut changed)
                    .await?;
            }
        }
        let gone: Vec<(String, String)> = have.into_keys().collect();
        self.deployments().delete_objects(tx, branch, &gone).await
    }

    /// Holds: a re-placement keeps them; a commit keeps those whose environment Git still wants
    /// as it did when the hold began (left out of `wanted`), and ends the others (and released
    /// ones). The environments held.
    async fn held(
        &self,
        tx: &mut Tx,
        branch: &str,
        wanted: &mut Vec<Desired>,
        now_ms: i64,
    ) -> Result<BTreeSet<String>, LedgerError> {
        let holds = self.deployments().holds_of(tx, branch).await?;
        let git: BTreeMap<String, String> = holds
            .iter()
            .filter(|(_, h)| !h.released)
            .map(|(env, h)| (env.clone(), h.git_hash.clone()))
            .collect();
        let (keep, ended) = generations::holds(wanted, &git);
        let released = holds.iter().filter(|(_, h)| h.released).map(|(env, _)| env.clone());
        for (env, why) in ended
            .into_iter()
            .map(|e| (e, "an accepted commit changes it"))
            .chain(released.map(|e| (e, "released: planned from Git again")))
        {
            self.deployments().set_hold(tx, &env, "").await?;
            self.events()
                .event(tx, now_ms, "rollback-hold-ended", &env, why)
                .await?;
        }
        wanted.retain(|d| !keep.contains(d.spec.environment.as_str()));
        Ok(keep)
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
        // Which deployments left out are kept; what the nodes run of new ones (a rebuild).
        (kept, adopted): (Kept<'_>, &generations::Adopted),
        revision: i64,
        now_ms: i64,
        applied: &mut Applied,
    ) -> Result<(), LedgerError> {
        let mut wanted = wanted;
        let held = match kept {
            Kept::All => BTreeSet::new(),
            Kept::These(_) => self.held(tx, branch, &mut wanted, now_ms).await?,
        };
        let current = self.deployments().current_of(tx, branch).await?;
        // Deployments are written first, then what waits is remembered on them.
        let waits: Vec<(String, Vec<Waiting>)> = wanted
            .iter()
            .map(|d| (d.spec.environment.to_string(), d.waiting.clone()))
            .collect();
        // What changed, first from hashes alone; then specs and owners are read for those only,
        // and the decision is `generations::decide`'s.
        let changes = generations::changes(wanted, current, |env| kept.contains(env) || held.contains(env));
        // The first branch to deploy a name keeps it.
        let owners = self
            .deployments()
            .owners_of(tx, branch, &changes.new_environments())
            .await?;
        let specs = self
            .deployments()
            .specs_of(tx, &changes.existing_environments())
            .await?;
        let decision = generations::decide(changes, &owners, specs, adopted);
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
        self.events().events_in(tx, now_ms, &events).await?;
        // Every node a new or scaled generation runs on gets the environment's subnet first.
        let wants: Vec<_> = starts
            .iter()
            .filter(|s| s.action == Action::Rollout)
            .map(|s| &s.spec)
            .chain(scales.iter().map(|s| &s.spec))
            .flat_map(Ledger::subnet_wants)
            .collect();
        self.ensure_subnets(tx, branch, &wants, now_ms).await?;
        // Volumes are pinned where this placement put their roles (the first time), and a
        // teardown starts their retention: a teardown never removes one.
        for s in &starts {
            match s.action {
                Action::Rollout => self.volumes().record_volumes(tx, &s.spec, now_ms).await?,
                Action::Teardown => {
                    self.volumes()
                        .release_volumes(tx, s.spec.environment.as_str(), now_ms)
                        .await?;
                }
            }
        }
        for s in &scales {
            self.volumes().record_volumes(tx, &s.spec, now_ms).await?;
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
        self.plan_branch(
            tx,
            branch,
            wanted,
            (Kept::All, &generations::Adopted::new()),
            revision,
            now_ms,
            applied,
        )
        .await
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
        let mut older = super::advance::Older::default();
        for chunk in starts.chunks(100) {
            let mut events: Vec<(String, String, String)> = Vec::new();
            // Only environments with an earlier generation can have jobs to cancel.
            let existed: Vec<(&str, u64)> = chunk
                .iter()
                .filter(|s| s.existed)
                .map(|s| (s.spec.environment.as_str(), s.generation))
                .collect();
            for (env, n) in self.deployments().cancel_older(tx, &existed, now_ms).await? {
                events.push(("jobs-cancelled".into(), env, format!("{n} jobs of older generations")));
            }
            let mut firsts: Vec<(Step, usize, bool)> = Vec::new();
            let mut generations = Vec::with_capacity(chunk.len());
            for s in chunk {
                let steps = Rollout {
                    action: s.action,
                    rollback: s.rollback,
                    generation: s.generation,
                    spec: &s.spec,
                    retired: &s.retired,
                }
                .steps();
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
                    firsts.extend(older.queued(self, tx, &steps, i).await?);
                }
            }
            self.deployments()
                .write_generations(tx, branch, revision, &generations, now_ms)
                .await?;
            let mut rows: Vec<JobRow<'_>> = Vec::new();
            let mut spans = Vec::with_capacity(firsts.len());
            for (step, index, held) in &firsts {
                let start = rows.len();
                rows.extend(job_rows(step, *index, now_ms, *held));
                spans.push((*index, *held, start..rows.len()));
            }
            let added = self.jobs().enqueue_in(tx, &rows, now_ms).await?;
            applied.jobs_queued += added.len();
            for (index, held, range) in spans {
                // `added` is sorted: the new jobs of this step are one run of it.
                let n = added.partition_point(|&i| i < range.end) - added.partition_point(|&i| i < range.start);
                if n > 0 {
                    let env = rows[range.start].task.environment().as_str().to_owned();
                    events.push(("jobs-queued".into(), env, queued_words(index, n, held)));
                }
            }
            self.events().events_in(tx, now_ms, &events).await?;
        }
        Ok(())
    }
}

/// When a preview judged by `j` expires: its commit's time plus the repository's
/// `previews.ttlHours`; `None` when the repository declares no previews.
fn preview_expiry(j: &Judgement) -> Option<i64> {
    let hours = i64::from(j.state.state.repository()?.previews.as_ref()?.ttl_hours);
    Some(j.committed_at_ms.saturating_add(hours.saturating_mul(3_600_000)))
}
