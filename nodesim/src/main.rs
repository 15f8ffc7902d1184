//! `pl-nodesim`: N simulated nodes in one process, each enrolled with a real one-time token and
//! its own key and certificate, speaking the agent protocol over mutual TLS with the agent's
//! own client: heartbeats with the replicas they run, long-poll leases, completions after a
//! configurable delay with a configurable failure rate. A thread per node (`node.rs`); an
//! observer reads `GET /v1/nodes` and counts nodes shown unhealthy or lost while they beat as
//! told. Prints a report (JSON with `--report`, a summary on standard error): latencies per call
//! kind, refusals, what the simulator itself cost per node. A run is a bench, not a test
//! (`nodesim/tests/small_run.rs` is the small one that is).

mod enrol;
mod node;
mod stats;

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use node::{Beating, Behaviour};
use stats::{Cost, Stats};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "pl-nodesim",
    version,
    about = "Simulated nodes against a Pushleft control plane"
)]
struct Args {
    /// The operator API (enrolment tokens, `GET /v1/nodes`): `https://host:port`.
    #[arg(long)]
    control: String,
    /// The agent API: `https://host:port`; given more than once (an HA pair's replicas), node
    /// i starts at the i-th (round robin) and moves to the next after two failed beats in a row.
    #[arg(long, required = true)]
    agent_api: Vec<String>,
    /// The control CA (PEM): the operator API is trusted with it, and its fingerprint pins it
    /// for enrolment.
    #[arg(long)]
    ca_cert: PathBuf,
    /// A file holding an operator token (or `PL_TOKEN`).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// How many nodes; named `PREFIX00001`… (each must be declared in Git's node pools).
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    #[arg(long, default_value = "sim-")]
    prefix: String,
    /// The nodes' identities (one folder each, reused by later runs).
    #[arg(long)]
    dir: PathBuf,
    /// How long the nodes run, in seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Each node's own heartbeat interval, in seconds (the control plane may tell a longer one).
    #[arg(long, default_value_t = 10)]
    heartbeat_seconds: u64,
    /// How long each job takes, in milliseconds.
    #[arg(long, default_value_t = 20)]
    task_ms: u64,
    /// The share of jobs that fail (retryable), in percent.
    #[arg(long, default_value_t = 0)]
    fail_percent: u32,
    /// Each node renews its certificate this often, in seconds (0: not in a run).
    #[arg(long, default_value_t = 0)]
    renew_seconds: u64,
    /// The nodes join the mesh: each advertises a key and takes the meshes it is handed.
    #[arg(long)]
    mesh: bool,
    /// Enrolments at once.
    #[arg(long, default_value_t = 8)]
    enrol_parallel: usize,
    /// Where to write the JSON report.
    #[arg(long)]
    report: Option<PathBuf>,
    /// A file that, once it appears, names nodes (one a line) that fall silent: each stops
    /// calling and drops its connection, as a host that lost its power (the scale bench times
    /// such a node's replicas placed elsewhere). Looked for every 100 ms.
    #[arg(long)]
    silence_file: Option<PathBuf>,
}

/// A node thread's stack: the agent's client needs little, and 10,000 of them must fit.
const STACK_BYTES: usize = 256 * 1024;
/// How often the observer reads `GET /v1/nodes`.
const OBSERVE_EVERY: Duration = Duration::from_secs(5);

fn main() -> Result<()> {
    let args = Args::parse();
    anyhow::ensure!((1..=100_000).contains(&args.nodes), "--nodes: 1 to 100000");
    anyhow::ensure!(args.fail_percent <= 100, "--fail-percent: 0 to 100");
    let operator_token = match std::env::var("PL_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        Some(t) => t.trim().to_owned(),
        None => {
            let f = args
                .token_file
                .as_ref()
                .ok_or_else(|| anyhow!("an operator token: --token-file or PL_TOKEN"))?;
            std::fs::read_to_string(f)
                .with_context(|| format!("reading {}", f.display()))?
                .trim()
                .to_owned()
        }
    };
    let control = enrol::Control {
        url: args.control.trim_end_matches('/').to_owned(),
        ca_pem: std::fs::read(&args.ca_cert).with_context(|| format!("reading {}", args.ca_cert.display()))?,
        operator_token,
    };
    std::fs::create_dir_all(&args.dir)?;
    let names: Vec<String> = (1..=args.nodes).map(|i| format!("{}{i:05}", args.prefix)).collect();
    let stats = Arc::new(Stats::default());
    let enrolling = Instant::now();
    let dirs = enrol::all(&control, &names, &args.dir, args.enrol_parallel, &stats)?;
    let enrol_seconds = enrolling.elapsed().as_secs_f64();
    eprintln!(
        "pl-nodesim: {} nodes enrolled (or reused) in {enrol_seconds:.1} s",
        names.len()
    );
    let how = Behaviour {
        every: Duration::from_secs(args.heartbeat_seconds.max(1)),
        task: Duration::from_millis(args.task_ms),
        fail_percent: args.fail_percent,
        lease_wait: Duration::from_secs(20),
        renew_every: (args.renew_seconds > 0).then(|| Duration::from_secs(args.renew_seconds)),
        mesh: args.mesh,
    };
    let beating: Arc<Vec<Beating>> = Arc::new(names.iter().map(|_| Beating::default()).collect());
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let until = started + Duration::from_secs(args.seconds);
    let urls: Arc<Vec<String>> = Arc::new(args.agent_api.clone());
    let mut threads = Vec::with_capacity(names.len());
    for (i, dir) in dirs.iter().enumerate() {
        let urls = Arc::clone(&urls);
        let (stats, beating) = (Arc::clone(&stats), Arc::clone(&beating));
        let (name, dir) = (names[i].clone(), dir.clone());
        threads.push(
            std::thread::Builder::new()
                .name(names[i].clone())
                .stack_size(STACK_BYTES)
                .spawn(move || {
                    let who = node::Identity { name: &name, dir: &dir };
                    node::run(&urls, i, &who, how, &stats, &beating[i], until);
                })?,
        );
    }
    let observer = {
        let (stats, beating, names) = (Arc::clone(&stats), Arc::clone(&beating), names.clone());
        let agent = control.observer()?;
        let (url, token) = (control.url.clone(), control.operator_token.clone());
        std::thread::spawn(move || observe(&agent, &url, &token, &names, &beating, &stats, until))
    };
    if let Some(file) = args.silence_file.clone() {
        let (beating, names) = (Arc::clone(&beating), names.clone());
        std::thread::spawn(move || silence(&file, &names, &beating, until));
    }
    for t in threads {
        let _ = t.join();
    }
    // The peak: every node's thread and connection were alive together.
    let rss = status_bytes("VmHWM:");
    let _ = observer.join();
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    let n = names.len().max(1) as u64;
    let report = stats.report(
        names.len(),
        (enrol_seconds, seconds),
        Cost {
            rss_bytes: rss,
            cpu_seconds: cpu,
            rss_bytes_per_node: rss / n,
            cpu_ms_per_node_second: cpu * 1000.0 / n as f64 / seconds.max(1e-9),
        },
    );
    summarise(&report);
    let json = serde_json::to_string_pretty(&report)?;
    match &args.report {
        Some(p) => std::fs::write(p, json).with_context(|| format!("writing {}", p.display()))?,
        None => println!("{json}"),
    }
    Ok(())
}

/// The report in a few lines, on standard error.
fn summarise(report: &stats::Report) {
    for (call, s) in &report.calls {
        eprintln!(
            "  {call:<10} {:>8} calls {:>8.1}/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>8.2} ms",
            s.count, s.per_second, s.p50_ms, s.p99_ms, s.max_ms
        );
    }
    eprintln!(
        "  refusals {:?}, transport errors {}, marked unhealthy or lost while beating {}; {} MB resident ({} KB a node), {:.3} ms CPU a node a second",
        report.refusals,
        report.transport_errors,
        report.marked_while_beating,
        report.cost.rss_bytes / 1_000_000,
        report.cost.rss_bytes_per_node / 1000,
        report.cost.cpu_ms_per_node_second
    );
}

/// Every `OBSERVE_EVERY` until `until`: the nodes `GET /v1/nodes` shows unhealthy or lost that
/// beat within the interval they were told (and a few seconds' slack).
/// Every page of `GET /v1/nodes` (at most 100: 100,000 nodes); what failed to come ends it.
fn node_pages(agent: &ureq::Agent, url: &str, token: &str) -> Vec<operator_proto::nodes::Node> {
    let mut out = Vec::new();
    let mut after = String::new();
    for _ in 0..100 {
        let mut req = agent.get(&format!("{url}/v1/nodes")).query("limit", "1000");
        if !after.is_empty() {
            req = req.query("after", &after);
        }
        let Ok(mut r) = req.header("authorization", &format!("Bearer {token}")).call() else {
            break;
        };
        let Ok(body) = r.body_mut().with_config().limit(64 << 20).read_to_string() else {
            break;
        };
        let Ok(page) = serde_json::from_str::<operator_proto::nodes::Nodes>(&body) else {
            break;
        };
        out.extend(page.nodes);
        match page.next {
            Some(n) if n != after => after = n,
            _ => break,
        }
    }
    out
}

fn observe(
    agent: &ureq::Agent,
    url: &str,
    token: &str,
    names: &[String],
    beating: &[Beating],
    stats: &Stats,
    until: Instant,
) {
    let index: std::collections::HashMap<&str, usize> =
        names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
    while Instant::now() + OBSERVE_EVERY < until {
        std::thread::sleep(OBSERVE_EVERY);
        // What the control plane answers was true when it was asked: a beat after that is not
        // in it.
        let asked = node::now_ms();
        for n in node_pages(agent, url, token) {
            let state = n.state.as_str();
            if !matches!(state, "unhealthy" | "lost") {
                continue;
            }
            if let Some(i) = index.get(n.name.as_str()) {
                let b = &beating[*i];
                if b.silent.load(std::sync::atomic::Ordering::Relaxed) {
                    // Told to fall silent: its mark is what the run asked for.
                    continue;
                }
                let last = b.last_ms.load(std::sync::atomic::Ordering::Relaxed);
                let interval = b.interval_ms.load(std::sync::atomic::Ordering::Relaxed);
                // Beat before the question, and within its interval (and a few seconds) of it.
                if last > 0 && last < asked - 1_000 && asked - last <= interval + 5_000 {
                    stats.marked(&n.name, state);
                }
            }
        }
    }
}

/// Until `until`: once `file` exists, the nodes it names (one a line; others ignored) fall
/// silent.
fn silence(file: &std::path::Path, names: &[String], beating: &[Beating], until: Instant) {
    while Instant::now() < until {
        if let Ok(text) = std::fs::read_to_string(file) {
            for name in text.lines().map(str::trim) {
                if let Some(i) = names.iter().position(|n| n == name) {
                    beating[i].silent.store(true, std::sync::atomic::Ordering::Relaxed);
                    eprintln!("pl-nodesim: {name} falls silent");
                }
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A figure of this process's `/proc/self/status` (`VmHWM:`, the peak resident memory), in
/// bytes.
fn status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// User and system CPU of this process so far, in seconds (clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .map_or(0.0, |t| t / 100.0)
}
