//! What `pl up` checks before it starts or records anything: the trust it judges by, that the
//! revision it applies is valid, that Docker answers, and that the ports it would serve on are
//! its own to take. A refused start changes nothing.

use super::local::{Local, Trust};
use super::processes::{alive, caddy_program, docker_answers};
use super::{UpArgs, report_invalid};
use anyhow::{Context, Result, bail};
use state_repo::load::load;
use state_repo::source::{Rev, StateRepo};

/// How the run is judged (local revisions, or commits against the allowed signers) and which
/// revision it applies (`None`: the working tree; a signed run's default is `HEAD`).
pub(super) fn trust_and_rev(args: &UpArgs) -> Result<(Trust, Option<String>)> {
    let trust = match &args.allowed_signers {
        None => Trust::Local,
        Some(f) => Trust::Signed {
            allowed_signers: std::fs::canonicalize(f).with_context(|| format!("{}", f.display()))?,
            policy: args
                .policy
                .as_ref()
                .map(|p| std::fs::canonicalize(p).with_context(|| format!("{}", p.display())))
                .transpose()?,
        },
    };
    let rev = match (&trust, &args.rev) {
        (Trust::Signed { .. }, None) => Some("HEAD".to_owned()),
        (_, r) => r.clone(),
    };
    Ok((trust, rev))
}

/// The state the run applies, loaded and checked; `None` (said on stderr) when it is invalid.
pub(super) fn checked_state(
    local: &Local,
    trust: &Trust,
    rev: Option<&str>,
    args: &UpArgs,
) -> Result<Option<state_schema::state::Loaded>> {
    // Commits need Git: said before anything starts (the working tree alone does not).
    if !local.in_git() && (rev.is_some() || !matches!(trust, Trust::Local)) {
        bail!(
            "{} is not in a Git repository, and {} reads commits: run `git init && git add -A && git commit -m \"initial state\"` there first, or leave it out to apply the working tree",
            local.repo.display(),
            if args.rev.is_some() {
                "--rev"
            } else {
                "--allowed-signers"
            }
        );
    }
    let repo = StateRepo::open(&local.repo)?;
    let loaded = match rev {
        Some(r) => load(&repo, &Rev::Commit(repo.resolve(r)?))?,
        None => load(&repo, &Rev::WorkTree)?,
    };
    if !loaded.is_valid() {
        report_invalid(&loaded);
        eprintln!(
            "pl up: {} is invalid; nothing was applied",
            rev.unwrap_or("the working tree")
        );
        return Ok(None);
    }
    Ok(Some(loaded))
}

/// Docker answers, and the ports this run would serve on are free or already this control
/// plane's. Whether this repository's control plane runs already.
pub(super) fn check_host(args: &UpArgs, local: &Local, web: bool) -> Result<bool> {
    if !docker_answers(&args.docker_socket) {
        bail!(
            "Docker does not answer at {}: install it (Debian: apt-get install docker.io) and start it (systemctl start docker)",
            args.docker_socket.display()
        );
    }
    // The port this run would serve on: `--port`, else the one recorded, else a free one. A
    // control plane that runs keeps its port; one that was stopped (`pl down`) takes `--port`.
    let running = alive(&local.path("reconciler.pid"), "pl-reconciler").is_some()
        || alive(&local.path("caddy.pid"), "caddy").is_some();
    let recorded = local.recorded_ports()?;
    if let (Some(p), Some(r), true) = (args.port, recorded, running)
        && p != r.http
    {
        bail!(
            "this repository's local control plane serves on port {} already; `pl down` first, then `pl up --port {p}`",
            r.http
        );
    }
    // Caddy missing or too old, or a port another program holds, would only show later, with
    // the control plane started: say so now.
    if web && alive(&local.path("caddy.pid"), "caddy").is_none() {
        caddy_program()?;
        let http = args.port.or(recorded.map(|r| r.http));
        if let Some(http) = http
            && std::net::TcpListener::bind(("127.0.0.1", http)).is_err()
        {
            bail!(
                "port {http} on 127.0.0.1 is taken by another program: stop it, or choose another port (`pl up --port PORT`)"
            );
        }
        let https = args.https_port.or(recorded.map(|r| r.https).filter(|p| *p != 0));
        if let (Some(https), false) = (https, args.http)
            && std::net::TcpListener::bind(("127.0.0.1", https)).is_err()
        {
            bail!(
                "port {https} on 127.0.0.1 is taken by another program: stop it, or choose another port (`pl up --https-port PORT`, or `--http` to serve plain HTTP only)"
            );
        }
    }
    Ok(running)
}
