//! Judging commits and recording them in the ledger, on both backends, with real repositories
//! made with the `git` CLI and a key made by `ssh-keygen`: accepted and rejected commits are
//! recorded once with every reason, the last accepted one stays in force, and reprocessing
//! writes nothing.

#[path = "support/postgres.rs"]
mod postgres_support;
#[path = "support/repo.rs"]
mod repo_support;

use reconciler::ledger::Ledger;
use reconciler::revision::judge;
use reconciler::source::StateRepo;
use reconciler::trust::allowed_signers;
use repo_support::git;
use std::path::Path;
use std::process::Command;

fn write(repo: &Path, file: &str, text: &str) {
    let p = repo.join(file);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

const ROOT: &str =
    "apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata: {name: t}\nspec: {baseDomain: example.com}\n";
const POOL: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n    - {name: n1, capacity: {cpu: \"2\", memory: 4Gi}}\n";

/// Builds the repository: good (signed), unsigned, invalid (signed), good again (signed).
fn repository(dir: &Path) -> (std::path::PathBuf, String, [String; 4]) {
    let key = dir.join("key");
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "ops", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen");
    assert!(o.status.success());
    let public = std::fs::read_to_string(key.with_extension("pub")).expect("pub");
    let repo = dir.join("state");
    std::fs::create_dir_all(&repo).expect("mkdir");
    git(&repo, &["init", "-q", "-b", "main"]);
    let signing = format!("user.signingKey={}", key.display());
    let commit = |message: &str, signed: bool| {
        git(&repo, &["add", "-A"]);
        if signed {
            git(
                &repo,
                &[
                    "-c",
                    "gpg.format=ssh",
                    "-c",
                    &signing,
                    "commit",
                    "-q",
                    "-S",
                    "-m",
                    message,
                ],
            );
        } else {
            git(&repo, &["commit", "-q", "-m", message]);
        }
        git(&repo, &["rev-parse", "HEAD"])
    };
    write(&repo, "pushleft.yaml", ROOT);
    write(&repo, "pools/main.yaml", POOL);
    let good = commit("good", true);
    write(&repo, "pools/main.yaml", &POOL.replace("region: eu", "region: us"));
    let unsigned = commit("unsigned", false);
    write(
        &repo,
        "envs/broken.yaml",
        "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: broken}\nspec: {project: nope, stage: production, pool: main}\n",
    );
    let invalid = commit("invalid", true);
    std::fs::remove_file(repo.join("envs/broken.yaml")).expect("rm");
    let good_again = commit("good again", true);
    (
        repo,
        format!("ops-alice {public}"),
        [good, unsigned, invalid, good_again],
    )
}

async fn scenario(ledger: Ledger, dir: &Path) {
    let (repo_dir, signers_text, [good, unsigned, invalid, good_again]) = repository(dir);
    let signers = allowed_signers::parse(&signers_text).expect("allowed signers");
    let repo = StateRepo::open(&repo_dir).expect("open");
    let mut last: Option<gix::ObjectId> = None;
    for (sha, want) in [
        (&good, None),
        (&unsigned, Some(vec!["unsigned"])),
        (&invalid, Some(vec!["dangling-reference"])),
        (&good_again, None),
    ] {
        let commit = repo.resolve(sha).expect("resolve");
        let j = judge(&repo, &commit, &signers, None, last).expect("judge");
        assert!(
            ledger.record_revision("main", &j, 1).await.expect("record"),
            "first time: recorded"
        );
        match want {
            None => {
                assert!(j.accepted(), "{:?}", j.reasons);
                assert_eq!(j.principals.as_deref(), Some("ops-alice"));
                last = Some(commit.id);
            }
            Some(codes) => {
                let got: Vec<&str> = j.reasons.iter().map(|r| r.code.as_str()).collect();
                assert_eq!(got, codes);
                assert_eq!(
                    ledger.revision("main", sha).await.expect("revision"),
                    Some(("rejected".into(), codes.iter().map(|c| (*c).to_owned()).collect()))
                );
                // A rejected commit leaves the last accepted one in force.
                assert_eq!(ledger.last_accepted("main").await.expect("last"), Some(good.clone()));
            }
        }
    }
    assert_eq!(
        ledger.last_accepted("main").await.expect("last"),
        Some(good_again.clone())
    );
    // Reprocessing every commit writes nothing: no row, no event.
    let events = ledger.events_after(0, 1000).await.expect("events");
    for sha in [&good, &unsigned, &invalid, &good_again] {
        let commit = repo.resolve(sha).expect("resolve");
        let j = judge(&repo, &commit, &signers, None, None).expect("judge");
        assert!(
            !ledger.record_revision("main", &j, 2).await.expect("record again"),
            "judged before: nothing written"
        );
    }
    assert_eq!(ledger.events_after(0, 1000).await.expect("events"), events);
    assert_eq!(events.iter().filter(|e| e.kind.starts_with("revision-")).count(), 4);
    assert!(
        ledger.execute_raw("DELETE FROM revisions").await.is_err(),
        "revisions are append-only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = Ledger::connect(&format!("sqlite://{}", dir.path().join("l.db").display()), 4)
        .await
        .expect("connect");
    ledger.migrate().await.expect("migrate");
    scenario(ledger, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_on_postgres() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = postgres_support::Postgres::start();
    let ledger = Ledger::connect(&pg.url(), 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    scenario(ledger, dir.path()).await;
}
