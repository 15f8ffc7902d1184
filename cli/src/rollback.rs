//! `pl rollback ENV`: the environment's previous release back (operator role), held there
//! until an accepted commit changes the environment; `--release` ends the hold, and the
//! environment goes back to what Git says. Both return once the agents report it true on the
//! hosts: every placed replica running and healthy at the new generation and none of another
//! still running. Exit codes: 0 done, 1 refused or failed, 2 not done within the timeout.

use crate::client::{Client, ServerArgs};
use anyhow::Result;
use operator_proto::rollbacks::{RollbackAnswer, RollbackAsk, RolledBack};
use std::time::{Duration, Instant};

pub fn rollback(server: &ServerArgs, environment: &str, release: bool, timeout: Duration) -> Result<u8> {
    let client = Client::new(server)?;
    let started = Instant::now();
    let ask = RollbackAsk {
        environment: environment.to_owned(),
        release,
    };
    let asked = match client.rollback(&ask) {
        Ok(RollbackAnswer::RolledBack(r)) => Some(r),
        Ok(RollbackAnswer::Released(_)) => None,
        Err(e) => {
            eprintln!("pl rollback: {e}");
            return Ok(1);
        }
    };
    follow(&client, environment, asked.as_ref(), started, timeout, "pl rollback")
}

/// Follows the rollback `asked` (or, `None`, a hold's release) until the agents report it true on the
/// hosts; the exit code as [`rollback`]'s. `me` starts each line on stderr.
pub(crate) fn follow(
    client: &Client,
    environment: &str,
    asked: Option<&RolledBack>,
    started: Instant,
    timeout: Duration,
    me: &str,
) -> Result<u8> {
    let wanted = asked.map(|a| a.generation);
    if let Some(a) = asked {
        eprintln!(
            "{me}: {environment}: generation {} back to generation {}'s release as generation {}",
            a.from, a.to, a.generation
        );
    } else {
        eprintln!("{me}: {environment}: hold released; planning it from Git");
    }
    let deadline = started + timeout;
    let mut said = String::new();
    let mut watch = crate::client::Watch::new(client, environment);
    loop {
        // The one environment, as its own resource, followed by a long poll.
        let d = watch.next(deadline.saturating_duration_since(Instant::now()))?;
        match judge(d.as_ref(), wanted) {
            Judged::Done => {
                let secs = started.elapsed().as_secs_f64();
                let generation = d.as_ref().map_or(0, |d| d.generation);
                if wanted.is_some() {
                    println!(
                        "{environment}: generation {generation} runs generation {}'s release on every replica ({secs:.1} s); held until a commit changes {environment} or `pl rollback --release {environment}`",
                        asked.map_or(0, |a| a.to)
                    );
                } else {
                    println!(
                        "{environment}: as Git says again, generation {generation} on every replica ({secs:.1} s)"
                    );
                }
                return Ok(0);
            }
            Judged::Failed(why) => {
                let failure = crate::up::follow::failure_of(client, environment)?;
                eprintln!(
                    "{me}: {environment}: {why}{}",
                    failure.map(|f| format!(": {f}")).unwrap_or_default()
                );
                return Ok(1);
            }
            Judged::Waiting(why) => {
                if why != said {
                    eprintln!("{me}: {why}");
                    said = why;
                }
            }
        }
        if Instant::now() >= deadline {
            eprintln!("{me}: not done within {} s: {said}", timeout.as_secs());
            return Ok(2);
        }
    }
}

enum Judged {
    Done,
    Failed(String),
    Waiting(String),
}

/// Where the deployment `d` stands against the rollback's generation (`wanted`), or, for a
/// release, against the hold's end.
fn judge(d: Option<&operator_proto::Deployment>, wanted: Option<u64>) -> Judged {
    use operator_proto::DeploymentStatus;
    let Some(d) = d else {
        return Judged::Failed("no deployment".into());
    };
    let generation = u64::try_from(d.generation).unwrap_or(0);
    let converged = d.running == d.replicas && d.stale == 0;
    let line = format!(
        "generation {generation} {}, {} of {} replicas running",
        d.status.as_str(),
        d.running,
        d.replicas
    );
    match wanted {
        Some(g) if generation > g => Judged::Failed(format!("generation {generation} replaced the rollback's {g}")),
        Some(g) if generation < g => Judged::Waiting(format!("generation {g} not started yet ({line})")),
        None if d.hold.is_some() => Judged::Waiting(format!("the hold is still on ({line})")),
        _ if d.status == DeploymentStatus::Failed => Judged::Failed(format!("generation {generation} failed")),
        _ if d.status == DeploymentStatus::Done && converged => Judged::Done,
        _ => Judged::Waiting(line),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_only_at_the_rollbacks_generation_with_every_replica_reported() {
        use operator_proto::DeploymentStatus::{Done, Failed, InProgress};
        let d = |g: i64, status, running: usize, stale: usize| {
            let mut d = crate::live::tests::done(2, 2, running);
            (d.generation, d.status, d.stale) = (g, status, stale);
            d.hold = Some(operator_proto::Hold {
                by: "ops".into(),
                at_ms: 0,
                from: 2,
                to: 1,
                generation: 3,
                git_hash: "h".into(),
                released: false,
            });
            d
        };
        assert!(matches!(judge(Some(&d(2, Done, 2, 0)), Some(3)), Judged::Waiting(_)));
        assert!(matches!(
            judge(Some(&d(3, InProgress, 2, 0)), Some(3)),
            Judged::Waiting(_)
        ));
        assert!(matches!(judge(Some(&d(3, Done, 2, 1)), Some(3)), Judged::Waiting(_)));
        assert!(matches!(judge(Some(&d(3, Done, 2, 0)), Some(3)), Judged::Done));
        assert!(matches!(judge(Some(&d(3, Failed, 0, 2)), Some(3)), Judged::Failed(_)));
        assert!(matches!(judge(Some(&d(4, Done, 2, 0)), Some(3)), Judged::Failed(_)));
        assert!(matches!(judge(None, Some(3)), Judged::Failed(_)));
        // A release: done once the hold is gone and the deployment converged.
        assert!(matches!(judge(Some(&d(3, Done, 2, 0)), None), Judged::Waiting(_)));
        let mut free = d(4, Done, 2, 0);
        free.hold = None;
        assert!(matches!(judge(Some(&free), None), Judged::Done));
    }
}
