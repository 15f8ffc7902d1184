//! The reconcile pass on both backends, against a real repository made with the `git` CLI:
//! accepted commits become deployments with generations and ordered jobs, a replay writes
//! nothing, a rejected commit leaves the last accepted one in force, rollouts advance step by
//! step as jobs succeed, and a deleted preview branch is torn down in order.

#[path = "support/dump.rs"]
mod dump;
#[path = "support/postgres.rs"]
mod postgres_support;
#[path = "support/repo.rs"]
mod repo_support;

use dump::rows;
use reconciler::config::Config;
use reconciler::reconcile::Reconciler;
use reconciler::store::now_ms;
use reconciler::store::{Completion, Ledger, Outcome};
use repo_support::{Repo, environment, project};
use std::path::Path;
use std::sync::Arc;

pub fn config(dir: &Path, repo: &Path, ledger_url: &str) -> Config {
    let text = format!(
        "[source]\npath = {repo:?}\npreview_branches = [\"feature/*\"]\n\n[trust]\nallowed_signers = \"allowed_signers\"\n\n[ledger]\nurl = {ledger_url:?}\n\n[api]\nlisten = \"127.0.0.1:0\"\ntls_cert = \"api.crt\"\ntls_key = \"api.key\"\n"
    );
    let path = dir.join("reconciler.toml");
    std::fs::write(&path, text).expect("write config");
    Config::load(&path).expect("config loads")
}

async fn count(url: &str, table: &str) -> usize {
    rows(url, &format!("SELECT 1 FROM {table}")).await.len()
}

/// `node`'s heartbeat from an agent of this version (`agent_proto::PROTOCOL`), seen until 2100.
async fn current_agent(ledger: &Ledger, node: &str) {
    let caps = ["docker", "ingress", "nftables", "routes"].map(String::from);
    let beat = reconciler::store::fleet::Beat {
        agent_version: "test",
        protocol: agent_proto::PROTOCOL,
        capabilities: &caps,
        host: None,
        observed: "[]",
        repaired: &[],
        taken_subnets: "",
        mesh: None,
        grace_ms: 0,
    };
    ledger
        .nodes()
        .record_beat(node, &beat, 4_102_444_800_000)
        .await
        .expect("beat");
}

/// Leases every due job of both nodes and completes them all as succeeded.
async fn complete_all(ledger: &Ledger) -> usize {
    let mut n = 0;
    for node in ["n1", "n2"] {
        let leases = ledger.jobs().lease(node, 100, 30_000, now_ms()).await.expect("lease");
        let done: Vec<Completion> = leases
            .iter()
            .map(|l| Completion {
                token: l.token.clone(),
                outcome: Outcome::Succeeded,
            })
            .collect();
        n += done.len();
        assert!(
            ledger
                .jobs()
                .complete(&done, now_ms())
                .await
                .expect("complete")
                .iter()
                .all(|r| r.is_ok())
        );
    }
    n
}

async fn scenario(url: String, dir: &Path) {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 3));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    let c1 = repo.commit("first", true);
    let ledger = Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n1", "n2"]).await;
    // n1's agent is this version's; n2's predates the one set-up task an environment.
    current_agent(&ledger, "n1").await;
    let shared = Arc::new(
        Reconciler::new(
            std::sync::Arc::new(config(dir, &repo.dir, &url)),
            std::sync::Arc::new(ledger),
            std::sync::Arc::default(),
        )
        .expect("shared"),
    );

    let r = shared.pass().await.expect("pass");
    assert_eq!((r.judged, r.accepted), (1, 1));
    assert_eq!(
        r.jobs_queued, 7,
        "one set-up on n1; network, firewall and routes on n2; the three replicas, held"
    );
    assert_eq!(
        rows(&url, "SELECT key, step, held FROM jobs ORDER BY key").await,
        [
            "app:api-production/web/0:g1:ensure@n1|2|1",
            "app:api-production/web/1:g1:ensure@n2|2|1",
            "app:api-production/web/2:g1:ensure@n1|2|1",
            "env:api-production:g1:ensure@n1|0|0",
            "fw:api-production:g1:apply@n2|0|0",
            "net:api-production:g1:ensure@n2|0|0",
            "routes:api-production:g1:ensure@n2|0|0",
        ]
    );
    let deps = rows(
        &url,
        "SELECT environment, generation, action, status, step FROM deployments",
    )
    .await;
    assert_eq!(deps, ["api-production|1|rollout|in-progress|0"]);
    assert_eq!(count(&url, "desired_objects").await, 4);

    // A replay writes nothing at all.
    let before: Vec<usize> = futures(&url).await;
    let r = shared.pass().await.expect("pass");
    assert_eq!((r.judged, r.jobs_queued, r.advanced), (0, 0, 0));
    assert_eq!(
        futures(&url).await,
        before,
        "reprocessing the same commit writes nothing"
    );

    // A node's replicas follow its own set-up, with no pass between and while the other node
    // still sets up: n1's set-up done, its two replicas are due; n2's waits for all three of
    // its older agent's tasks.
    let ledger = &shared.ledger;
    let lease = |node: &'static str| async move {
        let leases = ledger.jobs().lease(node, 100, 30_000, now_ms()).await.expect("lease");
        let keys: Vec<String> = leases.iter().map(|l| l.key.clone()).collect();
        (leases, keys)
    };
    let end = |leases: Vec<reconciler::store::Lease>, outcome: Outcome| async move {
        let done: Vec<Completion> = leases
            .into_iter()
            .map(|l| Completion {
                token: l.token,
                outcome: outcome.clone(),
            })
            .collect();
        let out = ledger.jobs().complete(&done, now_ms()).await.expect("complete");
        assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    };
    let succeed = |leases| end(leases, Outcome::Succeeded);
    let (set_up, keys) = lease("n1").await;
    assert_eq!(keys, ["env:api-production:g1:ensure@n1"], "the replicas are held");
    succeed(set_up).await;
    let (n1_apps, keys) = lease("n1").await;
    assert_eq!(
        keys,
        [
            "app:api-production/web/0:g1:ensure@n1",
            "app:api-production/web/2:g1:ensure@n1"
        ]
    );
    let (mut n2_set_up, keys) = lease("n2").await;
    assert_eq!(keys.len(), 3, "{keys:?}");
    let routes = n2_set_up.remove(keys.iter().position(|k| k.starts_with("routes:")).expect("routes"));
    succeed(n2_set_up).await;
    assert_eq!(
        rows(&url, "SELECT key FROM jobs WHERE held = 1").await,
        ["app:api-production/web/1:g1:ensure@n2"],
        "n2's routes are not made yet"
    );
    succeed(vec![routes]).await;
    assert!(rows(&url, "SELECT key FROM jobs WHERE held = 1").await.is_empty());
    succeed(n1_apps).await;
    assert_eq!(
        rows(&url, "SELECT step FROM deployments").await,
        ["0"],
        "the rollout's step moves on only in a pass"
    );
    shared.pass().await.expect("pass");
    let apps = rows(&url, "SELECT key FROM jobs WHERE state = 'queued' ORDER BY key").await;
    assert_eq!(apps, ["app:api-production/web/1:g1:ensure@n2"]);
    assert_eq!(
        rows(&url, "SELECT step FROM deployments").await,
        ["2"],
        "every set-up done: the replicas' step, one of them still to run"
    );
    assert_eq!(complete_all(&shared.ledger).await, 1);
    shared.pass().await.expect("pass");
    assert_eq!(
        complete_all(&shared.ledger).await,
        2,
        "ingress on both nodes with a web replica"
    );
    shared.pass().await.expect("pass");
    let deps = rows(&url, "SELECT environment, generation, status FROM deployments").await;
    assert_eq!(deps, ["api-production|1|done"]);

    // An unsigned commit is recorded with its reason; the last accepted one stays in force.
    repo.write("projects/api.yaml", &project("api", 1));
    let c2 = repo.commit("unsigned", false);
    let r = shared.pass().await.expect("pass");
    assert_eq!((r.judged, r.rejected, r.jobs_queued), (1, 1, 0));
    assert_eq!(
        shared.ledger.revisions().last_accepted("main").await.expect("last"),
        Some(c1.clone())
    );
    assert_eq!(
        shared.ledger.revisions().revision("main", &c2).await.expect("revision"),
        Some(("rejected".into(), vec!["unsigned".into()]))
    );

    // A signed commit after it scales 3 -> 1: not a release, so no new generation. The delta is
    // queued at generation 1 in order: n1 (which loses a replica) publishes its upstreams
    // again, ingress leaves n2, the two replicas go, n2's network.
    let c3 = repo.commit("signed", true);
    let r = shared.pass().await.expect("pass");
    assert_eq!((r.judged, r.accepted, r.teardowns), (1, 1, 0));
    assert_eq!(
        shared.ledger.revisions().last_accepted("main").await.expect("last"),
        Some(c3)
    );
    let queued = || async {
        rows(&url, "SELECT key FROM jobs WHERE state = 'queued' ORDER BY id")
            .await
            .into_iter()
            .map(|k| k.split('#').next().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        queued().await,
        [
            "ingress:api-production/api.example.com:g1:publish@n1",
            "ingress:api-production/api.example.com:g1:remove@n2",
            "app:api-production/web/1:g1:teardown@n2",
            "app:api-production/web/2:g1:teardown@n1",
            "net:api-production:g1:remove@n2",
        ]
    );
    assert_eq!(
        rows(&url, "SELECT generation, status FROM deployments").await,
        ["1|done"]
    );
    assert_eq!(
        rows(&url, "SELECT detail FROM events WHERE kind = 'deployment-scaled'").await,
        ["generation 1: 0 replicas added, 2 removed"]
    );
    complete_all(&shared.ledger).await;
    // And back to 3: n2 gets its infrastructure first, then the replicas, then ingress on n1
    // (a replica more) and on n2; replica 0 is not touched, nor re-released.
    repo.write("projects/api.yaml", &project("api", 3));
    repo.commit("scale up", true);
    // n2's agent upgraded meanwhile: its set-up is one job now.
    current_agent(&shared.ledger, "n2").await;
    shared.pass().await.expect("pass");
    assert_eq!(
        queued().await,
        [
            "env:api-production:g1:ensure@n2",
            "app:api-production/web/1:g1:ensure@n2",
            "app:api-production/web/2:g1:ensure@n1",
            "ingress:api-production/api.example.com:g1:publish@n1",
            "ingress:api-production/api.example.com:g1:publish@n2",
        ],
        "replicas removed and added again at one generation are queued again"
    );
    complete_all(&shared.ledger).await;

    // A new image is a release: generation 2, whose cleanup stops the old replicas.
    repo.write(
        "projects/api.yaml",
        &project("api", 3).replace("0123456789abcdef0123", "fedcba9876543210fedc"),
    );
    repo.commit("new image", true);
    let r = shared.pass().await.expect("pass");
    assert_eq!(r.accepted, 1);
    for _ in 0..4 {
        complete_all(&shared.ledger).await;
        shared.pass().await.expect("pass");
    }
    let cleanup = rows(
        &url,
        "SELECT key, state FROM jobs WHERE generation = 2 AND step = 4 ORDER BY key",
    )
    .await;
    assert_eq!(
        cleanup,
        [
            "app:api-production/web/0:g2:stop@n1|succeeded",
            "app:api-production/web/1:g2:stop@n2|succeeded",
            "app:api-production/web/2:g2:stop@n1|succeeded",
        ]
    );
    assert_eq!(
        rows(&url, "SELECT generation, status FROM deployments").await,
        ["2|done"]
    );
    // Back to one replica (a scale at generation 2), for the preview below.
    repo.write(
        "projects/api.yaml",
        &project("api", 1).replace("0123456789abcdef0123", "fedcba9876543210fedc"),
    );
    repo.commit("one replica", true);
    shared.pass().await.expect("pass");
    assert_eq!(
        complete_all(&shared.ledger).await,
        5,
        "ingress again on n1 and away from n2, two replicas, a network"
    );
    assert_eq!(rows(&url, "SELECT generation FROM deployments").await, ["2"]);

    // A preview branch gets its own environment; deleting the branch tears it down in order,
    // cancelling what its rollout had not done yet. History stays.
    repo.git(&["checkout", "-q", "-b", "feature/login"]);
    repo.commit("preview", true);
    repo.git(&["checkout", "-q", "main"]);
    let r = shared.pass().await.expect("pass");
    assert_eq!(r.accepted, 1);
    assert_eq!(
        rows(
            &url,
            "SELECT environment, branch, generation, action FROM deployments WHERE branch <> 'main'"
        )
        .await,
        ["feature-login--api|feature/login|1|rollout"]
    );
    repo.git(&["branch", "-q", "-D", "feature/login"]);
    let r = shared.pass().await.expect("pass");
    assert_eq!(r.teardowns, 1);
    assert_eq!(
        rows(
            &url,
            "SELECT environment, generation, action, status, step FROM deployments WHERE branch <> 'main'"
        )
        .await,
        ["feature-login--api|2|teardown|in-progress|0"]
    );
    let cancelled = rows(
        &url,
        "SELECT COUNT(*) FROM jobs WHERE environment = 'feature-login--api' AND state = 'cancelled'",
    )
    .await;
    assert_eq!(
        cancelled,
        ["2"],
        "the preview's queued set-up job on n1, and its replica held with it"
    );
    let order = [
        "ingress:feature-login--api/feature-login--api.preview.example.com:g2:remove@n1",
        "app:feature-login--api/web/0:g2:teardown@n1",
        "net:feature-login--api:g2:remove@n1",
    ];
    for want in order {
        let queued = rows(
            &url,
            "SELECT key FROM jobs WHERE environment = 'feature-login--api' AND state = 'queued'",
        )
        .await;
        assert_eq!(queued, [want], "routes, then containers, then the network");
        complete_all(&shared.ledger).await;
        shared.pass().await.expect("pass");
    }
    assert_eq!(
        rows(&url, "SELECT status FROM deployments WHERE branch <> 'main'").await,
        ["done"]
    );
    assert_eq!(
        count(&url, "deployment_generations").await,
        4,
        "every generation is kept"
    );
    let refused = shared.ledger.execute_raw("DELETE FROM deployment_generations").await;
    assert!(refused.is_err(), "generation history is append-only");

    // Previews live `previews.ttlHours` (24 here) after their last commit: a live one is torn
    // down once that has passed, and a branch whose last commit is older is never rolled out.
    repo.git(&["checkout", "-q", "-b", "feature/ttl"]);
    repo.commit("fresh preview", true);
    repo.git(&["checkout", "-q", "-b", "feature/old", "main"]);
    repo.commit_dated("old preview", "2020-01-01T00:00:00Z");
    repo.git(&["checkout", "-q", "main"]);
    shared.pass().await.expect("pass");
    assert_eq!(
        rows(
            &url,
            "SELECT environment, action FROM deployments WHERE branch IN ('feature/ttl', 'feature/old')"
        )
        .await,
        ["feature-ttl--api|rollout"],
        "the old branch's preview is not rolled out"
    );
    assert_eq!(
        rows(&url, "SELECT subject FROM events WHERE kind = 'preview-expired'").await,
        ["feature/old"]
    );
    assert!(
        shared
            .ledger
            .expire_previews(now_ms() + 23 * 3_600_000)
            .await
            .expect("expire")
            .is_empty()
    );
    let expired = shared
        .ledger
        .expire_previews(now_ms() + 25 * 3_600_000)
        .await
        .expect("expire");
    assert_eq!(expired, ["feature/ttl"]);
    assert_eq!(
        rows(
            &url,
            "SELECT action, generation FROM deployments WHERE branch = 'feature/ttl'"
        )
        .await,
        ["teardown|2"]
    );

    // A set-up that fails for good fails the rollout as before; what was queued ahead of it
    // (each node's replicas) is cancelled, and what a node had leased runs to its end.
    repo.write("projects/jobs.yaml", &project("jobs", 3));
    repo.write("envs/jobs-production.yaml", &environment("jobs-production", "jobs"));
    repo.commit("jobs", true);
    shared.pass().await.expect("pass");
    let ledger = &shared.ledger;
    let (set_up, keys) = lease("n1").await;
    assert_eq!(keys, ["env:jobs-production:g1:ensure@n1"]);
    succeed(set_up).await;
    let one = ledger.jobs().lease("n1", 1, 30_000, now_ms()).await.expect("lease");
    assert_eq!(one.len(), 1, "n1's first replica, due after its set-up");
    let (n2, keys) = lease("n2").await;
    assert_eq!(keys, ["env:jobs-production:g1:ensure@n2"]);
    end(n2, Outcome::Permanent("bridge-missing: no bridge".into())).await;
    shared.pass().await.expect("pass");
    assert_eq!(
        rows(
            &url,
            "SELECT status, step FROM deployments WHERE environment = 'jobs-production'"
        )
        .await,
        ["failed|0"]
    );
    assert_eq!(
        rows(
            &url,
            "SELECT key, state FROM jobs WHERE environment = 'jobs-production' AND step = 2 ORDER BY key"
        )
        .await,
        [
            "app:jobs-production/web/0:g1:ensure@n1|leased",
            "app:jobs-production/web/1:g1:ensure@n2|cancelled",
            "app:jobs-production/web/2:g1:ensure@n1|cancelled",
        ]
    );

    // A rollout an older daemon started queued its set-ups alone: once they succeeded, the
    // replicas' step is queued then, as it was.
    repo.write("projects/older.yaml", &project("older", 1));
    repo.write("envs/older-production.yaml", &environment("older-production", "older"));
    repo.commit("older", true);
    shared.pass().await.expect("pass");
    let older = "SELECT key, state FROM jobs WHERE environment = 'older-production' AND step = 2";
    assert_eq!(rows(&url, older).await.len(), 1, "queued ahead, held");
    shared
        .ledger
        .execute_raw("DELETE FROM jobs WHERE environment = 'older-production' AND step = 2")
        .await
        .expect("as an older daemon wrote it");
    complete_all(&shared.ledger).await;
    shared.pass().await.expect("pass");
    let queued = rows(&url, older).await;
    assert_eq!(queued.len(), 1, "{queued:?}");
    assert!(
        queued[0].starts_with("app:older-production/web/0:g1:ensure@") && queued[0].ends_with("|queued"),
        "{queued:?}"
    );
    shared.ledger.close().await;
}

/// Row counts of every table a pass writes.
async fn futures(url: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for t in [
        "revisions",
        "jobs",
        "events",
        "deployments",
        "deployment_generations",
        "desired_objects",
    ] {
        out.push(count(url, t).await);
    }
    out
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
