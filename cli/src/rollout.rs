//! `pl rollout promote ENV`: the environment's canary goes on past its pause (operator role);
//! returns once the step it let run is done on the hosts (its publish jobs reported by the
//! agents), or the rollout finished. `pl rollout abort ENV`: the rollout in progress stops and
//! the previous release takes every request back, held as `pl rollback` holds it; returns
//! once the agents report it. Exit codes: 0 done, 1 refused or failed, 2 not done within the
//! timeout.

use crate::operator::{Client, ServerArgs};
use anyhow::Result;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How often the deployment is looked at while following.
const POLL: Duration = Duration::from_millis(100);

pub fn promote(server: &ServerArgs, environment: &str, timeout: Duration) -> Result<u8> {
    let client = Client::new(server)?;
    let started = Instant::now();
    let body = json!({"environment": environment, "action": "promote"});
    let asked = match client.post_json("/v1/rollouts", &body) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("pl rollout promote: {e}");
            return Ok(1);
        }
    };
    let (Some(generation), Some(step)) = (asked["generation"].as_u64(), asked["step"].as_u64()) else {
        eprintln!("pl rollout promote: the control plane answered without a generation and step");
        return Ok(1);
    };
    eprintln!("pl rollout promote: {environment}: generation {generation}, step {step} runs now");
    let deadline = started + timeout;
    loop {
        let deployments = client.json("GET", "/v1/deployments?limit=1000")?;
        let d = deployments["deployments"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["environment"].as_str() == Some(environment))
            .cloned()
            .unwrap_or(Value::Null);
        match judge(&d, generation, step) {
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
                    "pl rollout promote: step {step} of generation {generation} not done within {} s",
                    timeout.as_secs()
                );
                return Ok(2);
            }
            None => std::thread::sleep(POLL),
        }
    }
}

/// Whether the promoted step (`step` of `generation`) is done on the hosts (`Ok`), will not be
/// (`Err`), or is still running (`None`), from the deployment `d` as `/v1/deployments` shows it.
fn judge(d: &Value, generation: u64, step: u64) -> Option<Result<String, String>> {
    let Some(now) = d["generation"].as_u64() else {
        return Some(Err("no deployment".into()));
    };
    let status = d["status"].as_str().unwrap_or("?");
    let at = d["step"].as_u64().unwrap_or(0);
    match (now == generation, status) {
        (false, _) => Some(Err(format!(
            "generation {now} replaced {generation} (a rollback, or a commit)"
        ))),
        (true, "failed") => Some(Err(format!("generation {generation} failed at step {at}"))),
        (true, "done") => Some(Ok(format!("generation {generation} switched: its canary is over"))),
        (true, _) if at > step => Some(Ok(format!(
            "generation {generation} past step {step}, now at step {at}"
        ))),
        _ => None,
    }
}

pub fn abort(server: &ServerArgs, environment: &str, timeout: Duration) -> Result<u8> {
    let client = Client::new(server)?;
    let started = Instant::now();
    let body = json!({"environment": environment, "action": "abort"});
    let asked = match client.post_json("/v1/rollouts", &body) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("pl rollout abort: {e}");
            return Ok(1);
        }
    };
    crate::rollback::follow(&client, environment, &asked, started, timeout, "pl rollout abort")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_promote_is_done_when_its_step_is_past_or_the_rollout_switched() {
        let d = |g: u64, status: &str, step: u64| json!({"generation": g, "status": status, "step": step});
        assert_eq!(judge(&d(4, "in-progress", 4), 4, 4), None);
        assert!(matches!(judge(&d(4, "in-progress", 5), 4, 4), Some(Ok(_))));
        assert!(matches!(judge(&d(4, "done", 6), 4, 4), Some(Ok(_))));
        assert!(matches!(judge(&d(4, "failed", 4), 4, 4), Some(Err(_))));
        assert!(matches!(judge(&d(5, "in-progress", 2), 4, 4), Some(Err(_))));
    }
}
