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
    eprintln!("pl rollout promote: {environment}: generation {generation}'s canary goes on to its next step");
    let deadline = started + timeout;
    loop {
        // The one environment, as its own resource (its judgement still reads the JSON form:
        // moving it onto the typed row is issue 43's next step).
        let d = match client.environment(environment)? {
            Some(d) => serde_json::to_value(d)?,
            None => Value::Null,
        };
        match judge(&d, environment, generation, step) {
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
            None => std::thread::sleep(POLL),
        }
    }
}

/// Whether the promoted step (rollout step `step` of `generation`) is done on the hosts
/// (`Ok`), will not be (`Err`), or is still running (`None`), from the deployment `d` as
/// `/v1/deployments` shows it. Said in the canary's terms (its share of requests), never in
/// the rollout's internal step numbers.
fn judge(d: &Value, environment: &str, generation: u64, step: u64) -> Option<Result<String, String>> {
    let Some(now) = d["generation"].as_u64() else {
        return Some(Err("no deployment".into()));
    };
    let status = d["status"].as_str().unwrap_or("?");
    let at = d["step"].as_u64().unwrap_or(0);
    match (now == generation, status) {
        (false, _) => Some(Err(format!(
            "generation {now} replaced {generation} (a rollback, or a commit)"
        ))),
        (true, "failed") => Some(Err(format!("generation {generation} failed during its canary"))),
        (true, "done") => Some(Ok(format!(
            "generation {generation} switched: every request goes to the new release, its canary is over"
        ))),
        (true, _) if at > step => {
            let c = &d["canary"];
            let next = if c["waitsForPromote"].as_bool() == Some(true) {
                format!("; the next step waits for `pl rollout promote {environment}`")
            } else {
                String::new()
            };
            Some(Ok(match c["weight"].as_u64() {
                Some(w) => format!(
                    "generation {generation}'s canary took its next step: {w}% of requests on the new release{next}"
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
        assert_eq!(judge(&d(4, "in-progress", 4), "web", 4, 4), None);
        assert!(matches!(judge(&d(4, "in-progress", 5), "web", 4, 4), Some(Ok(_))));
        assert!(matches!(judge(&d(4, "done", 6), "web", 4, 4), Some(Ok(_))));
        assert!(matches!(judge(&d(4, "failed", 4), "web", 4, 4), Some(Err(_))));
        assert!(matches!(judge(&d(5, "in-progress", 2), "web", 4, 4), Some(Err(_))));
    }

    /// A 2-step canary once read `past step 5, now at step 6`: the rollout's own step numbers.
    /// It is said in the canary's share of requests.
    #[test]
    fn a_promote_speaks_in_the_canarys_terms() {
        let mid = json!({"generation": 4, "status": "in-progress", "step": 6,
            "canary": {"weight": 50, "waitsForPromote": true}});
        let Some(Ok(line)) = judge(&mid, "web", 4, 5) else {
            panic!()
        };
        assert_eq!(
            line,
            "generation 4's canary took its next step: 50% of requests on the new release; the next step waits for `pl rollout promote web`"
        );
        let Some(Ok(done)) = judge(&json!({"generation": 4, "status": "done", "step": 7}), "web", 4, 6) else {
            panic!()
        };
        assert!(
            !done.contains("step 7") && done.contains("its canary is over"),
            "{done}"
        );
        let Some(Err(failed)) = judge(&json!({"generation": 4, "status": "failed", "step": 6}), "web", 4, 5) else {
            panic!()
        };
        assert!(!failed.contains("step 6"), "{failed}");
    }
}
