//! Rollbacks and rollouts: a rollback to the previous release (held until a commit changes the
//! environment) or its hold released; a canary promoted past its pause; a rollout aborted
//! (the previous release back, held as a rollback). The caller follows the environment.

use super::{Answer, OpError, Ops};
use crate::store::now_ms;
use crate::store::rollbacks::Refusal;
use operator_proto::rollbacks::{
    HoldReleased, Promoted, RollbackAnswer, RollbackAsk, RolledBack, RolloutAction, RolloutAnswer, RolloutAsk,
};
use state_schema::generations::RollbackRefusal;
use state_schema::generations::{self, Action, Status};
use state_schema::rollout::advance::{self, PromoteRefusal, StepState};

fn refused(env: &str, why: &Refusal) -> OpError {
    let code = why.code();
    match why {
        Refusal::UnknownEnvironment => OpError::not_found(code, format!("no deployment of {env}")),
        Refusal::NotHeld => OpError::conflict(code, format!("no rollback holds {env}")),
        Refusal::MovedOn => OpError::conflict(code, format!("{env} moved on to another generation")),
        Refusal::NotInProgress => OpError::conflict(
            code,
            format!("no rollout of {env} is in progress: nothing to abort (`pl rollback {env}` goes back a release)"),
        ),
        Refusal::Rollback(RollbackRefusal::NoPrevious) => OpError::conflict(
            code,
            format!(
                "{env} has no previous release to go back to (no finished generation with another release before this one)"
            ),
        ),
        Refusal::Rollback(RollbackRefusal::AlreadyHeld) => OpError::conflict(
            code,
            format!("a rollback holds {env} already; release it first (`pl rollback --release {env}`)"),
        ),
        Refusal::Rollback(RollbackRefusal::TornDown) => {
            OpError::conflict(code, format!("{env} is torn down: nothing to roll back"))
        }
    }
}

fn rolled_back(env: &str, a: &state_schema::generations::RollbackAsk) -> RolledBack {
    RolledBack {
        environment: env.to_owned(),
        from: a.from,
        to: a.to,
        generation: a.generation,
    }
}

impl Ops {
    /// `POST /v1/rollbacks`: a rollback, or (`release`) the end of a hold.
    pub async fn rollback(&self, who: &str, ask: RollbackAsk) -> Answer<RollbackAnswer> {
        let env = &ask.environment;
        if ask.release {
            let hold = self
                .ledger
                .deployments()
                .release_rollback(env, who, now_ms())
                .await?
                .map_err(|why| refused(env, &why))?;
            tracing::info!(by = %who, environment = %env, generation = hold.generation, "rollback hold released");
            self.hub.wrote.notify_waiters();
            self.hub.hint.notify_one();
            return Ok(RollbackAnswer::Released(HoldReleased {
                environment: env.clone(),
                released: true,
            }));
        }
        let a = self
            .ledger
            .deployments()
            .ask_rollback(env, None, who, now_ms(), generations::rollback)
            .await?
            .map_err(|why| refused(env, &why))?;
        tracing::info!(by = %who, environment = %env, from = a.from, to = a.to, generation = a.generation, "rollback asked for");
        self.hub.wrote.notify_waiters();
        self.hub.hint.notify_one();
        Ok(RollbackAnswer::RolledBack(rolled_back(env, &a)))
    }

    /// `POST /v1/rollouts`: a canary promoted, or a rollout aborted.
    pub async fn rollout(&self, who: &str, ask: RolloutAsk) -> Answer<RolloutAnswer> {
        let env = &ask.environment;
        match ask.action {
            RolloutAction::Promote => {
                let (generation, step) = self.promote(env, who).await?.map_err(|why| {
                    let code = why.code();
                    match why {
                        PromoteRefusal::UnknownEnvironment => OpError::not_found(code, format!("no deployment of {env}")),
                        PromoteRefusal::NotInProgress => OpError::conflict(
                            code,
                            format!("no rollout of {env} is in progress: nothing to promote"),
                        ),
                        PromoteRefusal::NotPaused => OpError::conflict(
                            code,
                            format!(
                                "{env}'s rollout is running a step, not pausing; promote when `pl status` shows its canary paused"
                            ),
                        ),
                    }
                })?;
                tracing::info!(by = %who, environment = %env, generation, step, "canary promoted");
                // The step's jobs are queued by the advance the settle runs.
                self.hub.settle_hint.notify_one();
                self.hub.hint.notify_one();
                Ok(RolloutAnswer::Promoted(Promoted {
                    environment: env.clone(),
                    generation,
                    step,
                }))
            }
            RolloutAction::Abort => {
                let a = self.abort(env, who).await?.map_err(|why| refused(env, &why))?;
                // Counted for the metrics once the ask is recorded (its own event is a
                // rollback's: `rollback-asked`).
                self.ledger
                    .events()
                    .tally(now_ms(), crate::store::tallies::ROLLOUTS, "aborted")
                    .await?;
                tracing::info!(by = %who, environment = %env, from = a.from, to = a.to, generation = a.generation, "rollout aborted");
                self.hub.wrote.notify_waiters();
                self.hub.hint.notify_one();
                Ok(RolloutAnswer::Aborted(rolled_back(env, &a)))
            }
        }
    }

    /// A promote judged on the deployment's row, then written on the condition that its step
    /// still waits: the generation and the step that runs now.
    async fn promote(&self, env: &str, who: &str) -> Result<Result<(u64, u64), PromoteRefusal>, OpError> {
        let Some(r) = self.ledger.deployments().step_row(env).await? else {
            return Ok(Err(PromoteRefusal::UnknownEnvironment));
        };
        let status = Status::parse(&r.status).ok_or_else(|| corrupt("status", &r.status))?;
        let state =
            StepState::from_row(&r.step_state, r.step_due).ok_or_else(|| corrupt("step state", &r.step_state))?;
        let now = now_ms();
        if let Err(why) = advance::promote(status, state, now) {
            return Ok(Err(why));
        }
        if !self
            .ledger
            .deployments()
            .promote_step(env, r.generation, r.step, who, now)
            .await?
        {
            // It ran, or another generation started, between the read and the write.
            return Ok(Err(PromoteRefusal::NotPaused));
        }
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(Ok((n(r.generation), n(r.step))))
    }

    /// An abort judged on the deployment's row: a rollback of that generation only (one that
    /// finished meanwhile is not aborted).
    async fn abort(
        &self,
        env: &str,
        who: &str,
    ) -> Result<Result<state_schema::generations::RollbackAsk, Refusal>, OpError> {
        let Some(r) = self.ledger.deployments().step_row(env).await? else {
            return Ok(Err(Refusal::UnknownEnvironment));
        };
        let status = Status::parse(&r.status).ok_or_else(|| corrupt("status", &r.status))?;
        let action = Action::parse(&r.action).ok_or_else(|| corrupt("action", &r.action))?;
        if advance::abort(action, status).is_err() {
            return Ok(Err(Refusal::NotInProgress));
        }
        let of = u64::try_from(r.generation).unwrap_or(0);
        Ok(self
            .ledger
            .deployments()
            .ask_rollback(env, Some(of), who, now_ms(), generations::rollback)
            .await?)
    }
}

fn corrupt(what: &str, value: &str) -> OpError {
    OpError::unavailable(crate::store::LedgerError::Corrupt(format!(
        "a deployment row's {what} is {value:?}"
    )))
}
