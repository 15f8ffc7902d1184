//! Following a `pl up` rollout through the reconciler's API until every environment is done
//! and serving, or one fails; shown live on a terminal (a spinner line per environment, with
//! its jobs' counts and what runs now) and as plain lines otherwise, one per job state.

use crate::client::Client;
use crate::live::Verdict;
use anyhow::Result;
use operator_proto::jobs::JobState;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// `pl up`'s exit code when every environment is done or waits for `pl rollout promote`.
pub const WAITS_FOR_OPERATOR: u8 = 3;

/// One environment `pl up` waits for: its name, hostname, and whether a web role serves it.
pub struct Followed {
    pub name: String,
    pub host: String,
    pub web: bool,
}

/// How progress is shown.
enum Display {
    /// Plain lines, each said once (logs, pipes, CI).
    Plain(BTreeSet<String>),
    /// A live line per environment on a terminal.
    Live {
        bars: indicatif::MultiProgress,
        lines: BTreeMap<String, indicatif::ProgressBar>,
    },
}

impl Display {
    fn new(environments: &[Followed]) -> Display {
        use std::io::IsTerminal;
        if !std::io::stdout().is_terminal() {
            return Display::Plain(BTreeSet::new());
        }
        let bars = indicatif::MultiProgress::new();
        let style = indicatif::ProgressStyle::with_template("{spinner} {prefix:.bold} {wide_msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner());
        let lines = environments
            .iter()
            .map(|e| {
                let bar = bars.add(indicatif::ProgressBar::new_spinner());
                bar.set_style(style.clone());
                bar.set_prefix(e.name.clone());
                bar.set_message("waiting for the revision");
                bar.enable_steady_tick(Duration::from_millis(120));
                (e.name.clone(), bar)
            })
            .collect();
        Display::Live { bars, lines }
    }

    /// An environment's jobs of the generation followed: `(key, state)`.
    fn jobs(&mut self, env: &str, generation: i64, jobs: &[(String, JobState)]) {
        match self {
            Display::Plain(said) => {
                for (key, state) in jobs {
                    let line = format!("{env}: {key} {state}");
                    if said.insert(line.clone()) {
                        println!("{line}");
                    }
                }
            }
            Display::Live { lines, .. } => {
                let Some(bar) = lines.get(env) else { return };
                let done = jobs.iter().filter(|j| j.1 == JobState::Succeeded).count();
                let now: Vec<String> = jobs
                    .iter()
                    .filter(|j| j.1 == JobState::Leased)
                    .map(|j| j.0.split('@').next().unwrap_or(&j.0).to_owned())
                    .collect();
                let queued = jobs.iter().filter(|j| j.1 == JobState::Queued).count();
                bar.set_message(format!(
                    "generation {generation}: {done}/{} jobs done{}{}",
                    jobs.len(),
                    if queued > 0 {
                        format!(", {queued} queued")
                    } else {
                        String::new()
                    },
                    if now.is_empty() {
                        String::new()
                    } else {
                        format!("; running {}", now.join(", "))
                    }
                ));
            }
        }
    }

    fn waiting(&mut self, env: &str) {
        if let Display::Plain(said) = self {
            let line = format!("{env}: waiting for the revision");
            if said.insert(line.clone()) {
                println!("{line}");
            }
        }
    }

    /// An environment whose canary waits for an operator: said once, on stdout.
    fn waiting_for_promote(&mut self, env: &str, why: &str) {
        if let Display::Live { lines, .. } = self
            && let Some(bar) = lines.get(env)
        {
            bar.finish_and_clear();
        }
        println!("{why}");
    }

    /// An environment done: its line stays, with its URL.
    fn done(&mut self, env: &str, line: String) {
        match self {
            Display::Plain(said) => {
                if said.insert(line.clone()) {
                    println!("{line}");
                }
            }
            Display::Live { bars, lines } => {
                // Printed above the live lines, whole (a bar's line is cut to the terminal).
                if let Some(bar) = lines.get(env)
                    && !bar.is_finished()
                {
                    bar.finish_and_clear();
                    let _ = bars.println(format!("✔ {line}"));
                }
            }
        }
    }

    /// Stops the live lines where they are (an error is printed below them).
    fn stop(&mut self) {
        if let Display::Live { lines, .. } = self {
            for bar in lines.values().filter(|b| !b.is_finished()) {
                bar.abandon();
            }
        }
    }
}

/// The newest failed job of `environment`, as `key: code: detail` (a log tail for a failed
/// health check), from the events.
pub(crate) fn failure_of(client: &Client, environment: &str) -> Result<Option<String>> {
    let events = client.events(0, 1000)?.events;
    let failed = events.iter().rfind(|e| {
        matches!(e.kind.as_str(), "job-failed" | "job-dead")
            && (e.subject.contains(&format!(":{environment}:")) || e.subject.contains(&format!(":{environment}/")))
    });
    Ok(failed.map(|e| format!("{}: {}", e.subject, e.detail)))
}

/// Where the environments are served: `https` on the HTTPS port, or `http` on the ingress port.
#[derive(Clone, Copy, Debug)]
pub struct Serving {
    pub scheme: &'static str,
    pub port: u16,
}

/// The longest `pl up` waits between two looks: a heartbeat is no event, and a replica
/// reported running ends a rollout (the pace it had before it waited on events).
const LOOK_AT_LEAST_EVERY: Duration = Duration::from_millis(300);

/// Follows the revision's verdict and each environment's rollout until all are done (exit 0,
/// with the URLs) or one fails (exit 1, with the failing job and its result).
///
/// Done means true on the hosts, as the agents report it: the generation's rollout finished,
/// its routes published, every replica it places reported running and healthy by its node's
/// agent, and none of another generation (or scaled away) still running. `since_ms` is when
/// this `pl up` began: the jobs it shows are the ones made since, and an environment that got
/// none is reported unchanged.
pub fn converge(
    client: &Client,
    head: &str,
    environments: &[Followed],
    serving: Serving,
    timeout: Duration,
    since_ms: i64,
) -> Result<u8> {
    let mut display = Display::new(environments);
    let code = follow(client, head, environments, serving, timeout, since_ms, &mut display);
    display.stop();
    code
}

fn follow(
    client: &Client,
    head: &str,
    environments: &[Followed],
    at: Serving,
    timeout: Duration,
    since_ms: i64,
    display: &mut Display,
) -> Result<u8> {
    let deadline = Instant::now() + timeout;
    // Between looks, a long poll on the fleet's events: a verdict, a job's end or a step
    // wakes it at once; what changes without an event (a heartbeat saying a replica runs) is
    // seen at the next look, `LOOK_AT_LEAST_EVERY` on at most.
    let mut wake = crate::client::Wake::new(client);
    let pause = |wake: &mut crate::client::Wake<'_>| {
        wake.wait(
            deadline
                .saturating_duration_since(Instant::now())
                .min(LOOK_AT_LEAST_EVERY),
        )
    };
    loop {
        match revision_judged(client, head, display)? {
            Judged::Accepted => {}
            Judged::Ended(code) => return Ok(code),
            Judged::NotYet if Instant::now() > deadline => {
                display.stop();
                eprintln!("pl up: the reconciler did not judge revision {} in time", &head[..12]);
                return Ok(1);
            }
            Judged::NotYet => {
                pause(&mut wake)?;
                continue;
            }
        }
        let mut done = 0;
        let mut promote = Vec::new();
        for env in environments {
            match look(client, env, at, since_ms, display)? {
                Looked::Done => done += 1,
                Looked::WaitsForPromote(why) => promote.push((env.name.clone(), why)),
                Looked::Ended(code) => return Ok(code),
                Looked::Going => {}
            }
        }
        // Every environment is done or waits for an operator: say which, and return (exit 3)
        // instead of waiting out the timeout for a promote nobody may give.
        if !promote.is_empty() && done + promote.len() == environments.len() {
            for (name, why) in &promote {
                display.waiting_for_promote(name, why);
            }
            display.stop();
            return Ok(WAITS_FOR_OPERATOR);
        }
        if done == environments.len() {
            return Ok(0);
        }
        if Instant::now() > deadline {
            display.stop();
            eprintln!("pl up: not converged within the timeout");
            return Ok(1);
        }
        pause(&mut wake)?;
    }
}

/// Where the revision `pl up` applied stands with the control plane.
enum Judged {
    /// Accepted: its deployments are the ones to follow.
    Accepted,
    /// Not judged yet.
    NotYet,
    /// Rejected, or refused as a rewrite: said, with the exit code.
    Ended(u8),
}

fn revision_judged(client: &Client, head: &str, display: &mut Display) -> Result<Judged> {
    let revisions = client.revisions(Some("main"), 5)?.revisions;
    let verdict = revisions.into_iter().find(|r| r.sha == head);
    if let Some(r) = &verdict
        && r.verdict == operator_proto::revisions::Verdict::Rejected
    {
        display.stop();
        eprintln!(
            "pl up: revision {} was rejected:\n{}",
            &head[..12],
            crate::live::reasons_text(&r.reasons)
        );
        return Ok(Judged::Ended(1));
    }
    // The verdict and the deployments it makes are written in one transaction: until the
    // verdict shows, the deployments are an older revision's.
    if verdict.is_some() {
        return Ok(Judged::Accepted);
    }
    // Refused as a rewrite of applied history (no verdict will come): say so now, not at the
    // timeout.
    let rewrites = client.rewrites(20)?.rewrites;
    if rewrites.iter().any(|r| r.sha == head && r.approved_by.is_none()) {
        display.stop();
        eprintln!(
            "pl up: the control plane refuses {} [history-rewritten]: it does not descend from the last commit it accepted",
            &head[..12]
        );
        eprintln!(
            "  hint: `pl revisions --local` shows both; `pl revisions approve-rewrite main {head} --local` applies it anyway"
        );
        return Ok(Judged::Ended(1));
    }
    Ok(Judged::NotYet)
}

/// Where one followed environment stands at a look.
enum Looked {
    Done,
    WaitsForPromote(String),
    /// Failed, or short of room on this machine: said, with the exit code.
    Ended(u8),
    Going,
}

fn look(client: &Client, env: &Followed, at: Serving, since_ms: i64, display: &mut Display) -> Result<Looked> {
    let name = env.name.as_str();
    // Each environment as its own resource: the daemon's work follows this repository's
    // environments, not the fleet's.
    let Some(d) = client.environment(name)? else {
        display.waiting(name);
        return Ok(Looked::Going);
    };
    let generation = d.generation;
    let listed = client.jobs(None, Some(name), 200)?.jobs;
    let of_generation: Vec<&operator_proto::jobs::Job> =
        listed.iter().filter(|j| j.generation == Some(generation)).collect();
    let pair = |j: &&operator_proto::jobs::Job| (j.key.clone(), j.state);
    let jobs: Vec<(String, JobState)> = of_generation.iter().map(pair).collect();
    // This run's jobs: a scale at the same generation shows its own, not the rollout's.
    let this_run: Vec<(String, JobState)> = of_generation
        .iter()
        .filter(|j| j.created_at_ms >= since_ms)
        .map(pair)
        .collect();
    display.jobs(name, generation, &this_run);
    let pending = jobs
        .iter()
        .any(|(_, state)| matches!(state, JobState::Queued | JobState::Leased));
    // Done means placed and serving: a generation made before this node's agent was heard
    // from places nothing, and the next one places the replicas.
    let served = jobs.iter().any(|(key, state)| {
        let serving = if env.web {
            key.starts_with("ingress:") && key.contains(":publish@")
        } else {
            key.starts_with("app:")
        };
        serving && *state == JobState::Succeeded
    });
    // The judgement `pl wait` makes (`live::judge`), then what `pl up` adds: the generation's
    // own jobs all ran and its routes (or replicas) were made.
    Ok(match crate::live::judge(&d) {
        Verdict::Live if served && !pending => {
            let what = if this_run.is_empty() {
                "unchanged, serving"
            } else {
                "done"
            };
            display.done(
                name,
                format!(
                    "{name}: generation {generation} {what} ({} replica(s) running): {}://{}.localhost:{}/",
                    d.running, at.scheme, env.host, at.port
                ),
            );
            Looked::Done
        }
        Verdict::Failed(why) => {
            display.stop();
            eprintln!("pl up: {why}");
            if d.status == operator_proto::DeploymentStatus::Failed
                && let Some(f) = failure_of(client, name)?
            {
                eprintln!("{f}");
            }
            Looked::Ended(1)
        }
        // One machine: nothing frees room while `pl up` waits, so it says so now.
        Verdict::Short(why) if !pending => {
            display.stop();
            eprintln!("pl up: {why}");
            eprintln!(
                "  hint: lower `replicas` or the roles' `resources`, or give the node more `capacity` in its NodePool; `pl status` shows asked, placed and running"
            );
            Looked::Ended(1)
        }
        Verdict::WaitsForPromote(why) => Looked::WaitsForPromote(why),
        _ => Looked::Going,
    })
}
