//! The daemon's image update watcher (`[image_updates]`) against a real registry on loopback
//! and a real repository: a project whose policy says `branch: applied` gets the registry's
//! newest allowed tag as a commit on the applied branch signed with the bot's key, which the
//! next pass judges like any other (the policy's `bots` let that key move web's image) and
//! rolls out; a project with `branch: own` gets it on `pl-image-update/project/<name>`, the
//! applied branch untouched; a pinned one is left alone; an environment a rollback holds is
//! left alone with an event saying why, until the hold is released. A look with nothing new
//! writes nothing and says nothing again.

#[path = "support/converge.rs"]
mod converge_support;
#[path = "support/dump.rs"]
mod dump;
#[path = "../../tests-support/registry.rs"]
mod registry_support;
#[path = "support/repo.rs"]
mod repo_support;

use converge_support::converge;
use dump::rows;
use reconciler::config::Config;
use reconciler::reconcile::Reconciler;
use reconciler::reconcile::image_updates::Said;
use reconciler::store::{Ledger, now_ms};
use repo_support::{Repo, environment, new_key};
use std::sync::Arc;

fn project(name: &str, image: &str, updates: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: {name}}}\nspec:\n  image: {image}\n  imageUpdates: {updates}\n  roles:\n    work: {{kind: worker, replicas: 1}}\n"
    )
}

async fn events(url: &str, kind: &str) -> Vec<String> {
    rows(
        url,
        &format!("SELECT subject, detail FROM events WHERE kind = '{kind}' ORDER BY id"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_writes_signed_updates_and_leaves_held_environments_alone() {
    let reg = registry_support::registry();
    let r = |name: &str| format!("127.0.0.1:{}/team/{name}", reg.port);
    let (api1, api2) = (
        reg.push("team/api", "1.0.0", "api 1"),
        reg.push("team/api", "1.0.1", "api 2"),
    );
    let api3 = reg.push("team/api", "1.1.0", "api 3");
    let web1 = reg.push("team/web", "1.0.0", "web 1");
    let web2 = reg.push("team/web", "1.2.0", "web 2");
    let db1 = reg.push("team/db", "15.1", "db 1");
    reg.push("team/db", "15.2", "db 2");
    let cache1 = reg.push("team/cache", "7.0.0", "cache 1");
    let cache2 = reg.push("team/cache", "7.0.1", "cache 2");

    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    let bot = dir.path().join("bot");
    let bot_public = new_key(&bot);
    std::fs::write(
        dir.path().join("allowed_signers"),
        format!("{}image-bot {bot_public}", repo.signers),
    )
    .expect("signers");
    std::fs::write(
        dir.path().join("policy.yaml"),
        "bots:\n  - principals: [image-bot]\n    images: [web, cache, db]\n",
    )
    .expect("policy");
    let api_v1 = project(
        "api",
        &format!("{}:1.0.0@{api1}", r("api")),
        "{semver: \"^1\", branch: applied}",
    );
    repo.write("projects/api.yaml", &api_v1);
    repo.write(
        "projects/web.yaml",
        &project(
            "web",
            &format!("{}:1.0.0@{web1}", r("web")),
            "{semver: \"^1\", branch: applied}",
        ),
    );
    repo.write(
        "projects/db.yaml",
        &project(
            "db",
            &format!("{}:15.1@{db1}", r("db")),
            "{semver: \"^15\", digests: pin}",
        ),
    );
    repo.write(
        "projects/cache.yaml",
        &project("cache", &format!("{}:7.0.0@{cache1}", r("cache")), "{semver: \"^7\"}"),
    );
    for p in ["api", "web", "db", "cache"] {
        repo.write(&format!("envs/{p}.yaml"), &environment(&format!("{p}-production"), p));
    }
    repo.commit("four projects", true);
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let config = dir.path().join("reconciler.toml");
    std::fs::write(
        &config,
        format!(
            "[source]\npath = {:?}\n\n[trust]\nallowed_signers = \"allowed_signers\"\npolicy = \"policy.yaml\"\n\n[ledger]\nurl = {url:?}\n\n[api]\nlisten = \"127.0.0.1:0\"\ntls_cert = \"api.crt\"\ntls_key = \"api.key\"\n\n[image_updates]\nsigning_key = \"bot\"\ninterval_seconds = 60\n",
            repo.dir
        ),
    )
    .expect("config");
    let ledger = Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n1"]).await;
    let shared = Arc::new(
        Reconciler::new(
            Arc::new(Config::load(&config).expect("config loads")),
            Arc::new(ledger),
            Arc::default(),
        )
        .expect("shared"),
    );
    converge(&shared).await;
    // api's second release, then a rollback to the first: api-production is held.
    repo.write(
        "projects/api.yaml",
        &api_v1.replace(&format!("1.0.0@{api1}"), &format!("1.0.1@{api2}")),
    );
    repo.commit("api 1.0.1", true);
    converge(&shared).await;
    shared
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
        .expect("rolled back");
    converge(&shared).await;
    let main_before = repo.git(&["rev-parse", "main"]).trim().to_owned();

    let mut said = Said::new();
    let looked = shared.image_updates_pass(&mut said).await.expect("look");
    let kinds: Vec<(String, &str)> = looked.iter().map(|l| (l.label.clone(), l.kind)).collect();
    assert!(
        kinds.contains(&("project/api".into(), "image-update-held")),
        "{looked:?}"
    );
    assert!(
        kinds.contains(&("project/web".into(), "image-update-written")),
        "{looked:?}"
    );
    assert!(
        kinds.contains(&("project/cache".into(), "image-update-written")),
        "{looked:?}"
    );
    assert!(
        kinds.contains(&("project/db".into(), "")),
        "pinned: nothing to say: {looked:?}"
    );
    let held = events(&url, "image-update-held").await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0].contains("api-production is held by a rollback"), "{held:?}");
    // web's went onto main, signed by the bot, on the commit in force; cache's on its own branch.
    let main = repo.git(&["rev-parse", "main"]).trim().to_owned();
    assert_ne!(main, main_before);
    assert_eq!(repo.git(&["rev-parse", "main^"]).trim(), main_before);
    assert!(
        repo.git(&["show", "main:projects/web.yaml"])
            .contains(&format!("1.2.0@{web2}"))
    );
    assert!(
        repo.git(&["show", "main:projects/api.yaml"])
            .contains(&format!("1.0.1@{api2}")),
        "api untouched"
    );
    assert!(
        repo.git(&["show", "pl-image-update/project/cache:projects/cache.yaml"])
            .contains(&format!("7.0.1@{cache2}"))
    );
    assert!(
        repo.git(&["show", "main:projects/cache.yaml"]).contains("7.0.0@"),
        "not on main"
    );

    // The next pass judges the bot's commit like any other: accepted, and web rolls out.
    converge(&shared).await;
    assert_eq!(
        shared.ledger.revisions().last_accepted("main").await.expect("accepted"),
        Some(main.clone())
    );
    let specs = rows(
        &url,
        "SELECT spec FROM deployments WHERE environment = 'web-production'",
    )
    .await;
    assert!(specs[0].contains(&format!("1.2.0@{web2}")), "web runs the update");

    // The commit in force moved: cache's own branch is written again on top of it.
    shared.image_updates_pass(&mut said).await.expect("look");
    assert_eq!(repo.git(&["rev-parse", "pl-image-update/project/cache^"]).trim(), main);
    // Nothing new: nothing written, nothing said again.
    let events_before = rows(&url, "SELECT id FROM events").await.len();
    let cache_tip = repo.git(&["rev-parse", "pl-image-update/project/cache"]);
    shared.image_updates_pass(&mut said).await.expect("look");
    assert_eq!(repo.git(&["rev-parse", "pl-image-update/project/cache"]), cache_tip);
    assert_eq!(repo.git(&["rev-parse", "main"]).trim(), main);
    assert_eq!(
        rows(&url, "SELECT id FROM events").await.len(),
        events_before,
        "said once: {:?}",
        rows(
            &url,
            "SELECT kind, subject, detail FROM events ORDER BY id DESC LIMIT 2"
        )
        .await
    );

    // Released, api would move to 1.1.0 on main; but the policy's bots do not let this key
    // move api's image, so nothing is written (the next pass would refuse it), and it says so.
    shared
        .ledger
        .deployments()
        .release_rollback("api-production", "ops", now_ms())
        .await
        .expect("release")
        .expect("released");
    converge(&shared).await;
    let main = repo.git(&["rev-parse", "main"]).trim().to_owned();
    let looked = shared.image_updates_pass(&mut said).await.expect("look");
    assert!(
        looked
            .iter()
            .any(|l| l.label == "project/api" && l.kind == "image-update-not-allowed"),
        "{looked:?}"
    );
    assert_eq!(repo.git(&["rev-parse", "main"]).trim(), main);
    let why = events(&url, "image-update-not-allowed").await;
    assert!(
        why[0].contains(&format!("1.1.0@{api3}")) && why[0].contains("image-bot"),
        "{why:?}"
    );
    // Written by hand with the same key, the daemon refuses it (reconciler/tests/history.rs
    // covers the bots rule itself).
    repo.write(
        "projects/api.yaml",
        &api_v1.replace(&format!("1.0.0@{api1}"), &format!("1.1.0@{api3}")),
    );
    let forged = repo.commit_signed_by("api 1.1.0, by the bot's key", &bot);
    converge(&shared).await;
    let (verdict, codes) = shared
        .ledger
        .revisions()
        .revision("main", &forged)
        .await
        .expect("revision")
        .expect("judged");
    assert_eq!(
        (verdict.as_str(), codes),
        ("rejected", vec!["principal-limited-to-images".to_owned()])
    );

    // web 1.3.0 comes while main's head is not the commit in force (the refused commit): the
    // applied branch only moves forward from what was judged, so the update waits.
    let web3 = reg.push("team/web", "1.3.0", "web 3");
    let looked = shared.image_updates_pass(&mut said).await.expect("look");
    assert!(
        looked
            .iter()
            .any(|l| l.label == "project/web" && l.kind == "image-update-deferred"),
        "{looked:?}"
    );
    assert_eq!(repo.git(&["rev-parse", "main"]).trim(), forged);
    assert!(!repo.git(&["show", "main:projects/web.yaml"]).contains(&web3));
}
