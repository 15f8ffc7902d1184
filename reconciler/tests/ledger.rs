//! The ledger's behaviour, run unchanged against SQLite and against a real PostgreSQL that
//! the test starts itself (initdb and pg_ctl into a temporary directory, on a free port).

use reconciler::store::wakes::Wake;
use reconciler::store::{Backend, Completion, Ledger, NewJob, Outcome, Refused};
use state_schema::task::Task;
use state_schema::values::Name;
use std::path::Path;

#[path = "support/postgres.rs"]
mod postgres_support;
use postgres_support::Postgres;

fn name(s: &str) -> Name {
    Name::new(s).expect("valid name")
}

fn job(env: &str, instance: u32, node: &str, max_attempts: u32) -> NewJob {
    NewJob {
        task: Task::EnsureApplication {
            environment: name(env),
            role: name("web"),
            instance,
            generation: 1,
            spec_hash: "sha256:00".into(),
            repair: 0,
        },
        target_node: node.into(),
        max_attempts,
        not_before_ms: 0,
    }
}

async fn sqlite(dir: &Path) -> Ledger {
    let l = Ledger::connect(&format!("sqlite://{}", dir.join("ledger.db").display()), 8)
        .await
        .expect("connect sqlite");
    l.migrate().await.expect("migrate");
    l
}

async fn postgres(pg: &Postgres) -> Ledger {
    let l = Ledger::connect(&pg.url(), 8).await.expect("connect postgres");
    l.migrate().await.expect("migrate");
    l
}

/// The behaviour both backends must share.
async fn suite(l: &Ledger) {
    // Enqueue is idempotent by key.
    let jobs: Vec<NewJob> = (0..5)
        .map(|i| job("api", i, "n1", 3))
        .chain([job("api", 9, "n2", 3)])
        .collect();
    assert_eq!(l.jobs().enqueue(&jobs, 1_000).await.expect("enqueue"), 6);
    assert_eq!(
        l.jobs().enqueue(&jobs, 1_001).await.expect("enqueue again"),
        0,
        "a replay adds no job"
    );

    // A node leases only its own jobs; a job's first lease has its first fencing token.
    let a = l.jobs().lease("n1", 2, 10_000, 2_000).await.expect("lease");
    assert_eq!(a.len(), 2);
    let b = l.jobs().lease("n1", 10, 10_000, 2_000).await.expect("lease");
    assert_eq!(b.len(), 3, "the rest of n1's jobs");
    assert!(b.iter().chain(&a).all(|x| x.token.fencing_token == 1));
    assert!(b.iter().chain(&a).all(|x| x.key.starts_with("app:api/web/")));
    assert!(
        l.jobs().lease("n1", 10, 10_000, 2_000).await.expect("lease").is_empty(),
        "nothing is leased twice"
    );
    assert_eq!(l.jobs().lease("n2", 10, 10_000, 2_000).await.expect("lease").len(), 1);

    // Renew and complete need the live pair; a stale one records nothing.
    let events_before = l.events().events_after(0, 10_000).await.expect("events").len();
    let mut stale = a[0].token.clone();
    stale.fencing_token -= 1;
    assert_eq!(
        l.jobs().renew(&[stale.clone()], 10_000, 3_000).await.expect("renew"),
        vec![Err(Refused::StaleFencingToken)]
    );
    assert_eq!(
        l.jobs()
            .complete(
                &[Completion {
                    token: stale,
                    outcome: Outcome::Succeeded
                }],
                3_000
            )
            .await
            .expect("complete"),
        vec![Err(Refused::StaleFencingToken)]
    );
    assert_eq!(
        l.events().events_after(0, 10_000).await.expect("events").len(),
        events_before,
        "a refusal records nothing"
    );
    assert!(
        l.jobs()
            .renew(&[a[0].token.clone()], 10_000, 3_000)
            .await
            .expect("renew")[0]
            .is_ok()
    );

    // Completions in a batch: success, retryable (backoff), permanent.
    let done = l
        .jobs()
        .complete(
            &[
                Completion {
                    token: a[0].token.clone(),
                    outcome: Outcome::Succeeded,
                },
                Completion {
                    token: a[1].token.clone(),
                    outcome: Outcome::Retryable("pull failed".into()),
                },
                Completion {
                    token: b[0].token.clone(),
                    outcome: Outcome::Permanent("exits at once".into()),
                },
            ],
            4_000,
        )
        .await
        .expect("complete");
    assert_eq!(done, vec![Ok(()), Ok(()), Ok(())]);
    assert_eq!(
        l.jobs().job(&a[0].key).await.expect("job"),
        Some(("succeeded".into(), 1))
    );
    assert_eq!(l.jobs().job(&a[1].key).await.expect("job"), Some(("queued".into(), 1)));
    assert_eq!(l.jobs().job(&b[0].key).await.expect("job"), Some(("failed".into(), 1)));
    assert_eq!(
        l.jobs()
            .complete(
                &[Completion {
                    token: a[0].token.clone(),
                    outcome: Outcome::Succeeded
                }],
                4_100
            )
            .await
            .expect("again"),
        vec![Err(Refused::StaleFencingToken)],
        "a completed lease is stale"
    );
    // The retry waits for its backoff.
    assert!(
        l.jobs().lease("n1", 10, 10_000, 4_100).await.expect("lease").is_empty(),
        "not before the backoff"
    );
    let retry = l
        .jobs()
        .lease("n1", 10, 10_000, 4_000 + 2_000 + 1_000)
        .await
        .expect("lease");
    assert_eq!((retry.len(), retry[0].attempt), (1, 2));

    // An expired lease goes back to the queue; its old token is refused; attempts run out.
    let later = 4_000 + 3_000 + 10_000 + 1;
    let again = l
        .jobs()
        .lease("n1", 10, 10_000, later)
        .await
        .expect("lease after expiry");
    assert!(again.iter().any(|x| x.key == retry[0].key && x.attempt == 3));
    assert_eq!(
        l.jobs()
            .complete(
                &[Completion {
                    token: retry[0].token.clone(),
                    outcome: Outcome::Succeeded
                }],
                later
            )
            .await
            .expect("stale"),
        vec![Err(Refused::StaleFencingToken)],
        "the expired lease's token is stale"
    );
    let third = again.iter().find(|x| x.key == retry[0].key).expect("leased again");
    assert_eq!(
        l.jobs()
            .complete(
                &[Completion {
                    token: third.token.clone(),
                    outcome: Outcome::Retryable("again".into())
                }],
                later + 1
            )
            .await
            .expect("complete"),
        vec![Ok(())]
    );
    assert_eq!(
        l.jobs().job(&retry[0].key).await.expect("job"),
        Some(("dead".into(), 3)),
        "attempts exhausted"
    );

    // History is append-only, enforced by the schema.
    for sql in [
        "UPDATE events SET kind = 'x'",
        "DELETE FROM events",
        "UPDATE job_results SET detail = 'x'",
        "DELETE FROM job_results",
    ] {
        assert!(l.execute_raw(sql).await.is_err(), "{sql} must be refused");
    }
    // Events resume from a cursor.
    let all = l.events().events_after(0, 10_000).await.expect("events");
    assert!(all.windows(2).all(|w| w[0].id < w[1].id));
    let tail = l
        .events()
        .events_after(all[all.len() - 3].id, 10)
        .await
        .expect("events");
    assert_eq!(tail, all[all.len() - 2..].to_vec());
    assert!(all.iter().any(|e| e.kind == "job-dead") && all.iter().any(|e| e.kind == "lease-expired"));
}

/// A group's leases (one statement on both ledgers): each request gets its own node's oldest due
/// jobs up to its `max`, a draining node's only removals, each request a lease token of its
/// own, and no job is leased twice.
async fn group_leases(l: &Ledger) {
    let mut jobs: Vec<NewJob> = (0..3).map(|i| job("grp-a", i, "g1", 3)).collect();
    jobs.extend((0..3).map(|i| job("grp-b", i, "g2", 3)));
    jobs.push(job("grp-c", 0, "g3", 3));
    jobs.push(NewJob {
        task: Task::StopApplication {
            environment: name("grp-c"),
            role: name("web"),
            instance: 1,
            generation: 1,
        },
        target_node: "g3".into(),
        max_attempts: 3,
        not_before_ms: 0,
    });
    // A volume's backup goes on on a draining node too (a move is made of one).
    jobs.push(NewJob {
        task: Task::BackupVolume {
            environment: name("grp-c"),
            volume: name("data"),
            generation: 1,
            scheduled: 60,
            on_demand: false,
            moving: false,
        },
        target_node: "g3".into(),
        max_attempts: 3,
        not_before_ms: 0,
    });
    l.jobs().enqueue(&jobs, 1).await.expect("enqueue");
    let asks = [("g1", 2, false), ("g2", 8, false), ("g3", 8, true)];
    let got = l.jobs().lease_many(&asks, 30_000, 2).await.expect("lease");
    assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [2, 3, 2]);
    for (leases, node) in got.iter().zip(["@g1", "@g2", "@g3"]) {
        assert!(leases.iter().all(|x| x.key.ends_with(node)), "{leases:?}");
        let tokens: std::collections::BTreeSet<&str> = leases.iter().map(|x| x.token.lease_token.as_str()).collect();
        assert_eq!(tokens.len(), 1, "one token per request");
    }
    assert!(
        got[0].iter().all(|x| !x.key.contains("/2:")),
        "the oldest first: {:?}",
        got[0]
    );
    assert!(
        got[2]
            .iter()
            .all(|x| x.key.contains(":stop@") || x.key.contains(":save@")),
        "a draining node gets only removals and backups: {:?}",
        got[2]
    );
    assert_ne!(got[0][0].token.lease_token, got[1][0].token.lease_token);
    let again = l.jobs().lease_many(&asks, 30_000, 3).await.expect("lease");
    assert_eq!(
        again.iter().map(Vec::len).collect::<Vec<_>>(),
        [1, 0, 0],
        "no job twice"
    );
    assert!(again[0][0].key.contains("grp-a/web/2:"));
}

/// Many workers lease and complete at once: every job succeeds exactly once, and no job is
/// ever held under two live fencing tokens.
async fn concurrent(l: std::sync::Arc<Ledger>) {
    let jobs: Vec<NewJob> = (0..400).map(|i| job("load", i, "n9", 5)).collect();
    l.jobs().enqueue(&jobs, 1).await.expect("enqueue");
    let mut handles = Vec::new();
    for _ in 0..16 {
        let l = l.clone();
        handles.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let leases = l.jobs().lease("n9", 8, 60_000, 10).await.expect("lease");
                if leases.is_empty() {
                    break;
                }
                let completions: Vec<Completion> = leases
                    .iter()
                    .map(|x| Completion {
                        token: x.token.clone(),
                        outcome: Outcome::Succeeded,
                    })
                    .collect();
                let r = l.jobs().complete(&completions, 11).await.expect("complete");
                assert!(r.iter().all(Result::is_ok), "a live lease completes");
                done.extend(leases.into_iter().map(|x| x.key));
            }
            done
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("worker"));
    }
    all.sort();
    let n = all.len();
    all.dedup();
    assert_eq!((n, all.len()), (400, 400), "each job leased and completed exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_ledger() {
    let dir = tempfile::tempdir().expect("tempdir");
    let l = sqlite(dir.path()).await;
    assert_eq!(l.backend(), Backend::Sqlite);
    suite(&l).await;
    group_leases(&l).await;
    concurrent(std::sync::Arc::new(l)).await;
    // Migrations are idempotent and the data survives a reconnect.
    let l = sqlite(dir.path()).await;
    assert!(l.events().events_after(0, 1).await.expect("events").len() == 1);
    // One daemon: nobody to tell, nothing to hear.
    l.announce(Wake::Jobs).await.expect("a word to nobody");
    assert!(l.wakes().await.expect("listen").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_ledger() {
    let pg = Postgres::start();
    let l = postgres(&pg).await;
    assert_eq!(l.backend(), Backend::Postgres);
    suite(&l).await;
    group_leases(&l).await;
    concurrent(std::sync::Arc::new(l)).await;
    let l = postgres(&pg).await;
    assert!(l.events().events_after(0, 1).await.expect("events").len() == 1);
    l.close().await;
    replica_wakes(&pg).await;
}

/// Two replicas' ledgers on one PostgreSQL: what one announces the other hears, in order, and
/// none hears its own.
async fn replica_wakes(pg: &Postgres) {
    let (a, b) = (postgres(pg).await, postgres(pg).await);
    let mut heard = b.wakes().await.expect("listen").expect("PostgreSQL listens");
    b.announce(Wake::Jobs).await.expect("b's own word");
    a.announce(Wake::Completions).await.expect("a's word");
    a.announce(Wake::Jobs).await.expect("a's word");
    for want in [Wake::Completions, Wake::Jobs] {
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), heard.next())
            .await
            .expect("heard within 10 s")
            .expect("heard");
        assert_eq!(got, want, "b hears a's words in order, not its own");
    }
    a.close().await;
    b.close().await;
}

/// Migration `name`'s text for `url`'s backend, and a pool on `url` to run parts of it again
/// over rows written as before it.
async fn migration(url: &str, name: &str) -> (String, sqlx::AnyPool) {
    let backend = if url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../migrations/{backend}/{name}.sql")),
    )
    .expect("the migration");
    sqlx::any::install_default_drivers();
    (text, sqlx::AnyPool::connect(url).await.expect("connect"))
}

async fn statement(pool: &sqlx::AnyPool, q: String) {
    sqlx::query(sqlx::AssertSqlSafe(q))
        .execute(pool)
        .await
        .expect("statement");
}

/// Migration 0024 fills `deployment_uses` for rows written before it from their stored specs'
/// text (the patterns the queries used then); rows written since set it from
/// `DeploymentSpec::uses` (`state-schema/tests/uses.rs` checks the two agree).
async fn uses_filled_from_stored_specs(url: &str) {
    let (fill, pool) = migration(url, "0024_deployment_uses").await;
    let update = &fill[fill.find("INSERT INTO deployment_uses").expect("the fill")..];
    let run = |q: String| statement(&pool, q);
    // The table as 0024 made it: 0028 dropped the column nothing read.
    run("ALTER TABLE deployment_uses ADD COLUMN canary INTEGER NOT NULL DEFAULT 0".into()).await;
    run(
        "INSERT INTO revisions (sha, branch, verdict, reasons, seen_at) VALUES ('u0', 'uses', 'accepted', '[]', 1)"
            .into(),
    )
    .await;
    let specs = [
        ("u-cron", r#"{"cron":[["nightly","0 3 * * *"]]}"#),
        (
            "u-backups",
            r#"{"roles":{"db":{"volumes":[{"backup":{"schedule":"x"}}]}},"backups":{"repository":"r"}}"#,
        ),
        (
            "u-half",
            r#"{"roles":{"db":{"volumes":[{"backup":{"schedule":"x"}}]}}}"#,
        ),
        ("u-domains", r#"{"domains":[["shop.example.invalid","cname"]]}"#),
        (
            "u-canary",
            r#"{"roles":{"web":{"canary":[{"weight":10}],"canaryGate":{}}}}"#,
        ),
        (
            "u-none",
            r#"{"roles":{"web":{"canaryGate":{}}},"note":"\"cron\":[[ inside a string"}"#,
        ),
    ];
    for (env, spec) in specs {
        run(format!(
            "INSERT INTO deployments (environment, branch, generation, action, status, step, spec_hash, spec, retired, revision_id, updated_at) \
             VALUES ('{env}', 'uses', 1, 'rollout', 'done', 1, 'h', '{}', '[]', (SELECT id FROM revisions WHERE sha = 'u0'), 1)",
            spec.replace('\'', "''")
        ))
        .await;
    }
    run(update.to_owned()).await;
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT environment, backups, cron, domains, canary FROM deployment_uses WHERE environment LIKE 'u-%' ORDER BY environment",
    )
    .fetch_all(&pool)
    .await
    .expect("read back");
    let got: Vec<(&str, [i64; 4])> = rows
        .iter()
        .map(|(e, b, c, d, k)| (e.as_str(), [*b, *c, *d, *k]))
        .collect();
    assert_eq!(
        got,
        [
            ("u-backups", [1, 0, 0, 0]),
            ("u-canary", [0, 0, 0, 1]),
            ("u-cron", [0, 1, 0, 0]),
            ("u-domains", [0, 0, 1, 0]),
            ("u-half", [0, 0, 0, 0]),
            // A string value's quotes are escaped in the stored JSON: no pattern matches it.
            ("u-none", [0, 0, 0, 0]),
        ]
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0024_fills_deployment_uses_on_both_backends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let l = sqlite(dir.path()).await;
    l.close().await;
    uses_filled_from_stored_specs(&format!("sqlite://{}", dir.path().join("ledger.db").display())).await;
    let pg = Postgres::start();
    let l = postgres(&pg).await;
    l.close().await;
    uses_filled_from_stored_specs(&pg.url()).await;
}

/// Migration 0025 turns the sentinels rows written before it hold into typed state: a
/// canary's watch to its switch (`watch_until = i64::MAX / 2`), a window, and a step whose
/// jobs wait for a promote (`not_before = i64::MAX / 4`: the jobs go, the step waits in its
/// row); a timed pause in flight keeps its jobs, due at their time.
async fn sentinels_become_step_states(url: &str) {
    let (text, pool) = migration(url, "0025_step_state").await;
    let from = text
        .find("UPDATE deployments SET watch = CASE")
        .expect("the carry-over");
    let to = text.find("DROP INDEX").expect("the index");
    let run = |q: String| statement(&pool, q);
    run(
        "INSERT INTO revisions (sha, branch, verdict, reasons, seen_at) VALUES ('s0', 'steps', 'accepted', '[]', 1)"
            .into(),
    )
    .await;
    // (environment, status, step, watch_until)
    let deployments = [
        ("s-promote", "in-progress", 5, 4611686018427387903_i64),
        ("s-paused", "in-progress", 4, 4611686018427387903),
        ("s-window", "done", 7, 1_800_000_000_000),
        ("s-none", "done", 7, 0),
    ];
    for (env, status, step, until) in deployments {
        run(format!(
            "INSERT INTO deployments (environment, branch, generation, action, status, step, spec_hash, spec, retired, revision_id, updated_at, watch_until) \
             VALUES ('{env}', 'steps', 2, 'rollout', '{status}', {step}, 'h', '{{}}', '[]', (SELECT id FROM revisions WHERE sha = 's0'), 1, {until})"
        ))
        .await;
    }
    // (key, environment, step, attempts, not_before)
    let jobs = [
        ("k-switch", "s-promote", 5, 0, 2305843009213693951_i64),
        ("k-w60", "s-paused", 4, 0, 1_900_000_000_000),
        ("k-retry", "s-paused", 3, 2, 1_900_000_000_000),
    ];
    for (key, env, step, attempts, due) in jobs {
        run(format!(
            "INSERT INTO jobs (key, task, target_node, state, attempts, max_attempts, not_before, created_at, updated_at, environment, generation, step) \
             VALUES ('{key}', '{{}}', 'n1', 'queued', {attempts}, 5, {due}, 1, 1, '{env}', 2, {step})"
        ))
        .await;
    }
    // A gated publish queued before: its gate goes (the agent no longer takes one).
    let gated = r#"{"task":"publish-ingress","environment":"s-paused","hostname":"a.example.com","generation":2,"weight":60,"gate":{"maxErrorPercent":5,"minRequests":20}}"#;
    run(format!(
        "INSERT INTO jobs (key, task, target_node, state, attempts, max_attempts, not_before, created_at, updated_at, environment, generation, step) \
         VALUES ('k-gated', '{gated}', 'n1', 'queued', 0, 5, 0, 1, 1, 's-paused', 2, 4)"
    ))
    .await;
    let strip = &text[text.find("UPDATE jobs SET task").expect("the gate's strip")..];
    let statements = text[from..to]
        .split(';')
        .chain(std::iter::once(strip.trim_end().trim_end_matches(';')));
    for statement in statements.filter(|s| !s.trim().is_empty()) {
        let statement: String = statement
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        if !statement.trim().is_empty() {
            run(statement).await;
        }
    }
    let got: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT environment, step_state, watch, watch_until FROM deployments WHERE environment LIKE 's-%' ORDER BY environment",
    )
    .fetch_all(&pool)
    .await
    .expect("read back");
    let got: Vec<(&str, &str, &str, i64)> = got
        .iter()
        .map(|(e, s, w, u)| (e.as_str(), s.as_str(), w.as_str(), *u))
        .collect();
    assert_eq!(
        got,
        [
            ("s-none", "running", "", 0),
            ("s-paused", "running", "to-switch", 0),
            ("s-promote", "awaits-promote", "to-switch", 0),
            ("s-window", "running", "window", 1_800_000_000_000),
        ]
    );
    let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM jobs WHERE key LIKE 'k-%' ORDER BY key")
        .fetch_all(&pool)
        .await
        .expect("jobs");
    assert_eq!(
        keys,
        ["k-gated", "k-retry", "k-w60"],
        "the promote's never-due job goes; the others stay"
    );
    let task: String = sqlx::query_scalar("SELECT task FROM jobs WHERE key = 'k-gated'")
        .fetch_one(&pool)
        .await
        .expect("task");
    let task: state_schema::task::Task = serde_json::from_str(&task).expect("reads as today's task");
    assert!(
        matches!(task, state_schema::task::Task::PublishIngress { weight: Some(60), .. }),
        "{task:?}"
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0025_types_the_step_and_watch_sentinels_on_both_backends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let l = sqlite(dir.path()).await;
    l.close().await;
    sentinels_become_step_states(&format!("sqlite://{}", dir.path().join("ledger.db").display())).await;
    let pg = Postgres::start();
    let l = postgres(&pg).await;
    l.close().await;
    sentinels_become_step_states(&pg.url()).await;
}

/// Migration 0027 turns a scale's held job (`not_before = i64::MAX`) into `held = 1`, due
/// when released; other queued jobs, and finished ones, keep what they had.
async fn held_jobs_become_typed(url: &str) {
    let (text, pool) = migration(url, "0027_held_jobs").await;
    let carry = text
        .lines()
        .find(|l| l.starts_with("UPDATE jobs SET held = 1"))
        .expect("the carry-over")
        .trim_end_matches(';')
        .to_owned();
    // (key, state, not_before, updated_at); `held` is 0 as a row written before has it.
    let jobs = [
        ("h-held", "queued", i64::MAX, 1_700_000_000_000_i64),
        ("h-due", "queued", 1_800_000_000_000, 1),
        ("h-done", "succeeded", i64::MAX, 1),
    ];
    for (key, state, due, at) in jobs {
        statement(
            &pool,
            format!(
                "INSERT INTO jobs (key, task, target_node, state, attempts, max_attempts, not_before, created_at, updated_at, environment, generation, step) \
                 VALUES ('{key}', '{{}}', 'n1', '{state}', 0, 5, {due}, 1, {at}, 'h-env', 1, NULL)"
            ),
        )
        .await;
    }
    statement(&pool, carry).await;
    let got: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT key, held, not_before FROM jobs WHERE key LIKE 'h-%' ORDER BY key")
            .fetch_all(&pool)
            .await
            .expect("read back");
    assert_eq!(
        got,
        [
            ("h-done".to_owned(), 0, i64::MAX),
            ("h-due".to_owned(), 0, 1_800_000_000_000),
            ("h-held".to_owned(), 1, 1_700_000_000_000),
        ]
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0027_types_a_held_job_on_both_backends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let l = sqlite(dir.path()).await;
    l.close().await;
    held_jobs_become_typed(&format!("sqlite://{}", dir.path().join("ledger.db").display())).await;
    let pg = Postgres::start();
    let l = postgres(&pg).await;
    l.close().await;
    held_jobs_become_typed(&pg.url()).await;
}

/// Migration 0031 fills `releases_live` from the `deployment-rollout-done` events written
/// before it: the first such event of each generation made, rollbacks left out.
async fn releases_live_filled_from_events(url: &str) {
    let (fill, pool) = migration(url, "0031_releases_live").await;
    let insert = &fill[fill.find("INSERT INTO releases_live").expect("the fill")..];
    let run = |q: String| statement(&pool, q);
    run(
        "INSERT INTO revisions (sha, branch, verdict, reasons, seen_at) VALUES ('r0', 'live', 'accepted', '[]', 1)"
            .into(),
    )
    .await;
    for (generation, made) in [(1, 1_000), (2, 5_000), (3, 9_000)] {
        run(format!(
            "INSERT INTO deployment_generations (environment, generation, branch, action, spec_hash, revision_id, created_at) \
             VALUES ('e-a', {generation}, 'live', 'rollout', 'h', (SELECT id FROM revisions WHERE sha = 'r0'), {made})"
        ))
        .await;
    }
    for (at, detail) in [
        (1_500, "generation 1"),
        (2_000, "generation 1"),
        (7_000, "generation 2, watched for 30 s"),
        (9_500, "generation 3, a rollback"),
        (9_900, "generation 12: no such generation"),
    ] {
        run(format!(
            "INSERT INTO events (at, kind, subject, detail) VALUES ({at}, 'deployment-rollout-done', 'e-a', '{detail}')"
        ))
        .await;
    }
    run("INSERT INTO events (at, kind, subject, detail) VALUES (3000, 'deployment-teardown-done', 'e-a', 'generation 2')".into())
        .await;
    run(insert.to_owned()).await;
    let rows: Vec<(String, i64, i64, i64)> =
        sqlx::query_as("SELECT environment, generation, made_at, live_at FROM releases_live ORDER BY generation")
            .fetch_all(&pool)
            .await
            .expect("read back");
    assert_eq!(
        rows,
        [("e-a".to_owned(), 1, 1_000, 1_500), ("e-a".to_owned(), 2, 5_000, 7_000)]
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0031_fills_releases_live_on_both_backends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let l = sqlite(dir.path()).await;
    l.close().await;
    releases_live_filled_from_events(&format!("sqlite://{}", dir.path().join("ledger.db").display())).await;
    let pg = Postgres::start();
    let l = postgres(&pg).await;
    l.close().await;
    releases_live_filled_from_events(&pg.url()).await;
}

/// What a rebuild writes (`store::fleet::Nodes::readmit`, `learn_recipient`, `adopt_subnets`,
/// `Volumes::adopt_volumes`, `mesh_floor`), on `url`'s backend: each writes only where the
/// ledger holds nothing yet, and a second call changes nothing.
async fn rebuild_writes_only_what_is_missing(url: &str) {
    let l = Ledger::connect(url, 2).await.expect("connect");
    l.migrate().await.expect("migrate");
    let cert = reconciler::store::fleet::Readmitted {
        node: "n1",
        fingerprint: "aa",
        ca: "ca",
        issued_at_ms: 1,
        not_after_ms: 10_000,
    };
    assert!(
        l.nodes().readmit(&cert, 5).await.expect("readmit"),
        "a node the ledger never knew"
    );
    let again = reconciler::store::fleet::Readmitted {
        fingerprint: "bb",
        ..cert
    };
    assert!(
        !l.nodes().readmit(&again, 6).await.expect("readmit"),
        "a known node: nothing written"
    );
    l.nodes().learn_recipient("n1", "age1first", 7).await.expect("learn");
    l.nodes().learn_recipient("n1", "age1second", 8).await.expect("learn");
    let networks = [("b".to_owned(), 0), ("a".to_owned(), 1)];
    l.nodes().adopt_subnets("n1", &networks).await.expect("subnets");
    l.nodes()
        .adopt_subnets("n1", &[("a".to_owned(), 5)])
        .await
        .expect("subnets again");
    let measured = |generation| reconciler::store::volumes::Measured {
        environment: "a".into(),
        volume: "data".into(),
        generation,
        bytes: 1,
    };
    l.volumes()
        .adopt_volumes("n1", &[measured(1), measured(3)], 9)
        .await
        .expect("volumes");
    l.volumes()
        .adopt_volumes("n1", &[measured(4)], 10)
        .await
        .expect("volumes again");
    l.nodes().mesh_floor("n1", 7).await.expect("floor");
    l.nodes().mesh_floor("n1", 9).await.expect("floor again");
    l.close().await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(url).await.expect("connect");
    let strings = async |q: &str| -> Vec<String> {
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(q.to_owned()))
            .fetch_all(&pool)
            .await
            .expect(q)
    };
    assert_eq!(strings("SELECT age_recipient FROM nodes").await, ["age1first"]);
    assert_eq!(strings("SELECT fingerprint FROM node_certificates").await, ["aa"]);
    assert_eq!(
        strings("SELECT kind FROM events ORDER BY id").await,
        ["node-readmitted", "node-recipient-learned"]
    );
    assert_eq!(
        strings("SELECT environment || ' ' || CAST(idx AS TEXT) FROM subnets ORDER BY environment").await,
        ["a 1", "b 0"]
    );
    assert_eq!(
        strings("SELECT environment || ' ' || volume || ' ' || node || ' ' || CAST(generation AS TEXT) FROM volumes")
            .await,
        ["a data n1 3"]
    );
    assert_eq!(
        strings("SELECT CAST(generation AS TEXT) || ' ' || spec FROM node_meshes").await,
        ["7 "]
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_writes_only_what_is_missing_on_both_backends() {
    let dir = tempfile::tempdir().expect("tempdir");
    rebuild_writes_only_what_is_missing(&format!("sqlite://{}", dir.path().join("ledger.db").display())).await;
    let pg = Postgres::start();
    rebuild_writes_only_what_is_missing(&pg.url()).await;
}
