//! A commit that changes only a Secret's values reaches what uses it, and `pl plan` says how,
//! from the same decision (`release::change`), on a real SQLite ledger:
//! - an environment's brought certificate (`tls.secret`): its new `CERT` and `KEY` are
//!   published again in place on every node that serves the hostname (a publish job at the
//!   current generation, a `certificate-rotated` event), no new generation, no replica job;
//! - a Secret a role reads as files: a new generation (its containers start with the new
//!   files), and `pl plan` lists the rollout.
//!
//! The trees are golden/plan/secrets-and-capacity's (real age ciphertext, rotated by `pl secret
//! set`), with the replica count kept.

#[path = "support/apply.rs"]
#[allow(dead_code)] // `state_of`: this test writes its own repositories
mod apply;
#[path = "support/dump.rs"]
mod dump;

use apply::{judgement, settle};
use reconciler::store::Ledger;
use reconciler::store::now_ms;
use state_schema::parse::parse_file;
use state_schema::plan::{Scope, plan_scoped};
use state_schema::state::{Loaded, assemble};
use std::path::Path;

/// The golden case's side `side` (`base` or `head`), replicas as in the base, with `extra`
/// appended to the project (a role's secret files).
fn side(side: &str, project_extra: &str) -> Loaded {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden/plan/secrets-and-capacity");
    let files = [
        "pushleft.yaml",
        "pools/default.yaml",
        "environments/hello-production.yaml",
        "projects/hello.yaml",
        "secrets/hello-tls.yaml",
    ];
    let parsed = files
        .iter()
        .map(|f| {
            let mut text = std::fs::read_to_string(root.join(side).join(f)).expect("golden file");
            if *f == "projects/hello.yaml" {
                text = text.replace("replicas: 20", "replicas: 2");
                text.push_str(project_extra);
            }
            parse_file(f, text.as_bytes())
        })
        .collect();
    let loaded = assemble(parsed, Vec::new());
    assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
    loaded
}

#[tokio::test(flavor = "current_thread")]
async fn a_rotated_certificate_is_published_in_place_and_the_plan_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("l.db").display());
    let ledger = Ledger::connect(&url, 2).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["node-1"]).await;
    let (base, head) = (side("base", ""), side("head", ""));
    let plan = plan_scoped(&base.state, &head.state, Scope::Full);
    assert!(plan.consequences.rollouts.is_empty(), "{:?}", plan.consequences);
    let rotated: Vec<String> = plan
        .consequences
        .certificates_changed
        .iter()
        .map(|c| format!("{}/{}", c.environment, c.hostname))
        .collect();
    assert_eq!(rotated, ["hello-production/hello.apps.example.com"]);

    ledger
        .apply_revision(
            "main",
            false,
            &mut judgement("a", base),
            now_ms(),
            state_schema::placement::LOST_AFTER_MS,
        )
        .await
        .expect("base");
    settle(&ledger, &url).await;
    let generation = || {
        dump::rows(
            &url,
            "SELECT generation FROM deployments WHERE environment = 'hello-production'",
        )
    };
    let before = generation().await;
    let jobs_before = dump::rows(&url, "SELECT key FROM jobs").await.len();
    ledger
        .apply_revision(
            "main",
            false,
            &mut judgement("b", head),
            now_ms(),
            state_schema::placement::LOST_AFTER_MS,
        )
        .await
        .expect("head");
    assert_eq!(generation().await, before, "no new generation");
    let new: Vec<String> = dump::rows(&url, "SELECT key FROM jobs ORDER BY id").await[jobs_before..].to_vec();
    assert!(
        !new.is_empty()
            && new
                .iter()
                .all(|k| k.starts_with("ingress:hello-production/hello.apps.example.com:g")
                    && k.contains(":publish@node-1")),
        "only the hostname's publish on its node: {new:?}"
    );
    let events = dump::rows(&url, "SELECT detail FROM events WHERE kind = 'certificate-rotated'").await;
    assert!(
        events.len() == 1 && events[0].contains("hello.apps.example.com") && events[0].contains("no replica restarted"),
        "{events:?}"
    );
    // The publish hands the node the new pair: the stored spec holds the head's ciphertext.
    let spec = dump::rows(
        &url,
        "SELECT spec FROM deployments WHERE environment = 'hello-production'",
    )
    .await;
    let head_cert = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden/plan/secrets-and-capacity/head/secrets/hello-tls.yaml"),
    )
    .expect("head secret");
    let first_line = head_cert
        .lines()
        .skip_while(|l| !l.contains("BEGIN AGE"))
        .nth(1)
        .expect("ciphertext")
        .trim()
        .to_owned();
    assert!(
        spec[0].contains(&first_line),
        "the stored spec carries the rotated certificate"
    );
    ledger.close().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_rotated_secret_a_role_reads_as_files_is_a_new_generation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("l.db").display());
    let ledger = Ledger::connect(&url, 2).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["node-1"]).await;
    // The role reads the same Secret as files (`/run/secrets/CERT`, `/run/secrets/KEY`).
    let files = "  secrets: [hello-tls]\n";
    let (base, head) = (side("base", files), side("head", files));
    let plan = plan_scoped(&base.state, &head.state, Scope::Full);
    let rollouts: Vec<String> = plan.consequences.rollouts.iter().map(|n| n.to_string()).collect();
    assert_eq!(rollouts, ["hello-production"], "{:?}", plan.consequences);
    ledger
        .apply_revision(
            "main",
            false,
            &mut judgement("a", base),
            now_ms(),
            state_schema::placement::LOST_AFTER_MS,
        )
        .await
        .expect("base");
    settle(&ledger, &url).await;
    let generation = || {
        dump::rows(
            &url,
            "SELECT generation FROM deployments WHERE environment = 'hello-production'",
        )
    };
    let before = generation().await;
    ledger
        .apply_revision(
            "main",
            false,
            &mut judgement("b", head),
            now_ms(),
            state_schema::placement::LOST_AFTER_MS,
        )
        .await
        .expect("head");
    assert_ne!(
        generation().await,
        before,
        "a new generation starts the role with the new files"
    );
    ledger.close().await;
}
