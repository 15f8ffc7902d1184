//! The reconciler's own speed, on SQLite and PostgreSQL in the same run:
//! - plan-and-write: the pass that judges a commit creating 1,000 environments and writes its
//!   revision, desired objects, 1,000 deployments, their first jobs and events (one transaction);
//! - commit to leasable: `pl-reconciler run` on a local repository; from the ref update to the
//!   first job of the new generation leased through the ledger API;
//! - daemon memory: peak RSS of `pl-reconciler run` after it has applied a 10,000-environment
//!   repository (about 11,000 objects).
//!
//! Run: `cargo bench -p reconciler --bench reconcile` (`-- --samples 20`).

#[path = "../tests/support/daemon.rs"]
mod daemon_support;
#[path = "../tests/support/dump.rs"]
mod dump;
#[path = "../tests/support/postgres.rs"]
mod postgres_support;
#[path = "../tests/support/repo.rs"]
mod repo_support;
#[path = "../tests/support/synthetic.rs"]
mod synthetic;

use daemon_support::{Daemon, config, free_port, setup};
use reconciler::reconcile::Reconciler;
use reconciler::store::Ledger;
use reconciler::store::now_ms;
use repo_support::{Repo, environment, git, project};
use state_schema::synthetic::{Params, generate};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use synthetic::{shared_config, synthetic_repo};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds of the pass that applies `head`, on a fresh ledger each sample.
async fn plan_and_write(
    dir: &Path,
    repo: &Repo,
    head: &str,
    url_for: &dyn Fn(usize) -> String,
    samples: usize,
) -> (f64, usize) {
    let mut times = Vec::new();
    let mut jobs = 0;
    for i in 0..samples {
        let url = url_for(i);
        let ledger = Ledger::connect(&url, 4).await.expect("connect");
        ledger.migrate().await.expect("migrate");
        dump::nodes_up(&url, &dump::SYNTHETIC_NODES).await;
        let shared = Arc::new(
            Reconciler::new(
                Arc::new(shared_config(dir, &repo.dir, &url)),
                Arc::new(ledger),
                Arc::default(),
            )
            .expect("shared"),
        );
        let base = repo.git(&["rev-parse", "HEAD"]);
        repo.git(&["update-ref", "refs/heads/main", &base]);
        shared.pass().await.expect("base pass");
        repo.git(&["update-ref", "refs/heads/main", head]);
        let start = Instant::now();
        let r = shared.pass().await.expect("head pass");
        times.push(start.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(r.accepted, 1, "the head is accepted");
        jobs = r.jobs_queued;
        shared.ledger.close().await;
    }
    (median(times), jobs)
}

/// Milliseconds from a ref update to the new generation's first job leased.
async fn commit_to_leasable(dir: &Path, url: &str, samples: usize) -> f64 {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 1));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("first", true);
    repo.git(&["checkout", "-q", "-b", "work"]);
    let s = setup(dir);
    let port = free_port();
    let cfg = config(&s, "lat", &repo.dir, url, port, "");
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(30));
    let ledger = Ledger::connect(url, 2).await.expect("connect");
    let mut times = Vec::new();
    for i in 0..samples + 1 {
        repo.write("projects/api.yaml", &project("api", (i % 2 + 2) as u32));
        let sha = repo.commit(&format!("change {i}"), true);
        let generation = format!(":g{}:", i + 2);
        let start = Instant::now();
        git(&repo.dir, &["update-ref", "refs/heads/main", &sha]);
        loop {
            let l = ledger.jobs().lease("n1", 100, 60_000, now_ms()).await.expect("lease");
            if l.iter().any(|x| x.key.contains(&generation)) {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no job of {generation}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if i > 0 {
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    d.term();
    ledger.close().await;
    median(times)
}

/// Peak RSS (MB) of the daemon once it has applied a 10,000-environment repository.
async fn daemon_memory(dir: &Path, url: &str) -> (f64, usize) {
    let (repo, _base, head) = synthetic_repo(dir, 10_000);
    let objects = generate(&Params::new(10_000)).len();
    let s = setup(dir);
    let port = free_port();
    let cfg = config(&s, "mem", &repo.dir, url, port, "");
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(60));
    git(&repo.dir, &["update-ref", "refs/heads/main", &head]);
    let ledger = Ledger::connect(url, 1).await.expect("connect");
    let start = Instant::now();
    while ledger.revisions().last_judged("main").await.expect("judged").as_deref() != Some(head.as_str()) {
        assert!(start.elapsed() < Duration::from_secs(300), "not applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).expect("status");
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .expect("VmHWM");
    d.term();
    ledger.close().await;
    (hwm / 1024.0, objects)
}

fn main() {
    let mut samples = 10usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--samples" {
            samples = args.next().expect("n").parse().expect("number");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let pg = postgres_support::Postgres::start();
    let admin = rt.block_on(Ledger::connect(&pg.url(), 1)).expect("admin");
    let db = |name: &str| {
        rt.block_on(admin.execute_raw(&format!("CREATE DATABASE {name}")))
            .expect("create database");
        pg.url().replace("/postgres", &format!("/{name}"))
    };

    let work = tempfile::tempdir().expect("tempdir");
    let (repo, _base, head) = synthetic_repo(&work.path().join("k1"), 1000);
    let sqlite_dir = work.path().join("k1-sqlite");
    std::fs::create_dir_all(&sqlite_dir).expect("mkdir");
    let pw_sqlite = rt.block_on(plan_and_write(
        &work.path().join("k1"),
        &repo,
        &head,
        &|i| format!("sqlite://{}", sqlite_dir.join(format!("l{i}.db")).display()),
        samples.min(5),
    ));
    let pg_urls: Vec<String> = (0..samples.min(5)).map(|i| db(&format!("pw{i}"))).collect();
    let pw_pg = rt.block_on(plan_and_write(
        &work.path().join("k1"),
        &repo,
        &head,
        &|i| pg_urls[i].clone(),
        samples.min(5),
    ));

    let lat_dir = work.path().join("lat-sqlite");
    std::fs::create_dir_all(&lat_dir).expect("mkdir");
    let lat_sqlite = rt.block_on(commit_to_leasable(
        &lat_dir,
        &format!("sqlite://{}", lat_dir.join("ledger.db").display()),
        samples,
    ));
    let lat_dir = work.path().join("lat-pg");
    std::fs::create_dir_all(&lat_dir).expect("mkdir");
    let lat_pg = rt.block_on(commit_to_leasable(&lat_dir, &db("lat"), samples));

    let mem_dir = work.path().join("mem-sqlite");
    std::fs::create_dir_all(&mem_dir).expect("mkdir");
    let (mem_sqlite, objects) = rt.block_on(daemon_memory(
        &mem_dir,
        &format!("sqlite://{}", mem_dir.join("ledger.db").display()),
    ));
    let mem_dir = work.path().join("mem-pg");
    std::fs::create_dir_all(&mem_dir).expect("mkdir");
    let (mem_pg, _) = rt.block_on(daemon_memory(&mem_dir, &db("mem")));

    println!("| measure | SQLite | PostgreSQL | target |");
    println!("|---|---:|---:|---:|");
    println!(
        "| plan-and-write, commit creating 1,000 deployments ({} jobs), median ms | {:.1} | {:.1} | - |",
        pw_sqlite.1, pw_sqlite.0, pw_pg.0
    );
    println!("| commit to first job leasable (local source), median ms | {lat_sqlite:.1} | {lat_pg:.1} | < 200 |");
    println!("| daemon peak RSS after applying {objects} objects, MB | {mem_sqlite:.0} | {mem_pg:.0} | < 100 |");
}
