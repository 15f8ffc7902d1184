//! `pl up` and `pl down` on a simulated host (`agent/tests/support/host.rs`: a network
//! namespace with a dockerd of its own and a registry), the issue's end-to-end scenario:
//! - `pl up` of a web project starts the local control plane (reconciler, SQLite ledger, an
//!   enrolled agent, Caddy), applies the working tree as a local revision and exits 0 with the
//!   URL, which answers with the image's response through Caddy; `pl status` and `pl jobs`
//!   reach it with `--local`. `pl up --watch` applies a new Environment file as it is written:
//!   its hostname answered 404 before, and another hostname still does.
//! - A preview branch serves its preview hostname, and is torn down when the branch is
//!   deleted, production untouched. A role scales from 1 to 3 replicas and back at the same
//!   generation, with no failed request meanwhile. `pl up` again changes nothing.
//! - Restart replay: with the agent and the reconciler SIGKILLed the URL keeps serving, and
//!   `pl up` brings them back with the same container and no new job.
//! - An invalid working tree, a release whose health check fails and one whose process exits
//!   at once each end `pl up` with exit 1 and the reason (the failing task's code), while the
//!   live release keeps serving and Caddy's routes stay as they were.
//! - A secret set with `pl secret set` reaches the application as `/run/secrets/KEY`, and is
//!   in no container configuration, ledger or log; without an identity that opens it `pl up`
//!   refuses.
//! - A second release with the agent SIGKILLed right after it started the new container: the
//!   restarted agent adopts that container, the new release serves.
//!   The old generation is kept paused; `pl rollback` thaws it (nothing made or started) and
//!   brings the first release back with no failed request, held (`pl status`
//!   says it differs from Git, `pl up` of the same files keeps it, a second rollback is
//!   refused with `rollback-held`) until `pl rollback --release`. A release with
//!   `rollout.watchSeconds` whose health path stops answering after its switch is rolled back
//!   on its own (held by `watch`), with no failed request. A canary step at 50% has both
//!   releases answer until `pl rollout promote` lets the switch run, with no failed request.
//!   A rolling rollout replaces two replicas one at a time, routing to the new release's first
//!   and the old release's second between its batches, with no failed request.
//! - `--build`: a local Dockerfile's image serves, pinned by digest, the Git files untouched;
//!   a failed build ends with its step's output and changes nothing.
//! - `pl down DIR ENV` tears that environment down alone; `pl down` tears the rest down (its
//!   containers, networks, firewall tables and rules gone), keeps the ledger and stops every
//!   process; `pl up` again works from the same ledger.
//! - Signed commits with `--allowed-signers`: a signed one serves; an unsigned one and an
//!   invalid one are refused with their reasons while the release in force serves on; after
//!   `pl down`, a signed `pl up` approves leaving the local teardown revision behind and
//!   serves again.

#[path = "../../agent/tests/support/mod.rs"]
mod agent_support;
mod common;
#[path = "../../agent/tests/support/host.rs"]
mod host_support;

use common::siblings;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
#[path = "../../agent/tests/support/tls.rs"]
mod tls_support;

#[path = "up/app.rs"]
mod app;
#[path = "up/volume_move.rs"]
mod volume_move;

use host_support::Host;
use repo_support::{Repo, environment};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The preview hostname of project `api`'s branch `branch`, as `pl up` serves it.
fn preview_host(branch: &str) -> String {
    format!(
        "{}.localhost",
        state_schema::state::branch_preview_hostname(
            branch,
            &state_schema::values::Name::new("api").expect("name"),
            &state_schema::values::Hostname::new("preview.example.com").expect("hostname"),
        )
        .expect("preview hostname")
    )
}

/// `pl` with the local control plane's state folder and the simulated host's engine.
fn pl_command(state: &Path, socket: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pl"));
    c.env("PL_STATE_DIR", state).env("PL_DOCKER_SOCKET", socket);
    c
}

/// `pl ARGS REPO` to its end: (exit code, stdout, stderr).
fn pl(args: &[&str], repo: &Path, state: &Path, socket: &Path) -> (i32, String, String) {
    outcome(pl_command(state, socket).args(args).arg(repo).output().expect("pl"))
}

fn outcome(o: std::process::Output) -> (i32, String, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A developer's age identity in `dir` (0600) and its recipient, named as the control
/// recipient in `repo_dir`'s `pushleft.yaml`: locally, the developer's identity is the control
/// plane's, and every Secret lists it.
fn developer_identity(dir: &Path, repo_dir: &Path) -> (PathBuf, String) {
    let dev = dir.join("dev.key");
    let o = Command::new("age-keygen")
        .arg("-o")
        .arg(&dev)
        .output()
        .expect("age-keygen");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::set_permissions(&dev, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let recipient = Command::new("age-keygen")
        .arg("-y")
        .arg(&dev)
        .output()
        .expect("age-keygen -y");
    let recipient = String::from_utf8_lossy(&recipient.stdout).trim().to_owned();
    let root = std::fs::read_to_string(repo_dir.join("pushleft.yaml")).expect("root");
    std::fs::write(
        repo_dir.join("pushleft.yaml"),
        root.replace("spec: {", &format!("spec: {{controlRecipient: {recipient}, ")),
    )
    .expect("write");
    (dev, recipient)
}

/// The Secret `backups` in `repo`, sealed to `recipient`, with `RESTIC_PASSWORD` set to
/// `password` by `pl secret set` (as a user sets it).
fn backups_secret(repo: &Repo, repo_dir: &Path, recipient: &str, password: &str) {
    repo.write(
        "secrets/backups.yaml",
        &format!("apiVersion: pushleft.dev/v1alpha1\nkind: Secret\nmetadata: {{name: backups}}\nspec:\n  recipients: [{recipient}]\n"),
    );
    let mut set = Command::new(env!("CARGO_BIN_EXE_pl"))
        .args(["secret", "set", "backups", "RESTIC_PASSWORD", "-C"])
        .arg(repo_dir)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("pl secret set");
    std::io::Write::write_all(&mut set.stdin.take().expect("stdin"), password.as_bytes()).expect("value");
    assert!(set.wait().expect("pl secret set").success());
}

/// The simulated host's engine CLI: its trimmed output.
fn docker(socket: &Path, args: &[&str]) -> String {
    host_support::docker_at(socket, args)
}

/// One request for `host` to Caddy on loopback `port` (2 s at most).
fn get(port: u16, host: &str) -> Option<(u16, String)> {
    agent_support::get_host(port, host).ok()
}

#[test]
fn pl_up_serves_the_working_tree_and_pl_down_tears_it_down() {
    siblings();
    let base = PathBuf::from(format!("/tmp/plup-{}", std::process::id()));
    let host = Host::start(&format!("plhost-up-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let _registry = Kill(registry);
    let image = host.image(
        port,
        "web",
        &[("/www/index.html", "hello from pl up\n"), ("/www/healthz", "ok\n")],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    let project = |health: &str| {
        format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: {health}, timeoutSeconds: 3}}, replicas: 1, command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]}}\n"
        )
    };
    repo.write("projects/api.yaml", &project("/healthz"));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    let (repo_dir, state, socket) = (repo.dir.clone(), dir.path().join("pl-state"), host.socket.clone());
    let netns = host.netns.clone();
    let signers = dir.path().join("allowed_signers");
    std::fs::write(&signers, &repo.signers).expect("signers");
    let signed_state = dir.path().join("pl-state-signed");
    let _detached = Detached(vec![state.clone(), signed_state.clone()]);
    let (project_healthy, project_missing_health) = (project("/healthz"), project("/missing"));
    let image_two = host.image(
        port,
        "web2",
        &[("/www/index.html", "release two\n"), ("/www/healthz", "ok\n")],
    );
    // Release two's server starts 2 s after its container: the agent is killed in that window.
    let project_two = project_healthy
        .replace(&image, &image_two)
        .replace(
            "command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]",
            "command: [/bin/busybox, sh, -c, 'sleep 2 && exec /bin/busybox httpd -f -p 8080 -h /www']",
        )
        .replace("timeoutSeconds: 3", "timeoutSeconds: 15");
    assert_ne!(project_two, project_healthy.replace(&image, &image_two));

    // Paths only: the temporary folder itself stays out here, so that it outlives the
    // processes `Detached` kills when an assertion fails.
    let scratch = dir.path().to_owned();
    host.run(move || {
        let http = 18_080;
        let port_arg = http.to_string();
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(
            code,
            0,
            "pl up: {out}\n{err}\nagent log: {}",
            std::fs::read_to_string(state.join("agents/n1/agent.log")).unwrap_or_default()
        );
        let url = format!("http://api.example.com.localhost:{http}/");
        assert!(out.contains(&url), "the URL is printed: {out}");
        assert!(out.contains("local revision"), "{out}");
        // The node this run enrolled was there before anything was placed: generation 1 runs.
        assert!(out.contains("api-production: generation 1 done"), "{out}");
        assert_eq!(
            get(http, "api.example.com.localhost"),
            Some((200, "hello from pl up".into()))
        );
        assert_eq!(
            get(http, "other.example.com.localhost").map(|r| r.0),
            Some(404),
            "another hostname"
        );

        // The operator commands reach the local control plane too.
        let (code, out, err) = pl(&["status", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains("main in force at"), "{out}");
        let (code, out, _) = pl(&["jobs", "--format", "json", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0);
        assert!(out.contains("ingress:api-production/api.example.com"), "{out}");
        // Inside the repository (a subfolder too) with nothing else named, they use it as is.
        let (code, out, err) = outcome(
            pl_command(&state, &socket)
                .arg("status")
                .current_dir(repo_dir.join("envs"))
                .env_remove("PL_SERVER")
                .env_remove("PL_TOKEN")
                .env_remove("PL_TOKEN_FILE")
                .output()
                .expect("pl status"),
        );
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains("main in force at"), "{out}");
        // Where no control plane runs, the error names the way to one.
        let (code, _, err) = outcome(
            Command::new(env!("CARGO_BIN_EXE_pl"))
                .arg("status")
                .current_dir("/")
                .env("XDG_STATE_HOME", scratch.join("no-state"))
                .env_remove("PL_STATE_DIR")
                .env_remove("PL_SERVER")
                .env_remove("PL_TOKEN")
                .env_remove("PL_TOKEN_FILE")
                .output()
                .expect("pl status"),
        );
        assert_eq!(code, 1);
        assert!(err.contains("--local DIR") && err.contains("--server"), "{err}");

        // `--watch`: a new Environment file is applied as soon as it is written.
        let mut watching = pl_command(&state, &socket)
            .args(["up", "--http", "--watch", "--node", "n1", "--port", &port_arg])
            .arg(&repo_dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("pl up --watch");
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(
            get(http, "staging.example.com.localhost").map(|r| r.0),
            Some(404),
            "the hostname answers 404 before its environment exists"
        );
        std::fs::write(
            repo_dir.join("envs/api-staging.yaml"),
            "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: api-staging}\nspec: {project: api, stage: production, pool: main, hostname: staging.example.com}\n",
        )
        .expect("write");
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(http, "staging.example.com.localhost") != Some((200, "hello from pl up".into())) {
            assert!(Instant::now() < deadline, "the watched change was never applied");
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = watching.kill();
        let _ = watching.wait();
        assert_eq!(
            get(http, "other.example.com.localhost").map(|r| r.0),
            Some(404),
            "another hostname still answers 404"
        );

        // A preview branch: its preview hostname serves; deleted, its environment goes and
        // production is untouched.
        repo.commit("base", true);
        repo_support::git(&repo_dir, &["branch", "feature/x"]);
        let preview = preview_host("feature/x");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "{out}\n{err}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(http, &preview) != Some((200, "hello from pl up".into())) {
            assert!(Instant::now() < deadline, "the preview {preview} never served");
            std::thread::sleep(Duration::from_millis(200));
        }
        repo_support::git(&repo_dir, &["branch", "-D", "feature/x"]);
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "{out}\n{err}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(http, &preview).map(|r| r.0) != Some(404) {
            assert!(Instant::now() < deadline, "the preview {preview} was never torn down");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(
            get(http, "api.example.com.localhost"),
            Some((200, "hello from pl up".into())),
            "production untouched"
        );

        let ledger_url = format!("sqlite://{}", state.join("ledger.db").display());
        // Scale 1 to 3 and back, at the same generation, under a request loop: no request fails.
        let generation = || agent_support::sql(&ledger_url, "SELECT CAST(generation AS TEXT) FROM deployments WHERE environment = 'api-production'");
        let replicas = || {
            docker(&socket, &["ps", "-q", "--filter", "status=running", "--filter", "label=dev.pushleft.environment=api-production"])
                .lines()
                .count()
        };
        let before = generation();
        let mut load = Load::start(&netns, http, "api.example.com.localhost", None);
        for (count, want) in [("replicas: 3", 3), ("replicas: 1", 1)] {
            std::fs::write(repo_dir.join("projects/api.yaml"), project_healthy.replace("replicas: 1", count)).expect("write");
            let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
            assert_eq!(code, 0, "{out}\n{err}");
            // `pl up` returns when it is true on the host: the replicas run now, not soon.
            assert_eq!(replicas(), want, "pl up returned before {want} replicas ran: {out}");
            assert!(out.contains(&format!("({want} replica(s) running)")), "{out}");
            assert_eq!(generation(), before, "a scale, not a new generation");
            if want == 3 {
                // (Requests routed to a replica removed by hand fail: the load pauses.)
                let (failed, served) = load.finish();
                assert_eq!(failed, 0, "requests failed during the scale up ({served} served)");
                // A replica the scale added is repaired like one the rollout placed: removed
                // by hand, it is made again at the same generation, with a `drift-repaired`
                // event (a scale's ask was once not recognised, and it never came back).
                let second = || {
                    docker(
                        &socket,
                        &[
                            "ps",
                            "-q",
                            "--filter",
                            "status=running",
                            "--filter",
                            "label=dev.pushleft.environment=api-production",
                            "--filter",
                            "label=dev.pushleft.instance=1",
                        ],
                    )
                };
                let removed = second();
                assert!(!removed.is_empty(), "web/1 runs");
                docker(&socket, &["rm", "-f", &removed]);
                let deadline = Instant::now() + Duration::from_secs(45);
                let repaired = || {
                    agent_support::sql(
                        &ledger_url,
                        "SELECT detail FROM events WHERE kind = 'drift-repaired' AND subject = 'api-production'",
                    )
                };
                while second().is_empty() || second() == removed || !repaired().iter().any(|d| d.contains("/web/1:")) {
                    assert!(Instant::now() < deadline, "the scaled replica was never repaired: {:?}", repaired());
                    std::thread::sleep(Duration::from_millis(200));
                }
                assert_eq!(generation(), before, "repaired at the same generation");
                load = Load::start(&netns, http, "api.example.com.localhost", None);
            }
        }
        let (failed, served) = load.finish();
        assert_eq!(failed, 0, "requests failed during the scale down");
        assert!(served > 5);

        // More replicas than the node has room for (4 CPUs, 250m each, two environments):
        // placed fewer than asked is not done. `pl up` fails naming the reason, `pl wait`
        // waits and fails at its timeout naming it, and `pl status` shows asked, placed and
        // running. Scaled back, all is done again.
        std::fs::write(repo_dir.join("projects/api.yaml"), project_healthy.replace("replicas: 1", "replicas: 10")).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 1, "placed fewer than asked is not done: {out}\n{err}");
        assert!(
            err.contains("api-staging generation") && err.contains("of 10 replicas placed") && err.contains("no-capacity"),
            "{err}"
        );
        let (code, _, err) = outcome(
            pl_command(&state, &socket)
                .args(["wait", "--timeout", "3s", "--local", &repo_dir.to_string_lossy()])
                .output()
                .expect("pl wait"),
        );
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("no-capacity") && err.contains("not live within 3 s"), "{err}");
        let (code, out, _) = pl(&["status", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0);
        assert!(
            out.contains(" asked, as agents report them") && out.contains("api-staging: ") && out.contains("of 10 asked") && out.contains("no-capacity"),
            "{out}"
        );
        std::fs::write(repo_dir.join("projects/api.yaml"), &project_healthy).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "scaled back: {out}\n{err}");
        assert_eq!(replicas(), 1, "{out}");

        // Nothing changed: quick, says so, and the same container serves.
        let started = Instant::now();
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains("unchanged, serving"), "a no-op says nothing changed: {out}");
        // `pl wait` (for CI): 0 when the revision is live, 2 when a commit never judged is
        // not live within its timeout.
        let repo_arg = repo_dir.to_string_lossy().into_owned();
        let (code, out, err) = outcome(
            pl_command(&state, &socket)
                .args(["wait", "--timeout", "30s", "--local", &repo_arg])
                .output()
                .expect("pl wait"),
        );
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains("live on main"), "{out}");
        let (code, _, err) = outcome(
            pl_command(&state, &socket)
                .args(["wait", "--rev", "0123456789abcdef", "--timeout", "2s", "--local", &repo_arg])
                .output()
                .expect("pl wait"),
        );
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("not judged") && err.contains("not live within 2 s"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a no-op took {:?}",
            started.elapsed()
        );
        assert_eq!(
            get(http, "api.example.com.localhost"),
            Some((200, "hello from pl up".into()))
        );

        // Drift: a replica removed by hand (not just stopped) comes back at the same
        // generation within 30 s, routes published to its new container, with a
        // `drift-repaired` event; until then `pl status` says it is not running.
        let removed = docker(&socket, &["ps", "-q", "--filter", "status=running", "--filter", "label=dev.pushleft.environment=api-production"]);
        let generation_before = generation();
        let repairs_before = agent_support::sql(
            &ledger_url,
            "SELECT detail FROM events WHERE kind = 'drift-repaired' AND subject = 'api-production'",
        )
        .len();
        docker(&socket, &["rm", "-f", &removed]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = docker(&socket, &["ps", "-q", "--filter", "status=running", "--filter", "label=dev.pushleft.environment=api-production"]);
            if !now.is_empty() && now != removed && get(http, "api.example.com.localhost") == Some((200, "hello from pl up".into())) {
                break;
            }
            assert!(Instant::now() < deadline, "the removed replica never came back");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(generation(), generation_before, "repaired at the same generation");
        // The event comes with the repair's reported end, which may come a moment after the
        // new container serves (Docker often gives it the removed one's address, so the old
        // route works at once): waited for within the same 30 s.
        let repaired = || {
            agent_support::sql(
                &ledger_url,
                "SELECT detail FROM events WHERE kind = 'drift-repaired' AND subject = 'api-production'",
            )
        };
        while !repaired()[repairs_before.min(repaired().len())..]
            .iter()
            .any(|d| d.contains("was gone from its node"))
        {
            assert!(Instant::now() < deadline, "no drift-repaired event: {:?}", repaired());
            std::thread::sleep(Duration::from_millis(200));
        }

        // Restart replay: the agent and the reconciler die; the URL keeps serving; `pl up`
        // brings them back, and the same container serves with no job added.
        let ledger = format!("sqlite://{}", state.join("ledger.db").display());
        let count_jobs = || agent_support::sql(&ledger, "SELECT CAST(COUNT(*) AS TEXT) FROM jobs");
        let jobs = count_jobs();
        let container = || {
            let id = docker(&socket, &["ps", "-q", "--filter", "status=running", "--filter", "label=dev.pushleft.environment=api-production"]);
            docker(&socket, &["inspect", "--format", "{{.Id}} {{.State.StartedAt}}", &id])
        };
        let serving = container();
        for pid in ["agents/n1/agent.pid", "reconciler.pid"] {
            let pid = std::fs::read_to_string(state.join(pid)).expect("pid");
            assert!(
                Command::new("kill")
                    .args(["-9", pid.trim()])
                    .status()
                    .expect("kill")
                    .success()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            get(http, "api.example.com.localhost"),
            Some((200, "hello from pl up".into())),
            "serving while they are down"
        );
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "{out}\n{err}");
        assert_eq!(container(), serving, "the same container");
        assert_eq!(count_jobs(), jobs, "no job added");

        // Caddy's routes, which no refused or failed release below may change.
        let caddy_socket = state.join("caddy-admin/admin.sock");
        let routes = move || {
            let (status, body) =
                agent_support::caddy_admin(&caddy_socket, "GET", "/config/apps/http/servers").expect("caddy admin");
            assert_eq!(status, 200, "{body}");
            body
        };
        let routes_before = routes();
        // The route names the control plane that owns it.
        let route = format!("pl-host.{}.api.example.com", agent_support::control_plane(&ledger_url));
        assert!(routes_before.contains(&route), "{routes_before}");

        // An invalid working tree: every problem, exit 1, nothing applied.
        std::fs::write(
            repo_dir.join("envs/broken.yaml"),
            "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: Broken}\n",
        )
        .expect("write");
        let (code, _, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 1);
        assert!(
            err.contains("envs/broken.yaml:3:") && err.contains("error[") && !err.contains("{\"code\""),
            "{err}"
        );
        std::fs::remove_file(repo_dir.join("envs/broken.yaml")).expect("rm");
        assert_eq!(count_jobs(), jobs, "nothing applied");

        // A release whose health check fails: exit 1 with the code; the live release serves on.
        std::fs::write(repo_dir.join("projects/api.yaml"), &project_missing_health).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(err.contains("health-deadline"), "the failed health's code: {err}");
        assert_eq!(
            get(http, "api.example.com.localhost"),
            Some((200, "hello from pl up".into()))
        );
        // `pl wait` (for CI) says the same: exit 1 with the failing job's code.
        let repo_arg = repo_dir.to_string_lossy().into_owned();
        let (code, _, err) = outcome(
            pl_command(&state, &socket)
                .args(["wait", "--timeout", "30s", "--local", &repo_arg])
                .output()
                .expect("pl wait"),
        );
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("failed") && err.contains("health-deadline"), "{err}");
        // `pl jobs` says why each failed job failed, and names jobs in words.
        let (code, out, err) = pl(&["jobs", "--state", "failed", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("start web replica 0 of generation") && out.contains("  why: ") && out.contains("health-deadline"),
            "{out}"
        );
        // A release whose process exits at once: exit 1 with the code; the live release serves on.
        let exits = project_healthy.replace("command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]", "command: [/bin/busybox, 'false']");
        assert_ne!(exits, project_healthy);
        std::fs::write(repo_dir.join("projects/api.yaml"), &exits).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(err.contains("exited"), "the failed start's code: {err}");
        assert_eq!(
            get(http, "api.example.com.localhost"),
            Some((200, "hello from pl up".into()))
        );
        assert_eq!(routes(), routes_before, "Caddy's routes unchanged by the failed releases");

        // A secret set with `pl secret set` reaches the application as /run/secrets/TOKEN and
        // nowhere else: not in the container's configuration, the ledger or any log.
        let (dev, recipient) = developer_identity(&scratch, &repo_dir);
        std::fs::create_dir_all(repo_dir.join("secrets")).expect("mkdir");
        std::fs::write(
            repo_dir.join("secrets/api.yaml"),
            format!("apiVersion: pushleft.dev/v1alpha1\nkind: Secret\nmetadata: {{name: api-secrets}}\nspec:\n  recipients: [{recipient}]\n"),
        )
        .expect("write");
        let value = "s3cr3t-value-for-the-up-test";
        let mut set = Command::new(env!("CARGO_BIN_EXE_pl"))
            .args(["secret", "set", "api-secrets", "TOKEN", "-C"])
            .arg(&repo_dir)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("pl secret set");
        std::io::Write::write_all(&mut set.stdin.take().expect("stdin"), value.as_bytes()).expect("value");
        assert!(set.wait().expect("pl secret set").success());
        std::fs::write(
            repo_dir.join("projects/api.yaml"),
            format!("{project_healthy}  secrets: [api-secrets]\n"),
        )
        .expect("write");
        // Without an identity that opens it, refused before anything is applied.
        let (code, _, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 1);
        assert!(err.contains("secret-no-identity"), "{err}");
        let dev_arg = dev.to_string_lossy().into_owned();
        let (code, out, err) = pl(
            &["up", "--http", "--node", "n1", "--port", &port_arg, "--identity", &dev_arg],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "with the identity: {out}\n{err}");
        let id = docker(&socket, &["ps", "-q", "--filter", "status=running", "--filter", "label=dev.pushleft.environment=api-production"]);
        assert_eq!(docker(&socket, &["exec", &id, "/bin/busybox", "cat", "/run/secrets/TOKEN"]), value);
        let inspected = docker(&socket, &["inspect", &id]);
        assert!(!inspected.contains(value), "not in the container's configuration");
        for file in ["ledger.db", "reconciler.log", "agents/n1/agent.log", "caddy.log"] {
            let bytes = std::fs::read(state.join(file)).unwrap_or_default();
            assert!(
                !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                "the secret is in {file}"
            );
        }
        std::fs::write(repo_dir.join("projects/api.yaml"), &project_healthy).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "healthy again: {out}\n{err}");

        // A second release (a new image digest), the agent SIGKILLed right after it started
        // the new container: restarted, it adopts that container, the new release serves, and
        // the old generation is stopped.
        let generation_now: i64 = generation()[0].parse().expect("generation");
        std::fs::write(repo_dir.join("projects/api.yaml"), &project_two).expect("write");
        let mut first = pl_command(&state, &socket)
            .args(["up", "--http", "--node", "n1", "--port", &port_arg])
            .arg(&repo_dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("pl up");
        let inner = |args: &[&str]| docker(&socket, args);
        let cp = agent_support::control_plane(&ledger_url);
        let new_container = format!("pl_{cp}_api-production_web_0_g{}", generation_now + 1);
        let deadline = Instant::now() + Duration::from_secs(60);
        let started = loop {
            let seen = inner(&["inspect", "--format", "{{.Id}} {{.State.Running}} {{.State.StartedAt}}", &new_container]);
            if seen.contains(" true ") {
                break seen;
            }
            assert!(Instant::now() < deadline, "the new container never started");
            std::thread::sleep(Duration::from_millis(20));
        };
        let attempts = || {
            agent_support::sql(&ledger_url, &format!("SELECT CAST(attempts AS TEXT) FROM jobs WHERE key LIKE 'app:api-production/web/0:g{}:ensure%'", generation_now + 1))
        };
        let pid = std::fs::read_to_string(state.join("agents/n1/agent.pid")).expect("pid");
        assert!(Command::new("kill").args(["-9", pid.trim()]).status().expect("kill").success());
        // Usually 1; a transient failure before the start (a pull under load) may add one.
        let before: u32 = attempts()[0].parse().expect("attempts");
        // The lease runs out (made to, here) and `pl up` brings the agent back.
        agent_support::sql(&ledger_url, "UPDATE jobs SET lease_expires_at = 0 WHERE state = 'leased'");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "after the crash: {out}\n{err}");
        assert_eq!(first.wait().expect("first pl up").code(), Some(0), "the first pl up converged too");
        assert_eq!(
            inner(&["inspect", "--format", "{{.Id}} {{.State.Running}} {{.State.StartedAt}}", &new_container]),
            started,
            "the very container, adopted"
        );
        assert_eq!(attempts(), [(before + 1).to_string()], "replayed once after the crash");
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "release two".into())));
        let old = format!("pl_{cp}_api-production_web_0_g{generation_now}");
        assert_eq!(
            inner(&["inspect", "--format", "{{.State.Status}}", &old]),
            "paused",
            "the old generation kept paused for a rollback"
        );

        // `pl rollback`: release one back under a request loop (none fails), held: `pl status`
        // says it differs from Git, `pl up` of the same files keeps it, a second rollback is
        // refused with its code, and `--release` brings release two back.
        let load = Load::start(&netns, http, "api.example.com.localhost", None);
        let (code, out, err) = pl(&["rollback", "api-production", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "pl rollback: {out}\n{err}");
        assert!(out.contains("held until a commit changes api-production"), "{out}");
        assert_eq!(
            get(http, "api.example.com.localhost"),
            Some((200, "hello from pl up".into())),
            "release one serves when pl rollback returns"
        );
        let (failed, served) = load.finish();
        assert_eq!(failed, 0, "requests failed during the rollback ({served} served)");
        // Release one's container was kept paused by the cleanup, and the rollback thawed it:
        // nothing was made or started.
        let rollback_container = format!("pl_{cp}_api-production_web_0_g{}", generation_now + 2);
        assert!(
            inner(&["ps", "-aq", "--filter", &format!("name=^{rollback_container}$")]).is_empty(),
            "no container made for the rollback's generation"
        );
        assert_eq!(inner(&["inspect", "--format", "{{.State.Status}}", &old]), "running");
        assert_eq!(
            agent_support::sql(&ledger_url, "SELECT kind FROM events WHERE kind LIKE 'rollback-%' OR kind = 'deployment-rollback' ORDER BY id"),
            ["rollback-asked", "deployment-rollback"]
        );
        let (code, out, _) = pl(&["status", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0);
        assert!(
            out.contains("held        api-production at generation") && out.contains("differs from Git"),
            "{out}"
        );
        // `pl up` of the same files keeps the hold, and says it is not what Git says (exit 1,
        // as `pl wait` does).
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(err.contains("differs from Git") && err.contains("pl rollback --release api-production"), "{err}");
        assert_eq!(
            get(http, "api.example.com.localhost"),
            Some((200, "hello from pl up".into())),
            "the same files keep the hold"
        );
        let (code, _, err) = pl(&["rollback", "api-production", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 1);
        assert!(err.contains("[rollback-held]"), "{err}");
        let (code, out, err) = pl(&["rollback", "--release", "api-production", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "pl rollback --release: {out}\n{err}");
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "release two".into())));
        let (code, out, _) = pl(&["status", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0);
        assert!(!out.contains("held "), "{out}");

        // A watched release whose health path stops answering 10 s after it starts: `pl up`
        // succeeds (it was healthy at the switch), then a heartbeat reports it unhealthy within
        // `rollout.watchSeconds` and the control plane rolls it back on its own, held by
        // `watch`; requests are answered throughout. (At 4 s a machine busy with a build
        // failed the watch before `pl up` had seen both environments done.)
        let watched = project_healthy.replace(&image, &image_two).replace(
            "command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]",
            "rollout: {watchSeconds: 30}, command: [/bin/busybox, sh, -c, '/bin/busybox cp -r /www /tmp/www; (/bin/busybox sleep 10; /bin/busybox rm /tmp/www/healthz) & exec /bin/busybox httpd -f -p 8080 -h /tmp/www']",
        );
        assert_ne!(watched, project_healthy.replace(&image, &image_two));
        let load = Load::start(&netns, http, "api.example.com.localhost", None);
        std::fs::write(repo_dir.join("projects/api.yaml"), &watched).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "the watched release is healthy at its switch: {out}\n{err}");
        let automatic = || agent_support::sql(&ledger_url, "SELECT detail FROM events WHERE kind = 'rollback-automatic'");
        let deadline = Instant::now() + Duration::from_secs(60);
        while automatic().is_empty() {
            assert!(Instant::now() < deadline, "the failing release was never rolled back");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(automatic()[0].contains("web/0 on n1: not healthy"), "{:?}", automatic());
        // CI's `pl wait` for that commit fails: what runs is not what Git says.
        let (code, out, err) = pl(&["wait", "--timeout", "60", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 1, "a rolled-back commit is not live: {out}\n{err}");
        assert!(err.contains("was rolled back by watch"), "{err}");
        // The rollback's generation finishes (the manual one earlier was the first).
        let rollbacks_done = || {
            agent_support::sql(
                &ledger_url,
                "SELECT detail FROM events WHERE kind = 'deployment-rollout-done' AND detail LIKE '%, a rollback'",
            )
            .len()
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while rollbacks_done() < 2 {
            assert!(Instant::now() < deadline, "the automatic rollback never finished");
            std::thread::sleep(Duration::from_millis(200));
        }
        let (failed, served) = load.finish();
        assert_eq!(failed, 0, "requests failed around the automatic rollback ({served} served)");
        let (code, out, _) = pl(&["status", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0);
        assert!(out.contains("held        api-production") && out.contains("by watch"), "{out}");

        // A canary: release one with `strategy: canary` and one step at 50% that waits for a
        // promote. `pl up` says at once that each environment waits for `pl rollout promote`
        // and returns (exit 3) instead of waiting out its timeout; meanwhile both releases
        // answer; `pl rollout promote` lets the switch run, and `pl up` then says done. No
        // request fails throughout.
        let canary = project_healthy.replace(
            "command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]",
            "rollout: {strategy: canary, steps: [{weight: 50}]}, command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]",
        );
        assert_ne!(canary, project_healthy);
        let load = Load::start(&netns, http, "api.example.com.localhost", None);
        std::fs::write(repo_dir.join("projects/api.yaml"), &canary).expect("write");
        let up_started = Instant::now();
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 3, "pl up returns waiting for an operator: {out}\n{err}");
        for env in ["api-production", "api-staging"] {
            assert!(
                out.contains(&format!("{env} generation"))
                    && out.contains(&format!("waits for `pl rollout promote {env}`")),
                "{out}"
            );
        }
        assert!(up_started.elapsed() < Duration::from_secs(120), "{:?}", up_started.elapsed());
        let steps = || agent_support::sql(&ledger_url, "SELECT detail FROM events WHERE kind = 'canary-step'");
        // Both environments of the project (production and staging) take their step.
        let deadline = Instant::now() + Duration::from_secs(90);
        while steps().len() < 2 {
            assert!(Instant::now() < deadline, "the canaries never took their first step: {:?}", steps());
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            steps().iter().all(|s| s.contains("50% of requests on the new release; the next step waits for `pl rollout promote`")),
            "{:?}",
            steps()
        );
        let answers: Vec<String> = (0..60)
            .filter_map(|_| get(http, "api.example.com.localhost").map(|(_, body)| body))
            .collect();
        let one = answers.iter().filter(|b| b.as_str() == "hello from pl up").count();
        let two = answers.iter().filter(|b| b.as_str() == "release two").count();
        // 6 of 12 slots each: 30 expected of 60; [8, 52] holds with overwhelming odds.
        assert!(one + two == 60 && (8..=52).contains(&one), "{one} new, {two} old of 60: {answers:?}");
        let (code, out, _) = pl(&["status", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0);
        assert!(
            out.contains("canary      api-production generation")
                && out.contains("50% of requests on the new release; the next step waits for `pl rollout promote api-production`"),
            "{out}"
        );
        for env in ["api-production", "api-staging"] {
            let (code, out, err) = pl(&["rollout", "promote", env, "--local"], &repo_dir, &state, &socket);
            assert_eq!(code, 0, "pl rollout promote {env}: {out}\n{err}");
            assert!(
                out.contains("its canary is over") || out.contains("canary took its next step"),
                "{out}"
            );
        }
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "pl up says done once both canaries switched: {out}\n{err}");
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "hello from pl up".into())));
        let (failed, served) = load.finish();
        assert_eq!(failed, 0, "requests failed during the canary ({served} served)");
        let (code, _, err) = pl(&["rollout", "promote", "api-production", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 1);
        assert!(err.contains("[not-in-progress]"), "{err}");

        // An aborted canary is held away from Git: `pl up` and `pl wait` both say so, from
        // one judgement (`pl up` once printed `done` while `pl wait` said it differed).
        std::fs::write(repo_dir.join("projects/api.yaml"), canary.replace(&image, &image_two)).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 3, "{out}\n{err}");
        for env in ["api-production", "api-staging"] {
            let (code, out, err) = pl(&["rollout", "abort", env, "--local"], &repo_dir, &state, &socket);
            assert_eq!(code, 0, "pl rollout abort {env}: {out}\n{err}");
        }
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "hello from pl up".into())));
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 1, "an aborted canary is not done: {out}\n{err}");
        assert!(err.contains("differs from Git") && !out.contains(" done ("), "{out}\n{err}");
        let (code, _, err) = outcome(
            pl_command(&state, &socket)
                .args(["wait", "--timeout", "30s", "--local", &repo_dir.to_string_lossy()])
                .output()
                .expect("pl wait"),
        );
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("differs from Git"), "{err}");

        // A rolling rollout: two replicas of release one (a scale: `rollout` is not the
        // release), then release two replaces them one at a time. Between the batches the
        // routes hold release two's first replica and release one's second (the agent finds
        // the older container that runs for it); no request fails throughout.
        let rolling = |project: &str| {
            project.replace("replicas: 1", "replicas: 2").replace(
                "health: {path: /healthz, timeoutSeconds",
                "rollout: {strategy: rolling, maxSurge: 1}, health: {path: /healthz, timeoutSeconds",
            )
        };
        assert_ne!(rolling(&project_healthy), project_healthy.replace("replicas: 1", "replicas: 2"));
        std::fs::write(repo_dir.join("projects/api.yaml"), rolling(&project_healthy)).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "{out}\n{err}");
        let load = Load::start(&netns, http, "api.example.com.localhost", None);
        std::fs::write(
            repo_dir.join("projects/api.yaml"),
            rolling(&project_healthy.replace(&image, &image_two)),
        )
        .expect("write");
        let (code, out, err) = pl(&["up", "--http", "--node", "n1", "--port", &port_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "the rolling rollout: {out}\n{err}");
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "release two".into())));
        let (failed, served, answers) = load.finish_answers();
        assert_eq!(failed, 0, "requests failed during the rolling rollout ({served} served)");
        // Between the batches both releases answer: release one's second replica keeps
        // answering after release two's first joined (a switch turns every slot at once).
        let first_new = answers.iter().position(|b| b == "release two").expect("release two answered");
        let old_after = answers[first_new..].iter().filter(|b| b.as_str() == "hello from pl up").count();
        assert!(
            old_after >= 3,
            "{old_after} answers of release one after release two's first, of {served}"
        );
        let done = agent_support::sql(
            &ledger_url,
            "SELECT detail FROM events WHERE kind = 'deployment-rollout-done' AND subject = 'api-production' ORDER BY id DESC LIMIT 1",
        );
        assert!(done[0].contains("rolled in 2 batch(es)"), "{done:?}");
        std::fs::write(repo_dir.join("projects/api.yaml"), &project_two).expect("write");

        // `--build api=DIR`: DIR's Dockerfile is built on the engine and runs as api's image,
        // pinned by digest in the local revision; the Git files stay as they were.
        let app = scratch.join("app");
        std::fs::create_dir_all(app.join("www")).expect("mkdir");
        std::fs::copy("/bin/busybox", app.join("busybox")).expect("busybox-static");
        std::fs::write(app.join("www/index.html"), "built locally\n").expect("write");
        std::fs::write(app.join("www/healthz"), "ok\n").expect("write");
        std::fs::write(app.join("scratch.tmp"), "left out\n").expect("write");
        std::fs::write(app.join(".dockerignore"), "*.tmp\n").expect("write");
        std::fs::write(app.join("Dockerfile"), "FROM scratch\nCOPY busybox /bin/busybox\nCOPY www /www\n").expect("write");
        let project_file = std::fs::read(repo_dir.join("projects/api.yaml")).expect("read");
        let build_arg = format!("api={}", app.display());
        let (code, out, err) = pl(
            &["up", "--http", "--node", "n1", "--port", &port_arg, "--build", &build_arg],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "pl up --build: {out}\n{err}");
        assert!(out.contains("api | Step 1/3 : FROM scratch"), "the build's output: {out}");
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "built locally".into())));
        assert_eq!(std::fs::read(repo_dir.join("projects/api.yaml")).expect("read"), project_file, "the Git file untouched");
        let id = docker(&socket, &["ps", "-q", "--filter", "status=running", "--filter", "label=dev.pushleft.environment=api-production"]);
        let running = docker(&socket, &["inspect", "--format", "{{.Config.Image}}", &id]);
        assert!(running.contains("/pl-build/api@sha256:"), "pinned by digest: {running}");
        // A preview branch of a built project runs the build too (it once got the files'
        // image), and goes with its branch.
        repo.commit("before a built preview", true);
        repo_support::git(&repo_dir, &["branch", "feature/built"]);
        let built_preview = preview_host("feature/built");
        let (code, out, err) = pl(
            &["up", "--http", "--node", "n1", "--port", &port_arg, "--build", &build_arg],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        let deadline = Instant::now() + Duration::from_secs(90);
        while get(http, &built_preview) != Some((200, "built locally".into())) {
            assert!(
                Instant::now() < deadline,
                "the built preview {built_preview} never served the build: {:?}",
                get(http, &built_preview)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        repo_support::git(&repo_dir, &["branch", "-D", "feature/built"]);
        let (code, out, err) = pl(
            &["up", "--http", "--node", "n1", "--port", &port_arg, "--build", &build_arg],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        // A failed build: exit 1 with the failing step's output; the live release serves on.
        std::fs::write(app.join("Dockerfile"), "FROM scratch\nCOPY busybox /bin/busybox\nCOPY scratch.tmp /x\n").expect("write");
        let (code, out, err) = pl(
            &["up", "--http", "--node", "n1", "--port", &port_arg, "--build", &build_arg],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(err.contains("building api") && err.contains("build-failed") && err.contains("scratch.tmp"), "{err}");
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "built locally".into())));

        // Drain, with two nodes on this machine (two agents sharing its engine and Caddy): n1
        // is drained in Git; its replica moves to n2, the new one healthy before the old one
        // stops, no request fails meanwhile, and the replica already on n2 is not touched (same
        // container, never stopped): a move is a scale at the same generation, not a release.
        // The same release throughout: the built image again (the same digest), so the only
        // change is where the replicas run.
        std::fs::write(app.join("Dockerfile"), "FROM scratch\nCOPY busybox /bin/busybox\nCOPY www /www\n").expect("write");
        let (code, out, err) = pl(
            &["up", "--http", "--node", "n1", "--node", "n2", "--port", &port_arg, "--build", &build_arg],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "two nodes: {out}\n{err}");
        assert!(state.join("agents/n2/agent.pid").exists(), "n2's agent runs");
        let on_node = |node: &str| -> BTreeSet<String> {
            docker(&socket, &["ps", "-q", "--no-trunc", "--filter", "status=running", "--filter", "label=dev.pushleft.environment=api-production", "--filter", &format!("label=dev.pushleft.node={node}")])
                .lines()
                .map(str::to_owned)
                .collect()
        };
        let leaving = on_node("n1");
        assert!(leaving.len() == 1 && on_node("n2").is_empty(), "nothing moves while n1 is fine");
        // A second replica: spread, it goes to n2 (a scale; web/0 on n1 stays as it was).
        let project_file = String::from_utf8(project_file).expect("utf-8");
        std::fs::write(repo_dir.join("projects/api.yaml"), project_file.replace("replicas: 1", "replicas: 2")).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--port", &port_arg, "--build", &build_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "two replicas: {out}\n{err}");
        let staying = on_node("n2");
        assert_eq!((on_node("n1"), staying.len()), (leaving.clone(), 1), "web/1 on n2, web/0 untouched");
        let release = generation();
        let load = Load::start(&netns, http, "api.example.com.localhost", Some("built locally"));
        let since = unix_now();
        let pool = repo_support::POOL.replace("{name: n1,", "{name: n1, state: draining,");
        assert_ne!(pool, repo_support::POOL);
        std::fs::write(repo_dir.join("pools/main.yaml"), &pool).expect("write");
        // No --node: the nodes enrolled here, both. `pl up` returns once it is true on the
        // hosts: web/0 runs on n2 and nothing runs on n1.
        let (code, out, err) = pl(&["up", "--http", "--port", &port_arg, "--build", &build_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "drained: {out}\n{err}");
        assert!(on_node("n1").is_empty(), "pl up returned with a replica on n1: {out}");
        let on_n2 = on_node("n2");
        assert_eq!(on_n2.len(), 2, "both replicas on n2: {on_n2:?}");
        assert!(on_n2.is_superset(&staying), "web/1 kept its container: {staying:?} then {on_n2:?}");
        assert_eq!(generation(), release, "a drain moves replicas at the same generation");
        std::thread::sleep(Duration::from_secs(1));
        let (failed, served) = load.finish();
        assert_eq!(failed, 0, "requests failed during the drain");
        assert!(served > 10);
        let arrived: BTreeSet<String> = on_n2.difference(&staying).cloned().collect();
        let (arrived, leaving) = (
            arrived.iter().next().cloned().expect("arrived"),
            leaving.iter().next().cloned().expect("leaving"),
        );
        // The engine's events: the new replica started before the old one was stopped, the
        // old one is gone from n1 (removed, not kept stopped: the replica lives on n2), and
        // the replica on n2 was neither stopped nor started again.
        let events = docker(&socket, &["events", "--since", &since, "--until", &unix_now(), "--format", "{{.TimeNano}} {{.Action}} {{.Actor.ID}}"]);
        let at = |action: &str, id: &str| -> Option<u128> {
            events
                .lines()
                .filter_map(|l| {
                    let mut w = l.split(' ');
                    let (t, a, who) = (w.next()?, w.next()?, w.next()?);
                    (a == action && who.starts_with(id)).then(|| t.parse::<u128>().ok()).flatten()
                })
                .min()
        };
        let seen = |action: &str, id: &str| at(action, id).unwrap_or_else(|| panic!("no {action} of {id} in {events}"));
        assert!(seen("start", &arrived) < seen("die", &leaving), "the new replica started before the old one was stopped:\n{events}");
        assert!(seen("die", &leaving) < seen("destroy", &leaving), "{events}");
        for id in &staying {
            for action in ["die", "stop", "kill", "start", "restart", "destroy"] {
                assert_eq!(at(action, id), None, "the replica on n2 saw {action}:\n{events}");
            }
        }
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "built locally".into())));
        // n1 active again: nothing moves back (a replica stays where it is fine).
        std::fs::write(repo_dir.join("pools/main.yaml"), repo_support::POOL).expect("write");
        let (code, out, err) = pl(&["up", "--http", "--port", &port_arg, "--build", &build_arg], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "undrained: {out}\n{err}");
        assert_eq!(on_node("n2"), on_n2, "the replicas stay on n2");
        assert_eq!(generation(), release, "nothing moved");

        // `pl down DIR ENV`: that environment alone goes; the rest and the control plane stay.
        let (code, said, err) = outcome(
            pl_command(&state, &socket)
                .arg("down")
                .arg(&repo_dir)
                .arg("api-staging")
                .output()
                .expect("pl down ENV"),
        );
        assert_eq!(code, 0, "{said}{err}");
        assert!(said.contains("keeps running api-production"), "{said}");
        assert_eq!(get(http, "staging.example.com.localhost").map(|r| r.0), Some(404));
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "built locally".into())));
        assert!(state.join("reconciler.pid").exists(), "the control plane runs on");
        let (code, out, err) = pl(&["down"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        assert!(!state.join("registry.pid").exists(), "the registry stopped");
        let left = docker(&socket, &["ps", "-aq", "--filter", "label=dev.pushleft.environment=api-production"]);
        assert!(left.is_empty(), "containers gone");
        for pid in ["reconciler.pid", "agents/n1/agent.pid", "agents/n2/agent.pid", "caddy.pid"] {
            assert!(!state.join(pid).exists(), "{pid} stopped");
        }
        assert!(state.join("ledger.db").exists(), "the history stays");
        // The networks, firewall tables and routes are gone too (this thread is on the host).
        let networks = docker(&socket, &["network", "ls", "--format", "{{.Name}}"]);
        assert!(!networks.contains("pl_"), "networks gone");
        let tables = Command::new("nft").args(["list", "tables"]).output().expect("nft");
        assert!(!String::from_utf8_lossy(&tables.stdout).contains("pl_"), "tables gone");
        let rules = Command::new("ip").arg("rule").output().expect("ip");
        assert!(!String::from_utf8_lossy(&rules.stdout).contains("10.208."), "rules gone");
        let count_revisions = || -> u64 {
            agent_support::sql(&ledger, "SELECT CAST(COUNT(*) AS TEXT) FROM revisions")[0]
                .parse()
                .expect("count")
        };
        let revisions = count_revisions();
        // `pl up` again works, from the same ledger (with the nodes enrolled here, both);
        // `--no-build` forgets the remembered build, so the files' image runs.
        let (code, out, err) = pl(&["up", "--http", "--port", &port_arg, "--no-build"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "up again: {out}\n{err}");
        assert_eq!(get(http, "api.example.com.localhost"), Some((200, "release two".into())));
        assert!(count_revisions() > revisions, "history kept and grown");
        let (code, out, err) = pl(&["down"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");

        // Signed commits, judged as the daemon judges them (a control plane of its own).
        repo.commit("signed release", true);
        let signers_arg = signers.to_string_lossy().into_owned();
        let signed = [
            "up",
            "--http",
            "--node",
            "n1",
            "--port",
            "18081",
            "--allowed-signers",
            signers_arg.as_str(),
        ];
        let (code, out, err) = pl(&signed, &repo_dir, &signed_state, &socket);
        assert_eq!(code, 0, "signed: {out}\n{err}");
        assert!(out.contains("judged against the allowed signers"), "{out}");
        assert_eq!(
            get(18_081, "api.example.com.localhost"),
            Some((200, "release two".into()))
        );
        // An unsigned commit is refused with its reason; the release in force serves on.
        std::fs::write(repo_dir.join("projects/api.yaml"), &project_missing_health).expect("write");
        repo.commit("unsigned", false);
        let (code, out, err) = pl(&signed, &repo_dir, &signed_state, &socket);
        assert_eq!(code, 1, "{out}\n{err}");
        // Said as `pl validate` says problems, not as the API's JSON.
        assert!(
            err.contains("rejected") && err.contains("error[unsigned]: ") && !err.contains("{\"code\""),
            "the reason: {err}"
        );
        assert_eq!(
            get(18_081, "api.example.com.localhost"),
            Some((200, "release two".into()))
        );
        // The obvious fix, `git commit --amend -S`, replaces the rejected commit (it was never
        // applied): `pl up` judges the amended one, no history thrown away.
        std::fs::write(
            repo_dir.join("projects/api.yaml"),
            project_two.replace("timeoutSeconds: 15", "timeoutSeconds: 14"),
        )
        .expect("write");
        let signing = format!("user.signingKey={}", repo.key.display());
        repo.git(&["add", "-A"]);
        repo.git(&["-c", "gpg.format=ssh", "-c", &signing, "commit", "-q", "--amend", "-S", "-m", "signed now"]);
        let (code, out, err) = pl(&signed, &repo_dir, &signed_state, &socket);
        assert_eq!(code, 0, "the amended commit: {out}\n{err}");
        assert!(!err.contains("does not descend"), "{err}");
        // An invalid signed commit: every problem, exit 1, the release in force serves on.
        std::fs::write(repo_dir.join("projects/api.yaml"), &project_two).expect("write");
        std::fs::write(
            repo_dir.join("envs/broken.yaml"),
            "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: Broken}\n",
        )
        .expect("write");
        repo.commit("invalid", true);
        let (code, _, err) = pl(&signed, &repo_dir, &signed_state, &socket);
        assert_eq!(code, 1);
        assert!(err.contains("envs/broken.yaml:") && err.contains("error["), "{err}");
        assert_eq!(
            get(18_081, "api.example.com.localhost"),
            Some((200, "release two".into()))
        );
        std::fs::remove_file(repo_dir.join("envs/broken.yaml")).expect("rm");
        // One trust per control plane: local revisions are refused here until `pl down`.
        let (code, _, err) = pl(
            &["up", "--http", "--node", "n1", "--port", "18081"],
            &repo_dir,
            &signed_state,
            &socket,
        );
        assert_eq!(code, 1);
        assert!(err.contains("pl down"), "{err}");
        let (code, out, err) = pl(&["down"], &repo_dir, &signed_state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        // Signed again after `pl down`: the signed head leaves the local teardown revision
        // behind, which pl up approves as a rewrite (an event says so), and it serves.
        repo.write("projects/api.yaml", &project_two);
        repo.commit("signed again", true);
        let (code, out, err) = pl(&signed, &repo_dir, &signed_state, &socket);
        assert_eq!(code, 0, "signed after down: {out}\n{err}");
        assert!(out.contains("approved as a rewrite"), "{out}");
        assert_eq!(get(18_081, "api.example.com.localhost"), Some((200, "release two".into())));
        // `pl down`, then `pl up` of the same signed HEAD: that commit was accepted before the
        // teardown, and is applied again (it used to hang, "not converged", with the teardown
        // revision in force); a new signed commit after it is judged and applied as usual.
        let (code, out, err) = pl(&["down"], &repo_dir, &signed_state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        let (code, out, err) = pl(&signed, &repo_dir, &signed_state, &socket);
        assert_eq!(code, 0, "the same HEAD after pl down: {out}\n{err}");
        assert_eq!(get(18_081, "api.example.com.localhost"), Some((200, "release two".into())));
        let signed_ledger = format!("sqlite://{}", signed_state.join("ledger.db").display());
        let events = agent_support::sql(&signed_ledger, "SELECT subject FROM events WHERE kind = 'revision-reapplied'");
        assert_eq!(events.len(), 1, "{events:?}");
        repo.write("projects/api.yaml", &project_two.replace("replicas: 1", "replicas: 2"));
        let after = repo.commit("signed after the return", true);
        let (code, out, err) = pl(&signed, &repo_dir, &signed_state, &socket);
        assert_eq!(code, 0, "a new commit after the return: {out}\n{err}");
        let verdict = agent_support::sql(
            &signed_ledger,
            &format!("SELECT verdict FROM revisions WHERE sha = '{after}'"),
        );
        assert_eq!(verdict, ["accepted"]);
        let (code, out, err) = pl(&["down"], &repo_dir, &signed_state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
    });
}

/// A request loop from inside the simulated host's namespace, bounded in count (100,000) and
/// time (120 s): a request fails unless it answers 200 (with `body`, when given).
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    counts: std::sync::Arc<[std::sync::atomic::AtomicUsize; 2]>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl Load {
    fn start(netns: &str, http: u16, host: &'static str, body: Option<&'static str>) -> Load {
        use std::sync::atomic::Ordering::Relaxed;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let counts = std::sync::Arc::new([
            std::sync::atomic::AtomicUsize::new(0),
            std::sync::atomic::AtomicUsize::new(0),
        ]);
        let path = format!("/run/netns/{netns}");
        let thread = {
            let (stop, counts) = (stop.clone(), counts.clone());
            std::thread::spawn(move || {
                let ns = std::fs::File::open(path).expect("netns");
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                let until = Instant::now() + Duration::from_secs(120);
                let mut answers = Vec::new();
                for _ in 0..100_000 {
                    if stop.load(Relaxed) || Instant::now() > until {
                        break;
                    }
                    let got = get(http, host);
                    let ok = matches!(&got, Some((200, b)) if body.is_none_or(|want| b == want));
                    counts[usize::from(ok)].fetch_add(1, Relaxed);
                    answers.push(got.map(|(_, b)| b).unwrap_or_default());
                }
                answers
            })
        };
        Load { stop, counts, thread }
    }

    /// Stops the loop: (failed, served).
    fn finish(self) -> (usize, usize) {
        let (failed, served, _) = self.finish_answers();
        (failed, served)
    }

    /// Stops the loop: (failed, served, each answer's body in order).
    fn finish_answers(self) -> (usize, usize, Vec<String>) {
        use std::sync::atomic::Ordering::Relaxed;
        self.stop.store(true, Relaxed);
        let answers = self.thread.join().expect("requests");
        (self.counts[0].load(Relaxed), self.counts[1].load(Relaxed), answers)
    }
}

/// Now, in Unix seconds (for `docker events --since/--until`).
fn unix_now() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        .to_string()
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The processes `pl up` detached, killed by their pid files when the test ends (a failing
/// assertion included; `pl down` has stopped them already when it passes).
struct Detached(Vec<PathBuf>);
impl Drop for Detached {
    fn drop(&mut self) {
        for state in &self.0 {
            for pid in [
                "agents/n1/agent.pid",
                "agents/n2/agent.pid",
                "agents/node-1/agent.pid",
                "caddy.pid",
                "registry.pid",
                "reconciler.pid",
            ] {
                if let Ok(pid) = std::fs::read_to_string(state.join(pid)) {
                    let _ = Command::new("kill").args(["-9", pid.trim()]).status();
                }
            }
        }
    }
}

/// What a local unprivileged user (`nobody`) reaches of a control plane `pl up --build`
/// started, each listener and the state folder tried as that user (docs/security.md, "A local
/// user"). The folders above the state folder are opened to everyone first, so only the
/// product's own protections stand between the user and its files.
fn local_user_reaches_only_what_docs_security_says(state: &Path, host_name: &str) {
    use agent_support::as_nobody;
    use std::os::unix::fs::PermissionsExt;
    let mut up = state.parent();
    while let Some(dir) = up.filter(|d| d.starts_with("/tmp") && *d != Path::new("/tmp")) {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        up = dir.parent();
    }
    let ports: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("ports.json")).expect("ports")).expect("json");
    let port = |name: &str| ports[name].as_u64().expect("port").to_string();
    // Caddy's admin API: a unix socket in a 0700 folder.
    let socket = state.join("caddy-admin/admin.sock");
    assert!(socket.exists());
    assert_eq!(
        as_nobody(&["unix", &socket.display().to_string()]),
        "denied",
        "Caddy's admin API"
    );
    // The state folder's secrets: the CA key, the admin token, the node's age identity.
    for file in [
        "tls/ca.key",
        "admin.token",
        "agents/node-1/node/age.key",
        "ledger.db",
        "ingress-ca/ca.key",
        "certificates.age",
        "ingress-tls",
    ] {
        let path = state.join(file);
        assert!(path.exists(), "{file}");
        assert_eq!(as_nobody(&["read", &path.display().to_string()]), "denied", "{file}");
    }
    assert_eq!(
        as_nobody(&["read", &state.join("agents").display().to_string()]),
        "denied",
        "the agents' folders"
    );
    // The operator API answers, but refuses a request without a token.
    assert_eq!(
        as_nobody(&["tls", &port("api"), "/v1/status"]),
        "401",
        "the operator API"
    );
    // The agent API refuses a connection without a node's certificate.
    assert_eq!(
        as_nobody(&["tls", &port("agent"), "/v1/leases"]),
        "handshake-refused",
        "the agent API"
    );
    // The ingress ports are public by design: plain HTTP redirects to HTTPS, which serves the
    // page (the TLS check is the test's own; the redirect shows the listener is open).
    assert_eq!(as_nobody(&["tcp", "18090", host_name, "/"]), "308", "the ingress");
    // The image store `--build` pushed to is the operator API's: nothing without a token.
    assert_eq!(as_nobody(&["tls", &port("api"), "/v2/"]), "401", "the image store");
    // The certificates server on loopback: without the node's token (in the 0700 folder
    // above) it serves nothing, not even the certificate a handshake is given.
    assert_eq!(
        as_nobody(&["tcp", &port("certs"), "localhost", "/ingress-tls/"]),
        "404",
        "the certificates server"
    );
}

/// The README's quickstart, as `scripts/quickstart` runs it: `pl up --build` of
/// examples/quickstart with its app built from nothing (the static busybox beside its
/// Dockerfile) serves the example's page at the URL it prints; Caddy missing and a taken port
/// are refused first, with the fix; `pl logs` shows both replicas' lines and follows new ones;
/// on a terminal the progress is live; `pl down` ends it.
#[test]
fn the_quickstart_builds_its_image_and_serves_its_page() {
    siblings();
    let base = PathBuf::from(format!("/tmp/plqs-{}", std::process::id()));
    let host = Host::start(&format!("plhost-qs-{}", std::process::id()), &base);
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, context, state) = common::quickstart_copy(dir.path());
    // Outside Git, what reads commits is refused before anything starts, in our own words.
    let signers = dir.path().join("allowed_signers");
    std::fs::write(&signers, "").expect("signers");
    let (code, _, err) = outcome(
        pl_command(&state, &host.socket)
            .args(["up", "--allowed-signers"])
            .arg(&signers)
            .arg(&repo)
            .output()
            .expect("pl"),
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("is not in a Git repository") && err.contains("git init"),
        "{err}"
    );
    assert!(!state.join("registry.pid").exists() && !state.join("reconciler.pid").exists());
    let (code, out, _) = outcome(
        pl_command(&state, &host.socket)
            .arg("down")
            .arg(&repo)
            .output()
            .expect("pl down"),
    );
    assert_eq!(code, 0);
    assert!(out.contains("nothing ran"), "{out}");
    repo_support::git(&repo, &["init", "-q", "-b", "main"]);
    let _detached = Detached(vec![state.clone()]);
    let socket = host.socket.clone();
    host.run(move || {
        let build = format!("hello={}", context.display());
        // No Caddy 2.8 on PATH (none, or Debian's 2.6): a clear error before anything starts.
        let (code, _, err) = outcome(
            pl_command(&state, &socket)
                .args(["up", "--port", "18090", "--build", &build])
                .arg(&repo)
                .env("PATH", "/usr/bin:/bin")
                .output()
                .expect("pl"),
        );
        assert_eq!(code, 1, "{err}");
        // The hint names where the quickstart (and the test command) installed Caddy 2.11.
        assert!(
            err.contains("Caddy is not on PATH") && err.contains("export PATH=/opt/pushleft-tools/bin:$PATH"),
            "{err}"
        );
        assert!(!state.join("reconciler.pid").exists(), "nothing started");
        // A port another program holds: a clear error before anything starts.
        let taken = std::net::TcpListener::bind("127.0.0.1:18090").expect("bind");
        let (code, _, err) = pl(&["up", "--port", "18090", "--build", &build], &repo, &state, &socket);
        assert_eq!(code, 1);
        assert!(
            err.contains("port 18090 on 127.0.0.1 is taken") && err.contains("--port"),
            "{err}"
        );
        assert!(!state.join("reconciler.pid").exists(), "nothing started");
        assert!(!state.join("ports.json").exists(), "a refused start records no port");
        drop(taken);
        let (code, out, err) = pl(
            &["up", "--port", "18090", "--https-port", "18443", "--build", &build],
            &repo,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "pl up: {out}\n{err}");
        // HTTPS by default, with a local CA pl up names; plain HTTP redirects there.
        let ca = state.join("ingress-ca/ca.crt");
        assert!(out.contains(&format!("trust {}", ca.display())), "{out}");
        let url = out
            .split_whitespace()
            .find(|w| w.starts_with("https://") && w.ends_with(".localhost:18443/"))
            .unwrap_or_else(|| panic!("no URL in {out}"))
            .to_owned();
        let host_name = url.trim_start_matches("https://").trim_end_matches(":18443/");
        let gets = |port: u16, host: &str| -> Option<(u16, String)> {
            let ca = std::fs::read_to_string(&ca).ok()?;
            let (status, text, _) = tls_support::get_tls(port, host, &ca).ok()?;
            Some((
                status,
                text.split_once("\r\n\r\n")
                    .map(|(_, b)| b.trim().to_owned())
                    .unwrap_or_default(),
            ))
        };
        let (status, body) = gets(18_443, host_name).expect("the URL answers");
        assert_eq!(status, 200);
        assert!(body.contains("hello from Pushleft"), "{body}");
        // `pl status` says what the control plane issued.
        let (code, status, err) = pl(&["status", "--local"], &repo, &state, &socket);
        assert_eq!(code, 0, "{err}");
        assert!(
            status.contains("certificates 1 valid of 1; next to expire: "),
            "{status}"
        );
        let plain = tls_support::head_plain(18_090, host_name);
        assert!(
            plain.starts_with("HTTP/1.1 308") && plain.contains(&format!("Location: https://{host_name}:18443/")),
            "{plain}"
        );
        local_user_reaches_only_what_docs_security_says(&state, host_name);
        // `pl logs`: the role's lines (httpd -v logs each response), relayed from the node.
        let repo_arg = repo.to_string_lossy().into_owned();
        let logs = |args: &[&str]| outcome(pl_command(&state, &socket).args(args).output().expect("pl logs"));
        let (code, out, err) = logs(&["logs", "hello-production", "web", "--tail", "5", "--local", &repo_arg]);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("web/0 g") && l.contains(" | ") && l.contains("response:200")),
            "{out}"
        );
        assert!(out.lines().any(|l| l.starts_with("web/1 g")), "both replicas: {out}");
        assert!(
            out.lines().filter(|l| l.starts_with("web/0 ")).count() <= 5,
            "--tail 5: {out}"
        );
        let (code, _, err) = logs(&["logs", "hello-production", "nope", "--local", &repo_arg]);
        assert_eq!(code, 1);
        assert!(err.contains("role-not-placed"), "{err}");
        // `--follow`: a new request's line arrives while it runs.
        let mut follow = pl_command(&state, &socket)
            .args([
                "logs",
                "hello-production",
                "web",
                "--tail",
                "0",
                "--follow",
                "--local",
                &repo_arg,
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("pl logs --follow");
        let lines = std::io::BufRead::lines(std::io::BufReader::new(follow.stdout.take().expect("stdout")));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let seen = loop {
            assert_eq!(gets(18_443, host_name).map(|r| r.0), Some(200));
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(500))
                && line.contains("response:200")
            {
                break line;
            }
            assert!(Instant::now() < deadline, "no followed line arrived");
        };
        assert!(seen.starts_with("web/"), "{seen}");
        let _ = follow.kill();
        let _ = follow.wait();
        // Relayed lines are never kept: the line the app logged for a request of a page it
        // lacks (its peer's address and port make it one of a kind) reaches `pl logs`, and
        // neither the ledger (its file and its write-ahead log), an event, nor the daemon's or
        // the agent's own log.
        let ca_text = std::fs::read_to_string(&ca).expect("ca");
        let (status, _, _) = tls_support::get_tls_path([127, 0, 0, 1], 18_443, host_name, "/no-such-page", &ca_text)
            .expect("a request for a missing page");
        assert_eq!(status, 404);
        let deadline = Instant::now() + Duration::from_secs(30);
        let marker = loop {
            let (code, out, err) = logs(&["logs", "hello-production", "web", "--tail", "50", "--local", &repo_arg]);
            assert_eq!(code, 0, "{out}\n{err}");
            if let Some(line) = out.lines().find(|l| l.ends_with("response:404")) {
                break line
                    .split_once(" | ")
                    .map(|(_, l)| l.to_owned())
                    .expect("a relayed line");
            }
            assert!(Instant::now() < deadline, "the 404 never reached pl logs: {out}");
            std::thread::sleep(Duration::from_millis(300));
        };
        assert!(marker.contains("]:"), "its peer's address and port: {marker}");
        let mut kept = Vec::new();
        let mut read_ledger = false;
        for e in std::fs::read_dir(&state).expect("state").flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("ledger.db") || name.ends_with(".log") {
                let bytes = std::fs::read(e.path()).unwrap_or_default();
                if bytes.windows(marker.len()).any(|w| w == marker.as_bytes()) {
                    kept.push(name.clone());
                }
                // The scan reads what is there: the ledger holds the environment's name.
                read_ledger |= name.starts_with("ledger.db") && bytes.windows(16).any(|w| w == b"hello-production");
            }
        }
        assert!(read_ledger, "the scan read the ledger");
        let agents: Vec<std::path::PathBuf> = std::fs::read_dir(state.join("agents"))
            .expect("the agents' homes")
            .flatten()
            .map(|d| d.path().join("agent.log"))
            .filter(|p| p.exists())
            .collect();
        assert!(!agents.is_empty(), "the walk saw the agent's log");
        for a in agents {
            let bytes = std::fs::read(&a).unwrap_or_default();
            if bytes.windows(marker.len()).any(|w| w == marker.as_bytes()) {
                kept.push(a.display().to_string());
            }
        }
        assert!(
            std::fs::read_dir(&state)
                .expect("state")
                .flatten()
                .any(|e| e.file_name() == "reconciler.log"),
            "the walk saw the daemon's log"
        );
        assert!(kept.is_empty(), "a relayed log line was kept in {kept:?}");
        let (_, events, _) = pl(&["events", "--local"], &repo, &state, &socket);
        assert!(!events.contains(&marker), "a relayed log line became an event");

        // `--build` is remembered: a plain `pl up` builds it again rather than roll out the
        // example's placeholder image; `--no-build` would run the placeholder, a registry under
        // `.invalid`, and is refused before anything changes, with the fix.
        let (code, out, err) = pl(&["up", "--port", "18090"], &repo, &state, &socket);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains("building hello from") && out.contains("again"), "{out}");
        assert_eq!(gets(18_443, host_name).map(|r| r.0), Some(200));
        let (code, _, err) = pl(&["up", "--port", "18090", "--no-build"], &repo, &state, &socket);
        assert_eq!(code, 1);
        assert!(
            err.contains("registry.example.invalid") && err.contains("pl up --build hello=DIR"),
            "{err}"
        );
        assert_eq!(gets(18_443, host_name).map(|r| r.0), Some(200), "still serving");

        // On a terminal the progress is live, and each environment's line ends with its URL.
        let project = repo.join("projects/hello.yaml");
        let text = std::fs::read_to_string(&project).expect("read");
        std::fs::write(&project, text.replace("replicas: 2", "replicas: 3")).expect("write");
        let command = format!(
            "{} up --port 18090 --build {build} {}",
            env!("CARGO_BIN_EXE_pl"),
            repo.display()
        );
        let o = Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .env("PL_STATE_DIR", &state)
            .env("PL_DOCKER_SOCKET", &socket)
            .output()
            .expect("script");
        let shown = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{shown}");
        assert!(
            shown.contains("✔ hello-production: generation") && shown.contains(&url),
            "{shown}"
        );
        let (code, out, err) = pl(&["down"], &repo, &state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        assert!(
            out.contains("stopped the agent of node-1, Caddy, the reconciler;") && !out.contains("registry"),
            "pl down says what it stopped: {out}"
        );
        assert_eq!(gets(18_443, host_name), None, "nothing serves after pl down");
        assert!(
            tls_support::head_plain_result(18_090, host_name).is_err(),
            "nor on plain HTTP"
        );
        // After `pl down`, `--port` takes effect (the port recorded before is no dead end).
        let (code, out, err) = pl(&["up", "--port", "18091", "--build", &build], &repo, &state, &socket);
        assert_eq!(code, 0, "pl up --port after pl down: {out}\n{err}");
        assert_eq!(gets(18_443, host_name).map(|r| r.0), Some(200), "HTTPS keeps its port");
        assert!(tls_support::head_plain(18_091, host_name).starts_with("HTTP/1.1 308"));
        let (code, _, err) = pl(&["up", "--port", "18092", "--build", &build], &repo, &state, &socket);
        assert_eq!(code, 1, "a running control plane keeps its port");
        assert!(err.contains("`pl down` first, then `pl up --port 18092`"), "{err}");
        let (code, out, err) = pl(&["down"], &repo, &state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
    });
}

/// Two repositories with the same environment, project, node and hostname names, each with
/// its own `pl up` (its own control plane) on one simulated host: both URLs serve their own
/// page, their containers, networks and firewall tables name their own control plane, their
/// subnets (and so route tables and rules) differ, and `pl down` of one leaves the other
/// serving with the same containers, table and rule.
#[test]
fn two_control_planes_share_a_host_without_touching_each_other() {
    siblings();
    let base = PathBuf::from(format!("/tmp/pl2cp-{}", std::process::id()));
    let host = Host::start(&format!("plhost-2cp-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let _registry = Kill(registry);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sides = Vec::new();
    for (side, page) in [("a", "page of repository a\n"), ("b", "page of repository b\n")] {
        let image = host.image(
            port,
            &format!("web-{side}"),
            &[("/www/index.html", page), ("/www/healthz", "ok\n")],
        );
        std::fs::create_dir_all(dir.path().join(side)).expect("side");
        let repo = Repo::new(&dir.path().join(side));
        repo.write(
            "projects/api.yaml",
            &format!(
                "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz, timeoutSeconds: 5}}, replicas: 1, command: [/bin/busybox, sh, -c, 'echo started by repository {side}; exec /bin/busybox httpd -f -p 8080 -h /www']}}\n"
            ),
        );
        repo.write("envs/api-production.yaml", &environment("api-production", "api"));
        sides.push((
            repo.dir.clone(),
            dir.path().join(format!("state-{side}")),
            page.trim().to_owned(),
        ));
    }
    let _detached = Detached(sides.iter().map(|s| s.1.clone()).collect());
    let socket = host.socket.clone();
    host.run(move || {
        let host_name = "api.example.com.localhost";
        let ports = [18_081u16, 18_082];
        for ((repo, state, _), http) in sides.iter().zip(ports) {
            let (code, out, err) = pl(
                &["up", "--http", "--node", "n1", "--port", &http.to_string()],
                repo,
                state,
                &socket,
            );
            assert_eq!(
                code,
                0,
                "pl up: {out}\n{err}\nagent log: {}",
                std::fs::read_to_string(state.join("agents/n1/agent.log")).unwrap_or_default()
            );
        }
        for ((_, _, page), http) in sides.iter().zip(ports) {
            assert_eq!(
                get(http, host_name),
                Some((200, page.clone())),
                "each serves its own page"
            );
        }
        let ledger = |state: &Path| format!("sqlite://{}", state.join("ledger.db").display());
        let ids: Vec<String> = sides
            .iter()
            .map(|s| agent_support::control_plane(&ledger(&s.1)))
            .collect();
        assert_ne!(ids[0], ids[1], "two control planes, two ids");
        let subnets: Vec<Vec<String>> = sides
            .iter()
            .map(|s| agent_support::sql(&ledger(&s.1), "SELECT CAST(idx AS TEXT) FROM subnets"))
            .collect();
        assert_ne!(subnets[0], subnets[1], "subnets differ on one machine: {subnets:?}");
        // What b runs, as the engine, nftables and the routing policy see it.
        let containers = |cp: &str| {
            docker(
                &socket,
                &[
                    "ps",
                    "-q",
                    "--no-trunc",
                    "--filter",
                    &format!("label=dev.pushleft.control-plane={cp}"),
                ],
            )
        };
        let b_containers = containers(&ids[1]);
        assert_eq!(b_containers.lines().count(), 1, "{b_containers}");
        assert_eq!(containers(&ids[0]).lines().count(), 1);
        let name = docker(&socket, &["inspect", "--format", "{{.Name}}", &b_containers]);
        assert_eq!(
            name,
            format!("/pl_{}_api-production_web_0_g{}", ids[1], {
                agent_support::sql(&ledger(&sides[1].1), "SELECT CAST(generation AS TEXT) FROM deployments")[0].clone()
            })
        );
        let table = |cp: &str| {
            Command::new("nft")
                .args(["list", "table", "inet", &format!("pl_{cp}_api-production_n1")])
                .output()
                .expect("nft")
        };
        assert!(table(&ids[0]).status.success() && table(&ids[1]).status.success());
        let rules =
            || String::from_utf8_lossy(&Command::new("ip").arg("rule").output().expect("ip").stdout).into_owned();
        let b_subnet = format!(
            "10.{}.{}.0/24",
            208 + subnets[1][0].parse::<u32>().expect("idx") / 256,
            subnets[1][0].parse::<u32>().expect("idx") % 256
        );
        assert!(rules().contains(&format!("from {b_subnet}")), "{}", rules());
        // `pl logs` reads its own control plane's containers only: both have node n1 and
        // environment api-production, each container says which repository started it.
        for ((repo, state, _), (mine, theirs)) in sides.iter().zip([("a", "b"), ("b", "a")]) {
            let repo_arg = repo.to_string_lossy().into_owned();
            let (code, out, err) = outcome(
                pl_command(state, &socket)
                    .args(["logs", "api-production", "web", "--local", &repo_arg])
                    .output()
                    .expect("pl logs"),
            );
            assert_eq!(code, 0, "pl logs: {out}\n{err}");
            assert!(
                out.contains(&format!("started by repository {mine}"))
                    && !out.contains(&format!("started by repository {theirs}")),
                "{out}"
            );
        }

        // a goes; b stays exactly as it was.
        let (code, out, err) = pl(&["down"], &sides[0].0, &sides[0].1, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        assert_eq!(get(ports[0], host_name), None, "a serves nothing");
        assert_eq!(containers(&ids[0]), "", "a's container is gone");
        assert!(!table(&ids[0]).status.success(), "a's table is gone");
        assert_eq!(
            get(ports[1], host_name),
            Some((200, sides[1].2.clone())),
            "b still serves"
        );
        assert_eq!(containers(&ids[1]), b_containers, "b's container is the same");
        let b_table = table(&ids[1]);
        assert!(b_table.status.success(), "b's table stays");
        assert!(
            rules().contains(&format!("from {b_subnet}")),
            "b's rule stays: {}",
            rules()
        );
        let (code, out, err) = pl(&["down"], &sides[1].0, &sides[1].1, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
    });
}

/// Volumes through `pl up`: a web role whose page is a log on its volume (each start appends
/// its release). The data survives a new release, a SIGKILL of the container (drift starts
/// it again, on the same volume), a SIGKILL of the agent (restarted by `pl up`), and a whole
/// `pl down` and `pl up`; `pl volumes` shows each environment's volume on its node; a torn-down
/// environment's volume is kept and removed only by `pl volume rm`, which refuses one in use.
#[test]
fn volumes_keep_their_data_across_releases_kills_and_down_up_until_removed() {
    siblings();
    let base = PathBuf::from(format!("/tmp/plvol-{}", std::process::id()));
    let host = Host::start(&format!("plhost-vol-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let _registry = Kill(registry);
    let image = host.image(port, "vol", &[("/www/healthz", "ok\n")]);
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    let project = move |release: &str| {
        format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  env: {{RELEASE: {release}}}\n  roles:\n    web:\n      kind: web\n      port: 8080\n      health: {{path: /healthz, timeoutSeconds: 10}}\n      volumes: [{{name: data, path: /data}}]\n      command: [/bin/busybox, sh, -c, 'echo $RELEASE >> /data/index.html && echo ok > /data/healthz && exec /bin/busybox httpd -f -p 8080 -h /data']\n"
        )
    };
    repo.write("projects/api.yaml", &project("r1"));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.write(
        "envs/api-staging.yaml",
        "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: api-staging}\nspec: {project: api, stage: production, pool: main, hostname: staging.example.com}\n",
    );
    let (repo_dir, state, socket) = (repo.dir.clone(), dir.path().join("pl-state"), host.socket.clone());
    let _detached = Detached(vec![state.clone()]);
    host.run(move || {
        let http = 18_083;
        let port_arg = http.to_string();
        let up = || {
            let (code, out, err) = pl(
                &["up", "--http", "--node", "n1", "--port", &port_arg],
                &repo_dir,
                &state,
                &socket,
            );
            assert_eq!(
                code,
                0,
                "pl up: {out}\n{err}\nagent log: {}",
                std::fs::read_to_string(state.join("agents/n1/agent.log")).unwrap_or_default()
            );
        };
        let page = |host: &str| get(http, host).map(|(_, body)| body);
        let eventually = |host: &str, want: &str| {
            let deadline = Instant::now() + Duration::from_secs(60);
            while page(host).as_deref() != Some(want) {
                assert!(
                    Instant::now() < deadline,
                    "{host} never served {want:?}: {:?}",
                    page(host)
                );
                std::thread::sleep(Duration::from_millis(300));
            }
        };
        let (prod, staging) = ("api.example.com.localhost", "staging.example.com.localhost");
        up();
        assert_eq!(page(prod).as_deref(), Some("r1"));
        assert_eq!(page(staging).as_deref(), Some("r1"), "each environment its own volume");

        // A new release finds the data (and started after the old container stopped).
        repo.write("projects/api.yaml", &project("r2"));
        up();
        assert_eq!(page(prod).as_deref(), Some("r1\nr2"));
        // SIGKILL of the container: drift starts it again, on the same volume.
        let container = docker(
            &socket,
            &[
                "ps",
                "-q",
                "--filter",
                "status=running",
                "--filter",
                "label=dev.pushleft.environment=api-production",
            ],
        );
        assert_eq!(container.lines().count(), 1, "one writer: {container}");
        docker(&socket, &["kill", "--signal", "KILL", &container]);
        eventually(prod, "r1\nr2\nr2");
        // SIGKILL of the agent: `pl up` restarts it, the container and its data are kept.
        let agent = std::fs::read_to_string(state.join("agents/n1/agent.pid")).expect("agent pid");
        assert!(
            Command::new("kill")
                .args(["-9", agent.trim()])
                .status()
                .expect("kill")
                .success()
        );
        up();
        assert_eq!(page(prod).as_deref(), Some("r1\nr2\nr2"), "the same container serves");

        // `pl volumes`: each environment's volume on n1, in use.
        let (code, out, err) = pl(&["volumes", "--format", "json", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "{out}\n{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        let rows: Vec<String> = v["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .map(|r| {
                format!(
                    "{}/{}@{} {}",
                    r["environment"].as_str().unwrap_or(""),
                    r["volume"].as_str().unwrap_or(""),
                    r["node"].as_str().unwrap_or(""),
                    r["state"].as_str().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(rows, ["api-production/data@n1 in-use", "api-staging/data@n1 in-use"]);

        // A whole `pl down` keeps the volumes; `pl up` again finds the data.
        let (code, out, err) = pl(&["down"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        assert!(
            out.contains("kept 2 volumes for their retainDays") && out.contains("api-production/data on n1"),
            "{out}"
        );
        let volumes = || {
            docker(
                &socket,
                &[
                    "volume",
                    "ls",
                    "-q",
                    "--filter",
                    "label=dev.pushleft.environment=api-production",
                ],
            )
        };
        assert_eq!(volumes().lines().count(), 1, "kept after pl down");
        up();
        assert_eq!(page(prod).as_deref(), Some("r1\nr2\nr2\nr2"));

        // One environment down, the control plane still up: its volume is retained, removed
        // only when an admin asks; a volume in use is refused.
        let (code, out, err) = outcome(
            pl_command(&state, &socket)
                .arg("down")
                .arg(&repo_dir)
                .arg("api-production")
                .output()
                .expect("pl down ENV"),
        );
        assert_eq!(code, 0, "pl down api-production: {out}\n{err}");
        let (code, out, _) = pl(&["volumes", "api-production", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0);
        assert!(out.contains("retained") && out.contains("removed in 168 h"), "{out}");
        let (code, _, err) = pl(
            &["volume", "rm", "api-staging", "data", "--local"],
            &repo_dir,
            &state,
            &socket,
        );
        assert_ne!(code, 0);
        assert!(err.contains("volume-in-use"), "{err}");
        assert_eq!(volumes().lines().count(), 1);
        let (code, out, err) = pl(
            &["volume", "rm", "api-production", "data", "--local"],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains("removed api-production/data from n1"), "{out}");
        assert_eq!(volumes(), "", "gone from the host");
        let (code, out, err) = pl(&["down"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        let staging_volume = docker(
            &socket,
            &[
                "volume",
                "ls",
                "-q",
                "--filter",
                "label=dev.pushleft.environment=api-staging",
            ],
        );
        assert_eq!(staging_volume.lines().count(), 1, "staging's is kept");
        // The commands `pl down` names for what it kept work after it: the control plane is
        // started for each (the agent too, to remove the volume) and stopped again after.
        let (code, out, err) = pl(&["volumes", "--local"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "pl volumes after pl down: {out}\n{err}");
        assert!(out.contains("api-staging") && out.contains("retained"), "{out}");
        assert!(err.contains("started for this command"), "{err}");
        let (code, out, err) = pl(
            &["volume", "rm", "api-staging", "data", "--local"],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "pl volume rm after pl down: {out}\n{err}");
        assert!(out.contains("removed api-staging/data from n1"), "{out}");
        assert_eq!(
            docker(
                &socket,
                &[
                    "volume",
                    "ls",
                    "-q",
                    "--filter",
                    "label=dev.pushleft.environment=api-staging"
                ]
            ),
            "",
            "gone from the host"
        );
        let running = |pid_file: &Path| {
            std::fs::read_to_string(pid_file)
                .ok()
                .and_then(|p| std::fs::read_to_string(format!("/proc/{}/cmdline", p.trim())).ok())
                .is_some_and(|c| c.contains("pl-reconciler") || c.contains("pl-agent"))
        };
        assert!(
            !running(&state.join("reconciler.pid")),
            "the reconciler is stopped again"
        );
        assert!(
            !running(&state.join("agents/n1/agent.pid")),
            "the agent is stopped again"
        );
    });
}

/// Backups, end to end with real restic: `pl backup` saves a web role's files (its container
/// paused meanwhile) and a worker's command output (`cat`, standing in for `pg_dump`) into the
/// environment's repository, which the `restic` CLI reads back with the password set by `pl
/// secret set`; a failing command is a failed backup with its reason (and no snapshot); `pl
/// backups` lists all three as the agent reported them; and a schedule saves one on its own, and
/// another proves it with a restore drill.
#[test]
fn backups_are_saved_into_a_restic_repository_the_restic_cli_reads() {
    siblings();
    let base = PathBuf::from(format!("/tmp/plbak-{}", std::process::id()));
    let host = Host::start(&format!("plhost-bak-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let _registry = Kill(registry);
    let image = host.image(port, "bak", &[("/www/healthz", "ok\n")]);
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    let (repo_dir, state, socket) = (repo.dir.clone(), dir.path().join("pl-state"), host.socket.clone());
    let restic_repo = state.join("backups/api");
    // The developer's identity is the control plane's (as in the secrets scenario above).
    let (dev, recipient) = developer_identity(dir.path(), &repo_dir);
    let password = "correct horse battery staple";
    backups_secret(&repo, &repo_dir, &recipient, password);
    let worker = |volume: &str, command: &str, restore: &str| {
        format!(
            "    {volume}:\n      kind: worker\n      volumes: [{{name: {volume}, path: /{volume}, backup: {{schedule: \"0 0 1 1 *\", keep: 2, command: {command}{restore}}}}}]\n      command: [/bin/busybox, sh, -c, 'echo row1 > /{volume}/table && exec /bin/busybox sleep 100000']\n"
        )
    };
    repo.write(
        "projects/api.yaml",
        &format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    web:\n      kind: web\n      port: 8080\n      health: {{path: /healthz, timeoutSeconds: 10}}\n      volumes: [{{name: data, path: /data, backup: {{schedule: \"* * * * *\", keep: 5, verify: {{schedule: \"* * * * *\", command: [/bin/busybox, grep, -q, kept, /data/index.html]}}}}}}]\n      command: [/bin/busybox, sh, -c, '[ -f /data/index.html ] || echo kept > /data/index.html; echo ok > /data/healthz && exec /bin/busybox httpd -f -p 8080 -h /data']\n{}{}",
            worker(
                "rows",
                "[/bin/busybox, cat, /rows/table]",
                ", restore: [/bin/busybox, sh, -c, 'cat > /rows/loaded']"
            ),
            worker(
                "broken",
                "[/bin/busybox, sh, -c, 'echo half; echo disk on fire >&2; exit 3']",
                ""
            ),
        ),
    );
    repo.write(
        "envs/api-production.yaml",
        &format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {{name: api-production}}\nspec:\n  project: api\n  stage: production\n  pool: main\n  backups: {{repository: {}, secret: backups}}\n",
            restic_repo.display()
        ),
    );
    let _detached = Detached(vec![state.clone()]);
    host.run(move || {
        let port_arg = "18084".to_owned();
        let dev_arg = dev.to_string_lossy().into_owned();
        let (code, out, err) = pl(
            &[
                "up",
                "--http",
                "--node",
                "n1",
                "--port",
                &port_arg,
                "--identity",
                &dev_arg,
            ],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(
            code,
            0,
            "pl up: {out}\n{err}\nagent log: {}",
            std::fs::read_to_string(state.join("agents/n1/agent.log")).unwrap_or_default()
        );
        let backup = |volume: &str| {
            pl(
                &["backup", "api-production", volume, "--local"],
                &repo_dir,
                &state,
                &socket,
            )
        };
        let (code, out, err) = backup("data");
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains("backed up api-production/data on n1: snapshot"), "{out}");
        // (The web volume's every-minute schedule may save one of its own meanwhile.)
        let data_snapshot = out
            .split("snapshot ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("snapshot id")
            .to_owned();
        let web = docker(&socket, &["ps", "-q", "--filter", "label=dev.pushleft.role=web"]);
        assert_eq!(
            docker(&socket, &["inspect", "--format", "{{.State.Status}}", &web]),
            "running",
            "unpaused after the backup"
        );
        let (code, out, err) = backup("rows");
        assert_eq!(code, 0, "{out}\n{err}");
        let (code, out, err) = backup("broken");
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(
            err.contains("error[backup-failed]") && err.contains("exited with 3") && err.contains("disk on fire"),
            "{err}"
        );
        // A volume nothing backs up is refused before anything is queued.
        let (code, _, err) = backup("nothing");
        assert_eq!(code, 1);
        assert!(err.contains("backup-not-planned"), "{err}");

        // The restic CLI reads what the agent wrote, with the password from the Secret.
        let pw = dir.path().join("password");
        std::fs::write(&pw, password).expect("password file");
        // Retention runs right after a backup is reported, under restic's exclusive lock for
        // its prune: a reader then waits for it (restic 0.14 has no --retry-lock), 30 s at most.
        let restic = |args: &[&str]| {
            let deadline = Instant::now() + Duration::from_secs(30);
            let o = loop {
                let o = Command::new("restic")
                    .arg("--repo")
                    .arg(&restic_repo)
                    .arg("--password-file")
                    .arg(&pw)
                    .arg("--no-cache")
                    .args(args)
                    .output()
                    .expect("restic");
                if o.status.success()
                    || !String::from_utf8_lossy(&o.stderr).contains("locked")
                    || Instant::now() > deadline
                {
                    break o;
                }
                std::thread::sleep(Duration::from_millis(300));
            };
            assert!(
                o.status.success(),
                "restic {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        let snapshots: serde_json::Value = serde_json::from_str(&restic(&["snapshots", "--json"])).expect("json");
        let tagged = |volume: &str| -> Vec<String> {
            snapshots
                .as_array()
                .expect("snapshots")
                .iter()
                .filter(|s| {
                    s["tags"]
                        .as_array()
                        .is_some_and(|t| t.iter().any(|t| t == &format!("pl-volume={volume}")))
                })
                .map(|s| s["short_id"].as_str().unwrap_or("").to_owned())
                .collect()
        };
        assert!(tagged("data").contains(&data_snapshot), "{snapshots}");
        assert_eq!(tagged("rows").len(), 1, "{snapshots}");
        assert!(
            tagged("broken").is_empty(),
            "a failed command leaves no snapshot: {snapshots}"
        );
        assert_eq!(restic(&["dump", &data_snapshot, "/index.html"]), "kept\n");
        assert_eq!(restic(&["dump", &tagged("rows")[0], "/rows.dump"]), "row1\n");

        // `pl backups`: what the agent reported, newest first.
        let (code, out, err) = pl(
            &["backups", "api-production", "--format", "json", "--local"],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        let listed: Vec<String> = v["backups"]
            .as_array()
            .expect("backups")
            .iter()
            .filter(|r| r["job"].as_str().is_some_and(|j| j.contains(":now")))
            .map(|r| {
                format!(
                    "{} {} {}",
                    r["volume"].as_str().unwrap_or(""),
                    r["status"].as_str().unwrap_or(""),
                    r["snapshot"].as_str().unwrap_or("-")
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                "broken failed -".to_owned(),
                format!("rows succeeded {}", tagged("rows")[0]),
                format!("data succeeded {data_snapshot}"),
            ],
            "{out}"
        );
        let (code, out, _) = pl(
            &["backups", "api-production", "rows", "--local"],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0);
        assert!(
            out.contains("succeeded") && out.contains(&tagged("rows")[0]) && !out.contains("broken"),
            "{out}"
        );

        // `/metrics`: each backed-up volume's age since its newest success, and failures since.
        let ports: serde_json::Value =
            serde_json::from_slice(&std::fs::read(state.join("ports.json")).expect("ports")).expect("ports json");
        let ca = std::fs::read_to_string(state.join("tls/ca.crt")).expect("ca");
        let api = u16::try_from(ports["api"].as_u64().expect("api port")).expect("port");
        let deadline = Instant::now() + Duration::from_secs(30);
        let metrics = loop {
            let (_, text, _) =
                tls_support::get_tls_path([127, 0, 0, 1], api, "localhost", "/metrics", &ca).expect("metrics");
            if text.contains("pushleft_backup_failures{environment=\"api-production\",volume=\"broken\"} 1") {
                break text;
            }
            assert!(Instant::now() < deadline, "{text}");
            std::thread::sleep(Duration::from_millis(500));
        };
        assert!(
            metrics.contains(
                "pushleft_backup_last_success_age_seconds{environment=\"api-production\",volume=\"broken\"} +Inf"
            ) && metrics.contains("pushleft_backup_failures{environment=\"api-production\",volume=\"rows\"} 0")
                && metrics.contains(
                    "pushleft_backup_last_success_age_seconds{environment=\"api-production\",volume=\"rows\"} "
                ),
            "{metrics}"
        );

        // The web volume's schedules fire every minute: a second snapshot comes on its own, and
        // a restore drill of the newest passes on its own.
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let (_, out, _) = pl(
                &["backups", "api-production", "data", "--format", "json", "--local"],
                &repo_dir,
                &state,
                &socket,
            );
            let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
            let scheduled = v["backups"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["status"] == "succeeded" && r["job"].as_str().is_some_and(|j| j.contains(":t")));
            let drilled = v["backups"].as_array().into_iter().flatten().any(|r| {
                r["status"] == "verified"
                    && r["job"]
                        .as_str()
                        .is_some_and(|j| j.starts_with("drill:") && j.contains(":t"))
            });
            if scheduled && drilled && v["proven"][0]["volume"] == "data" {
                break;
            }
            assert!(Instant::now() < deadline, "no scheduled backup and drill: {out}");
            std::thread::sleep(Duration::from_secs(2));
        }
        // The data is destroyed; `pl restore` from the first snapshot brings it back in a new
        // generation of the volume, the role rolled out on it, the old generation kept.
        let page = || get(18_084, "api.example.com.localhost").map(|(_, body)| body);
        assert_eq!(page().as_deref(), Some("kept"));
        let web = docker(&socket, &["ps", "-q", "--filter", "label=dev.pushleft.role=web"]);
        docker(
            &socket,
            &[
                "exec",
                &web,
                "/bin/busybox",
                "sh",
                "-c",
                "echo destroyed > /data/index.html",
            ],
        );
        assert_eq!(page().as_deref(), Some("destroyed"));
        // A well-formed id no backup of the volume saved: refused before anything is written
        // (no job, no volume generation).
        let ledger_url = format!("sqlite://{}", state.join("ledger.db").display());
        let jobs = || agent_support::sql(&ledger_url, "SELECT CAST(COUNT(*) AS TEXT) FROM jobs");
        let jobs_before = jobs();
        let (code, out, err) = pl(
            &["restore", "api-production", "data", "--snapshot", "deadbeef", "--local"],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(
            err.contains("[snapshot-unknown]") && err.contains("pl backups api-production data"),
            "{err}"
        );
        assert_eq!(jobs(), jobs_before, "no job queued");
        let (code, out, err) = pl(
            &[
                "restore",
                "api-production",
                "data",
                "--snapshot",
                &data_snapshot,
                "--timeout",
                "180",
                "--local",
            ],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            out.contains(&format!(
                "restored api-production/data from snapshot {data_snapshot} into generation 2 on n1"
            )),
            "{out}"
        );
        assert_eq!(page().as_deref(), Some("kept"), "the restored data serves");
        let data_volumes = docker(
            &socket,
            &["volume", "ls", "-q", "--filter", "label=dev.pushleft.volume=data"],
        );
        assert!(
            data_volumes.lines().any(|v| v.ends_with("_data_v1"))
                && data_volumes.lines().any(|v| v.ends_with("_data_v2")),
            "the old generation is kept: {data_volumes}"
        );
        // A command's output is a dump: the new generation starts empty, and the backup's
        // `restore` command loads the dump (on its standard input) in the role's container.
        let (code, out, err) = pl(
            &["restore", "api-production", "rows", "--timeout", "180", "--local"],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        let rows = docker(&socket, &["ps", "-q", "--filter", "label=dev.pushleft.role=rows"]);
        assert_eq!(
            docker(&socket, &["exec", &rows, "/bin/busybox", "cat", "/rows/loaded"]),
            "row1",
            "the dump was loaded"
        );
        assert!(
            docker(
                &socket,
                &["volume", "ls", "-q", "--filter", "label=dev.pushleft.volume=rows"]
            )
            .lines()
            .any(|v| v.ends_with("_rows_v2"))
        );
        let restores = state.join("agents/n1/restores");
        assert_eq!(
            std::fs::read_dir(&restores).map(|d| d.count()).unwrap_or(0),
            0,
            "the loaded dump is gone from {}",
            restores.display()
        );
        // Without a `restore` command, a dump cannot be restored: refused before anything runs.
        let (code, _, err) = pl(
            &["restore", "api-production", "broken", "--local"],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 1);
        assert!(err.contains("restore-of-a-dump"), "{err}");
        let (code, out, err) = pl(&["down"], &repo_dir, &state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        for v in docker(
            &socket,
            &[
                "volume",
                "ls",
                "-q",
                "--filter",
                "label=dev.pushleft.environment=api-production",
            ],
        )
        .lines()
        {
            docker(&socket, &["volume", "rm", v]);
        }
    });
}
