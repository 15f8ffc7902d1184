//! Rollbacks and rollouts: a rollback to the previous release (held until a commit changes the
//! environment) or its hold released; a canary promoted past its pause; a rollout aborted
//! (the previous release back, held as a rollback). The caller follows the environment.

use super::{Answer, OpError, Ops};
use crate::store::now_ms;
use crate::store::rollbacks::Refusal;
use crate::store::rollouts::PromoteRefusal;
use operator_proto::rollbacks::{
    HoldReleased, Promoted, RollbackAnswer, RollbackAsk, RolledBack, RolloutAction, RolloutAnswer, RolloutAsk,
};
use state_schema::generations::RollbackRefusal;

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
            .ask_rollback(env, who, now_ms())
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
                let p = self.ledger.promote(env, who, now_ms()).await?.map_err(|why| {
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
                tracing::info!(by = %who, environment = %env, generation = p.generation, step = p.step, "canary promoted");
                self.hub.jobs.notify_waiters();
                self.hub.hint.notify_one();
                Ok(RolloutAnswer::Promoted(Promoted {
                    environment: env.clone(),
                    generation: p.generation,
                    step: p.step,
                }))
            }
            RolloutAction::Abort => {
                let a = self
                    .ledger
                    .abort_rollout(env, who, now_ms())
                    .await?
                    .map_err(|why| refused(env, &why))?;
                tracing::info!(by = %who, environment = %env, from = a.from, to = a.to, generation = a.generation, "rollout aborted");
                self.hub.wrote.notify_waiters();
                self.hub.hint.notify_one();
                Ok(RolloutAnswer::Aborted(rolled_back(env, &a)))
            }
        }
    }
}
