//! `pl down [DIR] [ENV...]`: environments torn down through the reconciler, as a local
//! revision without their Environment documents; the control plane stops when none is left.

use super::local::{Local, Ports, Trust};
use super::previews_of;
use super::processes::{alive, stop};
use crate::client::Client;
use anyhow::{Result, bail};
use operator_proto::{Action, Deployment, DeploymentStatus};
use state_repo::load::load;
use state_repo::source::{Rev, StateRepo};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct DownArgs {
    /// `[DIR] [ENV...]`: the state repository (default: the current directory; the first
    /// argument is DIR when it is a folder), then the environments to tear down (default:
    /// all of them, and the local control plane stops).
    #[arg(value_name = "DIR | ENV")]
    pub args: Vec<String>,
    #[arg(long, default_value_t = 300)]
    pub timeout_seconds: u64,
}

impl DownArgs {
    /// The repository folder and the environments named.
    fn split(&self) -> (Option<PathBuf>, Vec<String>) {
        match self.args.split_first() {
            Some((first, rest)) if Path::new(first).is_dir() => (Some(PathBuf::from(first)), rest.to_vec()),
            _ => (None, self.args.clone()),
        }
    }
}

/// Tears environments down through the reconciler (a local revision without their
/// Environment documents: routes, containers, networks, in order), keeps the ledger's
/// history, and, when none is left, stops the local control plane.
pub fn down(args: &DownArgs) -> Result<u8> {
    let (dir, named) = args.split();
    let local = Local::new(dir.as_deref())?;
    let running = alive(&local.path("reconciler.pid"), "pl-reconciler").is_some();
    if running {
        let left_running = tear_down(&local, &named, Duration::from_secs(args.timeout_seconds))?;
        if !left_running.is_empty() {
            println!(
                "pl down: {} torn down; the local control plane keeps running {} (`pl down` with no environment stops it)",
                named.join(", "),
                left_running.join(", ")
            );
            return Ok(0);
        }
    }
    let stopped = stop_processes(&local);
    let what = match (running, stopped.is_empty()) {
        (_, true) => "nothing ran".to_owned(),
        (true, false) => format!("environments torn down; stopped {}", stopped.join(", ")),
        (false, false) => format!("stopped {}", stopped.join(", ")),
    };
    println!(
        "pl down: {what}; the ledger's history stays in {}",
        local.state.display()
    );
    Ok(0)
}

/// Tears down the `named` environments (all when none is named) through a local revision
/// without their files, waits until the reconciler did, and says which volumes outlive it.
/// The environments still running afterwards.
fn tear_down(local: &Local, named: &[String], timeout: Duration) -> Result<Vec<String>> {
    let ports: Ports = serde_json::from_slice(&std::fs::read(local.path("ports.json"))?)?;
    let repo = StateRepo::open(&local.repo)?;
    let loaded = load(&repo, &Rev::WorkTree)?;
    let files = teardown_files(local, &loaded.state, named)?;
    // The teardown is a local revision whatever the trust was: the reconciler runs with the
    // local key's trust for it (a signed-commit control plane is switched; the mirror's
    // history only moves forward).
    let client = local.reconciler(ports, &Trust::Local, &previews_of(&loaded.state))?;
    let (head, mut moved) = local.commit_worktree(&files, None, &[])?;
    // On a whole teardown preview branches go too: their environments are torn down as
    // for a deleted branch.
    if named.is_empty() {
        moved |= local.sync_previews(&[], &Trust::Local, &Default::default())?;
    }
    if moved {
        let _ = client.reconcile();
    }
    println!("pl down: tearing down through local revision {}", &head[..12]);
    let left_running = wait_torn_down(local, &client, named, Instant::now() + timeout)?;
    say_kept_volumes(&client, named);
    Ok(left_running)
}

/// The files of the Environments to tear down: each must be in a file of its own (the
/// teardown leaves those files out of the local revision).
fn teardown_files(local: &Local, state: &state_schema::state::State, named: &[String]) -> Result<Vec<String>> {
    use state_schema::model::Kind;
    let declared: Vec<String> = state.environments().map(|(n, _)| n.to_string()).collect();
    if let Some(unknown) = named.iter().find(|n| !declared.contains(n)) {
        bail!(
            "no Environment {unknown} in {} (declared: {})",
            local.repo.display(),
            declared.join(", ")
        );
    }
    let torn = |name: &str| named.is_empty() || named.iter().any(|n| n == name);
    let mut files: Vec<String> = Vec::new();
    for l in state.of_kind(Kind::Environment) {
        if !torn(l.object.name().as_str()) {
            continue;
        }
        let shares = state
            .iter()
            .any(|o| o.file == l.file && o.object.kind() != Kind::Environment)
            || state
                .of_kind(Kind::Environment)
                .any(|o| o.file == l.file && o.object.name() != l.object.name() && !torn(o.object.name().as_str()));
        if shares {
            bail!(
                "{} declares {} with other objects: pl down needs each Environment it tears down in a file of its own",
                l.file,
                l.object.name()
            );
        }
        if !files.contains(&l.file) {
            files.push(l.file.clone());
        }
    }
    Ok(files)
}

/// Waits until every named environment's teardown is done; the environments left running.
fn wait_torn_down(local: &Local, client: &Client, named: &[String], deadline: Instant) -> Result<Vec<String>> {
    let torn = |d: &&Deployment| d.action == Action::Teardown && d.status == DeploymentStatus::Done;
    let wanted = |d: &&Deployment| named.is_empty() || named.contains(&d.environment);
    loop {
        // Every page (the first alone held 100 environments).
        let rows = client.deployments()?;
        let left: Vec<&str> = rows
            .iter()
            .filter(wanted)
            .filter(|d| !torn(d))
            .map(|d| d.environment.as_str())
            .collect();
        if left.is_empty() {
            return Ok(rows
                .iter()
                .filter(|d| !torn(d))
                .map(|d| d.environment.clone())
                .collect());
        }
        if let Some(d) = rows
            .iter()
            .filter(wanted)
            // Only the teardown's own failure: a release that failed before `pl down` is
            // still the deployment until the pass makes the teardown generation.
            .find(|d| d.action == Action::Teardown && d.status == DeploymentStatus::Failed)
        {
            bail!(
                "the teardown of {} failed: see `pl events --local {}`",
                d.environment,
                local.repo.display()
            );
        }
        if Instant::now() > deadline {
            bail!("not torn down within the timeout: {}", left.join(", "));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Volumes outlive a teardown: says which, and until when.
fn say_kept_volumes(client: &Client, named: &[String]) {
    let Ok(v) = client.volumes() else { return };
    let kept: Vec<String> = v
        .volumes
        .iter()
        .filter(|r| r.state == operator_proto::volumes::VolumeState::Retained)
        .filter(|r| named.is_empty() || named.contains(&r.environment))
        .map(|r| format!("{}/{} on {}", r.environment, r.volume, r.node))
        .collect();
    if !kept.is_empty() {
        println!(
            "pl down: kept {} for their retainDays (`pl volumes`, `pl volume rm`): {}",
            if kept.len() == 1 {
                "1 volume".to_owned()
            } else {
                format!("{} volumes", kept.len())
            },
            kept.join(", ")
        );
    }
}

/// Stops the agents, Caddy, a build registry an older `pl up` started, and the reconciler;
/// what was stopped.
fn stop_processes(local: &Local) -> Vec<String> {
    let mut stopped: Vec<String> = Vec::new();
    for pid in local.agent_pids() {
        if stop(&pid, "pl-agent") {
            let node = pid
                .parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned());
            stopped.push(format!("the agent of {}", node.unwrap_or_default()));
        }
    }
    for (pid, program, what) in [
        ("caddy.pid", "caddy", "Caddy"),
        ("registry.pid", "docker-registry", "the build registry"),
        ("reconciler.pid", "pl-reconciler", "the reconciler"),
    ] {
        if stop(&local.path(pid), program) {
            stopped.push(what.to_owned());
        }
    }
    // The next `pl up` chooses its trust again.
    let _ = std::fs::remove_file(local.path("mode"));
    // And whether it serves HTTPS.
    let _ = std::fs::remove_file(local.path("scheme"));
    stopped
}
