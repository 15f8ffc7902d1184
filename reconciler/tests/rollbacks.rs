//! Rollbacks on both backends, against a real repository: `pl rollback`'s ask is refused
//! without a previous release; once two releases have rolled out it starts the next generation
//! with the previous release's spec and no release step, holds the environment there through
//! a commit that leaves it alone, and the hold ends when a commit changes it or an operator
//! releases it (the environment goes back to what Git says without a new commit).
//!
//! Canaries on both backends: a first release is published whole; the next goes through its
//! weighted publishes, each waiting out the pause before it (timed, or until a promote), is
//! watched from its first share, and switches; an abort mid-canary and a replica reported
//! unhealthy mid-canary take the previous release back, held; a failed step of the canary
//! does too. A repaired replica's routes are published again, once, by the pass.

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
        protocol: agent_proto::PROTOCOL,
        capabilities: &caps,
        host: None,
        observed: &observed,
        repaired: &[],
        taken_subnets: "",
        mesh: None,
        grace_ms: 0,
    };
    let hub = reconciler::hub::Hub::default();
    let lost_after = state_schema::placement::LOST_AFTER_MS;
    let hb = reconciler::ops::agents::Heartbeat {
        beat,
        volumes: &[],
        mesh: None,
        age_recipient: None,
        networks: &[],
    };
    reconciler::ops::agents::heartbeat(ledger, &hub, (lost_after, (50, 0)), "n1", &hb, now_ms())
        .await
        .expect("heartbeat");
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

/// A repository whose first commit ("release a") holds `project` and the environment `env`
/// (`envs/api-production.yaml`), a migrated ledger at `url` with node n1 up, and a reconciler
/// over both.
async fn release_a(url: &str, dir: &Path, project: &str, env: &str) -> (Repo, Arc<Reconciler>) {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", project);
    repo.write("envs/api-production.yaml", env);
    repo.commit("release a", true);
    let ledger = Ledger::connect(url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(url, &["n1"]).await;
    let shared = Arc::new(
        Reconciler::new(
            Arc::new(fleet_support::config(dir, &repo.dir, url)),
            Arc::new(ledger),
            Arc::default(),
        )
        .expect("shared"),
    );
    (repo, shared)
}

async fn scenario(url: String, dir: &Path) {
    let (repo, shared) = release_a(&url, dir, &project('a', 2), &environment("api-production", "api")).await;
    let env = "api-production";
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "1|done|0");
    // One release only: nothing to go back to; nothing written.
    let before = rows(&url, "SELECT id FROM events").await.len();
    let r = shared
        .ledger
        .deployments()
        .ask_rollback(env, None, "ops", now_ms(), state_schema::generations::rollback)
        .await
        .expect("ask");
    assert_eq!(r, Err(Refusal::Rollback(RollbackRefusal::NoPrevious)));
    assert_eq!(r.as_ref().map_err(Refusal::code).err(), Some("no-previous-release"));
    assert_eq!(
        rows(&url, "SELECT id FROM events").await.len(),
        before,
        "a refusal writes nothing"
    );
    assert_eq!(
        shared
            .ledger
            .deployments()
            .ask_rollback("nope", None, "ops", now_ms(), state_schema::generations::rollback)
            .await
            .expect("ask"),
        Err(Refusal::UnknownEnvironment)
    );
    assert_eq!(
        shared
            .ledger
            .deployments()
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
        .deployments()
        .ask_rollback(env, None, "ops", now_ms(), state_schema::generations::rollback)
        .await
        .expect("ask")
        .expect("asked");
    assert_eq!((ask.from, ask.to, ask.generation), (2, 1, 3));
    assert_eq!(
        shared
            .ledger
            .deployments()
            .ask_rollback(env, None, "ops", now_ms(), state_schema::generations::rollback)
            .await
            .expect("ask"),
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
        .deployments()
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
        .deployments()
        .ask_rollback(env, None, "ops", now_ms(), state_schema::generations::rollback)
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
        .deployments()
        .release_rollback(env, "ops", now_ms())
        .await
        .expect("release")
        .expect("held");
    let stranger = repo_support::new_key(&dir.join("stranger"));
    std::fs::write(dir.join("allowed_signers"), format!("someone-else {stranger}")).expect("signers");
    let distrusting = Arc::new(
        Reconciler::new(
            Arc::new(fleet_support::config(dir, &repo.dir, &url)),
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

    // Each release's commit-to-live is kept for the fleet's picture; a rollback is no release.
    let live = rows(
        &url,
        "SELECT generation FROM releases_live WHERE made_at <= live_at ORDER BY generation",
    )
    .await;
    assert!(
        live.iter().any(|g| g == "1") && live.iter().any(|g| g == "2"),
        "{live:?}"
    );
    assert!(
        !live.iter().any(|g| g == "3" || g == "9"),
        "rollbacks are not releases: {live:?}"
    );
    let read = shared
        .ledger
        .deployments()
        .live_times_since(0, 100)
        .await
        .expect("read");
    assert_eq!(read.len(), live.len());
    assert!(read.windows(2).all(|w| w[0].0 >= w[1].0), "newest first");
    let slowest = shared.ledger.deployments().slowest_since(0, 100).await.expect("read");
    assert_eq!(slowest.len(), live.len());
    assert!(
        slowest
            .windows(2)
            .all(|w| w[0].live_at - w[0].made_at >= w[1].live_at - w[1].made_at),
        "slowest first"
    );
}

/// Leases what n1 can, completing each job with `outcome` (a canary's publish failing, say).
async fn complete_all(shared: &Arc<Reconciler>, outcome: reconciler::store::Outcome) -> usize {
    shared.pass().await.expect("pass");
    let leases = shared
        .ledger
        .jobs()
        .lease("n1", 100, 30_000, now_ms())
        .await
        .expect("lease");
    let done: Vec<reconciler::store::Completion> = leases
        .iter()
        .map(|l| reconciler::store::Completion {
            token: l.token.clone(),
            outcome: outcome.clone(),
        })
        .collect();
    shared.ledger.jobs().complete(&done, now_ms()).await.expect("complete");
    leases.len()
}

/// Passes, leases and completions until the deployment's row (`generation|status|previous`)
/// says `done`, within 12 rounds 250 ms apart: every job succeeds, a canary's measure with 40
/// requests of which `errors` failed (p95 12 ms). Returns how many measures ran.
async fn drive_measured(shared: &Arc<Reconciler>, url: &str, errors: i64, done: impl Fn(&str) -> bool) -> usize {
    let mut measured = 0;
    for _ in 0..12 {
        shared.pass().await.expect("pass");
        let leases = shared
            .ledger
            .jobs()
            .lease("n1", 100, 30_000, now_ms())
            .await
            .expect("lease");
        let completions: Vec<reconciler::store::Completion> = leases
            .iter()
            .map(|l| reconciler::store::Completion {
                token: l.token.clone(),
                outcome: match l.key.contains(":measure/w20") {
                    true => {
                        measured += 1;
                        reconciler::store::Outcome::Measured(reconciler::store::Measure {
                            requests: 40,
                            errors,
                            p95_micros: Some(12_000),
                            logged: true,
                        })
                    }
                    false => reconciler::store::Outcome::Succeeded,
                },
            })
            .collect();
        shared
            .ledger
            .jobs()
            .complete(&completions, now_ms())
            .await
            .expect("complete");
        if done(&deployment(url).await) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    measured
}

/// `pl rollout promote` or `abort`, as the API runs it.
async fn rollout(
    ops: &reconciler::ops::Ops,
    env: &str,
    action: operator_proto::rollbacks::RolloutAction,
) -> Result<operator_proto::rollbacks::RolloutAnswer, reconciler::ops::OpError> {
    let ask = operator_proto::rollbacks::RolloutAsk {
        environment: env.to_owned(),
        action,
    };
    ops.rollout("ops", ask).await
}

async fn canary_scenario(url: String, dir: &Path) {
    use operator_proto::rollbacks::{RolloutAction, RolloutAnswer};
    let canary = ", rollout: {strategy: canary, steps: [{weight: 20, pause: 1s}, {weight: 60}]}";
    let (repo, shared) = release_a(
        &url,
        dir,
        &watched('a', 2, canary),
        &environment("api-production", "api"),
    )
    .await;
    let env = "api-production";
    let ops = reconciler::ops::Ops {
        ledger: shared.ledger.clone(),
        hub: shared.hub.clone(),
        branch: "main".into(),
        lost_after_ms: shared.config.control.lost_after_ms(),
        issues_certificates: shared.config.issues_certificates(),
        repo_dir: None,
        plans: tokio::sync::Semaphore::new(1),
        images: None,
        images_grace_hours: 24,
        indicators: Default::default(),
        fleet_cursors: Default::default(),
    };
    let step_state = || {
        let url = url.clone();
        async move {
            rows(
                &url,
                "SELECT step_state, CASE WHEN step_due > 0 THEN 1 ELSE 0 END, share, watch FROM deployments",
            )
            .await
            .join("")
        }
    };
    let publishes = |g: u64| {
        let url = url.clone();
        async move {
            rows(
                &url,
                &format!(
                    "SELECT key, state FROM jobs WHERE generation = {g} AND key LIKE 'ingress:%publish%' ORDER BY id"
                ),
            )
            .await
        }
    };
    // The first release has nothing to share requests with: published whole.
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "1|done|0");
    assert!(
        publishes(1).await.iter().all(|k| !k.contains("/w")),
        "{:?}",
        publishes(1).await
    );
    for action in [RolloutAction::Promote, RolloutAction::Abort] {
        let refused = rollout(&ops, env, action).await.expect_err("nothing in progress");
        assert_eq!(refused.code, "not-in-progress", "{refused:?}");
    }

    // The second: 20% first, and the 60% step waits out its 1 s pause.
    repo.write("projects/api.yaml", &watched('b', 2, canary));
    repo.commit("release b", true);
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "2|in-progress|1");
    // The 60% step waits in the deployment's row, its jobs not queued until it runs.
    let p = publishes(2).await;
    assert!(p.len() == 1 && p[0].ends_with("publish/w20@n1|succeeded"), "{p:?}");
    let step = events(&url, "canary-step").await;
    assert!(
        step.len() == 1 && step[0].contains("20% of requests on the new release; the next step in 1 s"),
        "{step:?}"
    );
    assert_eq!(
        step_state().await,
        "paused|1|20|to-switch",
        "paused, at 20%, watched from its first share to its switch"
    );
    assert_eq!(
        complete_all(&shared, reconciler::store::Outcome::Succeeded).await,
        0,
        "paused"
    );
    let c = ops
        .environment(env)
        .await
        .expect("view")
        .and_then(|d| d.canary)
        .expect("a canary under way");
    assert!(
        c.weight == 20 && !c.waits_for_promote && c.next_at_ms.is_some(),
        "{c:?}"
    );
    converge(&shared).await;
    assert_eq!(publishes(2).await.len(), 1, "its pause is not over");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    // Then 60%, and the switch waits for a promote.
    converge(&shared).await;
    let p = publishes(2).await;
    assert!(p.len() == 2 && p[1].ends_with("publish/w60@n1|succeeded"), "{p:?}");
    assert!(events(&url, "canary-step").await[1].contains("waits for `pl rollout promote`"));
    assert_eq!(step_state().await, "awaits-promote|0|60|to-switch");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    converge(&shared).await;
    assert_eq!(publishes(2).await.len(), 2, "until promoted");
    let c = ops
        .environment(env)
        .await
        .expect("view")
        .and_then(|d| d.canary)
        .expect("a canary under way");
    assert!(c.weight == 60 && c.waits_for_promote && c.next_at_ms.is_none(), "{c:?}");
    let Ok(RolloutAnswer::Promoted(promoted)) = rollout(&ops, env, RolloutAction::Promote).await else {
        panic!("promoted");
    };
    assert_eq!(promoted.generation, 2);
    assert_eq!(
        step_state().await,
        "paused|1|60|to-switch",
        "due now: the next advance queues it"
    );
    let refused = rollout(&ops, env, RolloutAction::Promote).await.expect_err("promoted");
    assert_eq!(refused.code, "not-paused", "promoted already: its switch runs");
    converge(&shared).await;
    let refused = rollout(&ops, env, RolloutAction::Promote).await.expect_err("done");
    assert_eq!(refused.code, "not-in-progress", "promoted already: its switch ran");
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "2|done|1");
    let done = events(&url, "deployment-rollout-done").await;
    assert!(
        done.last().is_some_and(|d| d.contains("after a canary of 2 step(s)")),
        "{done:?}"
    );
    assert_eq!(
        rows(&url, "SELECT watch, watch_until FROM deployments").await,
        ["|0"],
        "the canary's watch ends at its switch"
    );
    assert_eq!(
        events(&url, "canary-promoted").await,
        ["api-production|generation 2: step 5 runs now, promoted by ops"]
    );

    // An abort at 20%: generation 2's release back, held by the operator.
    repo.write("projects/api.yaml", &watched('c', 2, canary));
    repo.commit("release c", true);
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "3|in-progress|2");
    let Ok(RolloutAnswer::Aborted(ask)) = rollout(&ops, env, RolloutAction::Abort).await else {
        panic!("aborted");
    };
    assert_eq!((ask.from, ask.to, ask.generation), (3, 2, 4));
    converge(&shared).await;
    assert_eq!(
        deployment(&url).await,
        "4|done|2",
        "generation 3 never ran whole: not a previous release"
    );
    assert!(rows(&url, "SELECT hold FROM deployments").await[0].contains("\"by\":\"ops\""));
    assert!(
        publishes(4).await.iter().all(|k| !k.contains("/w")),
        "a rollback has no canary"
    );

    // Released: release c's canary again, as generation 5; its replica reported unhealthy at
    // 20% rolls it back, held by `canary`.
    shared
        .ledger
        .deployments()
        .release_rollback(env, "ops", now_ms())
        .await
        .expect("release")
        .expect("held");
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "5|in-progress|4");
    heartbeat(&shared.ledger, env, 5, false).await;
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "6|done|4");
    let auto = events(&url, "rollback-automatic").await;
    assert!(
        auto.len() == 1 && auto[0].contains("failed its canary: web/0 on n1: not healthy at generation 5"),
        "{auto:?}"
    );
    assert!(rows(&url, "SELECT hold FROM deployments").await[0].contains("\"by\":\"canary\""));

    // A commit (release d, with gates) ends the hold. Its 20% share is measured after its
    // pause; the ingress saw 9 of 40 requests fail: the gates fail it, the deployment fails,
    // and the pass takes release c... the previous release back, held by `canary`.
    let gated =
        ", rollout: {strategy: canary, steps: [{weight: 20, pause: 1s}], gates: {maxErrorPercent: 5, minRequests: 10}}";
    repo.write("projects/api.yaml", &watched('d', 2, gated));
    repo.commit("release d", true);
    let measured = drive_measured(&shared, &url, 9, |d| d.starts_with("7|failed")).await;
    assert_eq!(measured, 1, "one ingress, one hostname: one measure");
    // What the web view draws of the canary's gates: the step's measure, as reported.
    let drawn = shared
        .ledger
        .deployments()
        .generation_measures(env, 7)
        .await
        .expect("measures");
    assert!(
        drawn.len() == 1 && drawn[0].requests == 40 && drawn[0].errors == 9 && drawn[0].p95_micros == Some(12_000),
        "{drawn:?}"
    );
    // With the share its task measured: the step's 20%.
    let step = reconciler::ops::screens::CanaryMeasure::of(drawn[0].clone());
    assert_eq!((step.step, step.share), (4, Some(20)), "{step:?}");
    let failed = events(&url, "deployment-failed").await;
    assert!(failed.iter().any(|f| f.contains("generation 7, step 4")), "{failed:?}");
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "8|done|6");
    let auto = events(&url, "rollback-automatic").await;
    assert!(
        auto.len() == 2
            && auto[1].contains("generation 7 failed its canary: step 4 failed (a publish of its canary): canary-gate-failed: the new release's 9 of 40 requests 5xx or failed (22.5%), p95 12 ms: over maxErrorPercent 5")
            && auto[1].contains("back to generation 6's release"),
        "{auto:?}"
    );
    assert!(
        publishes(7).await.iter().all(|p| !p.ends_with(":publish@n1|succeeded")),
        "the switch never ran"
    );

    // A release that passes its gates (release e): after its 20% share's pause, its measure's
    // verdict is said, and the switch runs.
    shared
        .ledger
        .deployments()
        .release_rollback(env, "ops", now_ms())
        .await
        .expect("release")
        .expect("held");
    repo.write("projects/api.yaml", &watched('e', 2, gated));
    repo.commit("release e", true);
    drive_measured(&shared, &url, 1, |d| d.contains("|done|") && !d.starts_with("8|")).await;
    let gates = events(&url, "canary-gates").await;
    assert!(
        gates
            .last()
            .is_some_and(|g| g.contains("gates passed: 1 of 40 requests 5xx or failed (2.5%), p95 12 ms")),
        "{gates:?}"
    );
    assert!(
        deployment(&url).await.ends_with("|done|8"),
        "{}",
        deployment(&url).await
    );

    // What the metrics count of it, from the ledger: the gate that failed release d, the
    // operator's abort, the automatic rollbacks, and release e's rollout completed.
    let tallies = shared.ledger.events().tallies().await.expect("tallies");
    let count = |family: &str, labels: &str| {
        tallies
            .iter()
            .find(|t| t.family == family && t.labels == labels)
            .map_or(0, |t| t.value)
    };
    assert_eq!(count("rollouts", "gate-failed"), 1, "{tallies:?}");
    assert_eq!(count("rollouts", "aborted"), 1, "{tallies:?}");
    assert_eq!(count("events", "rollback-automatic"), 2, "{tallies:?}");
    assert!(count("rollouts", "completed") >= 2, "{tallies:?}");
    assert!(count("jobs", "ingress-measure|succeeded|none") >= 2, "{tallies:?}");
    // Per hour too: the last day's counts hold the same.
    let day = shared
        .ledger
        .events()
        .tallies_since(now_ms() - 86_400_000)
        .await
        .expect("day");
    assert_eq!(day, tallies, "every count of this run is within the day");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    canary_scenario(url, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_postgres() {
    let pg = postgres_support::Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    canary_scenario(pg.url(), dir.path()).await;
}

/// A repaired replica's routes are published again by the pass after its repair succeeded
/// (its address may have changed), once: the completion keeps the repair in `repaired`, and
/// the settle that follows queues the publish and takes the row in one transaction.
async fn repair_scenario(url: String, dir: &Path) {
    let env = environment("api-production", "api").replace("pool: main}", "pool: main, hostname: api.example.com}");
    let (_repo, shared) = release_a(&url, dir, &project('a', 1), &env).await;
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "1|done|0");
    let publishes = "SELECT key FROM jobs WHERE key LIKE 'ingress:%:publish#r%' ORDER BY key";
    assert!(rows(&url, publishes).await.is_empty());
    let name = |n: &str| state_schema::values::Name::new(n).expect("name");
    let repair = reconciler::store::NewJob {
        task: state_schema::task::Task::EnsureApplication {
            environment: name("api-production"),
            role: name("web"),
            instance: 0,
            generation: 1,
            spec_hash: "h".into(),
            repair: 1,
        },
        target_node: "n1".into(),
        max_attempts: 3,
        not_before_ms: 0,
    };
    shared
        .ledger
        .jobs()
        .enqueue(&[repair], now_ms())
        .await
        .expect("enqueue");
    let leases = shared
        .ledger
        .jobs()
        .lease("n1", 10, 30_000, now_ms())
        .await
        .expect("lease");
    assert_eq!(leases.len(), 1, "the repair alone is queued");
    let done = [reconciler::store::Completion {
        token: leases[0].token.clone(),
        outcome: reconciler::store::Outcome::Succeeded,
    }];
    shared.ledger.jobs().complete(&done, now_ms()).await.expect("complete");
    // Kept for the pass, nothing published by the completion itself.
    assert_eq!(
        rows(&url, "SELECT job_key FROM repaired").await,
        ["app:api-production/web/0:g1:ensure#r1@n1"]
    );
    assert!(rows(&url, publishes).await.is_empty());
    shared.pass().await.expect("pass");
    assert_eq!(
        rows(&url, publishes).await,
        ["ingress:api-production/api.example.com:g1:publish#r1@n1"]
    );
    assert!(rows(&url, "SELECT job_key FROM repaired").await.is_empty());
    // Once: another pass queues nothing more.
    shared.pass().await.expect("pass");
    assert_eq!(rows(&url, publishes).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repaired_replica_publishes_its_routes_again_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    repair_scenario(url, dir.path()).await;
    let pg = postgres_support::Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    repair_scenario(pg.url(), dir.path()).await;
}

/// A rollback takes the release back, not the scale: release a ran 1 replica, release b 2; the
/// rollback runs release a with 2 replicas, where b placed them (it once cut them to 1 without
/// a word).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_keeps_todays_replica_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let url = format!("sqlite://{}", dir.join("ledger.db").display());
    let (repo, shared) = release_a(&url, dir, &project('a', 1), &environment("api-production", "api")).await;
    converge(&shared).await;
    repo.write("projects/api.yaml", &project('b', 2));
    repo.commit("release b, two replicas", true);
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "2|done|1");
    let release_a: state_schema::deployment::DeploymentSpec =
        serde_json::from_str(&rows(&url, "SELECT previous_spec FROM deployments").await[0])
            .expect("generation 1's spec");
    assert_eq!(release_a.instances.len(), 1);
    let ask = shared
        .ledger
        .deployments()
        .ask_rollback(
            "api-production",
            None,
            "ops",
            now_ms(),
            state_schema::generations::rollback,
        )
        .await
        .expect("ask")
        .expect("asked");
    assert_eq!((ask.from, ask.to, ask.generation), (2, 1, 3));
    converge(&shared).await;
    assert_eq!(deployment(&url).await, "3|done|2");
    let spec: state_schema::deployment::DeploymentSpec = serde_json::from_str(
        &rows(
            &url,
            "SELECT spec FROM deployments WHERE environment = 'api-production'",
        )
        .await[0],
    )
    .expect("spec");
    assert_eq!(spec.release_hash, release_a.release_hash, "release a again");
    assert_eq!(spec.instances.len(), 2, "today's two replicas: {:?}", spec.instances);
    let web = state_schema::values::Name::new("web").expect("name");
    assert_eq!(spec.replicas.get(&web), Some(&2));
    let ensured = images(&url, 3).await;
    assert!(
        ensured.iter().any(|k| k.contains("/web/1:g3:ensure")),
        "the second replica runs at the rollback's generation: {ensured:?}"
    );
}
