//! `pl-reconciler run` as a real process over a real repository and a SQLite ledger: a new
//! commit is seen through the ref watch and its first job becomes leasable; the API refuses bad
//! tokens and low roles before doing anything; events page and stream from a cursor; webhooks
//! check signatures; the probes and metrics answer; SIGTERM stops it cleanly.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{Daemon, config, free_port, setup};
use reconciler::store::Ledger;
use reconciler::store::now_ms;
use repo_support::{Repo, environment, project};
use std::io::BufRead;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 2));
    repo.commit("pool and project", true);
    let s = setup(dir.path());
    daemon_support::write_private(&dir.path().join("github.secret"), "gh-s3cret\n");
    daemon_support::write_private(&dir.path().join("gitlab.token"), "gl-t0ken\n");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let webhooks = "[webhooks]\ngithub_secret_file = \"github.secret\"\ngitlab_token_file = \"gitlab.token\"\n";
    let cfg = config(&s, "d", &repo.dir, &url, port, webhooks);
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    assert_eq!(d.get("/healthz", None), (200, "ok\n".into()));

    // A new commit: the ref watch sees it, well before the 2 s interval would.
    let ledger = Ledger::connect(&url, 2).await.expect("ledger");
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    let started = Instant::now();
    repo.commit("environment", true);
    let leased = loop {
        let l = ledger.jobs().lease("n1", 1, 30_000, now_ms()).await.expect("lease");
        if !l.is_empty() || started.elapsed() > Duration::from_secs(10) {
            break l;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let seen_in = started.elapsed();
    assert_eq!(leased.len(), 1, "a job of the new commit is leasable");
    // The first step of generation 1: infrastructure on n1 (network, firewall or routes).
    let key = &leased[0].key;
    assert!(
        [
            "net:api-production:g1:ensure@n1",
            "fw:api-production:g1:apply@n1",
            "routes:api-production:g1:ensure@n1"
        ]
        .contains(&key.as_str()),
        "{key}"
    );
    assert!(
        seen_in < Duration::from_millis(1500),
        "seen through the watch, not the 2 s interval: {seen_in:?}"
    );

    // Refusals come first, with stable codes.
    let (code, body) = d.get("/v1/status", None);
    assert_eq!(code, 401);
    assert!(body.contains("\"bad-token\""), "{body}");
    let (code, body) = d.get("/v1/jobs", Some("plt_not-a-real-token"));
    assert_eq!((code, body.contains("\"bad-token\"")), (401, true));
    let viewer = format!("Bearer {}", s.viewer);
    let (code, body) = d.post("/v1/reconcile", &[("authorization", viewer.as_str())], b"");
    assert_eq!((code, body.contains("\"insufficient-role\"")), (403, true), "{body}");
    // Logs are the application's data: a viewer may not read them.
    let (code, body) = d.get("/v1/logs?environment=api-production&role=web", Some(&s.viewer));
    assert_eq!((code, body.contains("\"insufficient-role\"")), (403, true), "{body}");
    let (code, body) = d.get("/v1/logs?environment=nope&role=web", Some(&s.operator));
    assert_eq!(
        (code, body.contains("\"environment-not-running\"")),
        (404, true),
        "{body}"
    );
    let operator = format!("Bearer {}", s.operator);
    let (code, _) = d.post("/v1/reconcile", &[("authorization", operator.as_str())], b"");
    assert_eq!(code, 202);

    // Reads.
    let (code, body) = d.get("/v1/status", Some(&s.viewer));
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(status["leader"], true, "SQLite: the one daemon leads");
    assert_eq!(status["counts"]["revisions"]["accepted"], 2, "{body}");
    let (_, body) = d.get("/v1/revisions?branch=main", Some(&s.viewer));
    let revs: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(revs["revisions"].as_array().map(Vec::len), Some(2));
    let (_, body) = d.get("/v1/jobs?state=leased", Some(&s.viewer));
    assert!(body.contains(&leased[0].key), "{body}");
    let (_, body) = d.get("/v1/deployments?limit=1", Some(&s.viewer));
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(page["deployments"][0]["environment"], "api-production", "{body}");
    assert_eq!(page["next"], "api-production", "a full page names the next cursor");
    let (_, body) = d.get("/v1/deployments?after=api-production", Some(&s.viewer));
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (page["deployments"].as_array().map(Vec::len), &page["next"]),
        (Some(0), &serde_json::Value::Null)
    );

    // One environment as its own resource: the same row, typed on both ends; an unknown one
    // is a typed 404; with its ETag and `waitMs`, an unchanged environment answers 304 once
    // the wait is over (and not before), a changed one at once.
    let (code, etag, body) = d.get_with("/v1/environments/api-production", &s.viewer, &[]);
    assert_eq!(code, 200, "{body}");
    let one: operator_proto::Deployment = serde_json::from_str(&body).expect("typed");
    let listed: operator_proto::DeploymentsPage =
        serde_json::from_str(&d.get("/v1/deployments", Some(&s.viewer)).1).expect("typed page");
    assert_eq!(
        Some(&one),
        listed.deployments.iter().find(|x| x.environment == "api-production")
    );
    let etag = etag.expect("an ETag");
    let (code, _, body) = d.get_with("/v1/environments/nowhere", &s.viewer, &[]);
    let error: operator_proto::ErrorBody = serde_json::from_str(&body).expect("typed error");
    assert_eq!((code, error.code.as_str()), (404, "environment-unknown"), "{body}");
    let (code, _, _) = d.get_with("/v1/environments/api-production", "not-a-token", &[]);
    assert_eq!(code, 401);
    let asked = std::time::Instant::now();
    let (code, again, _) = d.get_with(
        "/v1/environments/api-production?waitMs=600",
        &s.viewer,
        &[("if-none-match", etag.as_str())],
    );
    let waited = asked.elapsed();
    assert_eq!((code, again.as_deref()), (304, Some(etag.as_str())));
    assert!(waited >= std::time::Duration::from_millis(550), "it waited: {waited:?}");
    let (code, _, _) = d.get_with(
        "/v1/environments/api-production?waitMs=5000",
        &s.viewer,
        &[("if-none-match", "\"another\"")],
    );
    assert_eq!(code, 200, "what the follower saw differs: answered at once");

    // Events page by cursor; the stream resumes from one.
    let (_, body) = d.get("/v1/events?after=0&limit=3", Some(&s.viewer));
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    let events = page["events"].as_array().expect("events");
    assert_eq!(events.len(), 3);
    let cursor = page["next"].as_i64().expect("next");
    assert_eq!(Some(cursor), events[2]["id"].as_i64());
    let (_, body) = d.get(&format!("/v1/events?after={cursor}&limit=1"), Some(&s.viewer));
    let next: serde_json::Value = serde_json::from_str(&body).expect("json");
    let fourth = next["events"][0]["id"].as_i64().expect("id");
    assert!(fourth > cursor);
    let (code, reader) = d.stream(&format!("/v1/events/stream?after={cursor}"), &s.viewer);
    assert_eq!(code, 200);
    let sse = std::thread::spawn(move || {
        let mut ids = Vec::new();
        for line in reader.expect("a stream").lines() {
            let line = line.expect("a line within the stream's time bound");
            if let Some(id) = line.strip_prefix("id:") {
                ids.push(id.trim().parse::<i64>().expect("numeric id"));
                if ids.len() == 2 {
                    break;
                }
            }
        }
        ids
    });
    let ids = sse.join().expect("stream thread");
    assert_eq!(ids[0], fourth, "the stream starts right after the cursor");
    assert!(ids[1] > ids[0]);

    // Webhooks: GitHub's HMAC and GitLab's token; a bad one is refused.
    let body = br#"{"ref":"refs/heads/main"}"#;
    let sig = reconciler::auth::github_signature(b"gh-s3cret", body);
    assert_eq!(
        d.post("/v1/webhooks/github", &[("x-hub-signature-256", sig.as_str())], body)
            .0,
        202
    );
    let bad = reconciler::auth::github_signature(b"wrong", body);
    let (code, resp) = d.post("/v1/webhooks/github", &[("x-hub-signature-256", bad.as_str())], body);
    assert_eq!((code, resp.contains("bad-webhook-signature")), (401, true));
    assert_eq!(
        d.post("/v1/webhooks/gitlab", &[("x-gitlab-token", "gl-t0ken")], body).0,
        202
    );
    assert_eq!(
        d.post("/v1/webhooks/gitlab", &[("x-gitlab-token", "nope")], body).0,
        401
    );
    let (code, resp) = d.post("/v1/webhooks/gitea", &[("x-gitea-signature", "00")], body);
    assert_eq!((code, resp.contains("webhook-not-configured")), (404, true));
    let big = vec![b'x'; reconciler::http::server::MAX_BODY_BYTES + 1];
    assert_eq!(
        d.post("/v1/webhooks/github", &[("x-hub-signature-256", sig.as_str())], &big)
            .0,
        413,
        "bodies are bounded"
    );

    // Probes and metrics.
    let (code, body) = d.get("/readyz", None);
    assert_eq!(code, 200, "{body}");
    // Metrics are the values of the last pass (a scrape costs no query): the job leased
    // above shows once a pass has run since (the interval is 2 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (code, metrics) = d.get("/metrics", None);
        assert_eq!(code, 200);
        if metrics.contains("pushleft_jobs{state=\"leased\"} 1") || Instant::now() > deadline {
            break metrics;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for want in [
        "pushleft_revisions_total{verdict=\"accepted\"} 2",
        "pushleft_jobs{state=\"leased\"} 1",
        "pushleft_reconcile_duration_seconds_count",
        "pushleft_queue_age_seconds",
        "pushleft_leader 1",
    ] {
        assert!(metrics.contains(want), "{want} missing from:\n{metrics}");
    }

    // No token or secret ever reaches the log.
    let log = std::fs::read_to_string(&d.log).expect("log");
    for secret in [s.viewer.as_str(), s.operator.as_str(), "gh-s3cret", "gl-t0ken"] {
        assert!(!log.contains(secret), "a secret leaked into the log");
    }
    assert!(
        log.lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()),
        "JSON logs"
    );
    // A follower's long poll on the events: an empty page waits out `waitMs`, and a new event
    // (a commit's verdict) answers it at once.
    let (_, body) = d.get("/v1/events?after=0&limit=1000", Some(&s.viewer));
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    let tip = page["next"].as_i64().expect("next");
    let asked = Instant::now();
    let (code, body) = d.get(&format!("/v1/events?after={tip}&waitMs=400"), Some(&s.viewer));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"events\":[]"), "{body}");
    assert!(
        asked.elapsed() >= Duration::from_millis(350),
        "waited: {:?}",
        asked.elapsed()
    );
    let (answered, waited) = std::thread::scope(|scope| {
        let poll = scope.spawn(|| {
            let asked = Instant::now();
            let answer = d.get(&format!("/v1/events?after={tip}&waitMs=20000"), Some(&s.viewer));
            (answer, asked.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        repo.write("projects/api.yaml", &project("api", 3));
        repo.commit("three replicas", true);
        poll.join().expect("the poll")
    });
    assert_eq!(answered.0, 200, "{}", answered.1);
    assert!(answered.1.contains("revision-accepted"), "{}", answered.1);
    assert!(
        waited < Duration::from_secs(10),
        "answered by the event, not the wait: {waited:?}"
    );
    assert!(d.term().success(), "SIGTERM stops the daemon cleanly");
    ledger.close().await;
}

#[test]
fn a_bad_config_is_refused_with_its_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[source]\npath = \"x\"\nbranchh = \"main\"\n").expect("write");
    for cmd in ["run", "migrate", "check-config"] {
        let o = std::process::Command::new(daemon_support::bin())
            .args([cmd, "--config"])
            .arg(&cfg)
            .output()
            .expect("runs");
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("bad.toml:3:1: unknown field `branchh`"), "{cmd}: {err}");
        assert!(err.contains("[config-malformed]"), "{err}");
    }
}

/// A remote source: a bare repository reached by URL, cloned and fetched with gix. With an
/// hour-long fetch interval, only the webhook can make a pushed commit appear within seconds;
/// a preview branch deleted on the remote is torn down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_source_fetches_on_webhook() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 1));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    let first = repo.commit("first", true);
    let bare = dir.path().join("remote.git");
    repo_support::git(
        dir.path(),
        &[
            "clone",
            "-q",
            "--bare",
            repo.dir.to_str().expect("utf-8"),
            bare.to_str().expect("utf-8"),
        ],
    );
    repo.git(&["remote", "add", "origin", bare.to_str().expect("utf-8")]);
    let s = setup(dir.path());
    daemon_support::write_private(&dir.path().join("gitea.secret"), "gt-s3cret");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let remote = format!("file://{}", bare.display());
    let cfg_path = config(
        &s,
        "r",
        &repo.dir,
        &url,
        port,
        "[webhooks]\ngitea_secret_file = \"gitea.secret\"\n",
    );
    let text = std::fs::read_to_string(&cfg_path).expect("config").replace(
        &format!("path = {:?}\n", repo.dir),
        &format!("url = {remote:?}\ncache_dir = \"cache\"\nfetch_interval_seconds = 3600\n"),
    );
    std::fs::write(&cfg_path, text).expect("config");
    let mut d = Daemon::start(&s, &cfg_path, port);
    d.wait_ready(Duration::from_secs(20));
    let ledger = Ledger::connect(&url, 2).await.expect("ledger");
    let log = d.log.clone();
    let wait_for = |branch: &'static str, sha: String| {
        let (ledger, log) = (&ledger, &log);
        async move {
            let start = Instant::now();
            while ledger.revisions().last_judged(branch).await.expect("judged").as_deref() != Some(sha.as_str()) {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "{branch} never reached {sha}: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for("main", first).await;

    // Push a commit and a preview branch; only the webhook announces them.
    repo.write("projects/api.yaml", &project("api", 2));
    let second = repo.commit("second", true);
    repo.git(&["branch", "feature/remote"]);
    repo.git(&["push", "-q", "origin", "main", "feature/remote"]);
    let body = br#"{"ref":"refs/heads/main"}"#;
    let sig = reconciler::auth::github_signature(b"gt-s3cret", body);
    let gitea = sig.trim_start_matches("sha256=");
    assert_eq!(
        d.post("/v1/webhooks/gitea", &[("x-gitea-signature", gitea)], body).0,
        202
    );
    wait_for("main", second.clone()).await;
    wait_for("feature/remote", second).await;
    let deployments = ledger
        .views()
        .deployments(None, 1000, reconciler::store::now_ms())
        .await
        .expect("deployments");
    assert!(
        deployments
            .iter()
            .any(|d| d.environment == "feature-remote--api" && d.action == "rollout")
    );

    // Deleting the branch on the remote tears its environment down.
    repo.git(&["push", "-q", "origin", "--delete", "feature/remote"]);
    assert_eq!(
        d.post("/v1/webhooks/gitea", &[("x-gitea-signature", gitea)], body).0,
        202
    );
    let start = Instant::now();
    loop {
        let deployments = ledger
            .views()
            .deployments(None, 1000, reconciler::store::now_ms())
            .await
            .expect("deployments");
        if deployments
            .iter()
            .any(|d| d.environment == "feature-remote--api" && d.action == "teardown")
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no teardown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(d.term().success());
    ledger.close().await;
}

/// Two daemons on one SQLite file: the second stands by (a lock on `<ledger>.leader`) and takes
/// over when the first is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_one_sqlite_file_stands_by() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.commit("first", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (pa, pb) = (free_port(), free_port());
    let mut a = Daemon::start(&s, &config(&s, "a", &repo.dir, &url, pa, ""), pa);
    a.wait_ready(Duration::from_secs(20));
    let start = Instant::now();
    while !a.is_leader(&s.viewer) {
        assert!(start.elapsed() < Duration::from_secs(10), "a never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut b = Daemon::start(&s, &config(&s, "b", &repo.dir, &url, pb, ""), pb);
    b.wait_ready(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_leader(&s.viewer), "one leader per ledger file");
    a.kill9();
    let killed = Instant::now();
    while !b.is_leader(&s.viewer) {
        assert!(killed.elapsed() < Duration::from_secs(5), "no takeover within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(b.term().success());
}

/// A webhook secret file that cannot be read stops the start, before anything is served.
#[test]
fn a_missing_webhook_secret_stops_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let cfg = config(
        &s,
        "w",
        &repo.dir,
        &url,
        free_port(),
        "[webhooks]\ngithub_secret_file = \"nope.secret\"\n",
    );
    let o = std::process::Command::new(daemon_support::bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .expect("runs");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nope.secret"), "{err}");
}
