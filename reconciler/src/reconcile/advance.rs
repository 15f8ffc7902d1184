//! How a generation's rollout advances, step by step (level-triggered: every unfinished
//! deployment is looked at, and the next step is queued once the current one succeeded): a
//! canary's pause and promote, a rolling replacement's batches, a watch after the switch. The
//! shapes of the steps are `state_schema::rollout`'s; this module writes what they say.

use crate::store::rollouts::PROMOTE;
use crate::store::rows::MAX_ATTEMPTS;
use crate::store::rows::gen_u64;
use crate::store::watch::CANARY_UNTIL;
use crate::store::{JobRow, Ledger, LedgerError};
use state_schema::generations::{self, Action, Next, Status};
use state_schema::rollout::{self, Step};
use state_schema::task::{Task, Wait};

use state_schema::deployment::DeploymentSpec;
use state_schema::values::Name;

type Tx = crate::store::WriteTx;

/// The jobs of step `index`, due now, or after the pause of the canary step before
/// (`pl rollout promote` makes them due at once).
pub(super) fn job_rows(step: &Step, index: usize, now_ms: i64) -> impl Iterator<Item = JobRow<'_>> {
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
pub(super) fn canary_steps(steps: &[Step]) -> Vec<(usize, u8)> {
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
pub(super) fn rolling_from(steps: &[Step]) -> Option<usize> {
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
pub(super) fn first_step_from(steps: &[Step], from: usize) -> Option<usize> {
    (from..steps.len()).find(|&i| !steps[i].is_empty())
}

impl Ledger {
    pub(super) async fn queue_step(
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

    pub(super) async fn advance_one(&self, tx: &mut Tx, env: &str, now_ms: i64) -> Result<bool, LedgerError> {
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

pub(super) fn steps_of(
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
