//! `pl up` and `pl down`: the whole path on one machine, through the same reconciler, ledger,
//! enrolment, agent and tasks as a fleet. `pl` links no SQL and no server: it starts the
//! `pl-reconciler` and `pl-agent` binaries (beside `pl`, or on `PATH`) and a Caddy as
//! background processes that outlive it, and talks to them over their APIs.
//!
//! Everything local lives in one state folder per repository
//! (`$XDG_STATE_HOME/pushleft/<name>-<hash>`, or `PL_STATE_DIR`): the control CA and API
//! certificate, an admin token, the SQLite ledger, a bare mirror repository the reconciler
//! reads, the node's enrolment, the processes' configurations, logs and pid files.
//!
//! The working tree is applied as a local revision: `pl up` commits it into the mirror (never
//! into the user's repository), signed by a key of the state folder that only this local
//! control plane trusts, so the reconciler judges it like any commit. That is what "unsigned
//! local revision" means here, and `pl up` says so.

mod build;
mod down;
pub(crate) mod follow;
mod local;
mod mirror;
mod preflight;
mod processes;
mod services;
mod wake;

pub use down::{DownArgs, down};
use local::{Local, Ports, Trust};
pub(crate) use local::{local_server, running_local_server};
pub use wake::sleep as sleep_woken;
pub(crate) use wake::{wake, wake_here};

use crate::client::Client;
use anyhow::{Result, bail};
use state_repo::load::load;
use state_repo::source::{Rev, StateRepo};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct UpArgs {
    /// The state repository (default: the current directory).
    pub dir: Option<PathBuf>,
    /// The ingress port on 127.0.0.1 (default: one chosen once and kept).
    #[arg(long)]
    pub port: Option<u16>,
    /// A node of the state's NodePools this machine runs, with an agent of its own; repeat it
    /// to run several here, sharing Docker and Caddy, as a rehearsal of a fleet (draining one,
    /// say). Default: the nodes enrolled here before, else the only one declared.
    #[arg(long = "node", value_name = "NODE")]
    pub nodes: Vec<String>,
    /// The Docker engine's socket.
    #[arg(long, env = "PL_DOCKER_SOCKET", default_value = "/var/run/docker.sock")]
    pub docker_socket: PathBuf,
    /// How long to wait for the environments to converge.
    #[arg(long, default_value_t = 300)]
    pub timeout_seconds: u64,
    /// Apply this commit instead of the working tree (its tree, as a local revision; with
    /// `--allowed-signers`, the commit itself; default there: `HEAD`).
    #[arg(long)]
    pub rev: Option<String>,
    /// Judge commits exactly as the daemon does: only commits signed by these keys (git's
    /// allowed-signers format) are applied, as they are, and uncommitted files are not. A local
    /// control plane judges either local revisions or signed commits: `pl down` to switch.
    #[arg(long, value_name = "FILE")]
    pub allowed_signers: Option<PathBuf>,
    /// The signing policy (`mode: head|strict` and path rules), with `--allowed-signers`.
    #[arg(long, value_name = "FILE", requires = "allowed_signers")]
    pub policy: Option<PathBuf>,
    /// After applying, keep applying the working tree as its files change.
    #[arg(long, conflicts_with_all = ["rev", "allowed_signers"])]
    pub watch: bool,
    /// An age identity that opens the Secrets the environments use (as for `pl secret show`):
    /// the local control plane reseals them to its node with it, as a control host does.
    #[arg(long, value_name = "FILE", env = "PL_AGE_IDENTITY")]
    pub identity: Option<PathBuf>,
    /// Build DIR's Dockerfile and run that image as PROJECT's for this local run only (pinned
    /// by digest in the local revision; your files are not changed). Repeatable.
    #[arg(long = "build", value_name = "PROJECT=DIR", conflicts_with = "allowed_signers")]
    pub builds: Vec<build::Build>,
    /// Serve plain HTTP only: no local CA, no HTTPS (kept until `pl down`). By default the
    /// environments are served at `https://<hostname>.localhost:<https port>/` with
    /// certificates from a CA of the local control plane's own, and plain HTTP redirects there.
    #[arg(long)]
    pub http: bool,
    /// The HTTPS port on 127.0.0.1 (default: one chosen once and kept).
    #[arg(long, conflicts_with = "http")]
    pub https_port: Option<u16>,
    /// Forget the builds an earlier `--build` asked for (they are built again on every `pl up`
    /// until then), and run the images the files name.
    #[arg(long, conflicts_with = "builds")]
    pub no_build: bool,
}

/// Where the environments answer: HTTPS when this control plane serves it, else plain HTTP.
fn serving(ports: Ports) -> follow::Serving {
    if ports.https != 0 {
        follow::Serving {
            scheme: "https",
            port: ports.https,
        }
    } else {
        follow::Serving {
            scheme: "http",
            port: ports.http,
        }
    }
}

/// Milliseconds since the epoch, as the ledger writes times.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

pub fn up(args: &UpArgs) -> Result<u8> {
    let started_ms = now_ms();
    let local = Local::new(args.dir.as_deref())?;
    let (trust, rev) = preflight::trust_and_rev(args)?;
    // What is applied is checked first: an invalid state ends here, before anything starts.
    let Some(loaded) = preflight::checked_state(&local, &trust, rev.as_deref(), args)? else {
        return Ok(1);
    };
    let signed = matches!(trust, Trust::Signed { .. });
    // Remembered builds rewrite the mirror's Projects, which a signed run never does.
    let builds = build::to_build(&local.state, &args.builds, args.no_build || signed, &loaded.state)?;
    build::check(&builds, &loaded.state)?;
    build::check_pullable(&builds, &loaded.state, signed)?;
    let nodes: Vec<String> = loaded
        .state
        .pools()
        .flat_map(|(_, p)| p.nodes.iter().map(|n| n.name.to_string()))
        .collect();
    let runs = local_nodes(&args.nodes, &nodes, &local.enrolled_nodes())?;
    // Caddy only when an environment serves a web role.
    let environments = environments_of(&loaded.state);
    let web = environments.iter().any(|e| e.web);
    let running = preflight::check_host(args, &local, web)?;
    // Nothing is recorded until every check has passed, so a refused start changes nothing.
    local.check_scheme(!args.http)?;
    let ports = local.init(
        args.port.filter(|_| !running),
        args.https_port.filter(|_| !running),
        !args.http,
    )?;
    local.settle_scheme(!args.http)?;
    local.settle_trust(&trust)?;
    local.settle_identity(&loaded.state, args.identity.as_deref())?;
    if args.no_build {
        build::remember(&local.state, &[])?;
    }
    let previews = previews_of(&loaded.state);
    // A build is pushed to the control plane's own store: the reconciler runs before it.
    if !builds.is_empty() {
        local.reconciler(ports, &trust, &previews)?;
    }
    let built = local.build(&builds, &loaded.state, rev.as_deref(), &args.docker_socket, ports)?;
    let replace = built.files.clone();
    // A first run enrols the nodes this machine runs before anything is placed: first a local
    // revision without the Environments (so the nodes are declared and may enrol), then, once
    // every agent has been heard from, the whole tree. The first deployment is generation 1,
    // placed on the nodes, instead of a generation 1 that waited for them and a 2 that ran.
    // Only before anything was ever applied here: later, a revision without Environments would
    // tear down what runs.
    let enrolled = local.enrolled_nodes();
    let bootstrap = (matches!(trust, Trust::Local)
        && rev.is_none()
        && !local.has_applied()
        && runs.iter().any(|n| !enrolled.contains(n)))
    .then(|| bootstrap_leave_out(&loaded.state))
    .flatten();
    let applied = apply(&local, &trust, rev.as_deref(), bootstrap.as_deref(), &replace)?;
    let (mut head, mut moved) = (applied.head, applied.moved);
    let previews_moved = local.sync_previews(&previews, &trust, &built)?;
    let client = local.reconciler(ports, &trust, &previews)?;
    if web {
        local.caddy()?;
    }
    start_agents(&local, &client, ports, &runs, bootstrap.is_none(), &args.docker_socket)?;
    if bootstrap.is_some() {
        wait_heard_from(&client, &runs, None)?;
        (head, moved) = local.commit_worktree(&[], None, &replace)?;
        println!(
            "pl up: applying the working tree of {} as local revision {} (signed by this machine's local key, which only pl up trusts)",
            local.repo.display(),
            &head[..12]
        );
    }
    if moved || previews_moved {
        let _ = client.reconcile();
    }
    if applied.replaces_local {
        approve_local_rewrite(&client, &head)?;
    }
    let timeout = Duration::from_secs(args.timeout_seconds);
    let serving = serving(ports);
    if serving.scheme == "https" && web {
        println!(
            "pl up: HTTPS with a local CA (for .localhost names only): trust {} in your browser, or `curl --cacert {} URL`",
            local.path(local::LOCAL_CA).display(),
            local.path(local::LOCAL_CA).display()
        );
    }
    let code = follow::converge(&client, &head, &environments, serving, timeout, started_ms)?;
    print_view(&local, &client);
    if signed {
        // Best effort: without the record, a commit replacing a rejected one is refused as
        // before (with how to start afresh), never applied wrongly.
        let _ = local.remember_accepted(&client);
    }
    if !args.watch {
        return Ok(code);
    }
    watch(&local, &client, ports, timeout, &builds, &args.docker_socket)
}

/// The web view beside the app's URL: its address and a one-click, one-time sign-in.
fn print_view(local: &Local, client: &crate::client::Client) {
    if let Some(lines) = crate::ui::lines_for_up(client) {
        for l in lines {
            println!("{l}");
        }
        println!(
            "pl up: the view's certificate is signed by this control plane's CA: trust {} in your browser",
            local.path("tls/ca.crt").display()
        );
    }
}

/// What a run applied into the mirror.
struct Applied {
    head: String,
    /// Whether the mirror's branch moved.
    moved: bool,
    /// A signed run's commit replaces local revisions applied before: approved as a rewrite.
    replaces_local: bool,
}

/// Applies the run's revision into the mirror: the working tree (or `rev`'s tree) as a local
/// revision, leaving out `bootstrap`'s files on a first run, or a signed commit as it is.
fn apply(
    local: &Local,
    trust: &Trust,
    rev: Option<&str>,
    bootstrap: Option<&[String]>,
    replace: &[(String, String)],
) -> Result<Applied> {
    match trust {
        Trust::Local => {
            let (head, moved) = local.commit_worktree(bootstrap.unwrap_or_default(), rev, replace)?;
            if bootstrap.is_none() {
                println!(
                    "pl up: applying {} of {} as local revision {} (signed by this machine's local key, which only pl up trusts)",
                    rev.unwrap_or("the working tree"),
                    local.repo.display(),
                    &head[..12]
                );
            }
            Ok(Applied {
                head,
                moved,
                replaces_local: false,
            })
        }
        Trust::Signed { .. } => {
            let r = rev.unwrap_or("HEAD");
            let (head, moved, replaces_local) = local.apply_commit(r)?;
            println!(
                "pl up: applying commit {} ({r}) of {}, judged against the allowed signers",
                &head[..12],
                local.repo.display()
            );
            Ok(Applied {
                head,
                moved,
                replaces_local,
            })
        }
    }
}

/// Starts (or keeps) an agent for each node this machine runs. An agent started now (it had
/// stopped or died) serves its service names and repairs only once it runs: until its first
/// heartbeat, what `pl up` reports would be early, so it is waited for (unless a bootstrap
/// run waits for every agent anyway).
fn start_agents(
    local: &Local,
    client: &Client,
    ports: Ports,
    runs: &[String],
    wait: bool,
    docker_socket: &Path,
) -> Result<()> {
    let agents_from = now_ms();
    let mut restarted = Vec::new();
    for node in runs {
        if local.agent(client, ports, node, docker_socket)? {
            restarted.push(node.clone());
        }
    }
    if wait && !restarted.is_empty() {
        wait_heard_from(client, &restarted, Some(agents_from))?;
    }
    Ok(())
}

/// The files to leave out of a first run's bootstrap revision: those of Environments and
/// Domains (what places and routes anything). `None` when one of them also holds what the
/// nodes need to enrol (the Repository or a NodePool): then there is no bootstrap revision.
fn bootstrap_leave_out(state: &state_schema::state::State) -> Option<Vec<String>> {
    use state_schema::model::Kind;
    let mut files: Vec<String> = state
        .of_kind(Kind::Environment)
        .chain(state.of_kind(Kind::Domain))
        .map(|l| l.file.clone())
        .collect();
    files.sort();
    files.dedup();
    let needed = state
        .iter()
        .any(|o| matches!(o.object.kind(), Kind::Repository | Kind::NodePool) && files.contains(&o.file));
    (!files.is_empty() && !needed).then_some(files)
}

/// Waits (30 s at most) until the control plane has heard from every node in `nodes`.
fn wait_heard_from(client: &Client, nodes: &[String], since_ms: Option<i64>) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let listed = client.nodes()?.nodes;
        let heard = |n: &String| {
            listed
                .iter()
                .any(|r| r.name == *n && r.last_seen_ms.is_some_and(|t| since_ms.is_none_or(|s| t >= s)))
        };
        if nodes.iter().all(heard) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!("the local agents did not report within 30 s: see the agents' logs in the state folder");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The reconciler refuses `sha` as a rewrite of `main` (it leaves a local teardown revision
/// behind, as it would a force-push): this control plane's own admin approves it, which an
/// event records, and the reconciler judges it like any commit.
fn approve_local_rewrite(client: &Client, sha: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending = client.rewrites(20)?.rewrites;
        let refused = pending.iter().any(|r| r.sha == sha && r.branch == "main");
        if refused {
            break;
        }
        if Instant::now() > deadline {
            bail!("the reconciler did not judge {} in time", &sha[..12]);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    client.approve_rewrite(&operator_proto::revisions::ApproveRewrite {
        branch: "main".to_owned(),
        sha: sha.to_owned(),
    })?;
    println!(
        "pl up: {} leaves this control plane's local teardown revision behind: approved as a rewrite (`pl events --local` records it)",
        &sha[..12]
    );
    let _ = client.reconcile();
    Ok(())
}

/// Every problem of an invalid state, as `pl validate` prints them, to standard error.
fn report_invalid(loaded: &state_schema::state::Loaded) {
    eprint!(
        "{}",
        crate::render::diagnostics::text(
            &loaded.diagnostics,
            loaded.state.len(),
            loaded.files,
            crate::render::Paint::new(false)
        )
    );
}

/// The Repository's preview branch patterns.
fn previews_of(state: &state_schema::state::State) -> Vec<String> {
    state
        .repository()
        .and_then(|r| r.previews.as_ref())
        .map(|p| p.branches.clone())
        .unwrap_or_default()
}

/// The nodes this machine runs: those named (each must be declared), else those enrolled here
/// before and still declared, else the only one declared.
fn local_nodes(named: &[String], declared: &[String], enrolled: &[String]) -> Result<Vec<String>> {
    if !named.is_empty() {
        let mut out = Vec::new();
        for n in named {
            if !declared.contains(n) {
                bail!(
                    "node {n} is not declared in a NodePool (declared: {})",
                    declared.join(", ")
                );
            }
            if !out.contains(n) {
                out.push(n.clone());
            }
        }
        return Ok(out);
    }
    let kept: Vec<String> = enrolled.iter().filter(|n| declared.contains(n)).cloned().collect();
    if !kept.is_empty() {
        return Ok(kept);
    }
    match declared {
        [one] => Ok(vec![one.clone()]),
        [] => bail!("no NodePool declares a node: declare this machine as one (`pl init` makes an example)"),
        many => bail!(
            "several nodes are declared ({}): say which this machine runs with --node (repeat it to run several here)",
            many.join(", ")
        ),
    }
}

/// Each environment, its hostname, and whether it has a web role.
fn environments_of(state: &state_schema::state::State) -> Vec<follow::Followed> {
    state
        .environments()
        .filter_map(|(name, env)| {
            let repo = state.repository()?;
            let host = state_schema::state::environment_hostname(repo, name, env).ok()?;
            let web = state
                .project(env.project.as_str())
                .is_some_and(|p| p.roles.values().any(|r| r.workload.kind_name() == "web"));
            Some(follow::Followed {
                name: name.to_string(),
                host: host.to_string(),
                web,
            })
        })
        .collect()
}

/// `--watch`: every change of the working tree (outside `.git`), 300 ms after the last one,
/// is validated and applied like the first; until the process is stopped.
fn watch(
    local: &Local,
    client: &Client,
    ports: Ports,
    timeout: Duration,
    builds: &[build::Build],
    socket: &Path,
) -> Result<u8> {
    use notify::Watcher;
    let (tx, rx) = std::sync::mpsc::channel();
    let git_dir = local.repo.join(".git");
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && ev.paths.iter().any(|p| !p.starts_with(&git_dir))
        {
            let _ = tx.send(());
        }
    })?;
    watcher.watch(&local.repo, notify::RecursiveMode::Recursive)?;
    // A build's folder outside the repository is watched too: a change there is rebuilt.
    for b in builds {
        if let Ok(dir) = std::fs::canonicalize(&b.dir)
            && !dir.starts_with(&local.repo)
        {
            watcher.watch(&dir, notify::RecursiveMode::Recursive)?;
        }
    }
    println!(
        "pl up: watching {} for changes (Ctrl-C stops watching; the environments keep running)",
        local.repo.display()
    );
    let repo = StateRepo::open(&local.repo)?;
    loop {
        if rx.recv().is_err() {
            return Ok(0);
        }
        while rx.recv_timeout(Duration::from_millis(300)).is_ok() {}
        let loaded = load(&repo, &Rev::WorkTree)?;
        if !loaded.is_valid() {
            report_invalid(&loaded);
            eprintln!("pl up: the working tree is invalid; nothing was applied, still watching");
            continue;
        }
        let replace = match local.build(builds, &loaded.state, None, socket, ports) {
            Ok(r) => r.files,
            Err(e) => {
                eprintln!("pl up: {e:#}; nothing was applied, still watching");
                continue;
            }
        };
        let (head, moved) = local.commit_worktree(&[], None, &replace)?;
        if !moved {
            continue;
        }
        println!("pl up: applying the working tree as local revision {}", &head[..12]);
        let since_ms = now_ms();
        let _ = client.reconcile();
        let code = follow::converge(
            client,
            &head,
            &environments_of(&loaded.state),
            serving(ports),
            timeout,
            since_ms,
        )?;
        println!(
            "pl up: {} ; still watching",
            match code {
                0 => "converged",
                follow::WAITS_FOR_OPERATOR => "waits for an operator",
                _ => "failed",
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::local_nodes;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_nodes_run_here_are_named_remembered_or_the_only_one() {
        let declared = names(&["n1", "n2"]);
        assert_eq!(
            local_nodes(&names(&["n2", "n1", "n2"]), &declared, &[]).expect("named"),
            ["n2", "n1"]
        );
        let e = local_nodes(&names(&["n3"]), &declared, &[]).expect_err("undeclared");
        assert!(e.to_string().contains("node n3 is not declared"), "{e}");
        assert_eq!(
            local_nodes(&[], &declared, &names(&["n1", "n2", "gone"])).expect("enrolled"),
            ["n1", "n2"]
        );
        let e = local_nodes(&[], &declared, &[]).expect_err("which");
        assert!(e.to_string().contains("--node"), "{e}");
        assert_eq!(local_nodes(&[], &names(&["solo"]), &[]).expect("only"), ["solo"]);
        assert!(local_nodes(&[], &[], &[]).is_err());
    }
}
