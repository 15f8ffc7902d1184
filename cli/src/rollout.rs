//! `pl rollout promote ENV`: the environment's canary goes on past its pause (operator role);
//! returns once the step it let run is done on the hosts (its publish jobs reported by the
//! agents), or the rollout finished. `pl rollout abort ENV`: the rollout in progress stops and
//! the previous release takes every request back, held as `pl rollback` holds it; returns
//! once the agents report it. Exit codes: 0 done, 1 refused or failed, 2 not done within the
//! timeout.

use crate::client::{Client, ServerArgs};
use anyhow::Result;
use operator_proto::rollbacks::{RolloutAction, RolloutAnswer, RolloutAsk};
use std::time::{Duration, Instant};

pub fn promote(server: &ServerArgs, environment: &str, timeout: Duration) -> Result<u8> {
    let client = Client::new(server)?;
    let started = Instant::now();
    let ask = RolloutAsk {
        environment: environment.to_owned(),
        action: RolloutAction::Promote,
    };
    let asked = match client.rollout(&ask) {
        Ok(RolloutAnswer::Promoted(p)) => p,
        Ok(RolloutAnswer::Aborted(_)) => {
            eprintln!("pl rollout promote: the control plane answered with an abort");
            return Ok(1);
        }
        Err(e) => {
            eprintln!("pl rollout promote: {e}");
            return Ok(1);
        }
    };
    let (generation, step) = (asked.generation, asked.step);
    eprintln!("pl rollout promote: {environment}: generation {generation}'s canary goes on to its next step");
    let deadline = started + timeout;
    let mut watch = crate::client::Watch::new(&client, environment);
    loop {
        // The one environment, as its own resource, followed by a long poll.
        let d = watch.next(deadline.saturating_duration_since(Instant::now()))?;
        match judge(d.as_ref(), environment, generation, step) {
            Some(Ok(line)) => {
                println!("{environment}: {line} ({:.1} s)", started.elapsed().as_secs_f64());
                return Ok(0);
            }
            Some(Err(why)) => {
                eprintln!("pl rollout promote: {environment}: {why}");
                return Ok(1);
            }
            None if Instant::now() >= deadline => {
                eprintln!(
                    "pl rollout promote: generation {generation}'s next canary step not done within {} s",
                    timeout.as_secs()
                );
                return Ok(2);
            }
            None => {}
        }
    }
}

/// Whether the promoted step (rollout step `step` of `generation`) is done on the hosts
/// (`Ok`), will not be (`Err`), or is still running (`None`), from the deployment `d` as
/// `/v1/deployments` shows it. Said in the canary's terms (its share of requests), never in
/// the rollout's internal step numbers.
fn judge(
    d: Option<&operator_proto::Deployment>,
    environment: &str,
    generation: u64,
    step: u64,
) -> Option<Result<String, String>> {
    use operator_proto::DeploymentStatus;
    let Some(d) = d else {
        return Some(Err("no deployment".into()));
    };
    let now = u64::try_from(d.generation).unwrap_or(0);
    let at = u64::try_from(d.step).unwrap_or(0);
    match (now == generation, d.status) {
        (false, _) => Some(Err(format!(
            "generation {now} replaced {generation} (a rollback, or a commit)"
        ))),
        (true, DeploymentStatus::Failed) => Some(Err(format!("generation {generation} failed during its canary"))),
        (true, DeploymentStatus::Done) => Some(Ok(format!(
            "generation {generation} switched: every request goes to the new release, its canary is over"
        ))),
        (true, DeploymentStatus::InProgress) if at > step => {
            let next = match d.canary.as_ref().is_some_and(|c| c.waits_for_promote) {
                true => format!("; the next step waits for `pl rollout promote {environment}`"),
                false => String::new(),
            };
            Some(Ok(match &d.canary {
                Some(c) => format!(
                    "generation {generation}'s canary took its next step: {}% of requests on the new release{next}",
                    c.weight
                ),
                None => format!("generation {generation}'s canary took its next step"),
            }))
        }
        _ => None,
    }
}

pub fn abort(server: &ServerArgs, environment: &str, timeout: Duration) -> Result<u8> {
    let client = Client::new(server)?;
    let started = Instant::now();
    let ask = RolloutAsk {
        environment: environment.to_owned(),
        action: RolloutAction::Abort,
    };
    let asked = match client.rollout(&ask) {
        Ok(RolloutAnswer::Aborted(a)) => a,
        Ok(RolloutAnswer::Promoted(_)) => {
            eprintln!("pl rollout abort: the control plane answered with a promotion");
            return Ok(1);
        }
        Err(e) => {
            eprintln!("pl rollout abort: {e}");
            return Ok(1);
        }
    };
    crate::rollback::follow(&client, environment, Some(&asked), started, timeout, "pl rollout abort")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_promote_is_done_when_its_step_is_past_or_the_rollout_switched() {
        use operator_proto::DeploymentStatus::{Done, Failed, InProgress};
        let d = |g: i64, status, step: i64| {
            let mut d = crate::live::tests::done(1, 1, 1);
            (d.generation, d.status, d.step) = (g, status, step);
            d
        };
        assert_eq!(judge(Some(&d(4, InProgress, 4)), "web", 4, 4), None);
        assert!(matches!(judge(Some(&d(4, InProgress, 5)), "web", 4, 4), Some(Ok(_))));
        assert!(matches!(judge(Some(&d(4, Done, 6)), "web", 4, 4), Some(Ok(_))));
        assert!(matches!(judge(Some(&d(4, Failed, 4)), "web", 4, 4), Some(Err(_))));
        assert!(matches!(judge(Some(&d(5, InProgress, 2)), "web", 4, 4), Some(Err(_))));
        assert!(matches!(judge(None, "web", 4, 4), Some(Err(_))));
    }

    /// A 2-step canary once read `past step 5, now at step 6`: the rollout's own step numbers.
    /// It is said in the canary's share of requests.
    #[test]
    fn a_promote_speaks_in_the_canarys_terms() {
        use operator_proto::DeploymentStatus::{Done, Failed, InProgress};
        let d = |status, step: i64| {
            let mut d = crate::live::tests::done(1, 1, 1);
            (d.generation, d.status, d.step) = (4, status, step);
            d
        };
        let mut mid = d(InProgress, 6);
        mid.canary = Some(operator_proto::Canary {
            weight: 50,
            waits_for_promote: true,
            next_at_ms: None,
        });
        let Some(Ok(line)) = judge(Some(&mid), "web", 4, 5) else {
            panic!()
        };
        assert_eq!(
            line,
            "generation 4's canary took its next step: 50% of requests on the new release; the next step waits for `pl rollout promote web`"
        );
        let Some(Ok(done)) = judge(Some(&d(Done, 7)), "web", 4, 6) else {
            panic!()
        };
        assert!(
            !done.contains("step 7") && done.contains("its canary is over"),
            "{done}"
        );
        let Some(Err(failed)) = judge(Some(&d(Failed, 6)), "web", 4, 5) else {
            panic!()
        };
        assert!(!failed.contains("step 6"), "{failed}");
    }
}
