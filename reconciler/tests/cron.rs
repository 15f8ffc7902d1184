//! Cron roles on both backends, with the clock passed in: a live deployment's cron role is
//! placed on a node; its first sight counts from then; a time that comes queues one
//! `run-cron` job on that node (ten missed times queue one run, for the newest); a tick again
//! queues nothing; a time that comes while the run still goes is skipped with an event; once
//! the run ended the next time runs again.

#[path = "support/dump.rs"]
mod dump;
#[path = "support/postgres.rs"]
mod postgres_support;
#[path = "support/repo.rs"]
mod repo_support;

use dump::rows;
use reconciler::reconcile::Reconciler;
use reconciler::store::now_ms;
use reconciler::store::{Completion, Ledger, Outcome};
use repo_support::{DIGEST, Repo, environment};
use std::path::Path;
use std::sync::Arc;

fn config(dir: &Path, repo: &Path, ledger_url: &str) -> reconciler::config::Config {
    let text = format!(
        "[source]\npath = {repo:?}\n\n[trust]\nallowed_signers = \"allowed_signers\"\n\n[ledger]\nurl = {ledger_url:?}\n\n[api]\nlisten = \"127.0.0.1:0\"\ntls_cert = \"api.crt\"\ntls_key = \"api.key\"\n"
    );
    let path = dir.join("reconciler.toml");
    std::fs::write(&path, text).expect("write config");
    reconciler::config::Config::load(&path).expect("config loads")
}

/// Leases every due job of both nodes and completes them as succeeded.
async fn complete_all(ledger: &Ledger, now: i64) {
    for node in ["n1", "n2"] {
        let leases = ledger.jobs().lease(node, 100, 30_000, now).await.expect("lease");
        let done: Vec<Completion> = leases
            .iter()
            .map(|l| Completion {
                token: l.token.clone(),
                outcome: Outcome::Succeeded,
            })
            .collect();
        assert!(
            ledger
                .jobs()
                .complete(&done, now)
                .await
                .expect("complete")
                .iter()
                .all(|r| r.is_ok())
        );
    }
}

async fn scenario(url: String, dir: &Path) {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write(
        "projects/api.yaml",
        &format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@{DIGEST}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}, replicas: 1}}\n    sweep: {{kind: cron, schedule: \"*/5 * * * *\", command: [/app/sweep]}}\n"
        ),
    );
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("first", true);
    let ledger = Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n1", "n2"]).await;
    let shared = Arc::new(
        Reconciler::new(
            std::sync::Arc::new(config(dir, &repo.dir, &url)),
            std::sync::Arc::new(ledger),
            std::sync::Arc::default(),
        )
        .expect("shared"),
    );
    let ledger = &shared.ledger;

    // Nothing is due while the deployment rolls out.
    shared.pass().await.expect("pass");
    let t0 = now_ms();
    assert_eq!(
        ledger.cron_tick(t0 + 3_600_000).await.expect("tick"),
        Default::default()
    );
    for _ in 0..4 {
        complete_all(ledger, now_ms()).await;
        shared.pass().await.expect("pass");
    }
    let spec = rows(&url, "SELECT status, spec FROM deployments").await;
    assert!(spec[0].starts_with("done|"), "{spec:?}");
    assert!(
        spec[0].contains("\"cron\":[[\"sweep\",\"n1\"]]"),
        "the run's node: {spec:?}"
    );

    // The pass that saw it done counted the schedule from then: nothing ran for earlier times.
    let first: Vec<String> = rows(&url, "SELECT last_scheduled FROM cron_schedules").await;
    assert_eq!(first.len(), 1);
    let start: i64 = first[0].parse().expect("seconds");
    assert_eq!(start % 60, 0);
    assert!(
        rows(&url, "SELECT key FROM jobs WHERE key LIKE 'cron:%'")
            .await
            .is_empty()
    );

    // An hour later (twelve times missed while nobody looked): one run, for the newest time.
    let later = (start + 3_600) * 1000 + 30_000;
    let tick = ledger.cron_tick(later).await.expect("tick");
    let newest = start + 3_600 - (start + 3_600) % 300;
    assert_eq!(
        tick.queued,
        vec![(format!("cron:api-production/sweep:t{newest}:run@n1"), newest)]
    );
    assert!(tick.skipped.is_empty());
    assert_eq!(
        ledger.cron_tick(later).await.expect("again"),
        Default::default(),
        "a tick again queues nothing"
    );
    let task = rows(&url, "SELECT task FROM jobs WHERE key LIKE 'cron:%'").await;
    assert_eq!(task.len(), 1);
    assert!(
        task[0].contains("\"task\":\"run-cron\"") && task[0].contains(&format!("\"scheduled\":{newest}")),
        "{task:?}"
    );

    // The next time comes while that run still goes (queued): skipped, with an event.
    let next = (newest + 300) * 1000 + 1_000;
    let tick = ledger.cron_tick(next).await.expect("tick");
    assert!(tick.queued.is_empty());
    assert_eq!(tick.skipped, vec![("api-production/sweep".to_owned(), newest + 300)]);
    let skipped = rows(&url, "SELECT subject, detail FROM events WHERE kind = 'cron-skipped'").await;
    assert_eq!(skipped.len(), 1);
    assert!(
        skipped[0].starts_with("api-production/sweep|") && skipped[0].contains("still goes"),
        "{skipped:?}"
    );
    assert_eq!(rows(&url, "SELECT 1 FROM jobs WHERE key LIKE 'cron:%'").await.len(), 1);

    // The agent leases it with what it runs: the role's hardened container, as a run once.
    let leases = ledger.jobs().lease("n1", 10, 30_000, next).await.expect("lease");
    assert_eq!(leases.len(), 1);
    let execution = ledger
        .executions("n1", &leases, (&[], false, &Default::default()), next)
        .await
        .expect("executions");
    let Ok(agent_proto::Execution::Application(app)) = &execution[0] else {
        panic!("a cron run is delivered as an application: {execution:?}");
    };
    assert_eq!(
        (app.role.as_str(), app.command.as_slice()),
        ("sweep", ["/app/sweep".to_owned()].as_slice())
    );
    assert_eq!(app.instance, None, "a run, not a replica");
    assert!(app.image.ends_with(DIGEST));
    // The run ends; the time after runs again.
    let done: Vec<Completion> = leases
        .iter()
        .map(|l| Completion {
            token: l.token.clone(),
            outcome: Outcome::Succeeded,
        })
        .collect();
    assert!(
        ledger
            .jobs()
            .complete(&done, next)
            .await
            .expect("complete")
            .iter()
            .all(|r| r.is_ok())
    );
    let tick = ledger.cron_tick((newest + 600) * 1000 + 1_000).await.expect("tick");
    assert_eq!(tick.queued.len(), 1);
    assert!(tick.queued[0].0.contains(&format!(":t{}:", newest + 600)));
    let queued = rows(
        &url,
        "SELECT subject, detail FROM events WHERE kind = 'cron-queued' ORDER BY id",
    )
    .await;
    assert_eq!(queued.len(), 2, "{queued:?}");
    assert!(queued[0].ends_with(" on n1"), "{queued:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    scenario(url, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let pg = postgres_support::Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    scenario(pg.url(), dir.path()).await;
}
