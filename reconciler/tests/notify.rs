//! Feedback to the forge and to webhook receivers, against real HTTP receivers on loopback that
//! answer like each forge's API (status codes and bodies from their documentation): GitHub's
//! `POST /repos/{owner}/{repo}/statuses/{sha}` (201, 401 "Bad credentials"), Gitea's (201) and
//! GitLab's `POST /projects/{id}/statuses/{sha}` (201, and 400 "Cannot transition status" for a
//! state the commit has already). Commit statuses follow rollouts, failures and rollbacks in
//! order; a webhook receiver that is down and then up receives every event once, in order,
//! signed; a receiver that refuses for good leaves a dead letter with its reason.

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
use reconciler::notify::{self, Targets};
use reconciler::reconcile::Reconciler;
use reconciler::store::{Ledger, now_ms};
use repo_support::{Repo, environment};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request a receiver took: path, headers (lowercase names), body.
#[derive(Clone, Debug)]
struct Got {
    path: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("a JSON body")
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    GitHub,
    Gitea,
    GitLab,
    Hook,
}

/// An HTTP/1.1 receiver on a loopback port: records each request and answers as `api` does.
struct Receiver {
    port: u16,
    got: Arc<Mutex<Vec<Got>>>,
    stop: Arc<AtomicBool>,
    down: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const TOKEN: &str = "forge-t0ken-never-logged";
const HOOK_SECRET: &str = "hook-secret";

fn read_request(stream: &mut std::net::TcpStream) -> Option<Got> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':')?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len.min(1 << 20)];
    reader.read_exact(&mut body).ok()?;
    Some(Got {
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// What `api` answers to `got`, given what it took before.
fn answer(api: Api, got: &Got, before: &[Got]) -> (u16, String) {
    match api {
        Api::GitHub => {
            if got.header("authorization") != Some(&format!("Bearer {TOKEN}")) {
                return (
                    401,
                    r#"{"message":"Bad credentials","documentation_url":"https://docs.github.com/rest"}"#.into(),
                );
            }
            let b = got.json();
            let body = serde_json::json!({"url": format!("https://api.github.invalid{}", got.path), "id": before.len() + 1,
                "state": b["state"], "description": b["description"], "context": b["context"]});
            (201, body.to_string())
        }
        Api::Gitea => {
            if got.header("authorization") != Some(&format!("token {TOKEN}")) {
                return (401, r#"{"message":"token is required"}"#.into());
            }
            let b = got.json();
            (
                201,
                serde_json::json!({"id": before.len() + 1, "status": b["state"], "context": b["context"]}).to_string(),
            )
        }
        Api::GitLab => {
            if got.header("private-token") != Some(TOKEN) {
                return (401, r#"{"message":"401 Unauthorized"}"#.into());
            }
            let b = got.json();
            let same = before
                .iter()
                .any(|p| p.path == got.path && p.json()["name"] == b["name"] && p.json()["state"] == b["state"]);
            if same {
                let state = b["state"].as_str().unwrap_or("?");
                return (
                    400,
                    format!(
                        r#"{{"message":"Cannot transition status via :enqueue from :{state} (Reason(s): Status cannot transition via \"enqueue\".)"}}"#
                    ),
                );
            }
            (
                201,
                serde_json::json!({"id": before.len() + 1, "status": b["state"], "name": b["name"]}).to_string(),
            )
        }
        Api::Hook => {
            let want = forge::hook::signature(&forge::Secret::new(HOOK_SECRET.into()), got.body.as_bytes());
            if got.header("x-pushleft-signature-256") != Some(want.as_str()) {
                return (401, "bad signature".into());
            }
            (204, String::new())
        }
    }
}

impl Receiver {
    /// A receiver on a port of its own (bound here, so no other test can take it meanwhile).
    fn start(api: Api) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let (got, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let down = Arc::new(AtomicBool::new(false));
        let thread = {
            let (got, stop, down) = (Arc::clone(&got), Arc::clone(&stop), Arc::clone(&down));
            std::thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(120);
                let mut served = 0;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until && served < 1000 {
                    let Ok((mut stream, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    served += 1;
                    if down.load(Ordering::Relaxed) {
                        // Down: the connection is closed before a byte is read or written.
                        drop(stream);
                        continue;
                    }
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let Some(req) = read_request(&mut stream) else { continue };
                    let (code, body) = {
                        let mut list = got.lock().expect("lock");
                        let a = answer(api, &req, &list);
                        list.push(req);
                        a
                    };
                    let text = match code {
                        201 => "Created",
                        204 => "No Content",
                        400 => "Bad Request",
                        _ => "Unauthorized",
                    };
                    let _ = write!(
                        stream,
                        "HTTP/1.1 {code} {text}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            })
        };
        Receiver {
            port,
            got,
            stop,
            down,
            thread: Some(thread),
        }
    }

    /// Down (every connection closed at once) or up.
    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }

    fn port(&self) -> u16 {
        self.port
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().expect("lock").clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

use test_ports::free_port;

fn private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

fn project(digest: char) -> String {
    let d: String = std::iter::repeat_n(digest, 64).collect();
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@sha256:{d}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}, replicas: 1}}\n"
    )
}

/// Collects and delivers until every row is delivered or dead, or `within` passed.
async fn drain(ledger: &Ledger, targets: &Arc<Targets>, within: Duration) {
    let until = Instant::now() + within;
    notify::collect(ledger, targets).await.expect("collect");
    while Instant::now() < until {
        notify::deliver(ledger, targets).await.expect("deliver");
        if ledger
            .events()
            .outbox(Some("pending"), 10)
            .await
            .expect("outbox")
            .is_empty()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (state, description) of each status posted for `sha`, in order.
fn statuses(r: &Receiver, sha: &str) -> Vec<(String, String)> {
    r.got()
        .iter()
        .filter(|g| g.path.ends_with(sha))
        .map(|g| {
            let b = g.json();
            assert_eq!(b["context"], "pushleft/api-production");
            (
                b["state"].as_str().unwrap_or("?").to_owned(),
                b["description"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

async fn scenario(url: String, dir: &Path) {
    let github = Receiver::start(Api::GitHub);
    let github_port = github.port();
    let hook = Receiver::start(Api::Hook);
    hook.set_down(true);
    let hook_port = hook.port();
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    private(&dir.join("forge-token"), TOKEN);
    private(&dir.join("hook-secret"), HOOK_SECRET);
    let text = format!(
        "[source]\npath = {:?}\n\n[trust]\nallowed_signers = \"allowed_signers\"\n\n[ledger]\nurl = {url:?}\n\n[api]\nlisten = \"127.0.0.1:0\"\ntls_cert = \"api.crt\"\ntls_key = \"api.key\"\n\n\
         [forge]\nkind = \"github\"\napi = \"http://127.0.0.1:{github_port}\"\nrepository = \"acme/infra\"\ntoken_file = \"forge-token\"\n\n\
         [[hooks]]\nurl = \"http://127.0.0.1:{hook_port}/pushleft\"\nsecret_file = \"hook-secret\"\n",
        repo.dir
    );
    std::fs::write(dir.join("reconciler.toml"), text).expect("config");
    let config = reconciler::config::Config::load(&dir.join("reconciler.toml")).expect("config loads");
    let targets = Arc::new(Targets::of(&config));
    let ledger = Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n1"]).await;
    let shared = Arc::new(Reconciler::new(Arc::new(config), Arc::new(ledger), Arc::default()).expect("shared"));
    let ledger = &shared.ledger;
    // The first round starts at the newest event: history is not replayed.
    notify::collect(ledger, &targets).await.expect("collect");

    repo.write("projects/api.yaml", &project('a'));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    let a = repo.commit("release a", true);
    converge(&shared).await;
    repo.write("projects/api.yaml", &project('b'));
    let b = repo.commit("release b", true);
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
        .expect("asked");
    converge(&shared).await;
    // The hook receiver is down throughout: the forge's statuses are not held up by it.
    drain(ledger, &targets, Duration::from_secs(3)).await;
    let live = "live: generation 1 on every replica".to_owned();
    assert_eq!(
        statuses(&github, &a),
        [
            ("pending".into(), "rolling out generation 1".into()),
            ("success".into(), live)
        ]
    );
    assert_eq!(
        statuses(&github, &b),
        [
            ("pending".to_owned(), "rolling out generation 2".to_owned()),
            ("success".into(), "live: generation 2 on every replica".into()),
            ("failure".into(), "rolled back by ops".into())
        ],
        "the rollback's own generation posts nothing for the commit it rolled back"
    );
    let first = &github.got()[0];
    assert_eq!(first.path, format!("/repos/acme/infra/statuses/{a}"));
    assert_eq!(first.header("accept"), Some("application/vnd.github+json"));
    let pending = ledger.events().outbox(Some("pending"), 100).await.expect("outbox");
    assert!(
        !pending.is_empty() && pending.iter().all(|r| r.target == "hook:0"),
        "{pending:?}"
    );
    let head = pending.iter().min_by_key(|r| r.id).expect("a head");
    assert!(
        head.attempts > 0 && !head.last_error.is_empty(),
        "the head was tried: {head:?}"
    );
    assert!(
        pending.iter().filter(|r| r.id != head.id).all(|r| r.attempts == 0),
        "the rest wait behind it"
    );

    // The receiver comes up: every event it asked for arrives once, in order, signed.
    hook.set_down(false);
    drain(ledger, &targets, Duration::from_secs(60)).await;
    let got = hook.got();
    let events: Vec<(String, String)> = got
        .iter()
        .map(|g| {
            (
                g.header("x-pushleft-event").unwrap_or("?").to_owned(),
                g.json()["detail"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            ("deployment-rollout-done".to_owned(), "generation 1".to_owned()),
            ("deployment-rollout-done".into(), "generation 2".into()),
            (
                "deployment-rollback".into(),
                "generation 3: generation 1's release again, rolled back from 2 by ops".into()
            ),
            ("deployment-rollout-done".into(), "generation 3, a rollback".into()),
        ]
    );
    let ids: Vec<&str> = got.iter().filter_map(|g| g.header("x-pushleft-delivery")).collect();
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(ids, unique, "each delivered once");
    assert!(
        ledger
            .events()
            .outbox(Some("dead"), 10)
            .await
            .expect("outbox")
            .is_empty()
    );

    // A token the forge refuses: the status is a dead letter with the forge's reason, and the
    // token is in no row.
    private(&dir.join("forge-token"), "revoked");
    repo.write("projects/api.yaml", &project('c'));
    repo.commit("release c", true);
    converge(&shared).await;
    drain(ledger, &targets, Duration::from_secs(5)).await;
    let dead = ledger.events().outbox(Some("dead"), 10).await.expect("outbox");
    assert!(
        !dead.is_empty()
            && dead.iter().all(|r| r.target == "forge"
                && r.last_error.starts_with("401")
                && r.last_error.contains("Bad credentials")),
        "{dead:?}"
    );
    let everything = rows(&url, "SELECT payload || last_error FROM outbox").await.join("\n");
    assert!(!everything.contains(TOKEN) && !everything.contains("revoked") && !everything.contains(HOOK_SECRET));
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

/// Each forge's API, called by `forge::send` for real: the path, the token header and the
/// state words each takes, and GitLab's answer to a state the commit has already.
#[test]
fn each_forges_api_takes_its_own_call() {
    use forge::status::{CommitStatus, Forge, Kind, State};
    let sha = "c".repeat(40);
    let status = |state| CommitStatus {
        sha: sha.clone(),
        context: "pushleft/web".into(),
        state,
        description: "live".into(),
        target_url: None,
    };
    for (api, kind, base) in [
        (Api::GitHub, Kind::GitHub, ""),
        (Api::Gitea, Kind::Gitea, "/api/v1"),
        (Api::GitLab, Kind::GitLab, "/api/v4"),
    ] {
        let r = Receiver::start(api);
        let port = r.port();
        let forge = Forge::new(
            kind,
            &format!("http://127.0.0.1:{port}{base}"),
            "acme/web",
            forge::Secret::new(TOKEN.into()),
        )
        .expect("forge");
        for state in [State::Pending, State::Failure, State::Failure] {
            let request = forge.request(&status(state)).expect("request");
            assert_eq!(
                forge::send(&request, |c, b| forge.judge(c, b)),
                forge::Outcome::Delivered
            );
        }
        let got = r.got();
        let path = match kind {
            Kind::GitLab => format!("/api/v4/projects/acme%2Fweb/statuses/{sha}"),
            Kind::Gitea => format!("/api/v1/repos/acme/web/statuses/{sha}"),
            Kind::GitHub => format!("/repos/acme/web/statuses/{sha}"),
        };
        assert!(got.iter().all(|g| g.path == path), "{path}");
        let failure = if kind == Kind::GitLab { "failed" } else { "failure" };
        assert_eq!(got[1].json()["state"], failure);
        let wrong = Forge::new(
            kind,
            &format!("http://127.0.0.1:{port}{base}"),
            "acme/web",
            forge::Secret::new("wrong".into()),
        )
        .expect("forge");
        let request = wrong.request(&status(State::Success)).expect("request");
        assert!(
            matches!(forge::send(&request, |c, b| wrong.judge(c, b)), forge::Outcome::Refused(r) if r.starts_with("401"))
        );
    }
    // Nobody listening: worth retrying.
    let forge = Forge::new(
        Kind::GitHub,
        &format!("http://127.0.0.1:{}", free_port()),
        "a/b",
        forge::Secret::new(TOKEN.into()),
    )
    .expect("forge");
    let request = forge.request(&status(State::Pending)).expect("request");
    assert!(matches!(
        forge::send(&request, |c, b| forge.judge(c, b)),
        forge::Outcome::Retry(_)
    ));
}
