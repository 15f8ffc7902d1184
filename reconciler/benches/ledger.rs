//! Lease + complete throughput of the ledger with 100 concurrent workers, on SQLite and on
//! PostgreSQL, beside the raw-SQL baseline: pgbench running a two-statement script (a
//! `FOR UPDATE SKIP LOCKED` claim that sets a lease, then a completion) on the same cluster.
//! Durable settings throughout (fsync on, synchronous_commit on, SQLite synchronous=FULL).
//!
//! Run: `cargo bench -p reconciler --bench ledger` (`-- --jobs 20000 --batch 32`).

#[path = "../tests/support/postgres.rs"]
mod postgres_support;

use reconciler::store::{Completion, Ledger, NewJob, Outcome};
use state_schema::task::Task;
use state_schema::values::Name;
use std::sync::Arc;
use std::time::Instant;

const WORKERS: usize = 100;

fn jobs(n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| NewJob {
            task: Task::EnsureApplication {
                environment: Name::new("bench").expect("name"),
                role: Name::new("web").expect("name"),
                instance: i as u32,
                generation: 1,
                spec_hash: String::new(),
                repair: 0,
            },
            target_node: format!("node-{}", i % WORKERS),
            max_attempts: 3,
            not_before_ms: 0,
        })
        .collect()
}

/// Jobs per second through lease + complete, every worker an agent of its own node.
async fn throughput(ledger: Ledger, n: usize, batch: u32) -> f64 {
    let all = jobs(n);
    for chunk in all.chunks(2000) {
        ledger.jobs().enqueue(chunk, 1).await.expect("enqueue");
    }
    let ledger = Arc::new(ledger);
    let start = Instant::now();
    let mut handles = Vec::new();
    for w in 0..WORKERS {
        let l = ledger.clone();
        handles.push(tokio::spawn(async move {
            let node = format!("node-{w}");
            let mut done = 0usize;
            loop {
                let leases = l.jobs().lease(&node, batch, 60_000, 10).await.expect("lease");
                if leases.is_empty() {
                    return done;
                }
                let c: Vec<Completion> = leases
                    .iter()
                    .map(|x| Completion {
                        token: x.token.clone(),
                        outcome: Outcome::Succeeded,
                    })
                    .collect();
                let r = l.jobs().complete(&c, 11).await.expect("complete");
                done += r.iter().filter(|x| x.is_ok()).count();
            }
        }));
    }
    let mut done = 0;
    for h in handles {
        done += h.await.expect("worker");
    }
    assert_eq!(done, n, "every job completed once");
    n as f64 / start.elapsed().as_secs_f64()
}

fn pgbench(pg: &postgres_support::Postgres, n: usize, clients: usize) -> f64 {
    let psql = |sql: &str| {
        let o = std::process::Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &pg.url(), "-c", sql])
            .output()
            .expect("psql");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    psql(
        "DROP TABLE IF EXISTS pgb_jobs; DROP SEQUENCE IF EXISTS pgb_fence; CREATE SEQUENCE pgb_fence; CREATE TABLE pgb_jobs (id bigserial primary key, state text not null, lease_token text, fencing bigint, expires bigint);",
    );
    psql(&format!(
        "INSERT INTO pgb_jobs (state) SELECT 'queued' FROM generate_series(1, {n}); CREATE INDEX ON pgb_jobs (state, id); ANALYZE pgb_jobs;"
    ));
    let script = tempfile::NamedTempFile::new().expect("script");
    std::fs::write(
        script.path(),
        "BEGIN;\nUPDATE pgb_jobs SET state = 'leased', lease_token = md5(random()::text), fencing = nextval('pgb_fence'), expires = 60000 WHERE id = (SELECT id FROM pgb_jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id \\gset\nUPDATE pgb_jobs SET state = 'succeeded', lease_token = NULL WHERE id = :id;\nCOMMIT;\n",
    )
    .expect("write");
    let per_client = n / clients;
    let o = std::process::Command::new("pgbench")
        .args([
            "-n",
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-t",
            &per_client.to_string(),
            "-f",
        ])
        .arg(script.path())
        .arg(pg.url())
        .output()
        .expect("pgbench");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "pgbench: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.lines()
        .find(|l| l.starts_with("tps"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .expect("tps line")
}

fn main() {
    let mut n = 20_000usize;
    let mut batch = 32u32;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--jobs" => n = args.next().expect("n").parse().expect("number"),
            "--batch" => batch = args.next().expect("n").parse().expect("number"),
            _ => {}
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = postgres_support::Postgres::start();
    let (sqlite, postgres) = rt.block_on(async {
        let s = Ledger::connect(&format!("sqlite://{}", dir.path().join("bench.db").display()), 16)
            .await
            .expect("sqlite");
        s.migrate().await.expect("migrate");
        let sqlite = throughput(s, n, batch).await;
        let p = Ledger::connect(&pg.url(), 32).await.expect("postgres");
        p.migrate().await.expect("migrate");
        let postgres = throughput(p, n, batch).await;
        (sqlite, postgres)
    });
    // The baseline with the same 100 clients, and with 10 (less contention for the head of
    // the queue); the better of the two is the one compared against.
    let baseline_100 = pgbench(&pg, n, WORKERS);
    let baseline_10 = pgbench(&pg, n, 10);
    let baseline = baseline_100.max(baseline_10);
    println!("{n} jobs, {WORKERS} concurrent workers, lease batches of {batch}:");
    println!("| path | jobs/s | vs pgbench |");
    println!("|---|---:|---:|");
    println!("| ledger on SQLite | {sqlite:.0} | {:.1}× |", sqlite / baseline);
    println!("| ledger on PostgreSQL | {postgres:.0} | {:.1}× |", postgres / baseline);
    println!(
        "| pgbench, one job per two-statement transaction, 100 clients | {baseline_100:.0} | {:.1}× |",
        baseline_100 / baseline
    );
    println!(
        "| pgbench, one job per two-statement transaction, 10 clients | {baseline_10:.0} | {:.1}× |",
        baseline_10 / baseline
    );
}
