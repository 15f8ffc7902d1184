//! Bench (a binary): `pl-nodesim` fleets of several sizes against `pl-reconciler run` on SQLite
//! or a throwaway PostgreSQL,
//! side by side in one run (100 nodes beside the larger ones). For each size: a pool of that
//! many nodes (pools of 500) and a daemon whose agent API admits every node's connections;
//! the simulator's nodes enrol and beat, then a release of environments of 50 replicas (five
//! replicas a node: 1,000 environments and 50,000 replicas at 10,000 nodes) is committed and
//! timed until every replica is placed and its job leased. Then a node is drained in Git (timed
//! until its replicas' jobs elsewhere are leased), another falls silent (timed until it is marked
//! lost, 90 s past its told interval here, and from the mark until its replicas' jobs elsewhere
//! are leased), and the daemon is killed (`SIGKILL`) and started again with every node
//! attached. From the simulator's report: enrolment time, the
//! first beats (the join wave) apart from the beats at the told intervals, lease latencies (a
//! lease with the ends before it, as the agent sends them; p50, p99), refusals, nodes shown unhealthy or lost while beating (across the
//! restart), the daemon's peak resident memory, and the simulator's own cost a node. A run
//! shorter than the told interval (200 to 300 s at 10,000 nodes) has no told beats to time.
//!
//! `cargo bench -p pushleft-nodesim --bench scale` (`-- --nodes 100,1000,10000 --seconds 180,180,600
//! --ledger sqlite,postgres,ha`: `ha` is a pair of replicas on one PostgreSQL, both serving
//! agents, the nodes spread over them, the leader killed instead of restarted; build
//! `pl-nodesim` first: `cargo build --release -p pushleft-nodesim`). Needs
//! `prlimit` (util-linux) and an open-file limit of at least twice the largest fleet. Every
//! packet stays on loopback. `PLBENCH_KEEP=1` keeps each run's folder (the daemon's journal, a
//! SQLite ledger).

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../../reconciler/tests/support/postgres.rs"]
mod postgres_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;

use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use repo_support::Repo;
use std::time::{Duration, Instant};

/// Nodes a pool declares: pools of 500 share no node, so each has the subnet pool's 4,096
/// environment-node pairs to itself (`state_schema::placement::subnets`); 50 environments of
/// 50 replicas spread over one take 2,500.
const POOL_NODES: usize = 500;
/// Replicas an environment runs.
const REPLICAS: usize = 50;

fn pool(index: usize, first: usize, count: usize) -> String {
    let mut s = format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {{name: p{index:03}}}\nspec:\n  region: eu\n  nodes:\n"
    );
    for i in first..first + count {
        s.push_str(&format!(
            "    - {{name: sim-{i:05}, capacity: {{cpu: \"64\", memory: 256Gi}}}}\n"
        ));
    }
    s
}

fn project(name: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: {name}}}\nspec:\n  image: registry.example.invalid/{name}@{}\n  roles:\n    work: {{kind: worker, replicas: {REPLICAS}, command: [/bin/true], resources: {{cpu: 10m, memory: 16Mi, pids: 16}}}}\n",
        repo_support::DIGEST
    )
}

fn environment(name: &str, project: &str, pool: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {{name: {name}}}\nspec: {{project: {project}, stage: production, pool: {pool}}}\n"
    )
}

/// The tests' configuration gives the ledger 4 connections; a daemon holding 10,000 agents is
/// given 16, as docs/scale.md says to (on PostgreSQL, 4 leave heartbeats waiting for one).
fn more_ledger_connections(cfg: &std::path::Path) {
    let text = std::fs::read_to_string(cfg).expect("config");
    let raised = text.replacen(
        "max_connections = 4\n",
        &format!("max_connections = {LEDGER_CONNECTIONS}\n"),
        1,
    );
    assert_ne!(raised, text, "the ledger's connections are in the configuration");
    std::fs::write(cfg, raised).expect("config");
}

/// The ledger's connections each daemon of the bench gets.
const LEDGER_CONNECTIONS: u32 = 16;

fn epoch_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The peak resident memory of process `pid`, in MB.
fn peak_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1000.0)
}

/// Reads one number from the ledger at `url`.
struct Ledger {
    rt: tokio::runtime::Runtime,
    pool: sqlx::AnyPool,
    /// The condition that picks the replicas' jobs (`ensure-application`).
    replicas: &'static str,
}

impl Ledger {
    fn open(url: &str) -> Ledger {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        sqlx::any::install_default_drivers();
        let pool = rt.block_on(sqlx::AnyPool::connect(url)).expect("ledger");
        // By their key (`app:…:ensure…@node`), through its unique index: a LIKE over the
        // task's JSON read every job's row, and polled every 10 ms it took a sixth of this
        // machine's CPU at 3,000 nodes (`perf`), from the daemon it measures.
        let replicas = match url.starts_with("sqlite:") {
            true => "key GLOB 'app:*:ensure*'",
            false => "key LIKE 'app:%:ensure%'",
        };
        Ledger { rt, pool, replicas }
    }

    fn count(&self, q: &str) -> i64 {
        self.rt
            .block_on(sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(q.to_owned())).fetch_one(&self.pool))
            .expect("count")
    }

    /// Waits (at most `limit`) until `q` counts `want`; how long it took. It looks every
    /// 10 ms, or four times as long as its last look took (at most 250 ms), so that its own
    /// reads stay under a fifth of a core beside the daemon it times.
    fn until(&self, q: &str, want: i64, limit: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let looked = Instant::now();
            let n = self.count(q);
            if n >= want {
                return started.elapsed();
            }
            assert!(started.elapsed() < limit, "{q}: {n} of {want} after {limit:?}");
            let pause = (looked.elapsed() * 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
            std::thread::sleep(pause);
        }
    }
}

/// One fleet: the release, a drained node's replicas moved, a restart of the daemon.
fn run(nodes: usize, seconds: u64, ledger_kind: &str) -> Run {
    let (postgres, ha) = (ledger_kind != "sqlite", ledger_kind == "ha");
    let dir = tempfile::Builder::new()
        .prefix("plbench-scale-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    let pools = nodes.div_ceil(POOL_NODES);
    for p in 0..pools {
        let first = p * POOL_NODES + 1;
        let count = POOL_NODES.min(nodes - p * POOL_NODES);
        repo.write(&format!("pools/p{p:03}.yaml"), &pool(p, first, count));
    }
    repo.commit("the fleet", true);
    let s = setup(dir.path());
    let pg = postgres.then(postgres_support::Postgres::start);
    let url = pg.as_ref().map_or_else(
        || format!("sqlite://{}", dir.path().join("ledger.db").display()),
        |pg| pg.url(),
    );
    // A daemon of its own ports, admitting every node's connection, its ledger given 16
    // connections: (the daemon, its configuration, its port, its agent API's port).
    let start = |name: &str| {
        let (port, agent_port) = (free_port(), free_port());
        let agents = format!(
            "{CONTROL_CA}lost_after_seconds = 90\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\nmax_connections = {}\n",
            (2 * nodes + 100).min(19_000)
        );
        let cfg = config(&s, name, &repo.dir, &url, port, &agents);
        more_ledger_connections(&cfg);
        let mut d = Daemon::start_with(&s, &cfg, port, Some(20_000));
        d.wait_ready(Duration::from_secs(60));
        (d, cfg, port, agent_port)
    };
    let (mut d, cfg, port, agent_port) = start("d");
    // The pair: a second replica on the same PostgreSQL, serving agents too; the simulator's
    // nodes start on each in turn. The first leads.
    let mut pair = ha.then(|| {
        let (d2, _, port2, agent_port2) = start("d2");
        (d2, port2, agent_port2)
    });
    let report = dir.path().join("report.json");
    let silence = dir.path().join("silence");
    let nodesim = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/pl-nodesim");
    let log = std::fs::File::create(dir.path().join("nodesim.log")).expect("log");
    let mut sim = std::process::Command::new("prlimit")
        .arg("--nofile=20000:20000")
        .arg("--")
        .arg(&nodesim)
        .args(["--nodes", &nodes.to_string(), "--seconds", &seconds.to_string()])
        .args([
            "--enrol-parallel",
            "16",
            "--mesh",
            "--renew-seconds",
            "600",
            "--control",
        ])
        // The observer asks the replica that stays up.
        .arg(format!("https://localhost:{}", pair.as_ref().map_or(port, |p| p.1)))
        .arg("--agent-api")
        .arg(format!("https://localhost:{agent_port}"))
        .args(
            pair.as_ref()
                .map(|p| ["--agent-api".to_owned(), format!("https://localhost:{}", p.2)])
                .into_iter()
                .flatten(),
        )
        .arg("--ca-cert")
        .arg(dir.path().join("tls/ca.crt"))
        .arg("--dir")
        .arg(dir.path().join("nodes"))
        .arg("--report")
        .arg(&report)
        .arg("--silence-file")
        .arg(&silence)
        .env("PL_TOKEN", &s.operator)
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("pl-nodesim (cargo build --release -p pushleft-nodesim)");
    // Every node beating, then the release: five replicas a node, in environments of 50.
    let ledger = Ledger::open(&url);
    let nodes_i = i64::try_from(nodes).expect("nodes");
    ledger.until(
        "SELECT COUNT(*) FROM nodes WHERE last_seen IS NOT NULL",
        nodes_i,
        Duration::from_secs(600),
    );
    // The simulator's nodes run `seconds` from about now (after their enrolment).
    let sim_until = Instant::now() + Duration::from_secs(seconds);
    let environments = (nodes * 5).div_ceil(REPLICAS);
    for e in 0..environments {
        let name = format!("app{e:05}");
        repo.write(&format!("projects/{name}.yaml"), &project(&name));
        repo.write(
            &format!("envs/{name}.yaml"),
            &environment(&format!("{name}-production"), &name, &format!("p{:03}", e % pools)),
        );
    }
    repo_support::git(&repo.dir, &["add", "-A"]);
    let started = Instant::now();
    let committed_ms = epoch_ms();
    repo.commit("the release", true);
    let replicas = i64::try_from(environments * REPLICAS).expect("replicas");
    ledger.until(
        &format!(
            "SELECT COUNT(*) FROM jobs WHERE {} AND state <> 'queued'",
            ledger.replicas
        ),
        replicas,
        Duration::from_secs(600),
    );
    let release = started.elapsed().as_secs_f64();
    eprintln!("{nodes} nodes: {environments} environments, {replicas} replicas placed and leased in {release:.2} s");
    // Where the release's time went, from the ledger's own times (ms after the commit).
    let at = |q: &str| ledger.count(q) - committed_ms;
    eprintln!(
        "{nodes} nodes: the release's revision seen at +{} ms; its first job made at +{}, its first replica's job due at +{}, the last at +{}; the last replica's job leased by +{} ms",
        at("SELECT MAX(seen_at) FROM revisions"),
        at(&format!(
            "SELECT MIN(created_at) FROM jobs WHERE created_at >= {committed_ms}"
        )),
        // Due, not made: a replica's job may be made held with its node's set-up, and is due
        // (`not_before`) when that set-up succeeded.
        at(&format!("SELECT MIN(not_before) FROM jobs WHERE {}", ledger.replicas)),
        at(&format!("SELECT MAX(not_before) FROM jobs WHERE {}", ledger.replicas)),
        at(&format!(
            "SELECT MAX(updated_at) FROM jobs WHERE {} AND state <> 'queued'",
            ledger.replicas
        )),
    );
    // A node drained in Git: its replicas placed elsewhere and their jobs leased (the same
    // re-placement a lost node gets, reached by a commit instead of five minutes of silence).
    let leased = format!(
        "SELECT COUNT(*) FROM jobs WHERE {} AND state <> 'queued'",
        ledger.replicas
    );
    let before = ledger.count(&leased);
    let moving = ledger.count(&format!(
        "SELECT COUNT(*) FROM jobs WHERE {} AND target_node = 'sim-00001'",
        ledger.replicas
    ));
    repo.write(
        "pools/p000.yaml",
        &pool(0, 1, POOL_NODES.min(nodes)).replace("{name: sim-00001,", "{name: sim-00001, state: draining,"),
    );
    let started = Instant::now();
    repo.commit("drain sim-00001", true);
    ledger.until(&leased, before + moving, Duration::from_secs(120));
    let drained = started.elapsed().as_secs_f64();
    eprintln!("{nodes} nodes: {moving} replicas of a drained node placed elsewhere and leased in {drained:.2} s");
    let lost = lose_a_node(&ledger, &silence, sim_until);
    // The control plane killed with every node attached, and started again; of a pair, the
    // leader killed and the other taking the lead (its nodes reach for the other replica).
    // None may be shown unhealthy or lost (the simulator's observer counts them).
    let mut peak = peak_mb(d.child.id());
    d.kill9();
    let started = Instant::now();
    let restart = match pair.as_mut() {
        Some((d2, _, _)) => {
            while !d2.is_leader(&s.operator) {
                assert!(started.elapsed() < Duration::from_secs(120), "no failover in 120 s");
                std::thread::sleep(Duration::from_millis(20));
            }
            let took = started.elapsed().as_secs_f64();
            eprintln!("{nodes} nodes: the leader killed, the other replica leading in {took:.2} s");
            took
        }
        None => {
            d = Daemon::start_with(&s, &cfg, port, Some(20_000));
            d.wait_ready(Duration::from_secs(120));
            let took = started.elapsed().as_secs_f64();
            eprintln!("{nodes} nodes: the daemon killed and ready again in {took:.2} s");
            took
        }
    };
    let done = sim.wait().expect("pl-nodesim");
    let log = std::fs::read_to_string(dir.path().join("nodesim.log")).unwrap_or_default();
    eprint!("{log}");
    assert!(done.success(), "pl-nodesim failed");
    match pair.as_mut() {
        Some((d2, _, _)) => {
            peak = peak.max(peak_mb(d2.child.id()));
            d2.kill9();
        }
        None => {
            peak = peak.max(peak_mb(d.child.id()));
            d.kill9();
        }
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("json");
    if std::env::var_os("PLBENCH_KEEP").is_some() {
        // The daemon's journal and the ledger, kept to read where the time went.
        eprintln!("{nodes} nodes: kept {}", dir.keep().display());
    }
    Run {
        report: v,
        release,
        drained: (moving, drained),
        lost,
        restart,
        daemon_mb: peak,
    }
}

/// The node the bench silences.
const SILENCED: &str = "sim-00002";

/// A node lost: `SILENCED` falls silent (the simulator stops its calls and drops its
/// connection), the control plane marks it lost past its told interval and the lost threshold
/// (90 s in the bench's configuration), and its replicas are placed elsewhere and leased.
/// Returns its replicas, the seconds from the silence to the mark and from the mark until they
/// were leased; `None` when the simulator's run (ending at `sim_until`) would end first.
fn lose_a_node(ledger: &Ledger, silence: &std::path::Path, sim_until: Instant) -> Option<(i64, f64, f64)> {
    let moving = ledger.count(&format!(
        "SELECT COUNT(*) FROM jobs WHERE {} AND target_node = '{SILENCED}'",
        ledger.replicas
    ));
    let silenced_ms = epoch_ms();
    std::fs::write(silence, format!("{SILENCED}\n")).expect("silence file");
    let silenced = Instant::now();
    // Replica jobs made for other nodes since the silence, leased: the lost node's replicas
    // placed elsewhere.
    let leased = format!(
        "SELECT COUNT(*) FROM jobs WHERE {} AND state <> 'queued' \
         AND target_node <> '{SILENCED}' AND created_at >= {silenced_ms}",
        ledger.replicas
    );
    let mark = format!("SELECT COUNT(*) FROM nodes WHERE name = '{SILENCED}' AND lost_at > 0");
    loop {
        if ledger.count(&mark) > 0 {
            break;
        }
        if Instant::now() + Duration::from_secs(15) > sim_until {
            eprintln!("{SILENCED} not marked lost before the run's end: lengthen --seconds");
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let to_mark = silenced.elapsed().as_secs_f64();
    let marked = Instant::now();
    ledger.until(&leased, moving, Duration::from_secs(120));
    let took = marked.elapsed().as_secs_f64();
    eprintln!(
        "{SILENCED}: silent, marked lost after {to_mark:.1} s; its {moving} replicas leased elsewhere {took:.2} s after the mark"
    );
    Some((moving, to_mark, took))
}

/// What one fleet's run measured besides the simulator's report.
struct Run {
    report: serde_json::Value,
    /// The release placed and leased, in seconds.
    release: f64,
    /// Replicas moved off the drained node, and how long until they were leased elsewhere.
    drained: (i64, f64),
    /// A node that fell silent: its replicas, the seconds from its silence to its lost mark,
    /// and from the mark until they were leased elsewhere (`None`: the run ended first).
    lost: Option<(i64, f64, f64)>,
    /// From the kill to the restarted daemon answering (of a pair: to the other replica
    /// leading), in seconds.
    restart: f64,
    /// The daemon's peak resident memory in MB (the larger of its two lives).
    daemon_mb: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let sizes: Vec<usize> = value("--nodes")
        .unwrap_or_else(|| "100,1000".to_owned())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    // Long enough for the silent node to be marked lost (its interval and 90 s) at 1,000 nodes;
    // 10,000 nodes (intervals of 200 to 300 s) want 600. One figure for every size, or one a
    // size in the order of `--nodes` (`--seconds 180,180,600`).
    let seconds: Vec<u64> = value("--seconds")
        .unwrap_or_else(|| "180".to_owned())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let seconds_for = |i: usize| seconds.get(i).or(seconds.last()).copied().unwrap_or(180);
    let ledgers: Vec<String> = value("--ledger")
        .unwrap_or_else(|| "sqlite".to_owned())
        .split(',')
        .map(|l| l.trim().to_owned())
        .collect();
    println!(
        "| ledger | nodes | enrol s | release placed and leased s | drained node's replicas leased elsewhere s | lost node: silent to marked s / replicas leased elsewhere after the mark s | restart (pair: failover) s | first beat p99 ms | heartbeat p50 / p99 ms | beats/s | lease p99 ms | refusals | transport errors | marked while beating | largest peer set | daemon peak MB | sim KB a node | sim CPU ms a node-second |"
    );
    println!("|---|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (ledger, (i, n)) in ledgers
        .iter()
        .flat_map(|l| sizes.iter().enumerate().map(move |(i, n)| (l, (i, *n))))
    {
        let run = run(n, seconds_for(i), ledger);
        let r = &run.report;
        let c = |call: &str, f: &str| r["calls"][call][f].as_f64().unwrap_or(0.0);
        println!(
            "| {ledger} | {n} | {:.1} | {:.2} | {:.2} ({}) | {} | {:.1} | {:.1} | {:.1} / {:.1} | {:.1} | {:.1} | {} | {} | {} | {} | {:.0} | {:.0} | {:.3} |",
            r["enrolSeconds"].as_f64().unwrap_or(0.0),
            run.release,
            run.drained.1,
            run.drained.0,
            run.lost.map_or_else(
                || "not reached in the run".to_owned(),
                |(moving, to_mark, took)| format!("{to_mark:.1} / {took:.2} ({moving})")
            ),
            run.restart,
            c("firstBeat", "p99Ms"),
            c("heartbeat", "p50Ms"),
            c("heartbeat", "p99Ms"),
            c("heartbeat", "perSecond") + c("firstBeat", "perSecond"),
            c("lease", "p99Ms"),
            r["refusals"],
            r["transportErrors"],
            r["markedWhileBeating"],
            r["largestPeerSet"],
            run.daemon_mb,
            r["cost"]["rssBytesPerNode"].as_f64().unwrap_or(0.0) / 1000.0,
            r["cost"]["cpuMsPerNodeSecond"].as_f64().unwrap_or(0.0),
        );
    }
}
