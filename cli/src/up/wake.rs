//! A local control plane woken for one operator command after `pl down`: `pl down` says the
//! volumes are kept and names `pl volumes` and `pl volume rm`, which need the reconciler (and,
//! to remove a volume, the node's agent). The reconciler and the enrolled agents start from the
//! configurations the last `pl up` wrote, nothing is applied, and what was started here stops
//! again once the command ends ([`sleep`]), so `pl down` stays down.

use super::local::{Local, Ports};
use super::processes::{alive, run_daemon, stop};
use crate::client::{Client, ServerArgs};
use anyhow::{Result, bail};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What [`wake`] started: (pid file, program), stopped by [`sleep`].
static STARTED: Mutex<Vec<(PathBuf, &'static str)>> = Mutex::new(Vec::new());

/// The API of `dir`'s local control plane, started for this command if `pl down` stopped it;
/// `None` when `pl up` never ran there.
pub(crate) fn wake(dir: &Path) -> Result<Option<ServerArgs>> {
    let local = Local::new(Some(dir))?;
    let (Ok(ports), true) = (
        std::fs::read(local.path("ports.json")),
        local.path("reconciler.toml").exists(),
    ) else {
        return Ok(None);
    };
    let ports: Ports = serde_json::from_slice(&ports)?;
    let server = local.server(ports);
    if alive(&local.path("reconciler.pid"), "pl-reconciler").is_some() {
        return Ok(Some(server));
    }
    eprintln!(
        "pl: the local control plane of {} is down (`pl down`): started for this command, stopped again after it",
        local.repo.display()
    );
    let pid = local.path("reconciler.pid");
    run_daemon(
        "pl-reconciler",
        &local.path("reconciler.toml"),
        &local.path("reconciler.log"),
        &pid,
    )?;
    remember(pid, "pl-reconciler");
    let client = Client::new(&server)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.status().is_err() {
        if Instant::now() > deadline {
            bail!(
                "the local reconciler did not start; see {}",
                local.path("reconciler.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The agents: a volume is removed (or backed up, restored) by its node's.
    for node in local.enrolled_nodes() {
        let home = local.agent_dir(&node);
        if !home.join("agent.toml").exists() {
            continue;
        }
        let pid = home.join("agent.pid");
        if run_daemon("pl-agent", &home.join("agent.toml"), &home.join("agent.log"), &pid)?.is_some() {
            remember(pid, "pl-agent");
        }
    }
    Ok(Some(server))
}

/// The local control plane for the current folder or one above it that `pl up` ran and `pl
/// down` stopped, started for this command (see [`wake`]).
pub(crate) fn wake_here() -> Option<ServerArgs> {
    let here = std::env::current_dir().ok()?;
    here.ancestors()
        .find(|d| Local::new(Some(d)).is_ok_and(|l| l.path("ports.json").exists()))
        .and_then(|d| wake(d).ok().flatten())
}

fn remember(pid: PathBuf, program: &'static str) {
    STARTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((pid, program));
}

/// Stops what [`wake`] started (agents first, then the reconciler).
pub fn sleep() {
    let started = std::mem::take(&mut *STARTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    for (pid, program) in started.iter().rev() {
        stop(pid, program);
    }
}
