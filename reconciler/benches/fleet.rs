//! Simulated agents against `pl-reconciler run`, over real mutual TLS on loopback, on both ledger
//! backends: 100 enrolled nodes, each an agent with the client library that leases only its
//! own node's jobs (at most 8 per call, as a real node would) and completes each with its
//! proof. Measures lease+complete throughput and the lease round trip (p50, p99).
//!
//! Run: `cargo bench -p reconciler --bench fleet` (`-- --jobs 20000`). It starts its own
//! PostgreSQL, as the tests do.

#[path = "../tests/support/daemon.rs"]
mod daemon_support;
#[path = "../tests/support/postgres.rs"]
mod postgres_support;
#[path = "../tests/support/repo.rs"]
mod repo_support;

use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use pushleft_agent::client::AgentClient;
use reconciler::ledger::{Ledger, NewJob};
use repo_support::Repo;
use state_schema::task::Task;
use state_schema::values::Name;
use std::time::{Duration, Instant};

const NODES: usize = 100;

struct Figures {
    jobs_per_second: f64,
    p50: Duration,
    p99: Duration,
}

fn run(url: &str, jobs: usize) -> Figures {
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
        clients.push(AgentClient::from_dir(&agents, &node_dir).expect("client"));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let ledger = Ledger::connect(url, 2).await.expect("ledger");
        let all: Vec<NewJob> = (0..jobs)
            .map(|i| NewJob {
                task: Task::EnsureApplication {
                    environment: Name::new("bench").expect("name"),
                    role: Name::new("web").expect("name"),
                    instance: i as u32,
                    generation: 1,
                    spec_hash: String::new(),
                },
                target_node: format!("n{:03}", i % NODES),
                max_attempts: 3,
                not_before_ms: 0,
            })
            .collect();
        for chunk in all.chunks(2000) {
            ledger.enqueue(chunk, 1).await.expect("enqueue");
        }
        ledger.close().await;
    });
    let started = Instant::now();
    let workers: Vec<_> = clients
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let mut rtts = Vec::new();
                let mut done = 0usize;
                loop {
                    let t = Instant::now();
                    let leased = c.lease(8, Duration::ZERO).expect("lease");
                    rtts.push(t.elapsed());
                    if leased.jobs.is_empty() {
                        break;
                    }
                    for j in &leased.jobs {
                        c.complete(&j.proof, agent_proto::Outcome::Succeeded, "")
                            .expect("complete");
                        done += 1;
                    }
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
    let elapsed = started.elapsed();
    assert_eq!(done, jobs, "every job once");
    rtts.sort();
    d.kill9();
    Figures {
        jobs_per_second: jobs as f64 / elapsed.as_secs_f64(),
        p50: rtts[rtts.len() / 2],
        p99: rtts[rtts.len() * 99 / 100],
    }
}

fn main() {
    let mut jobs = 20_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--jobs" {
            jobs = args.next().and_then(|n| n.parse().ok()).expect("--jobs N");
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = run(&format!("sqlite://{}", dir.path().join("ledger.db").display()), jobs);
    let pg = postgres_support::Postgres::start();
    let postgres = run(&pg.url(), jobs);
    println!("{jobs} jobs, {NODES} simulated agents over mutual TLS, leases of at most 8, one completion per request:");
    println!("| ledger | lease+complete jobs/s | lease p50 | lease p99 |");
    println!("|---|---:|---:|---:|");
    for (name, f) in [("SQLite", sqlite), ("PostgreSQL", postgres)] {
        println!(
            "| {name} | {:.0} | {:.1} ms | {:.1} ms |",
            f.jobs_per_second,
            f.p50.as_secs_f64() * 1000.0,
            f.p99.as_secs_f64() * 1000.0
        );
    }
}
