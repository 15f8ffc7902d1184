//! Simulated agents against `pl-reconciler run`, over real mutual TLS on loopback, on both ledger
//! backends: 100 enrolled nodes, each an agent with the client library that leases only its
//! own node's jobs (at most 8 per call, as a real node would) and completes each with its
//! proof. Measures lease+complete throughput and the lease round trip (p50, p99), at
//! saturation (agents that never pause) and below it (agents that pause per lease as if they
//! ran their tasks, their starts spread over one pause); then the agent's own lease loop
//! (`pushleft_agent::lease_loop`, tasks that do nothing), which is what a fleet gets; then a
//! commit of 1,000 single-replica deployments onto the 100 heartbeating nodes, timed from the
//! ref update until every deployment is placed and its first job leased, and until every job
//! of the release is (each replica's start), and checks afterwards that no node holds more
//! than its declared capacity.
//!
//! Run: `cargo bench -p reconciler --bench fleet` (`-- --jobs 20000`; `-- --only-loop` for the
//! agent's loop beside the bare client with the next lease in its request, nothing else;
//! `-- --only-deployments` for the release alone). It starts its own PostgreSQL, as the tests
//! do; `PLBENCH_DAEMON=path/to/pl-reconciler` runs another build's daemon under the same
//! bench, for an A/B.

#[path = "../tests/support/daemon.rs"]
mod daemon_support;
#[path = "../tests/support/postgres.rs"]
mod postgres_support;
#[path = "../tests/support/repo.rs"]
mod repo_support;

use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use pushleft_agent::client::AgentClient;
use pushleft_agent::lease_loop::{LeaseLoop, Tasks};
use reconciler::store::{Ledger, NewJob};
use repo_support::Repo;
use state_schema::task::Task;
use state_schema::values::Name;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const NODES: usize = 100;

struct Throughput {
    jobs_per_second: f64,
    p50: Duration,
    p99: Duration,
    /// CPU the daemon, the ledger's server (PostgreSQL's processes; none for SQLite, which
    /// runs inside the daemon) and the simulated agents (this process) spent per 1,000 jobs:
    /// what a job costs each side, steadier on a shared machine than the rate.
    cpu_per_1000: Cpu,
}

/// CPU milliseconds (daemon, PostgreSQL, the simulated agents).
#[derive(Clone, Copy, Default)]
struct Cpu(f64, f64, f64);

/// The daemon's process id, for [`cpu_now`].
static DAEMON: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// User and system CPU so far, in milliseconds, of the daemon, of every `postgres` process and
/// of this process.
fn cpu_now() -> Cpu {
    // Fields 14 and 15 of /proc/PID/stat, after the command in parentheses; clock ticks of
    // 10 ms (USER_HZ is 100 on Linux).
    let ticks = |pid: &str| -> Option<(String, f64)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (head, rest) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_owned();
        let f: Vec<&str> = rest.split_whitespace().collect();
        let t = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        Some((comm, t * 10.0))
    };
    let daemon = ticks(&DAEMON.load(Ordering::Relaxed).to_string()).map_or(0.0, |(_, t)| t);
    let mut db = 0.0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.bytes().all(|b| b.is_ascii_digit())
            && let Some((comm, t)) = ticks(&name)
            && comm == "postgres"
        {
            db += t;
        }
    }
    let agents = ticks("self").map_or(0.0, |(_, t)| t);
    Cpu(daemon, db, agents)
}

/// CPU per 1,000 jobs since `before`.
fn cpu_since(before: Cpu, jobs: usize) -> Cpu {
    let now = cpu_now();
    let k = 1000.0 / jobs as f64;
    Cpu((now.0 - before.0) * k, (now.1 - before.1) * k, (now.2 - before.2) * k)
}

/// How a simulated agent sends its completions.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// One completion per request.
    Single,
    /// The completions of a lease in one request.
    Batched,
    /// The completions of a lease and the next lease in one request.
    WithLease,
}

struct Figures {
    /// One completion per request.
    single: Throughput,
    /// The completions of a lease in one request.
    batched: Throughput,
    /// The completions of a lease and the next lease in one request.
    with_lease: Throughput,
    /// A lease's completions in one request, then the next lease, each agent pausing
    /// [`TASK_PAUSE`] per lease as if it ran its tasks: the lease round trip under a load
    /// below saturation.
    paced: Throughput,
    /// The same with [`SLOW_TASK_PAUSE`]: a fleet at a quarter of that load.
    paced_slow: Throughput,
    /// One agent alone leasing one job at a time: the round trip without queueing.
    alone: Throughput,
    /// Each node running the agent's own lease loop with tasks that do nothing.
    agent_loop: Throughput,
    /// From the commit of 1,000 deployments to each one's first job leased.
    placed_all: Duration,
    /// From the same commit to each one's replica start leased: every job of the release.
    started_all: Duration,
    over_capacity: usize,
}

/// What a run measures: everything, or one part when working on it.
#[derive(Clone, Copy, PartialEq)]
enum Only {
    Everything,
    /// The agent's loop beside the bare client with the same protocol.
    Loop,
    /// The 1,000 deployments' release alone.
    Deployments,
}

const DEPLOYMENTS: usize = 1000;
/// What a paced agent spends running a lease's tasks before it reports them.
const TASK_PAUSE: Duration = Duration::from_millis(250);
const SLOW_TASK_PAUSE: Duration = Duration::from_millis(1000);

fn run(url: &str, jobs: usize, only: Only) -> Figures {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    let mut pool = String::from(
        "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n",
    );
    for i in 0..NODES {
        pool.push_str(&format!(
            "    - {{name: n{i:03}, capacity: {{cpu: \"4\", memory: 8Gi}}}}\n"
        ));
    }
    repo.write("pools/main.yaml", &pool);
    repo.commit("a hundred nodes", true);
    let s = setup(dir.path());
    let (port, agent_port) = (free_port(), free_port());
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        url,
        port,
        &format!("{CONTROL_CA}\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n"),
    );
    // The daemon's pool: enough connections for a hundred agents' requests at once.
    let text = std::fs::read_to_string(&cfg)
        .expect("config")
        .replace("max_connections = 4", "max_connections = 16");
    std::fs::write(&cfg, text).expect("config");
    let mut d = Daemon::start(&s, &cfg, port);
    DAEMON.store(d.child.id(), Ordering::Relaxed);
    d.wait_ready(Duration::from_secs(30));
    let control = format!("https://localhost:{port}");
    let agents = format!("https://localhost:{agent_port}");
    let ca = std::fs::read_to_string(dir.path().join("tls/ca.crt")).expect("ca");
    let fingerprint = format!(
        "SHA256:{}",
        reconciler::pki::fingerprint_of_pem(&ca).expect("fingerprint")
    );
    let mut clients = Vec::new();
    for i in 0..NODES {
        let node = format!("n{i:03}");
        let node_dir = dir.path().join(&node);
        let token = d.enrolment_token(&node, &s.operator);
        pushleft_agent::enroll::enroll(&control, &fingerprint, &node, &node_dir, &token).expect("enrol");
        clients.push(Arc::new(AgentClient::from_dir(&agents, &node_dir).expect("client")));
    }
    let none = || Throughput {
        jobs_per_second: 0.0,
        p50: Duration::ZERO,
        p99: Duration::ZERO,
        cpu_per_1000: Cpu::default(),
    };
    if only == Only::Loop {
        // `--only-loop`: the agent's loop beside the bare client with the same protocol, and
        // nothing else (for working on the loop).
        let agent_loop = agent_loops(url, &clients, jobs, 0);
        let with_lease = throughput(url, &clients, jobs, jobs, Mode::WithLease, Duration::ZERO);
        d.kill9();
        return Figures {
            single: none(),
            batched: none(),
            with_lease,
            paced: none(),
            paced_slow: none(),
            alone: none(),
            agent_loop,
            placed_all: Duration::ZERO,
            started_all: Duration::ZERO,
            over_capacity: 0,
        };
    }
    if only == Only::Deployments {
        // `--only-deployments`: the release alone (its rows come after none of the modes').
        let placed = thousand_deployments(&repo, &clients, url);
        d.kill9();
        return Figures {
            single: none(),
            batched: none(),
            with_lease: none(),
            paced: none(),
            paced_slow: none(),
            alone: none(),
            agent_loop: none(),
            placed_all: placed.first,
            started_all: placed.every,
            over_capacity: placed.over_capacity,
        };
    }
    let single = throughput(url, &clients, jobs, 0, Mode::Single, Duration::ZERO);
    let batched = throughput(url, &clients, jobs, jobs, Mode::Batched, Duration::ZERO);
    let with_lease = throughput(url, &clients, jobs, 2 * jobs, Mode::WithLease, Duration::ZERO);
    let paced = throughput(url, &clients, jobs, 3 * jobs, Mode::Batched, TASK_PAUSE);
    let paced_slow = throughput(url, &clients, jobs / 4, 4 * jobs, Mode::Batched, SLOW_TASK_PAUSE);
    let alone = unloaded(url, &clients[0], 5 * jobs);
    let agent_loop = agent_loops(url, &clients, jobs, 6 * jobs);
    let placed = thousand_deployments(&repo, &clients, url);
    d.kill9();
    Figures {
        single,
        batched,
        with_lease,
        paced,
        paced_slow,
        alone,
        agent_loop,
        placed_all: placed.first,
        started_all: placed.every,
        over_capacity: placed.over_capacity,
    }
}

/// Queues a removal for each of `instances`, on the node `node_of` names. A removal's
/// execution spec needs no deployment, so the bench measures the lease and completion path,
/// not spec building.
fn enqueue_removals(url: &str, instances: std::ops::Range<usize>, node_of: impl Fn(usize) -> String) {
    let all: Vec<NewJob> = instances
        .map(|i| NewJob {
            task: Task::StopApplication {
                environment: Name::new("bench").expect("name"),
                role: Name::new("web").expect("name"),
                instance: i as u32,
                generation: 1,
            },
            target_node: node_of(i),
            max_attempts: 3,
            not_before_ms: 0,
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let ledger = Ledger::connect(url, 2).await.expect("ledger");
        for chunk in all.chunks(2000) {
            ledger.jobs().enqueue(chunk, 1).await.expect("enqueue");
        }
        ledger.close().await;
    });
}

/// One agent, nobody else asking: 300 rounds of leasing one job and completing it. The lease
/// round trip a node sees on a quiet control plane (TLS, certificate check, one group
/// transaction with its durable commit).
fn unloaded(url: &str, client: &AgentClient, offset: usize) -> Throughput {
    const ROUNDS: usize = 300;
    enqueue_removals(url, offset..offset + ROUNDS, |_| "n000".into());
    let cpu = cpu_now();
    let started = Instant::now();
    let mut rtts = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let leased = client.lease(1, Duration::ZERO).expect("lease");
        rtts.push(t.elapsed());
        let j = leased.jobs.first().expect("a job");
        client
            .complete(&j.proof, agent_proto::Outcome::Succeeded, "")
            .expect("complete");
    }
    let elapsed = started.elapsed();
    rtts.sort();
    Throughput {
        jobs_per_second: ROUNDS as f64 / elapsed.as_secs_f64(),
        p50: rtts[ROUNDS / 2],
        p99: rtts[ROUNDS * 99 / 100],
        cpu_per_1000: cpu_since(cpu, ROUNDS),
    }
}

/// Queues `jobs` removals over the nodes (instances from `offset`, so each round's keys are
/// new) and has every agent lease at most 8 and complete them, one request per completion or
/// one per lease (`batched`), until none is left.
fn throughput(
    url: &str,
    clients: &[Arc<AgentClient>],
    jobs: usize,
    offset: usize,
    mode: Mode,
    pause: Duration,
) -> Throughput {
    enqueue_removals(url, offset..offset + jobs, |i| format!("n{:03}", i % NODES));
    let cpu = cpu_now();
    let started = Instant::now();
    let (done, mut rtts) = std::thread::scope(|scope| {
        let workers: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                scope.spawn(move || {
                    let mut rtts = Vec::new();
                    let mut done = 0usize;
                    // Paced agents start spread over one pause, as a fleet's do, not all at
                    // once (in step, their requests would come in bursts of a hundred).
                    std::thread::sleep(pause.mul_f64(i as f64 / NODES as f64));
                    let t = Instant::now();
                    let mut leased = c.lease(8, Duration::ZERO).expect("lease");
                    rtts.push(t.elapsed());
                    while !leased.jobs.is_empty() {
                        std::thread::sleep(pause);
                        let all: Vec<(&agent_proto::LeaseProof, agent_proto::Outcome, &str)> = leased
                            .jobs
                            .iter()
                            .map(|j| (&j.proof, agent_proto::Outcome::Succeeded, ""))
                            .collect();
                        let next = match mode {
                            Mode::Single => {
                                for (proof, outcome, detail) in &all {
                                    c.complete(proof, *outcome, detail).expect("complete");
                                }
                                done += all.len();
                                let t = Instant::now();
                                let next = c.lease(8, Duration::ZERO).expect("lease");
                                rtts.push(t.elapsed());
                                next
                            }
                            Mode::Batched => {
                                let results = c.complete_many(&all).expect("complete");
                                assert!(results.iter().all(Option::is_none), "{results:?}");
                                done += results.len();
                                let t = Instant::now();
                                let next = c.lease(8, Duration::ZERO).expect("lease");
                                rtts.push(t.elapsed());
                                next
                            }
                            Mode::WithLease => {
                                // The round trip of the one request that completes and leases.
                                let t = Instant::now();
                                let (results, next) = c.complete_and_lease(&all, 8, Duration::ZERO).expect("complete");
                                rtts.push(t.elapsed());
                                assert!(results.iter().all(Option::is_none), "{results:?}");
                                done += results.len();
                                next.expect("lease")
                            }
                        };
                        leased = next;
                    }
                    (done, rtts)
                })
            })
            .collect();
        let mut done = 0;
        let mut rtts = Vec::new();
        for w in workers {
            let (n, r) = w.join().expect("agent");
            done += n;
            rtts.extend(r);
        }
        (done, rtts)
    });
    let elapsed = started.elapsed();
    let cpu = cpu_since(cpu, jobs);
    assert_eq!(done, jobs, "every job once");
    rtts.sort();
    Throughput {
        jobs_per_second: jobs as f64 / elapsed.as_secs_f64(),
        p50: rtts[rtts.len() / 2],
        p99: rtts[rtts.len() * 99 / 100],
        cpu_per_1000: cpu,
    }
}

/// Tasks that do nothing, for the agent's lease loop.
struct Nothing;

impl Tasks for Nothing {
    fn execute(
        &self,
        _job: &agent_proto::LeasedJob,
    ) -> impl std::future::Future<Output = Result<pushleft_agent::lease_loop::Ended, pushleft_agent::outcome::Failure>> + Send
    {
        std::future::ready(Ok(String::new().into()))
    }
}

/// Every node running the agent's own lease loop, on one runtime with two threads.
struct Loops<T: Tasks> {
    rt: tokio::runtime::Runtime,
    loops: Vec<Arc<LeaseLoop<T>>>,
    stop: Arc<AtomicBool>,
    running: Vec<tokio::task::JoinHandle<()>>,
}

impl<T: Tasks> Loops<T> {
    fn start(clients: &[Arc<AgentClient>], tasks: &Arc<T>, long_wait: Duration) -> Loops<T> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("rt");
        let loops: Vec<Arc<LeaseLoop<T>>> = clients
            .iter()
            .map(|c| Arc::new(LeaseLoop::new(Arc::clone(c), Arc::clone(tasks), 4, long_wait)))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let running = loops
            .iter()
            .map(|l| {
                let (l, stop) = (Arc::clone(l), Arc::clone(&stop));
                rt.spawn(async move { l.run(&stop).await })
            })
            .collect();
        Loops {
            rt,
            loops,
            stop,
            running,
        }
    }

    /// Stops every loop (each within its long poll) and waits for them; the ends recorded, the
    /// reports that carried them, and the requests made in all.
    fn stop(self) -> (usize, usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.rt.block_on(async {
            for r in self.running {
                r.await.expect("lease loop");
            }
        });
        let recorded = self.loops.iter().map(|l| l.recorded()).sum::<u64>() as usize;
        let reports = self.loops.iter().map(|l| l.reports()).sum::<u64>() as usize;
        let requests = self.loops.iter().map(|l| l.requests()).sum::<u64>() as usize;
        (recorded, reports, requests)
    }
}

/// Queues `jobs` removals over the nodes and runs the agent's own lease loop on each node (on
/// one runtime with two threads) until the control plane has recorded every end. The round
/// trip is not sampled here (the loop's requests are its own).
fn agent_loops(url: &str, clients: &[Arc<AgentClient>], jobs: usize, offset: usize) -> Throughput {
    enqueue_removals(url, offset..offset + jobs, |i| format!("n{:03}", i % NODES));
    // Done when the ledger holds every end (a loop's last report waits out its long poll
    // before it hears that it was recorded). The poll must cost the machine nothing it could
    // give the daemon: the newest result's id is one index lookup (a count of open jobs
    // scanned up to 20,000 index entries every 10 ms), and the exact count runs only once
    // that id says all may be there.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    sqlx::any::install_default_drivers();
    let ledger = rt.block_on(sqlx::AnyPool::connect(url)).expect("ledger");
    let newest = || {
        rt.block_on(sqlx::query_scalar::<_, i64>("SELECT COALESCE(MAX(id), 0) FROM job_results").fetch_one(&ledger))
            .expect("newest result")
    };
    let base = newest();
    let cpu = cpu_now();
    let fleet = Loops::start(clients, &Arc::new(Nothing), Duration::from_millis(100));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    let all_there = || {
        rt.block_on(
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM job_results WHERE id > {base}"
            )))
            .fetch_one(&ledger),
        )
        .expect("count") as usize
            >= jobs
    };
    let elapsed = loop {
        if (newest() - base) as usize >= jobs && all_there() || Instant::now() >= deadline {
            break started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let cpu = cpu_since(cpu, jobs);
    rt.block_on(ledger.close());
    let (recorded, reports, requests) = fleet.stop();
    assert_eq!(recorded, jobs, "every job once, within the deadline");
    let backend = url.split(':').next().unwrap_or_default();
    eprintln!(
        "agent loop on {backend}: {recorded} ends in {reports} reports ({:.1} a report), {requests} requests in all",
        recorded as f64 / reports.max(1) as f64
    );
    Throughput {
        jobs_per_second: jobs as f64 / elapsed.as_secs_f64(),
        p50: Duration::ZERO,
        p99: Duration::ZERO,
        cpu_per_1000: cpu,
    }
}

/// Tasks that do nothing but note which environments had a job, and which had their
/// replica's start.
#[derive(Default)]
struct Seen {
    any: std::sync::Mutex<std::collections::BTreeSet<String>>,
    started: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Seen {
    fn count(&self) -> usize {
        self.any.lock().map(|s| s.len()).unwrap_or(0)
    }

    fn started(&self) -> usize {
        self.started.lock().map(|s| s.len()).unwrap_or(0)
    }
}

impl Tasks for Seen {
    fn execute(
        &self,
        job: &agent_proto::LeasedJob,
    ) -> impl std::future::Future<Output = Result<pushleft_agent::lease_loop::Ended, pushleft_agent::outcome::Failure>> + Send
    {
        if let Ok(mut s) = self.any.lock() {
            s.insert(job.task.environment().to_owned());
        }
        if matches!(job.task, agent_proto::Task::EnsureApplication { .. })
            && let Ok(mut s) = self.started.lock()
        {
            s.insert(job.task.environment().to_owned());
        }
        std::future::ready(Ok(String::new().into()))
    }
}

/// What the release of the 1,000 deployments took.
struct Placed {
    /// Until each deployment's first job (its node's set-up) was leased.
    first: Duration,
    /// Until each deployment's replica start was leased: every job of the release.
    every: Duration,
    over_capacity: usize,
}

/// Commits 1,000 single-replica deployments (one project each, so each has its own hostname)
/// while every node heartbeats and runs the agent's own lease loop, and times from the commit
/// until each deployment's first job is leased (and run, doing nothing), and until its
/// replica's start is. Then counts the nodes whose reservations exceed their capacity (there
/// must be none).
fn thousand_deployments(repo: &Repo, clients: &[Arc<AgentClient>], url: &str) -> Placed {
    for c in clients {
        c.heartbeat(&agent_proto::Heartbeat::new("bench", &agent_proto::FULL_CAPABILITIES))
            .expect("heartbeat");
    }
    for i in 0..DEPLOYMENTS {
        repo.write(
            &format!("projects/p{i:04}.yaml"),
            &repo_support::project(&format!("p{i:04}"), 1),
        );
        repo.write(
            &format!("envs/p{i:04}.yaml"),
            &repo_support::environment(&format!("p{i:04}-production"), &format!("p{i:04}")),
        );
    }
    // Staged first: the clock starts at the commit, as a push's would.
    repo_support::git(&repo.dir, &["add", "-A"]);
    let seen = Arc::new(Seen::default());
    let fleet = Loops::start(clients, &seen, Duration::from_millis(200));
    let started = Instant::now();
    repo.commit("a thousand deployments", true);
    let deadline = started + Duration::from_secs(120);
    let mut first = None;
    while seen.started() < DEPLOYMENTS && Instant::now() < deadline {
        if first.is_none() && seen.count() >= DEPLOYMENTS {
            first = Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let every = started.elapsed();
    fleet.stop();
    assert_eq!(
        seen.count(),
        DEPLOYMENTS,
        "every deployment's first job leased within the deadline"
    );
    assert_eq!(
        seen.started(),
        DEPLOYMENTS,
        "every deployment's replica start leased within the deadline"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let over = rt.block_on(async {
        let ledger = Ledger::connect(url, 2).await.expect("ledger");
        let now = reconciler::store::now_ms();
        let nodes = reconciler::ops::nodes::node_rows(&ledger, "main", now, state_schema::placement::LOST_AFTER_MS)
            .await
            .expect("nodes");
        ledger.close().await;
        let placed: usize = nodes.iter().map(|n| n.instances).sum();
        assert_eq!(placed, DEPLOYMENTS, "every replica placed");
        nodes
            .iter()
            .filter(|n| n.reserved_cpu_millis > n.cpu_millis || n.reserved_memory_bytes > n.memory_bytes)
            .count()
    });
    Placed {
        first: first.unwrap_or(every),
        every,
        over_capacity: over,
    }
}

fn main() {
    let mut jobs = 20_000usize;
    let mut only = Only::Everything;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--jobs" {
            jobs = args.next().and_then(|n| n.parse().ok()).expect("--jobs N");
        } else if a == "--only-loop" {
            only = Only::Loop;
        } else if a == "--only-deployments" {
            only = Only::Deployments;
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = run(
        &format!("sqlite://{}", dir.path().join("ledger.db").display()),
        jobs,
        only,
    );
    let pg = postgres_support::Postgres::start();
    let postgres = run(&pg.url(), jobs, only);
    println!("{jobs} jobs per mode, {NODES} simulated agents over mutual TLS, leases of at most 8:");
    println!(
        "| ledger | completions | lease+complete jobs/s | lease p50 | lease p99 | CPU per 1,000 jobs: daemon / PostgreSQL / agents |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let figures = [("SQLite", sqlite), ("PostgreSQL", postgres)];
    for (name, f) in &figures {
        for (mode, t) in [
            ("one per request", &f.single),
            ("one request per lease", &f.batched),
            ("with the next lease in the same request", &f.with_lease),
            ("one request per lease, each agent pausing 250 ms per lease", &f.paced),
            ("one request per lease, each agent pausing 1 s per lease", &f.paced_slow),
            ("one agent alone, one job at a time", &f.alone),
            ("the agent's own lease loop, tasks that do nothing", &f.agent_loop),
        ] {
            if t.jobs_per_second == 0.0 {
                // Not run (`--only-loop`, `--only-deployments`).
                continue;
            }
            let rtt = |d: Duration| {
                if d.is_zero() {
                    "–".to_owned()
                } else {
                    format!("{:.1} ms", ms(d))
                }
            };
            println!(
                "| {name} | {mode} | {:.0} | {} | {} | {:.0} / {:.0} / {:.0} ms |",
                t.jobs_per_second,
                rtt(t.p50),
                rtt(t.p99),
                t.cpu_per_1000.0,
                t.cpu_per_1000.1,
                t.cpu_per_1000.2,
            );
        }
    }
    println!();
    println!("{DEPLOYMENTS} single-replica deployments committed onto the {NODES} nodes, the agents' own lease loops:");
    println!(
        "| ledger | each one's first job leased | every job leased (each replica's start) | nodes over capacity |"
    );
    println!("|---|---:|---:|---:|");
    for (name, f) in &figures {
        if f.started_all.is_zero() {
            // Not run (`--only-loop`).
            continue;
        }
        println!(
            "| {name} | {:.2} s | {:.2} s | {} |",
            f.placed_all.as_secs_f64(),
            f.started_all.as_secs_f64(),
            f.over_capacity
        );
    }
}
