//! Judging commits and recording them in the ledger, on both backends, with real repositories
//! made with the `git` CLI and a key made by `ssh-keygen`: accepted and rejected commits are
//! recorded once with every reason, the last accepted one stays in force, and reprocessing
//! writes nothing.

#[path = "support/postgres.rs"]
mod postgres_support;
#[path = "support/repo.rs"]
mod repo_support;

use reconciler::store::Ledger;
use repo_support::{POOL, Repo};
use state_repo::revision::{Trust, judge};
use state_repo::source::StateRepo;
use state_repo::trust::allowed_signers;
use std::path::Path;

/// Builds the repository: good (signed), unsigned, invalid (signed), two nodes at one address
/// (signed), good again (signed).
fn repository(dir: &Path) -> (std::path::PathBuf, String, [String; 5]) {
    let repo = Repo::new(dir);
    let good = repo.commit("good", true);
    repo.write("pools/main.yaml", &POOL.replace("region: eu", "region: us"));
    let unsigned = repo.commit("unsigned", false);
    repo.write(
        "envs/broken.yaml",
        "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: broken}\nspec: {project: nope, stage: production, pool: main}\n",
    );
    let invalid = repo.commit("invalid", true);
    repo.remove("envs/broken.yaml");
    // Two nodes at one address: the mesh would send one's traffic to the other.
    repo.write(
        "pools/main.yaml",
        &POOL
            .replace("{name: n1,", "{name: n1, address: 203.0.113.5,")
            .replace("{name: n2,", "{name: n2, address: 203.0.113.5,"),
    );
    let same_address = repo.commit("same address", true);
    repo.write("pools/main.yaml", &POOL.replace("region: eu", "region: us"));
    let good_again = repo.commit("good again", true);
    (
        repo.dir.clone(),
        repo.signers.clone(),
        [good, unsigned, invalid, same_address, good_again],
    )
}

fn trust(signers: &[allowed_signers::AllowedSigner]) -> Trust<'_> {
    Trust {
        signers,
        policy: None,
        seen_at: None,
        preview: None,
    }
}

async fn scenario(ledger: Ledger, dir: &Path) {
    let (repo_dir, signers_text, [good, unsigned, invalid, same_address, good_again]) = repository(dir);
    let signers = allowed_signers::parse(&signers_text).expect("allowed signers");
    let repo = StateRepo::open(&repo_dir).expect("open");
    let mut last: Option<gix::ObjectId> = None;
    for (sha, want) in [
        (&good, None),
        (&unsigned, Some(vec!["unsigned"])),
        (&invalid, Some(vec!["dangling-reference"])),
        (&same_address, Some(vec!["duplicate-address"])),
        (&good_again, None),
    ] {
        let commit = repo.resolve(sha).expect("resolve");
        let j = judge(&repo, &commit, last, &trust(&signers)).expect("judge");
        assert!(
            ledger.revisions().record_revision("main", &j, 1).await.expect("record"),
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
                // Trust is checked first: a commit it refuses is never read or parsed.
                let loaded = codes != ["unsigned"];
                assert_eq!(j.state.files > 0, loaded, "{codes:?}: state loaded = {}", j.state.files);
                assert_eq!(
                    ledger.revisions().revision("main", sha).await.expect("revision"),
                    Some(("rejected".into(), codes.iter().map(|c| (*c).to_owned()).collect()))
                );
                // A rejected commit leaves the last accepted one in force.
                assert_eq!(
                    ledger.revisions().last_accepted("main").await.expect("last"),
                    Some(good.clone())
                );
            }
        }
    }
    assert_eq!(
        ledger.revisions().last_accepted("main").await.expect("last"),
        Some(good_again.clone())
    );
    // Reprocessing every commit writes nothing: no row, no event.
    let events = ledger.events().events_after(0, 1000).await.expect("events");
    for sha in [&good, &unsigned, &invalid, &same_address, &good_again] {
        let commit = repo.resolve(sha).expect("resolve");
        let j = judge(&repo, &commit, None, &trust(&signers)).expect("judge");
        assert!(
            !ledger
                .revisions()
                .record_revision("main", &j, 2)
                .await
                .expect("record again"),
            "judged before: nothing written"
        );
    }
    assert_eq!(ledger.events().events_after(0, 1000).await.expect("events"), events);
    assert_eq!(events.iter().filter(|e| e.kind.starts_with("revision-")).count(), 5);
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
