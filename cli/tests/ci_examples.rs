//! `examples/ci/`: the pipelines' `pl` lines run as written against a real repository, and
//! `post-plan-comments` keeps one set of plan comments on a forge that answers on loopback like
//! GitHub's, Gitea's and GitLab's APIs (their documented paths, methods, statuses and bodies).

mod common;
use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

const TOKEN: &str = "forge-token-for-tests";

#[derive(Clone, Copy, PartialEq)]
enum Forge {
    GitHub,
    Gitea,
    GitLab,
}

#[derive(Default)]
struct Comments {
    next: u64,
    /// (id, body), oldest first.
    list: Vec<(u64, String)>,
    /// "METHOD path" of every request, in order.
    seen: Vec<String>,
}

/// A forge on loopback: one pull (merge) request, number 7, and its comments.
struct FakeForge {
    api: String,
    state: Arc<Mutex<Comments>>,
}

impl FakeForge {
    fn start(forge: Forge) -> FakeForge {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(Mutex::new(Comments {
            next: 100,
            ..Comments::default()
        }));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = serve(forge, stream, &shared);
            }
        });
        let api = match forge {
            Forge::GitHub => format!("http://127.0.0.1:{port}"),
            Forge::Gitea => format!("http://127.0.0.1:{port}/api/v1"),
            Forge::GitLab => format!("http://127.0.0.1:{port}/api/v4"),
        };
        FakeForge { api, state }
    }

    fn comment(&self, body: &str) -> u64 {
        let mut s = self.state.lock().expect("lock");
        s.next += 1;
        let id = s.next;
        s.list.push((id, body.to_owned()));
        id
    }

    fn comments(&self) -> Vec<(u64, String)> {
        self.state.lock().expect("lock").list.clone()
    }

    fn seen(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().expect("lock").seen)
    }
}

/// One request on `stream` (curl sends one per connection here), answered as the forge would.
fn serve(forge: Forge, stream: std::net::TcpStream, state: &Mutex<Comments>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_owned(),
        parts.next().unwrap_or("").to_owned(),
    );
    let (mut length, mut authorised) = (0usize, false);
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (name, value) = h.split_once(':').unwrap_or((h, ""));
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().unwrap_or(0),
            "authorization" if forge != Forge::GitLab => authorised = value == format!("token {TOKEN}"),
            "private-token" if forge == Forge::GitLab => authorised = value == TOKEN,
            _ => {}
        }
    }
    let mut body = vec![0; length.min(1 << 20)];
    reader.read_exact(&mut body)?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let page: usize = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("page="))
        .and_then(|p| p.parse().ok())
        .unwrap_or(1);
    let mut s = state.lock().expect("lock");
    s.seen.push(format!("{method} {path}"));
    let (list, one) = match forge {
        Forge::GitHub => (
            "/repos/acme/state/issues/7/comments",
            "/repos/acme/state/issues/comments/",
        ),
        Forge::Gitea => (
            "/api/v1/repos/acme/state/issues/7/comments",
            "/api/v1/repos/acme/state/issues/comments/",
        ),
        Forge::GitLab => (
            "/api/v4/projects/42/merge_requests/7/notes",
            "/api/v4/projects/42/merge_requests/7/notes/",
        ),
    };
    let edit = if forge == Forge::GitLab { "PUT" } else { "PATCH" };
    let new_body = || -> Option<String> {
        serde_json::from_slice::<Value>(&body).ok()?["body"]
            .as_str()
            .map(str::to_owned)
    };
    let as_json = |id: u64, body: &str| json!({"id": id, "body": body});
    let (status, answer) = if !authorised {
        match forge {
            Forge::GitLab => (401, json!({"message": "401 Unauthorized"})),
            _ => (401, json!({"message": "Bad credentials"})),
        }
    } else if path == list && method == "GET" {
        let all: Vec<Value> = s.list.iter().map(|(id, b)| as_json(*id, b)).collect();
        let page: Vec<Value> = all.into_iter().skip((page - 1) * 100).take(100).collect();
        (200, Value::Array(page))
    } else if path == list && method == "POST" {
        match new_body() {
            Some(b) => {
                s.next += 1;
                let id = s.next;
                s.list.push((id, b.clone()));
                (201, as_json(id, &b))
            }
            None => (422, json!({"message": "body is missing"})),
        }
    } else if let Some(id) = path.strip_prefix(one).and_then(|i| i.parse::<u64>().ok()) {
        let at = s.list.iter().position(|(i, _)| *i == id);
        match (method.as_str(), at) {
            (m, Some(at)) if m == edit => match new_body() {
                Some(b) => {
                    s.list[at].1 = b.clone();
                    (200, as_json(id, &b))
                }
                None => (422, json!({"message": "body is missing"})),
            },
            ("DELETE", Some(at)) => {
                s.list.remove(at);
                (204, Value::Null)
            }
            _ => (404, json!({"message": "Not Found"})),
        }
    } else {
        (404, json!({"message": "Not Found"}))
    };
    drop(s);
    let text = if status == 204 {
        String::new()
    } else {
        answer.to_string()
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    out.flush()
}

fn script() -> PathBuf {
    workspace().join("examples/ci/post-plan-comments")
}

/// `post-plan-comments` for `forge` with `dir`'s parts and `token`.
fn post(forge: Forge, fake: &FakeForge, dir: &Path, token: &str) -> Output {
    let name = match forge {
        Forge::GitHub => "github",
        Forge::Gitea => "gitea",
        Forge::GitLab => "gitlab",
    };
    let mut c = Command::new("bash");
    c.arg(script()).arg(name).arg(dir);
    match forge {
        Forge::GitHub | Forge::Gitea => {
            let api = if forge == Forge::Gitea {
                "GITEA_API_URL"
            } else {
                "GITHUB_API_URL"
            };
            c.env(api, &fake.api)
                .env("GITHUB_REPOSITORY", "acme/state")
                .env("PR_NUMBER", "7")
                .env("GITHUB_TOKEN", token);
        }
        Forge::GitLab => {
            c.env("CI_API_V4_URL", &fake.api)
                .env("CI_PROJECT_ID", "42")
                .env("CI_MERGE_REQUEST_IID", "7")
                .env("GITLAB_TOKEN", token);
        }
    }
    run(&mut c)
}

fn parts(dir: &Path, bodies: &[&str]) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("dir");
    for (i, b) in bodies.iter().enumerate() {
        std::fs::write(
            dir.join(format!("plan-{}.md", i + 1)),
            format!("<!-- pushleft-plan part {}/{} -->\n{b}\n", i + 1, bodies.len()),
        )
        .expect("part");
    }
}

#[test]
fn plan_comments_are_kept_as_one_set_on_github_gitea_and_gitlab() {
    for forge in [Forge::GitHub, Forge::Gitea, Forge::GitLab] {
        let fake = FakeForge::start(forge);
        let foreign = fake.comment("LGTM, but see the <!-- pushleft-plan part 1/1 --> below");
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("plan-comment");

        // First push: two parts, two new comments; the reviewer's comment is not ours.
        parts(&dir, &["first, part one", "first, part two"]);
        let o = post(forge, &fake, &dir, TOKEN);
        assert!(o.status.success(), "{}", stderr(&o));
        let c = fake.comments();
        assert_eq!(c.len(), 3, "{c:?}");
        assert_eq!(c[0].0, foreign);
        assert!(
            c[1].1.starts_with("<!-- pushleft-plan part 1/2 -->\nfirst, part one"),
            "{c:?}"
        );
        assert!(
            c[2].1.starts_with("<!-- pushleft-plan part 2/2 -->\nfirst, part two"),
            "{c:?}"
        );
        let (first, second) = (c[1].0, c[2].0);
        fake.seen();

        // Second push: one part. The first comment of ours is edited in place, the second
        // deleted, nothing created, the reviewer's comment untouched.
        parts(&dir, &["second"]);
        let o = post(forge, &fake, &dir, TOKEN);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stdout(&o).contains("1 part(s) posted, 1 old one(s) deleted"),
            "{}",
            stdout(&o)
        );
        let c = fake.comments();
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!((c[0].0, c[1].0), (foreign, first));
        assert!(c[0].1.starts_with("LGTM"));
        assert_eq!(c[1].1, "<!-- pushleft-plan part 1/1 -->\nsecond\n");
        let seen = fake.seen();
        let edit = if forge == Forge::GitLab { "PUT" } else { "PATCH" };
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen[0].starts_with("GET "), "{seen:?}");
        assert!(
            seen[1].starts_with(edit) && seen[1].ends_with(&format!("/{first}")),
            "{seen:?}"
        );
        assert!(
            seen[2].starts_with("DELETE") && seen[2].ends_with(&format!("/{second}")),
            "{seen:?}"
        );

        // A refused token fails the job and changes nothing; the token is in no output.
        parts(&dir, &["third", "third again"]);
        let o = post(forge, &fake, &dir, "wrong-token");
        assert!(!o.status.success());
        assert_eq!(fake.comments(), c);
        for text in [stdout(&o), stderr(&o)] {
            assert!(!text.contains("wrong-token") && !text.contains(TOKEN), "{text}");
        }
    }
}

#[test]
fn a_missing_plan_or_an_unknown_forge_is_refused_before_any_request() {
    let fake = FakeForge::start(Forge::GitHub);
    let tmp = tempfile::tempdir().expect("tmp");
    let o = post(Forge::GitHub, &fake, &tmp.path().join("none"), TOKEN);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no ") && stderr(&o).contains("plan-1.md"),
        "{}",
        stderr(&o)
    );
    parts(&tmp.path().join("p"), &["x"]);
    let o = run(Command::new("bash")
        .arg(script())
        .args(["bitbucket"])
        .arg(tmp.path().join("p")));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown forge"), "{}", stderr(&o));
    assert!(fake.seen().is_empty());
}

/// The shell lines of a pipeline file that run `pl`, `post-plan-comments` or prepare them:
/// GitHub's `run:` values (one line, or each line of a `run: |` block) and GitLab's `script:`
/// items.
fn pipeline_lines(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("pipeline");
    let mut lines = Vec::new();
    let mut block: Option<usize> = None;
    for l in text.lines() {
        let indent = l.len() - l.trim_start().len();
        let t = l.trim();
        if let Some(at) = block {
            if indent > at && !t.is_empty() {
                lines.push(t.to_owned());
                continue;
            }
            block = None;
        }
        if t == "run: |" || t == "- run: |" {
            block = Some(indent);
        } else if let Some(r) = t.strip_prefix("run: ").or_else(|| t.strip_prefix("- run: ")) {
            lines.push(r.to_owned());
        } else if let Some(r) = t.strip_prefix("- ")
            && (r.contains("pl ") || r.contains("post-plan-comments") || r.starts_with("git "))
        {
            lines.push(r.to_owned());
        }
    }
    lines
        .into_iter()
        .filter(|l| !l.starts_with("cargo install") && !l.starts_with("apt-get"))
        .collect()
}

#[test]
fn the_pipelines_run_as_written_against_a_state_repository() {
    let pl_dir = Path::new(env!("CARGO_BIN_EXE_pl"))
        .parent()
        .expect("bin dir")
        .to_owned();
    for (file, forge) in [
        ("examples/ci/github/pushleft.yml", Forge::GitHub),
        ("examples/ci/gitlab/.gitlab-ci.yml", Forge::GitLab),
    ] {
        let lines = pipeline_lines(&workspace().join(file));
        let has = |s: &str| lines.iter().any(|l| l.contains(s));
        assert!(
            has("pl validate") && has("pl plan") && has("pl wait") && has("post-plan-comments"),
            "{file}: {lines:?}"
        );

        // The state repository: main at the quickstart, the request's branch scaling it.
        let tmp = tempfile::tempdir().expect("tmp");
        let repo = tmp.path().join("state");
        std::fs::create_dir_all(&repo).expect("repo");
        copy_tree(&workspace().join("examples/quickstart"), &repo);
        init_repo(&repo);
        let base = commit_all(&repo, "the quickstart");
        git(&repo, &["update-ref", "refs/remotes/origin/main", &base]);
        git(&repo, &["checkout", "-q", "-b", "scale"]);
        let project = repo.join("projects/hello.yaml");
        let text = std::fs::read_to_string(&project).expect("project");
        std::fs::write(&project, text.replace("replicas: 2", "replicas: 3")).expect("write");
        let head = commit_all(&repo, "three replicas");
        std::fs::create_dir_all(repo.join(".pushleft")).expect(".pushleft");
        std::fs::copy(script(), repo.join(".pushleft/post-plan-comments")).expect("script");

        let fake = FakeForge::start(forge);
        let env = |c: &mut Command| {
            c.current_dir(&repo)
                .env(
                    "PATH",
                    format!("{}:{}", pl_dir.display(), std::env::var("PATH").unwrap_or_default()),
                )
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("RUNNER_TEMP", tmp.path())
                // GitHub's.
                .env("GITHUB_BASE_REF", "main")
                .env("GITHUB_SHA", &head)
                .env("GITHUB_API_URL", &fake.api)
                .env("GITHUB_REPOSITORY", "acme/state")
                .env("PR_NUMBER", "7")
                .env("GITHUB_TOKEN", TOKEN)
                // GitLab's.
                .env("CI_MERGE_REQUEST_TARGET_BRANCH_NAME", "main")
                .env("CI_COMMIT_SHA", &head)
                .env("CI_API_V4_URL", &fake.api)
                .env("CI_PROJECT_ID", "42")
                .env("CI_MERGE_REQUEST_IID", "7")
                .env("GITLAB_TOKEN", TOKEN)
                // The control plane `pl wait` is given: nothing listens there.
                .env("PL_SERVER", "https://127.0.0.1:9")
                .env("PUSHLEFT_SERVER", "https://127.0.0.1:9")
                .env("PL_TOKEN", "viewer-token")
                .env("PUSHLEFT_TOKEN", "viewer-token")
                .env("CA_CERT", "not a certificate")
                .env("PUSHLEFT_CA_CERT", tmp.path().join("ca.crt"));
        };
        std::fs::write(tmp.path().join("ca.crt"), "not a certificate").expect("ca");
        for line in &lines {
            // The remote is the repository itself here: a fetch of it is a no-op.
            if line.starts_with("git fetch") {
                continue;
            }
            let mut c = Command::new("bash");
            c.args(["-euo", "pipefail", "-c", line]);
            env(&mut c);
            let o = c.output().expect("bash");
            if line.contains("pl wait") {
                // Parsed (a usage error would exit 2), then refused for want of a control
                // plane: the flags the pipeline passes exist.
                assert_eq!(o.status.code(), Some(1), "{file}: {line}: {}", stderr(&o));
                assert!(!stderr(&o).contains("Usage"), "{file}: {line}: {}", stderr(&o));
            } else {
                assert!(o.status.success(), "{file}: {line}: {}{}", stdout(&o), stderr(&o));
            }
        }
        // The plan of the request was posted: one comment, the scale in it.
        let c = fake.comments();
        assert_eq!(c.len(), 1, "{file}: {c:?}");
        assert!(c[0].1.starts_with("<!-- pushleft-plan part 1/1 -->"), "{}", c[0].1);
        assert!(c[0].1.contains("replicas"), "{}", c[0].1);
    }
}
