//! Rolling rollouts on both backends, against a real repository: a first release starts whole;
//! the next replaces its replicas one batch at a time (each new replica leased, and so healthy,
//! before the routes take it and its old one stops), the routes between batches list the new
//! replicas that joined and the old ones not replaced yet, and a batch that fails rolls the
//! environment back to the previous release, held by `rolling`.

#[path = "support/converge.rs"]
mod converge_support;
#[path = "support/dump.rs"]
mod dump;
#[path = "support/fleet.rs"]
#[allow(dead_code)] // (its settling helpers are other tests')
mod fleet_support;
#[path = "support/postgres.rs"]
mod postgres_support;
#[path = "support/repo.rs"]
mod repo_support;

use agent_proto::Execution;
use converge_support::converge;
use dump::rows;
use reconciler::reconcile::Reconciler;
use reconciler::store::{Completion, Outcome, now_ms};
use repo_support::{Repo, environment};
use std::path::Path;
use std::sync::Arc;

const ENV: &str = "api-production";

/// A project whose image is `digest` (the release), 3 web replicas rolling one at a time.
fn project(digest: char) -> String {
    let d: String = std::iter::repeat_n(digest, 64).collect();
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@sha256:{d}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}, replicas: 3, rollout: {{strategy: rolling, maxSurge: 1}}}}\n"
    )
}

/// What a key says of a replica or route, short: `web/0 ensure`, `publish/b0`, `publish`.
fn short(key: &str) -> Option<String> {
    let key = key.split('@').next().unwrap_or(key);
    if let Some(rest) = key.strip_prefix(&format!("app:{ENV}/")) {
        let mut parts = rest.split(':');
        let (replica, _, what) = (parts.next()?, parts.next()?, parts.next()?);
        return Some(format!("{replica} {what}"));
    }
    key.strip_prefix("ingress:")
        .and_then(|k| k.rsplit(':').next())
        .map(str::to_owned)
}

/// Runs passes until nothing is queued, succeeding every job but those `fail` picks; returns
/// the rounds' replica and route jobs, and each rolled publish's upstreams (`web_0_g2` new,
/// `web/1 old`).
async fn rounds(
    shared: &Arc<Reconciler>,
    fail: impl Fn(&str) -> bool,
) -> (Vec<Vec<String>>, Vec<(String, Vec<String>)>) {
    let (mut seen, mut routes) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        shared.pass().await.expect("pass");
        let leases = shared
            .ledger
            .jobs()
            .lease("n1", 100, 30_000, now_ms())
            .await
            .expect("lease");
        if leases.is_empty() {
            break;
        }
        let executions = shared
            .ledger
            .executions("n1", &leases, (&[], false, &Default::default()), now_ms())
            .await
            .expect("executions");
        for (l, e) in leases.iter().zip(&executions) {
            if let (true, Ok(Execution::Ingress(spec))) = (l.key.contains("publish/b"), e) {
                let ups = spec
                    .upstreams
                    .iter()
                    .map(|u| match &u.older {
                        Some(o) => format!("{}/{} old", o.role, o.instance),
                        None => u
                            .container
                            .rsplit_once(&format!("{ENV}_"))
                            .map_or(u.container.clone(), |(_, r)| r.to_owned()),
                    })
                    .collect();
                routes.push((short(&l.key).unwrap_or_default(), ups));
            }
        }
        let mut round: Vec<String> = leases.iter().filter_map(|l| short(&l.key)).collect();
        round.sort();
        if !round.is_empty() {
            seen.push(round);
        }
        let done: Vec<Completion> = leases
            .iter()
            .map(|l| Completion {
                token: l.token.clone(),
                outcome: match fail(&l.key) {
                    true => Outcome::Permanent("unhealthy: the health check answered 503".into()),
                    false => Outcome::Succeeded,
                },
            })
            .collect();
        shared.ledger.jobs().complete(&done, now_ms()).await.expect("complete");
    }
    (seen, routes)
}

async fn scenario(url: String, dir: &Path) {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project('a'));
    repo.write("envs/api-production.yaml", &environment(ENV, "api"));
    repo.commit("release a", true);
    let ledger = reconciler::store::Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n1"]).await;
    let shared = Arc::new(
        Reconciler::new(
            Arc::new(fleet_support::config(dir, &repo.dir, &url)),
            Arc::new(ledger),
            Arc::default(),
        )
        .expect("shared"),
    );
    let deployment = || {
        let url = url.clone();
        async move {
            rows(&url, "SELECT generation, status, previous_generation FROM deployments")
                .await
                .join(";")
        }
    };

    // The first release has nothing to replace: every replica at once.
    let (first, routes) = rounds(&shared, |_| false).await;
    assert_eq!(deployment().await, "1|done|0");
    assert!(routes.is_empty(), "{routes:?}");
    assert!(
        first
            .iter()
            .any(|r| r == &["web/0 ensure", "web/1 ensure", "web/2 ensure"]),
        "{first:?}"
    );

    // The second: one replica at a time, each healthy before the routes take it and its old
    // one stops beside the next one's start.
    repo.write("projects/api.yaml", &project('b'));
    repo.commit("release b", true);
    let (second, routes) = rounds(&shared, |_| false).await;
    assert_eq!(deployment().await, "2|done|1");
    let tail: Vec<Vec<String>> = second
        .iter()
        .skip_while(|r| !r.iter().any(|k| k.ends_with("ensure")))
        .cloned()
        .collect();
    let expect: Vec<Vec<&str>> = vec![
        vec!["web/0 ensure"],
        vec!["publish/b0"],
        vec!["web/0 stop", "web/1 ensure"],
        vec!["publish/b1"],
        vec!["web/1 stop", "web/2 ensure"],
        vec!["publish"],
        vec!["web/2 stop"],
    ];
    assert_eq!(tail, expect, "{second:?}");
    assert_eq!(
        routes,
        [
            (
                "publish/b0".to_owned(),
                vec!["web_0_g2".to_owned(), "web/1 old".into(), "web/2 old".into()]
            ),
            (
                "publish/b1".to_owned(),
                vec!["web_0_g2".to_owned(), "web_1_g2".into(), "web/2 old".into()]
            ),
        ],
        "new replicas that joined, old ones not replaced yet"
    );
    let done = rows(
        &url,
        "SELECT detail FROM events WHERE kind = 'deployment-rollout-done' ORDER BY id",
    )
    .await;
    assert!(done[1].contains("rolled in 3 batch(es)"), "{done:?}");
    // The same rollout again (a replayed pass) writes no second job.
    let jobs = rows(&url, "SELECT COUNT(*) FROM jobs").await;
    converge(&shared).await;
    assert_eq!(rows(&url, "SELECT COUNT(*) FROM jobs").await, jobs);

    // The third: its second replica fails its health check after the first joined the routes
    // and its old one stopped: the deployment fails and the pass takes release b back, held.
    repo.write("projects/api.yaml", &project('c'));
    repo.commit("release c", true);
    let (_, _) = rounds(&shared, |k| k.contains("/web/1:g3:ensure")).await;
    let failed = rows(&url, "SELECT detail FROM events WHERE kind = 'deployment-failed'").await;
    assert!(failed.iter().any(|f| f.starts_with("generation 3, step")), "{failed:?}");
    converge(&shared).await;
    assert_eq!(deployment().await, "4|done|2");
    let auto = rows(&url, "SELECT detail FROM events WHERE kind = 'rollback-automatic'").await;
    assert!(
        auto.len() == 1
            && auto[0].contains("generation 3 failed its rolling rollout: step")
            && auto[0].contains("(between its rolling batches): unhealthy: the health check answered 503")
            && auto[0].contains("back to generation 2's release"),
        "{auto:?}"
    );
    assert!(rows(&url, "SELECT hold FROM deployments").await[0].contains("\"by\":\"rolling\""));
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
