//! `pl wait`: for CI, until a revision is live everywhere it applies, as the agents report it.
//!
//! Live means: the revision was accepted on the applied branch (and is in force, or a later
//! accepted revision followed it), and every rollout of that branch (or of the environments
//! named) is done with every placed replica reported running and healthy and none of another
//! generation still running: what `pl up` waits for, against any control plane. An environment
//! a rollback holds (by an operator, or by a release's failed watch) is not live as Git says: a
//! failure. Exit codes: 0 live, 1 rejected, failed or rolled back (with the reasons, or the
//! failing job's code, detail and log tail), 2 not live within the timeout (with what it
//! waits for: a step, replicas no node has room for, or a canary's promote).

use crate::client::{Client, ServerArgs};
use anyhow::{Result, bail};
use operator_proto::revisions::Verdict as Judged;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct WaitArgs {
    /// The commit to wait for (a full sha or a prefix of at least 7 hex digits; default: the
    /// newest commit the control plane judged on its branch).
    #[arg(long)]
    pub rev: Option<String>,
    /// Only these environments (repeatable; default: every environment of the branch).
    #[arg(long = "env", value_name = "ENV")]
    pub environments: Vec<String>,
    /// How long to wait: seconds, or with a unit (`90s`, `5m`, `1h`).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `90`, `90s`, `5m`, `1h`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (90s, 5m, 1h)"))?;
    let seconds = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("`{s}` is not a duration (90s, 5m, 1h)")),
    };
    Ok(Duration::from_secs(seconds))
}

pub fn wait(args: &WaitArgs) -> Result<u8> {
    if let Some(r) = &args.rev
        && (r.len() < 7 || r.len() > 40 || !r.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        bail!("--rev `{r}` is not a commit sha (7 to 40 hex digits)");
    }
    let client = Client::new(&args.server)?;
    let deadline = Instant::now() + args.timeout;
    let mut said = String::new();
    // One environment named: between looks, a long poll on it (a change answers at once).
    let mut watch = match args.environments.as_slice() {
        [one] => Some(crate::client::Watch::new(&client, one)),
        _ => None,
    };
    // Several (or every) environment: a long poll on the fleet's events.
    let mut wake = match watch {
        Some(_) => None,
        None => Some(crate::client::Wake::new(&client)),
    };
    loop {
        match check(&client, args)? {
            Verdict::Live(line) => {
                println!("{line}");
                return Ok(0);
            }
            Verdict::Failed(why) => {
                eprintln!("pl wait: {why}");
                return Ok(1);
            }
            Verdict::Waiting(why) => {
                if why != said {
                    eprintln!("pl wait: {why}");
                    said = why;
                }
            }
        }
        if Instant::now() >= deadline {
            eprintln!("pl wait: not live within {} s: {said}", args.timeout.as_secs());
            return Ok(2);
        }
        match watch.as_mut() {
            // A verdict on a commit changes no deployment: look again within 2 s whatever.
            Some(w) => {
                w.next(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_secs(2)),
                )?;
            }
            // An event wakes it at once; a heartbeat (no event) is seen 500 ms on at most.
            None => {
                if let Some(w) = wake.as_mut() {
                    w.wait(
                        deadline
                            .saturating_duration_since(Instant::now())
                            .min(Duration::from_millis(500)),
                    )?;
                }
            }
        }
    }
}

enum Verdict {
    Live(String),
    Failed(String),
    Waiting(String),
}

fn check(client: &Client, args: &WaitArgs) -> Result<Verdict> {
    let status = client.status()?;
    let branch = status.branch.clone();
    let list = client.revisions(Some(&branch), 1000)?.revisions;
    let wanted = match &args.rev {
        Some(r) => {
            let r = r.to_ascii_lowercase();
            match list.iter().position(|v| v.sha.starts_with(&r)) {
                Some(i) => i,
                None => return Ok(Verdict::Waiting(format!("{r} is not judged on {branch} yet"))),
            }
        }
        None if list.is_empty() => return Ok(Verdict::Waiting(format!("nothing judged on {branch} yet"))),
        None => 0,
    };
    let revision = &list[wanted];
    let sha = revision.sha.clone();
    if revision.verdict == Judged::Rejected {
        return Ok(Verdict::Failed(format!(
            "{sha} was rejected:\n{}",
            crate::live::reasons_text(&revision.reasons)
        )));
    }
    // Newest first: a later accepted revision carries this one's changes on.
    let in_force = status.in_force.as_deref().unwrap_or_default();
    let later = list[..wanted].iter().any(|v| v.verdict == Judged::Accepted);
    if in_force != sha && !later {
        return Ok(Verdict::Waiting(format!("{sha} accepted, not in force yet")));
    }
    // The environments named, each as its own resource; else every deployment, page by page.
    let rows: Vec<crate::live::Deployment> = match args.environments.is_empty() {
        true => client.deployments()?,
        false => {
            let mut rows = Vec::new();
            for env in &args.environments {
                rows.extend(client.environment(env)?);
            }
            rows
        }
    };
    let mut waiting = Vec::new();
    let mut seen = Vec::new();
    for d in &rows {
        let env = d.environment.as_str();
        if d.branch != branch || (!args.environments.is_empty() && !args.environments.iter().any(|e| e == env)) {
            continue;
        }
        seen.push(env.to_owned());
        // The same judgement `pl up` makes: a hold, a failure, a canary that waits for an
        // operator, replicas that wait for room, or not yet running.
        match crate::live::judge(d) {
            crate::live::Verdict::Live => {}
            crate::live::Verdict::Failed(why) => {
                let failure = if d.status == operator_proto::DeploymentStatus::Failed {
                    crate::up::follow::failure_of(client, env)?
                        .map(|f| format!(": {f}"))
                        .unwrap_or_default()
                } else {
                    String::new()
                };
                return Ok(Verdict::Failed(format!("{why}{failure}")));
            }
            crate::live::Verdict::Progressing(why)
            | crate::live::Verdict::WaitsForPromote(why)
            | crate::live::Verdict::Short(why) => waiting.push(why),
        }
    }
    if let Some(missing) = args.environments.iter().find(|e| !seen.contains(e)) {
        return Ok(Verdict::Waiting(format!("no deployment of {missing} on {branch} yet")));
    }
    if !waiting.is_empty() {
        return Ok(Verdict::Waiting(waiting.join("; ")));
    }
    Ok(Verdict::Live(format!(
        "{} live on {branch}: {} environment(s) done, every replica asked for running",
        &sha[..sha.len().min(12)],
        seen.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("5 m").is_err() && parse_duration("m").is_err() && parse_duration("5d").is_err());
    }
}
