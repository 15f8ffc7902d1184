//! Trust against hostile pushes, through the reconcile pass on a real repository made with the
//! `git` CLI and keys made by `ssh-keygen`: the applied branch only moves forward (a force-push
//! is refused with `history-rewritten` until an admin approves it), a rebased preview branch in
//! strict mode stalls nothing, a retired key cannot sign with a backdated commit, environment
//! rules follow what a change does whichever file caused it, and a preview branch cannot widen
//! its own preview settings.

#[path = "support/dump.rs"]
mod dump;
#[path = "support/repo.rs"]
mod repo_support;

use dump::rows;
use reconciler::config::Config;
use reconciler::reconcile::Reconciler;
use reconciler::store::Ledger;
use reconciler::store::rewrites::Approval;
use repo_support::{Repo, environment, new_key, project};
use std::path::Path;
use std::sync::Arc;

/// A daemon's shared state on a SQLite ledger in `dir`, with an optional policy file.
async fn shared(dir: &Path, repo: &Repo, signers: &str, policy: Option<&str>) -> (Arc<Reconciler>, String) {
    std::fs::write(dir.join("allowed_signers"), signers).expect("signers");
    let url = format!("sqlite://{}", dir.join("ledger.db").display());
    let mut text = format!(
        "[source]\npath = {:?}\npreview_branches = [\"feature/*\"]\n\n[trust]\nallowed_signers = \"allowed_signers\"\n",
        repo.dir
    );
    if let Some(p) = policy {
        std::fs::write(dir.join("policy.yaml"), p).expect("policy");
        text.push_str("policy = \"policy.yaml\"\n");
    }
    text.push_str(&format!(
        "\n[ledger]\nurl = {url:?}\n\n[api]\nlisten = \"127.0.0.1:0\"\ntls_cert = \"api.crt\"\ntls_key = \"api.key\"\n"
    ));
    let path = dir.join("reconciler.toml");
    std::fs::write(&path, text).expect("config");
    let ledger = Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n1", "n2"]).await;
    let shared = Reconciler::new(
        std::sync::Arc::new(Config::load(&path).expect("config loads")),
        std::sync::Arc::new(ledger),
        std::sync::Arc::default(),
    )
    .expect("shared");
    (Arc::new(shared), url)
}

fn base_state(repo: &Repo) {
    repo.write("projects/api.yaml", &project("api", 1));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
}

async fn accepted(s: &Reconciler, branch: &str) -> Option<String> {
    s.ledger.revisions().last_accepted(branch).await.expect("last accepted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applied_branch_only_moves_forward() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    base_state(&repo);
    let c1 = repo.commit("first", true);
    repo.write("projects/api.yaml", &project("api", 2));
    let c2 = repo.commit("second", true);
    // A signed commit that main never had, on a side branch from the first commit.
    repo.git(&["checkout", "-q", "-b", "side", &c1]);
    repo.write("projects/api.yaml", &project("api", 5));
    let side = repo.commit("side", true);
    repo.git(&["checkout", "-q", "main"]);
    let (s, url) = shared(dir.path(), &repo, &repo.signers, None).await;
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(c2.clone()));

    // Force-push main to the old first commit: a rollback, refused; c2 stays in force.
    repo.git(&["reset", "-q", "--hard", &c1]);
    let r = s.pass().await.expect("pass");
    assert_eq!((r.judged, r.rejected, r.jobs_queued), (1, 1, 0));
    assert_eq!(accepted(&s, "main").await, Some(c2.clone()));
    let events = rows(
        &url,
        "SELECT kind, subject, detail FROM events WHERE detail = 'history-rewritten'",
    )
    .await;
    assert_eq!(events, [format!("revision-rejected|main@{c1}|history-rewritten")]);
    // Recorded once: the next pass writes nothing.
    let r = s.pass().await.expect("pass");
    assert_eq!(r.judged, 0);

    // Force-push to the signed commit from the other branch: refused the same way.
    repo.git(&["reset", "-q", "--hard", &side]);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(c2.clone()));
    assert_eq!(
        rows(
            &url,
            "SELECT sha, accepted_sha, approved_by FROM history_rewrites ORDER BY id"
        )
        .await,
        [format!("{c1}|{c2}|NULL"), format!("{side}|{c2}|NULL")]
    );

    // An admin approves exactly that head; it is judged and rolled out like any commit.
    assert_eq!(
        s.ledger
            .revisions()
            .approve_rewrite("main", &c1, "root-admin", 5)
            .await
            .expect("approve"),
        Approval::Approved,
        "the old head's refusal can be approved too"
    );
    assert_eq!(
        s.ledger
            .revisions()
            .approve_rewrite("main", "0000", "root-admin", 5)
            .await
            .expect("approve"),
        Approval::NotPending
    );
    assert_eq!(
        s.ledger
            .revisions()
            .approve_rewrite("main", &side, "root-admin", 5)
            .await
            .expect("approve"),
        Approval::Approved
    );
    assert_eq!(
        s.ledger
            .revisions()
            .approve_rewrite("main", &side, "root-admin", 6)
            .await
            .expect("approve"),
        Approval::AlreadyApproved
    );
    let r = s.pass().await.expect("pass");
    assert_eq!((r.judged, r.accepted), (1, 1));
    assert_eq!(accepted(&s, "main").await, Some(side.clone()));
    assert_eq!(
        rows(
            &url,
            "SELECT kind, detail FROM events WHERE kind = 'rewrite-approved' ORDER BY id"
        )
        .await,
        ["rewrite-approved|root-admin", "rewrite-approved|root-admin"]
    );
    // The approval was for that head alone: going back to c2 is a new rewrite.
    repo.git(&["reset", "-q", "--hard", &c2]);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(side));
    // Moving forward again from the accepted head is accepted without any approval.
    repo.git(&["reset", "-q", "--hard", "side"]);
    repo.write("projects/api.yaml", &project("api", 3));
    let c4 = repo.commit("forward", true);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(c4.clone()));

    // Back to c2, accepted long ago (a rollback by force-push, or `pl up` of the commit a
    // `pl down` teardown followed): approved, it is applied again and is in force again, and
    // the branch moves forward from it without another approval.
    repo.git(&["reset", "-q", "--hard", &c2]);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(c4.clone()), "refused until approved");
    assert_eq!(
        s.ledger
            .revisions()
            .approve_rewrite("main", &c2, "root-admin", 7)
            .await
            .expect("approve"),
        Approval::Approved
    );
    let r = s.pass().await.expect("pass");
    assert!(r.jobs_queued > 0, "c2's replicas come back: {r:?}");
    assert_eq!(accepted(&s, "main").await, Some(c2.clone()), "c2 in force again");
    assert_eq!(
        rows(&url, "SELECT subject FROM events WHERE kind = 'revision-reapplied'").await,
        [format!("main@{c2}")]
    );
    assert_eq!(s.pass().await.expect("pass").judged, 0, "settled: nothing judged again");
    repo.write("projects/api.yaml", &project("api", 4));
    let c5 = repo.commit("after the return", true);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(c5.clone()));
    // The same head over another commit in force is another rewrite: the approval given over
    // c4 does not carry over.
    repo.git(&["reset", "-q", "--hard", &c2]);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(c5), "a new approval is needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebased_preview_in_strict_mode_stalls_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    base_state(&repo);
    let c1 = repo.commit("first", true);
    repo.git(&["checkout", "-q", "-b", "feature/login"]);
    repo.write("projects/web.yaml", &project("web", 1));
    let p1 = repo.commit("preview work", true);
    repo.git(&["checkout", "-q", "main"]);
    let (s, _url) = shared(dir.path(), &repo, &repo.signers, Some("mode: strict\n")).await;
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(c1));
    assert_eq!(accepted(&s, "feature/login").await, Some(p1.clone()));

    // main moves on; the preview branch is rebased onto it (and re-signed).
    repo.write("projects/api.yaml", &project("api", 2));
    let c2 = repo.commit("second", true);
    repo.git(&["checkout", "-q", "feature/login"]);
    let signing = format!("user.signingKey={}", dir.path().join("key").display());
    repo.git(&[
        "-c",
        "gpg.format=ssh",
        "-c",
        &signing,
        "-c",
        "commit.gpgSign=true",
        "rebase",
        "-q",
        "main",
    ]);
    let rebased = repo.git(&["rev-parse", "HEAD"]);
    assert_ne!(rebased, p1);
    repo.git(&["checkout", "-q", "main"]);
    // And a new signed commit lands on main in the same pass.
    repo.write("projects/api.yaml", &project("api", 3));
    let c3 = repo.commit("third", true);
    let r = s.pass().await.expect("a rebased preview must not fail the pass");
    assert_eq!(accepted(&s, "main").await, Some(c3), "main is applied: {r:?}");
    assert!(c2 != rebased);
    assert_eq!(
        accepted(&s, "feature/login").await,
        Some(rebased),
        "the rebased preview is judged afresh against its merge base with main"
    );
    assert_eq!(s.hub.metrics.tick_errors.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_key_cannot_sign_with_a_backdated_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    base_state(&repo);
    let c1 = repo.commit("first", true);
    // The key was retired at the start of 2021 (valid-before); the attacker who still holds it
    // backdates the committer date to 2020, when git's check alone would pass it.
    let public = std::fs::read_to_string(dir.path().join("key.pub")).expect("pub");
    let signers = format!("ops-old valid-before=\"20210101\" {public}");
    repo.write("projects/api.yaml", &project("api", 4));
    let old = repo.commit_dated("backdated", "2020-06-01T00:00:00Z");
    let (s, _url) = shared(dir.path(), &repo, &signers, None).await;
    // The first pass sees only the head (a branch starts at its head).
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, None);
    assert_eq!(
        s.ledger.revisions().revision("main", &old).await.expect("revision"),
        Some(("rejected".into(), vec!["key-not-valid-when-seen".into()]))
    );
    // git's rule alone (the committer date) would have passed it; `pl verify --at` is the
    // daemon's rule.
    let parsed = state_repo::trust::allowed_signers::parse(&signers).expect("signers");
    let state = state_repo::source::StateRepo::open(&repo.dir).expect("open");
    let id = state.resolve(&old).expect("resolve").id;
    assert!(
        state
            .verify_commit(id, &parsed, &[], None, None)
            .expect("verify")
            .result
            .is_ok()
    );
    let now = reconciler::store::now_ms() / 1000;
    let at_now = state.verify_commit(id, &parsed, &[], None, Some(now)).expect("verify");
    assert_eq!(at_now.result.expect_err("retired").code(), "key-not-valid-when-seen");
    let c1 = state.resolve(&c1).expect("resolve").id;
    let current = state.verify_commit(c1, &parsed, &[], None, None).expect("verify");
    assert_eq!(current.result.expect_err("after valid-before").code(), "key-expired");
}

const POLICY: &str = "mode: head\nrules:\n  - environments: {stage: production}\n    principals: [\"ops-*\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_rules_follow_what_a_change_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    let dev_key = dir.path().join("dev");
    let dev_public = new_key(&dev_key);
    let signers = format!("{}dev-bob {dev_public}", repo.signers);
    base_state(&repo);
    repo.write(
        "envs/api-preview.yaml",
        &environment("api-staging", "api").replace("stage: production", "stage: preview"),
    );
    let c1 = repo.commit("first", true);
    let (s, _url) = shared(dir.path(), &repo, &signers, Some(POLICY)).await;
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(c1.clone()));

    // dev-bob changes the project file: no path rule matches it, but it rolls out production.
    repo.write("projects/api.yaml", &project("api", 2));
    let by_dev = repo.commit_signed_by("scale api", &dev_key);
    s.pass().await.expect("pass");
    let (verdict, codes) = s
        .ledger
        .revisions()
        .revision("main", &by_dev)
        .await
        .expect("revision")
        .expect("judged");
    assert_eq!(
        (verdict.as_str(), codes),
        ("rejected", vec!["principal-not-allowed-for-environment".to_owned()])
    );
    assert_eq!(accepted(&s, "main").await, Some(c1));

    // dev-bob may change what reaches only the preview-stage environment.
    repo.write("projects/api.yaml", &project("api", 1));
    repo.write(
        "envs/api-preview.yaml",
        &environment("api-staging", "api")
            .replace("stage: production", "stage: preview")
            .replace("pool: main}", "pool: main, replicas: {web: 2}}"),
    );
    let dev_ok = repo.commit_signed_by("scale staging", &dev_key);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(dev_ok));

    // ops-alice may roll production out.
    repo.write("projects/api.yaml", &project("api", 3));
    let by_ops = repo.commit("scale api", true);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(by_ops));
}

/// `pl image update`'s key, limited by the policy's `bots` to moving api's image: such a commit
/// is accepted; one by the same key that also scales api, touches a pool or moves another
/// project's image is refused (`principal-limited-to-images`), whatever path rules say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_key_may_move_its_projects_images_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    let bot_key = dir.path().join("bot");
    let bot_public = new_key(&bot_key);
    let signers = format!("{}image-bot {bot_public}", repo.signers);
    base_state(&repo);
    repo.write("projects/web.yaml", &project("web", 1));
    let c1 = repo.commit("first", true);
    let policy = "bots:\n  - principals: [image-bot]\n    images: [api]\n";
    let (s, _url) = shared(dir.path(), &repo, &signers, Some(policy)).await;
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(c1));
    let moved = |name: &str, replicas: u32, hex: &str| {
        project(name, replicas).replace(repo_support::DIGEST, &format!("sha256:{}", hex.repeat(64)))
    };
    let refused = |s: Arc<Reconciler>, sha: String| async move {
        s.pass().await.expect("pass");
        s.ledger
            .revisions()
            .revision("main", &sha)
            .await
            .expect("revision")
            .expect("judged")
    };

    // Its own kind of change: api's image, nothing else.
    repo.write("projects/api.yaml", &moved("api", 1, "a"));
    let bumped = repo.commit_signed_by("api: image 1.4.1", &bot_key);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(bumped.clone()));

    // The image and a replica count: refused, and nothing moves.
    repo.write("projects/api.yaml", &moved("api", 3, "b"));
    let forged = repo.commit_signed_by("api: image 1.4.2", &bot_key);
    let (verdict, codes) = refused(Arc::clone(&s), forged).await;
    assert_eq!(
        (verdict.as_str(), codes),
        ("rejected", vec!["principal-limited-to-images".to_owned()])
    );
    // Another file it has no business in (no path rule guards it).
    repo.write("projects/api.yaml", &moved("api", 1, "a"));
    repo.write(
        "pools/main.yaml",
        &repo_support::POOL.replace("region: eu", "region: us"),
    );
    let forged = repo.commit_signed_by("a pool, quietly", &bot_key);
    let (_, codes) = refused(Arc::clone(&s), forged).await;
    assert_eq!(codes, ["principal-limited-to-images"]);
    // Another project's image.
    repo.write("pools/main.yaml", repo_support::POOL);
    repo.write("projects/web.yaml", &moved("web", 1, "c"));
    let forged = repo.commit_signed_by("web: image", &bot_key);
    let (_, codes) = refused(Arc::clone(&s), forged).await;
    assert_eq!(codes, ["principal-limited-to-images"]);
    assert_eq!(accepted(&s, "main").await, Some(bumped));
    // A person's key is not limited by it.
    let by_ops = repo.commit("web's image, by ops", true);
    s.pass().await.expect("pass");
    assert_eq!(accepted(&s, "main").await, Some(by_ops));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_branch_cannot_widen_its_own_preview_settings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    base_state(&repo);
    repo.commit("first", true);
    repo.git(&["checkout", "-q", "-b", "feature/long"]);
    // The branch asks for a preview that lives a year.
    let root = std::fs::read_to_string(repo.dir.join("pushleft.yaml")).expect("root");
    repo.write("pushleft.yaml", &root.replace("ttlHours: 24", "ttlHours: 8760"));
    let p = repo.commit("longer previews", true);
    repo.git(&["checkout", "-q", "main"]);
    let (s, url) = shared(dir.path(), &repo, &repo.signers, None).await;
    s.pass().await.expect("pass");
    assert_eq!(
        s.ledger
            .revisions()
            .revision("feature/long", &p)
            .await
            .expect("revision"),
        Some(("accepted".into(), vec![]))
    );
    let committed_ms: i64 = repo
        .git(&["show", "-s", "--format=%ct", &p])
        .parse::<i64>()
        .expect("time")
        * 1000;
    let expiry = rows(
        &url,
        "SELECT DISTINCT expires_at FROM deployments WHERE branch = 'feature/long'",
    )
    .await;
    assert_eq!(
        expiry,
        [(committed_ms + 24 * 3_600_000).to_string()],
        "main's accepted ttlHours (24) applies, not the branch's (8760)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_backlog_is_judged_in_bounded_slices_and_previews_wait_for_the_applied_branch() {
    use reconciler::reconcile::MAX_JUDGED_PER_PASS;
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    base_state(&repo);
    repo.commit("first", true);
    let (s, _url) = shared(dir.path(), &repo, &repo.signers, None).await;
    s.pass_bounded().await.expect("pass");
    let backlog = MAX_JUDGED_PER_PASS + 8;
    let mut last = String::new();
    for i in 0..backlog {
        repo.write("projects/api.yaml", &project("api", 2 + (i % 3) as u32));
        repo.write("notes.txt", &format!("{i}\n"));
        last = repo.commit(&format!("change {i}"), true);
    }
    repo.git(&["checkout", "-q", "-b", "feature/login"]);
    repo.write("projects/web.yaml", &project("web", 1));
    let preview = repo.commit("preview work", true);
    repo.git(&["checkout", "-q", "main"]);

    let first = s.pass_bounded().await.expect("first slice");
    assert_eq!(first.judged, MAX_JUDGED_PER_PASS, "{first:?}");
    assert!(first.more, "a slice says more waits: {first:?}");
    assert_ne!(accepted(&s, "main").await, Some(last.clone()));
    assert_eq!(accepted(&s, "feature/login").await, None, "the preview waits for main");

    let second = s.pass_bounded().await.expect("second slice");
    assert_eq!(second.judged, backlog - MAX_JUDGED_PER_PASS + 1, "{second:?}");
    assert!(!second.more, "{second:?}");
    assert_eq!(accepted(&s, "main").await, Some(last));
    assert_eq!(accepted(&s, "feature/login").await, Some(preview));
}
