//! How a generation's rollout advances, step by step, written: `state_schema::rollout::advance`
//! decides (level-triggered: every unfinished deployment whose step can move is looked at) and
//! this module writes what it says: a step's jobs queued, a pause or a promote's wait set on
//! the deployment's row, a canary's share and watch, a failure taken back, a rollout done.
//! A newcomer changing how a canary step advances opens that function and this module.

use crate::hub::WatchHint;
use crate::store::rows::MAX_ATTEMPTS;
use crate::store::rows::gen_u64;
use crate::store::tallies as tally;
use crate::store::{JobRow, Ledger, LedgerError};
use state_schema::generations::{Action, Status};
use state_schema::rollout::Step;
use state_schema::rollout::advance::{self, Advance, Measured, Rollout, Standing, StepState, Watch};

type Tx = crate::store::WriteTx;

/// Which nodes' agents predate `ensure-environment` (`rollout::for_agents`): read at most once
/// a write, and only when a step it shapes sets up an environment.
#[derive(Default)]
pub(super) struct Older(Option<std::collections::BTreeSet<String>>);

impl Older {
    /// `step` as its nodes' agents can run it.
    pub(super) async fn shape(&mut self, ledger: &Ledger, tx: &mut Tx, step: Step) -> Result<Step, LedgerError> {
        if !state_schema::rollout::sets_up(&step) {
            return Ok(step);
        }
        let older = match &mut self.0 {
            Some(older) => older,
            none => none.insert(ledger.nodes().older_agents_in(tx, agent_proto::PROTOCOL).await?),
        };
        Ok(state_schema::rollout::for_agents(step, |n| older.contains(n.as_str())))
    }

    /// What queueing step `index` of `steps` writes: that step as its agents can run it, due
    /// now, and the step [`advance::held_with`] puts beside it, held (each node's replicas,
    /// due once that node's set-up succeeded). Each with its index and whether it is held.
    pub(super) async fn queued(
        &mut self,
        ledger: &Ledger,
        tx: &mut Tx,
        steps: &[Step],
        index: usize,
    ) -> Result<Vec<(Step, usize, bool)>, LedgerError> {
        let Some(step) = steps.get(index) else {
            return Ok(Vec::new());
        };
        let mut out = vec![(self.shape(ledger, tx, step.clone()).await?, index, false)];
        if let Some(h) = advance::held_with(steps, index) {
            out.push((steps[h].clone(), h, true));
        }
        Ok(out)
    }
}

/// The jobs of step `index`, due now unless `held` (a step that waits is queued only when it
/// runs).
pub(super) fn job_rows(step: &Step, index: usize, now_ms: i64, held: bool) -> impl Iterator<Item = JobRow<'_>> {
    step.iter().map(move |(task, node)| {
        let row = JobRow::new(task, node.as_str(), MAX_ATTEMPTS, now_ms, Some(index as i64));
        if held { row.held() } else { row }
    })
}

/// The `jobs-queued` event's words for `n` new jobs of step `index`.
pub(super) fn queued_words(index: usize, n: usize, held: bool) -> String {
    match held {
        true => format!("step {index}: {n} jobs, each held until its node's set-up succeeded"),
        false => format!("step {index}: {n} jobs"),
    }
}

impl Ledger {
    /// Queues step `index` of `env`'s generation `generation` (with what is held beside it,
    /// [`Older::queued`]), and makes due whatever of it was queued held before. Returns how
    /// many jobs were new.
    pub(super) async fn queue_step(
        &self,
        tx: &mut Tx,
        (env, generation): (&str, i64),
        steps: &[Step],
        index: usize,
        now_ms: i64,
    ) -> Result<usize, LedgerError> {
        let mut new = 0;
        for (step, i, held) in Older::default().queued(self, tx, steps, index).await? {
            let rows: Vec<JobRow<'_>> = job_rows(&step, i, now_ms, held).collect();
            let added = self.jobs().enqueue_in(tx, &rows, now_ms).await?;
            if !added.is_empty() {
                let detail = queued_words(i, added.len(), held);
                self.events().event(tx, now_ms, "jobs-queued", env, &detail).await?;
            }
            new += added.len();
        }
        self.jobs()
            .release_step_in(tx, (env, generation, index as i64), now_ms)
            .await?;
        Ok(new)
    }

    /// Step `s` runs now, after step `at`: queued, unless it was queued with `at`
    /// ([`advance::held_with`]), in its transaction: then only what a node's set-up has not
    /// released yet is made due (not a statement of 50 rows whose every key exists, while the
    /// writer waits). A rollout a daemon before this one started has none there, and gets them
    /// queued.
    async fn start_step(
        &self,
        tx: &mut Tx,
        (env, generation): (&str, i64),
        steps: &[Step],
        (at, s): (usize, usize),
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let ahead = advance::held_with(steps, at) == Some(s)
            && self.deployments().step_queued(tx, env, generation, s as i64).await?;
        match ahead {
            true => {
                self.jobs()
                    .release_step_in(tx, (env, generation, s as i64), now_ms)
                    .await?;
            }
            false => {
                self.queue_step(tx, (env, generation), steps, s, now_ms).await?;
            }
        }
        Ok(())
    }

    /// Moves every unfinished deployment on that can move (its step's jobs all ended, or its
    /// pause over): what [`advance::advance`] decides, written. Returns how many changed.
    /// A watch it sets extends `watching`, so that heartbeats judge against it at once.
    pub async fn advance(&self, now_ms: i64, watching: &WatchHint) -> Result<usize, LedgerError> {
        let envs = self.deployments().advanceable(now_ms).await?;
        let mut changed = 0;
        for env in envs {
            let mut tx = self.write_tx().await?;
            if self.advance_one(&mut tx, &env, now_ms, watching).await? {
                changed += 1;
            }
            tx.commit().await?;
        }
        Ok(changed)
    }

    pub(super) async fn advance_one(
        &self,
        tx: &mut Tx,
        env: &str,
        now_ms: i64,
        watching: &WatchHint,
    ) -> Result<bool, LedgerError> {
        let Some(d) = self.deployments().in_progress(tx, env).await? else {
            return Ok(false);
        };
        let (generation, step) = (d.generation, d.step);
        let jobs = self.deployments().step_jobs(tx, env, generation, step).await?;
        let rollout = Rollout {
            action: d.action,
            rollback: d.rollback,
            generation: gen_u64(generation),
            spec: &d.spec,
            retired: &d.retired,
        };
        let steps = rollout.steps();
        let at = usize::try_from(step).unwrap_or(0);
        // A step of canary measures: what they reported, for the decision's gates.
        let measured = match steps.get(at).is_some_and(|s| s.iter().any(|(t, _)| t.gate().is_some())) {
            true => self.measured(tx, env, generation, step).await?,
            false => Vec::new(),
        };
        let standing = Standing {
            step: at,
            state: d.state,
            jobs,
            measured: &measured,
        };
        let here = Here {
            env,
            generation,
            step,
            rollback: if d.rollback { ", a rollback" } else { "" },
            now_ms,
        };
        match advance::advance(&rollout, &steps, standing, now_ms) {
            Advance::Wait => return Ok(false),
            Advance::Resume { step: s } => {
                self.deployments()
                    .set_step(tx, env, Status::InProgress, s as i64, StepState::Running, now_ms)
                    .await?;
                self.queue_step(tx, (env, generation), &steps, s, now_ms).await?;
            }
            Advance::Fail { back, gate } => self.write_failed(tx, &here, back, gate).await?,
            Advance::Next {
                step: s,
                state,
                share,
                gate,
            } => {
                self.deployments()
                    .set_step(tx, env, Status::InProgress, s as i64, state, now_ms)
                    .await?;
                if let Some(v) = gate {
                    let detail = format!("generation {generation}: {}", v.words());
                    self.events().event(tx, now_ms, "canary-gates", env, &detail).await?;
                }
                if state == StepState::Running {
                    self.start_step(tx, (env, generation), &steps, (at, s), now_ms).await?;
                }
                if let Some(share) = share {
                    self.write_share(tx, &here, share, state, watching).await?;
                }
            }
            Advance::Done { steps: n, watch } => {
                self.deployments()
                    .set_step(tx, env, Status::Done, n as i64, StepState::Running, now_ms)
                    .await?;
                if d.action == Action::Teardown {
                    // Its networks are gone from every node: their subnets are free again.
                    self.deployments().free_subnets(tx, env).await?;
                }
                let mut detail = format!("generation {generation}{}", here.rollback);
                if let Some(watched) = self.write_watch(tx, &here, watch, watching).await? {
                    detail.push_str(&watched);
                }
                detail.push_str(&done_words(&steps, &d.spec, &d.retired));
                if d.action == Action::Rollout && !d.rollback {
                    // A release (a rollback is none): its commit-to-live, for the fleet's picture
                    // and the metrics, and a rollout completed.
                    self.deployments().record_live(tx, env, generation, now_ms).await?;
                    tx.tally_one(now_ms, tally::ROLLOUTS, "completed");
                }
                self.events()
                    .event(tx, now_ms, &format!("deployment-{}-done", d.action), env, &detail)
                    .await?;
            }
        }
        Ok(true)
    }

    /// What a step's canary measures reported, as the decision reads them.
    async fn measured(&self, tx: &mut Tx, env: &str, generation: i64, step: i64) -> Result<Vec<Measured>, LedgerError> {
        let measures = self.deployments().step_measures(tx, env, generation, step).await?;
        Ok(measures
            .iter()
            .map(|m| Measured {
                requests: u32::try_from(m.requests).unwrap_or(u32::MAX),
                errors: u32::try_from(m.errors).unwrap_or(u32::MAX),
                p95_micros: m.p95_micros.and_then(|p| u64::try_from(p).ok()),
                logged: m.logged,
            })
            .collect())
    }

    /// A failed step, written: the deployment failed with its event, and what had moved off the
    /// old release goes back to it (the pass rolls it back, held, as a failed watch is).
    async fn write_failed(
        &self,
        tx: &mut Tx,
        here: &Here<'_>,
        back: Option<advance::Back>,
        gate: Option<advance::GateVerdict>,
    ) -> Result<(), LedgerError> {
        let Here {
            env,
            generation,
            step,
            rollback,
            now_ms,
        } = *here;
        self.deployments()
            .set_step(tx, env, Status::Failed, step, StepState::Running, now_ms)
            .await?;
        // What was queued ahead with a set-up (each node's replicas) does not start now.
        self.jobs()
            .cancel_after_step_in(tx, (env, generation, step), now_ms)
            .await?;
        let detail = format!("generation {generation}, step {step}{rollback}");
        self.events()
            .event(tx, now_ms, "deployment-failed", env, &detail)
            .await?;
        if gate.is_some() {
            tx.tally_one(now_ms, tally::ROLLOUTS, "gate-failed");
        }
        let Some(back) = back else { return Ok(()) };
        let what = back.what();
        let failure = match gate {
            Some(v) => Some(format!("canary-gate-failed: {}", v.words())),
            None => self.deployments().step_failure(tx, env, generation, step).await?,
        };
        let why = match failure {
            Some(d) => format!("step {step} failed ({what}): {d}"),
            None => format!("step {step} failed ({what})"),
        };
        self.deployments().fail_canary(tx, env, generation, &why, now_ms).await
    }

    /// A canary's share given, written with its event; its replicas are watched from the
    /// first share of requests to the switch.
    async fn write_share(
        &self,
        tx: &mut Tx,
        here: &Here<'_>,
        share: advance::Share,
        state: StepState,
        watching: &WatchHint,
    ) -> Result<(), LedgerError> {
        let (env, now_ms) = (here.env, here.now_ms);
        self.deployments().set_share(tx, env, share.weight).await?;
        if share.first {
            self.deployments().watch_to_switch(tx, env, now_ms).await?;
            watching.extend(i64::MAX);
        }
        let next = match state {
            StepState::Paused { due_ms } => {
                format!("the next step in {} s", (due_ms - now_ms).max(0) / 1000)
            }
            StepState::AwaitsPromote => "the next step waits for `pl rollout promote`".to_owned(),
            StepState::Running => "the next step now".to_owned(),
        };
        let detail = format!(
            "generation {}: {}% of requests on the new release; {next}",
            here.generation, share.weight
        );
        self.events().event(tx, now_ms, "canary-step", env, &detail).await
    }

    /// What becomes of the watch at a rollout's end, written; what the done event adds.
    async fn write_watch(
        &self,
        tx: &mut Tx,
        here: &Here<'_>,
        watch: Watch,
        watching: &WatchHint,
    ) -> Result<Option<String>, LedgerError> {
        let (env, now_ms) = (here.env, here.now_ms);
        match watch {
            Watch::Window(w) => {
                let until = now_ms + i64::from(w) * 1000;
                self.deployments().set_watch(tx, env, now_ms, until).await?;
                watching.extend(until);
                Ok(Some(format!(", watched for {w} s")))
            }
            Watch::End => {
                self.deployments().end_watch(tx, env).await?;
                Ok(None)
            }
            Watch::Keep => Ok(None),
        }
    }
}

/// The deployment a decision is written for.
#[derive(Clone, Copy)]
struct Here<'a> {
    env: &'a str,
    generation: i64,
    step: i64,
    /// `", a rollback"` for a rollback's rollout, for its events.
    rollback: &'static str,
    now_ms: i64,
}

/// What a rollout's done event says of its shape: a canary's steps, a rolling one's batches.
fn done_words(
    steps: &[Step],
    spec: &state_schema::deployment::DeploymentSpec,
    retired: &[state_schema::deployment::DeploymentSpec],
) -> String {
    let mut words = String::new();
    let canary = advance::canary_steps(steps);
    if !canary.is_empty() {
        words.push_str(&format!(", after a canary of {} step(s)", canary.len()));
    }
    if advance::rolling_from(steps).is_some() {
        let batches = state_schema::rolling::batch_count(spec, &state_schema::rolling::rolling_of(spec, retired));
        words.push_str(&format!(", rolled in {batches} batch(es)"));
    }
    words
}
