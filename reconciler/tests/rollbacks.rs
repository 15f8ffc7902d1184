//! Rollbacks on both backends, against a real repository: `pl rollback`'s ask is refused
//! without a previous release; once two releases have rolled out it starts the next generation
//! with the previous release's spec and no release step, holds the environment there through
//! a commit that leaves it alone, and the hold ends when a commit changes it or an operator
//! releases it (the environment goes back to what Git says without a new commit).

#[path = "support/converge.rs"]
mod converge_support;
#[path = "support/dump.rs"]
mod dump;
#[path = "support/postgres.rs"]
mod postgres_support;
#[path = "support/repo.rs"]
mod repo_support;

use converge_support::converge;
use dump::rows;
use reconciler::reconcile::Reconciler;
use reconciler::store::rollbacks::Refusal;
use reconciler::store::{Ledger, now_ms};
use repo_support::{Repo, environment};
use state_schema::generations::RollbackRefusal;
use std::path::Path;
use std::sync::Arc;

/// A project whose image is `digest` (the release), with a release role.
fn project(digest: char, replicas: u32) -> String {
    watched(digest, replicas, "")
}

/// n1's heartbeat: web/0 and web/1 of `env` at `generation`, web/0 `healthy` or not.
async fn heartbeat(ledger: &Ledger, env: &str, generation: u64, healthy: bool) {
    let observed = serde_json::json!([
        {"environment": env, "role": "web", "instance": 0, "generation": generation, "healthy": healthy},
        {"environment": env, "role": "web", "instance": 1, "generation": generation, "healthy": true},
    ])
    .to_string();
    let caps = [
        "docker".to_owned(),
        "ingress".to_owned(),
        "nftables".to_owned(),
        "routes".to_owned(),
    ];
    let beat = reconciler::store::fleet::Beat {
        agent_version: "test",
        capabilities: &caps,
        host: None,
        observed: &observed,
        repaired: &[],
        taken_subnets: "",
        mesh: None,
    };
    ledger.heartbeat("n1", &beat, now_ms()).await.expect("heartbeat");
}

/// The same, its web role with `extra` fields (`, rollout: {...}`).
fn watched(digest: char, replicas: u32, extra: &str) -> String {
    let d: String = std::iter::repeat_n(digest, 64).collect();
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@sha256:{d}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}, replicas: {replicas}{extra}}}\n    migrate: {{kind: release, command: [/app/migrate]}}\n"
    )
}

/// Runs passes, leasing and succeeding every job, until nothing more is queued.
async fn deployment(url: &str) -> String {
    rows(url, "SELECT generation, status, previous_generation FROM deployments")
        .await
        .join(";")
}

async fn images(url: &str, generation: u64) -> Vec<String> {
    rows(
        url,
        &format!("SELECT key FROM jobs WHERE generation = {generation} AND (key LIKE 'app:%' OR key LIKE 'once:%') ORDER BY key"),
    )
    .await
}

async fn events(url: &str, kind: &str) -> Vec<String> {
    rows(
        url,
        &format!("SELECT subject, detail FROM events WHERE kind = '{kind}' ORDER BY id"),
    )
    .await
}

async fn scenario(url: String, dir: &Path) {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project('a', 2));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("release a", true);
    let ledger = Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n1"]).await;
    let shared = Arc::new(
        Reconciler::new(
            Arc::new(crate_config(dir, &repo.dir, &url)),
            Arc::new(ledger),
            Arc::default(),
        )
        .expect("shared"),
    );
    let env = "api-production";
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "1|done|0");
    // One release only: nothing to go back to; nothing written.
    let before = rows(&url, "SELECT id FROM events").await.len();
    let r = shared.ledger.ask_rollback(env, "ops", now_ms()).await.expect("ask");
    assert_eq!(r, Err(Refusal::Rollback(RollbackRefusal::NoPrevious)));
    assert_eq!(r.as_ref().map_err(Refusal::code).err(), Some("no-previous-release"));
    assert_eq!(
        rows(&url, "SELECT id FROM events").await.len(),
        before,
        "a refusal writes nothing"
    );
    assert_eq!(
        shared.ledger.ask_rollback("nope", "ops", now_ms()).await.expect("ask"),
        Err(Refusal::UnknownEnvironment)
    );
    assert_eq!(
        shared
            .ledger
            .release_rollback(env, "ops", now_ms())
            .await
            .expect("release"),
        Err(Refusal::NotHeld)
    );

    // A second release rolls out; the first becomes the previous one.
    repo.write("projects/api.yaml", &project('b', 2));
    repo.commit("release b", true);
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "2|done|1");
    assert!(
        images(&url, 2).await.iter().any(|k| k.starts_with("once:")),
        "a release runs its release role"
    );

    // The rollback: generation 3 with generation 1's spec, no release step, held.
    let ask = shared
        .ledger
        .ask_rollback(env, "ops", now_ms())
        .await
        .expect("ask")
        .expect("asked");
    assert_eq!((ask.from, ask.to, ask.generation), (2, 1, 3));
    assert_eq!(
        shared.ledger.ask_rollback(env, "ops", now_ms()).await.expect("ask"),
        Err(Refusal::Rollback(RollbackRefusal::AlreadyHeld))
    );
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "3|done|2");
    let spec_hash = |g: u64| {
        let url = url.clone();
        async move {
            rows(
                &url,
                &format!("SELECT spec_hash FROM deployment_generations WHERE generation = {g}"),
            )
            .await
        }
    };
    assert_eq!(spec_hash(3).await, spec_hash(1).await, "generation 1's spec again");
    let keys = images(&url, 3).await;
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k.starts_with("app:")),
        "no release step: {keys:?}"
    );
    let held = rows(&url, "SELECT hold FROM deployments").await.join("");
    assert!(
        held.contains("\"by\":\"ops\"") && held.contains("\"generation\":3"),
        "{held}"
    );
    assert_eq!(events(&url, "deployment-rollback").await.len(), 1);

    // A commit that leaves the environment alone keeps the hold (nothing rolls forward).
    repo.write("README.md", "unrelated\n");
    repo.commit("docs", true);
    converge(&shared).await;
    assert_eq!(
        deployment(&url).await,
        "3|done|2",
        "held through a commit that does not change it"
    );

    // An operator's release: planned from Git again, without a new commit.
    let hold = shared
        .ledger
        .release_rollback(env, "ops", now_ms())
        .await
        .expect("release")
        .expect("held");
    assert!(hold.released);
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "4|done|3");
    assert_eq!(spec_hash(4).await, spec_hash(2).await, "Git's release b again");
    assert_eq!(rows(&url, "SELECT hold FROM deployments").await, [""]);
    assert_eq!(events(&url, "rollback-hold-ended").await.len(), 1);

    // Held again (back to generation 3's release a), then a commit changing the environment
    // ends the hold and decides as usual.
    shared
        .ledger
        .ask_rollback(env, "ops", now_ms())
        .await
        .expect("ask")
        .expect("asked");
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "5|done|4");
    repo.write("projects/api.yaml", &project('c', 2));
    repo.commit("release c", true);
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "6|done|5");
    assert_eq!(rows(&url, "SELECT hold FROM deployments").await, [""]);
    let ended = events(&url, "rollback-hold-ended").await;
    assert!(
        ended
            .last()
            .is_some_and(|e| e.contains("an accepted commit changes it")),
        "{ended:?}"
    );

    // A watched release: healthy through its window, the watch passes and later reports
    // change nothing.
    let watch = ", rollout: {watchSeconds: 60}";
    repo.write("projects/api.yaml", &watched('d', 2, watch));
    repo.commit("release d, watched", true);
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "7|done|6");
    assert!(
        events(&url, "deployment-rollout-done")
            .await
            .last()
            .is_some_and(|e| e.contains("watched for 60 s"))
    );
    heartbeat(&shared.ledger, env, 7, true).await;
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "7|done|6");
    assert_eq!(shared.ledger.watch_tick(now_ms() + 61_000).await.expect("tick"), 0);
    assert_eq!(events(&url, "watch-passed").await.len(), 1);
    heartbeat(&shared.ledger, env, 7, false).await;
    converge(&shared).await;
    assert_eq!(
        deployment(&url).await,
        "7|done|6",
        "after its window a release is not watched"
    );

    // A watched release one of whose replicas its node reports unhealthy: rolled back at once,
    // held by `watch`, the event saying which replica and what was seen.
    repo.write("projects/api.yaml", &watched('e', 2, watch));
    repo.commit("release e, watched", true);
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "8|done|7");
    heartbeat(&shared.ledger, env, 8, false).await;
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "9|done|8");
    assert_eq!(spec_hash(9).await, spec_hash(7).await, "release d again");
    let auto = events(&url, "rollback-automatic").await;
    assert!(
        auto.len() == 1
            && auto[0].contains("web/0 on n1: not healthy at generation 8")
            && auto[0].contains("as generation 9"),
        "{auto:?}"
    );
    let held = rows(&url, "SELECT hold FROM deployments").await.join("");
    assert!(held.contains("\"by\":\"watch\""), "{held}");
    assert_eq!(
        rows(&url, "SELECT watch_until FROM deployments").await,
        ["0"],
        "a rollback's generation is not watched"
    );

    // Released when the commit in force is no longer trusted (its signer gone from the
    // allowed signers): nothing is planned, the hold ends once with why, and the passes after
    // do not judge it again.
    shared
        .ledger
        .release_rollback(env, "ops", now_ms())
        .await
        .expect("release")
        .expect("held");
    let stranger = repo_support::new_key(&dir.join("stranger"));
    std::fs::write(dir.join("allowed_signers"), format!("someone-else {stranger}")).expect("signers");
    let distrusting = Arc::new(
        Reconciler::new(
            Arc::new(crate_config(dir, &repo.dir, &url)),
            Arc::clone(&shared.ledger),
            Arc::default(),
        )
        .expect("reconciler"),
    );
    distrusting.pass().await.expect("pass");
    distrusting.pass().await.expect("pass");
    assert_eq!(
        deployment(&url).await,
        "9|done|8",
        "nothing planned from an untrusted commit"
    );
    assert_eq!(rows(&url, "SELECT hold FROM deployments").await, [""]);
    let ended = events(&url, "rollback-hold-ended").await;
    assert_eq!(
        ended
            .iter()
            .filter(|e| e.contains("not accepted when judged again"))
            .count(),
        1,
        "{ended:?}"
    );
}

fn crate_config(dir: &Path, repo: &Path, url: &str) -> reconciler::config::Config {
    let text = format!(
        "[source]\npath = {repo:?}\n\n[trust]\nallowed_signers = \"allowed_signers\"\n\n[ledger]\nurl = {url:?}\n\n[api]\nlisten = \"127.0.0.1:0\"\ntls_cert = \"api.crt\"\ntls_key = \"api.key\"\n"
    );
    let path = dir.join("reconciler.toml");
    std::fs::write(&path, text).expect("write config");
    reconciler::config::Config::load(&path).expect("config loads")
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
