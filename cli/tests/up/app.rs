//! examples/app, as `scripts/example-app` runs it, on a simulated host: a web role and a worker
//! that reach a real PostgreSQL (Debian's binaries in an image built from nothing by
//! `scripts/app-image`, running as an unprivileged user) through the service name `db`, its
//! data on a volume. The rows survive a new release of web, a SIGKILL of the database's
//! container (restarted in place), a SIGKILL of the agent, and `pl down` then `pl up`; after a
//! backup a restore drill proves the snapshot (PostgreSQL starts on a scratch copy and
//! answers), the data is destroyed and `pl restore` brings the rows back, and a drill of a
//! corrupted repository fails with restic's reason. Another environment can neither resolve
//! `db` nor reach the database's address.

use super::*;

/// The notes the web role lists (`None` while it cannot answer).
fn notes(port: u16, host: &str, query: &str) -> Option<String> {
    match agent_support::get_host_path(port, host, &format!("/cgi-bin/notes{query}")) {
        Ok((200, body)) => Some(body.trim().to_owned()),
        _ => None,
    }
}

/// Waits (90 s at most) until the web role lists `want`.
fn notes_become(port: u16, host: &str, want: &str, after: &str, diagnose: &dyn Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = notes(port, host, "");
        if got.as_deref() == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {after}: notes {got:?}, want {want:?}\n{}",
            diagnose()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn the_example_app_keeps_its_rows_in_postgresql_through_releases_kills_down_up_and_a_restore() {
    siblings();
    let base = PathBuf::from(format!("/tmp/plapp-{}", std::process::id()));
    let host = Host::start(&format!("plhost-app-{}", std::process::id()), &base);
    let dir = tempfile::tempdir().expect("tempdir");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace");
    let (repo, context, state) = (
        dir.path().join("app"),
        dir.path().join("image"),
        dir.path().join("pl-state"),
    );
    // The image's context, staged as scripts/example-app stages it.
    let o = Command::new("bash")
        .arg(workspace.join("scripts/app-image"))
        .arg(&context)
        .output()
        .expect("scripts/app-image");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        Command::new("cp")
            .arg("-r")
            .arg(workspace.join("examples/app"))
            .arg(&repo)
            .status()
            .expect("cp")
            .success()
    );
    std::fs::remove_dir_all(repo.join("app")).expect("rm app/");
    // As the script does: the developer's identity replaces the placeholders.
    let (dev, recipient) = {
        let dev = dir.path().join("dev.key");
        assert!(
            Command::new("age-keygen")
                .arg("-o")
                .arg(&dev)
                .output()
                .expect("age-keygen")
                .status
                .success()
        );
        let o = Command::new("age-keygen")
            .arg("-y")
            .arg(&dev)
            .output()
            .expect("age-keygen -y");
        (dev, String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let root = std::fs::read_to_string(repo.join("pushleft.yaml")).expect("root");
    let placeholder = root
        .lines()
        .find_map(|l| l.trim().strip_prefix("controlRecipient: "))
        .expect("the example names a control recipient")
        .to_owned();
    std::fs::write(repo.join("pushleft.yaml"), root.replace(&placeholder, &recipient)).expect("root");
    std::fs::write(
        repo.join("secrets/app-backups.yaml"),
        format!("apiVersion: pushleft.dev/v1alpha1\nkind: Secret\nmetadata:\n  name: app-backups\nspec:\n  recipients:\n    - {recipient}\n"),
    )
    .expect("secret");
    let mut set = Command::new(env!("CARGO_BIN_EXE_pl"))
        .args(["secret", "set", "app-backups", "RESTIC_PASSWORD", "-C"])
        .arg(&repo)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("pl secret set");
    std::io::Write::write_all(&mut set.stdin.take().expect("stdin"), b"example app's password").expect("value");
    assert!(set.wait().expect("pl secret set").success());
    // The repository under this control plane's own backup root, not the machine's.
    let env_file = repo.join("environments/app-production.yaml");
    let env_text = std::fs::read_to_string(&env_file).expect("environment");
    std::fs::write(
        &env_file,
        env_text.replace(
            "/var/backups/pushleft/example-app",
            &state.join("backups/example-app").to_string_lossy(),
        ),
    )
    .expect("environment");
    // The nightly backup and the weekly drill would collide with the test's own if a run
    // crossed 03:17 or a Sunday's 04:47 UTC: moved to a time no run meets.
    let project_file = repo.join("projects/app.yaml");
    let text = std::fs::read_to_string(&project_file).expect("project");
    assert!(text.contains("\"17 3 * * *\"") && text.contains("\"47 4 * * 0\""));
    std::fs::write(
        &project_file,
        text.replace("\"17 3 * * *\"", "\"0 0 1 1 *\"")
            .replace("\"47 4 * * 0\"", "\"0 0 1 1 *\""),
    )
    .expect("project");
    // Another project's environment on the same node, for the isolation checks.
    std::fs::write(
        repo.join("projects/probe.yaml"),
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {name: probe}\nspec:\n  image: registry.example.invalid/probe@sha256:1111111111111111111111111111111111111111111111111111111111111111\n  roles:\n    sh: {kind: worker, command: [/bin/sleep, '100000']}\n",
    )
    .expect("probe");
    std::fs::write(
        repo.join("environments/probe-production.yaml"),
        "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: probe-production}\nspec: {project: probe, stage: production, pool: default}\n",
    )
    .expect("probe environment");

    let _detached = Detached(vec![state.clone()]);
    let socket = host.socket.clone();
    host.run(move || {
        let http = 18_086;
        let port_arg = http.to_string();
        let (build_app, build_probe) = (
            format!("app={}", context.display()),
            format!("probe={}", context.display()),
        );
        let dev_arg = dev.to_string_lossy().into_owned();
        let up = |what: &str| -> String {
            let (code, out, err) = pl(
                &[
                    "up",
                    "--http",
                    "--node",
                    "node-1",
                    "--port",
                    &port_arg,
                    "--identity",
                    &dev_arg,
                    "--build",
                    &build_app,
                    "--build",
                    &build_probe,
                    "--timeout-seconds",
                    "240",
                ],
                &repo,
                &state,
                &socket,
            );
            assert_eq!(
                code,
                0,
                "pl up ({what}): {out}\n{err}\nagent log: {}",
                std::fs::read_to_string(state.join("agents/node-1/agent.log")).unwrap_or_default()
            );
            out
        };
        let out = up("first");
        let host_name = out
            .split_whitespace()
            .find(|w| w.starts_with("http://app.") && w.contains(".localhost:"))
            .and_then(|u| u.trim_start_matches("http://").split(':').next())
            .unwrap_or_else(|| panic!("no URL in {out}"))
            .to_owned();
        let host_name = host_name.as_str();
        let container = |env: &str, role: &str| -> String {
            docker(
                &socket,
                &[
                    "ps",
                    "-q",
                    "--filter",
                    "status=running",
                    "--filter",
                    &format!("label=dev.pushleft.environment={env}"),
                    "--filter",
                    &format!("label=dev.pushleft.role={role}"),
                ],
            )
        };

        let diagnose = || {
            let all = docker(&socket, &["ps", "-a", "--format", "{{.Names}} {{.Status}}"]);
            let db = docker(
                &socket,
                &[
                    "ps",
                    "-aq",
                    "--filter",
                    "label=dev.pushleft.role=db",
                    "--filter",
                    "label=dev.pushleft.environment=app-production",
                ],
            );
            let logs = db
                .lines()
                .map(|c| host_support::docker_at(&socket, &["logs", "--tail", "20", c]))
                .collect::<Vec<_>>()
                .join("\n");
            format!(
                "containers:\n{all}\ndb logs:\n{logs}\nagent log:\n{}",
                std::fs::read_to_string(state.join("agents/node-1/agent.log"))
                    .unwrap_or_default()
                    .lines()
                    .rev()
                    .take(30)
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        };
        // The web role writes through `db` and reads back; the database runs unprivileged.
        assert_eq!(
            notes(http, host_name, "?add=first").as_deref(),
            Some("first"),
            "{host_name}: {:?}\n{out}",
            agent_support::get_host_path(http, host_name, "/cgi-bin/notes")
        );
        assert_eq!(notes(http, host_name, "?add=second").as_deref(), Some("first\nsecond"));
        assert_eq!(notes(http, host_name, "?add=no'quote"), None, "refused input");
        let db = container("app-production", "db");
        assert_eq!(db.lines().count(), 1, "one database: {db}");
        assert_eq!(docker(&socket, &["exec", &db, "/bin/busybox", "id", "-u"]), "999");
        // The worker reads them too.
        let worker = container("app-production", "worker");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !docker(&socket, &["logs", "--tail", "3", &worker]).contains("worker: 2 notes") {
            assert!(Instant::now() < deadline, "the worker never saw the notes");
            std::thread::sleep(Duration::from_millis(500));
        }

        // A new release of web: the rows are there.
        let project = repo.join("projects/app.yaml");
        let text = std::fs::read_to_string(&project).expect("project");
        std::fs::write(
            &project,
            text.replace(r#"["/bin/httpd", "-f", "-p""#, r#"["/bin/httpd", "-f", "-v", "-p""#),
        )
        .expect("project");
        up("a release of web");
        assert_eq!(notes(http, host_name, "").as_deref(), Some("first\nsecond"));
        // (A release is a new generation of the whole deployment: the database's container
        // was stopped and its successor started on the same volume.)
        let db = container("app-production", "db");

        // SIGKILL of the database: started again in place, on the same volume (PostgreSQL
        // recovers from its WAL; the agent makes the container again, see `recreate`).
        let name_of = |id: &str| docker(&socket, &["inspect", "--format", "{{.Name}}", id]);
        let db_name = name_of(&db);
        docker(&socket, &["kill", "--signal", "KILL", &db]);
        notes_become(http, host_name, "first\nsecond", "a SIGKILL of the database", &diagnose);
        let db = container("app-production", "db");
        assert_eq!(
            name_of(&db),
            db_name,
            "the same replica and generation, made again in place"
        );

        // SIGKILL of the agent, then `pl up`: nothing lost.
        let agent = std::fs::read_to_string(state.join("agents/node-1/agent.pid")).expect("agent pid");
        assert!(
            Command::new("kill")
                .args(["-9", agent.trim()])
                .status()
                .expect("kill")
                .success()
        );
        // `pl up` returns once the restarted agent reported: its service names answer already.
        up("after the agent's SIGKILL");
        assert_eq!(
            notes(http, host_name, "?add=third").as_deref(),
            Some("first\nsecond\nthird")
        );

        // `pl down`, then `pl up`: the volume was kept, the database starts on it.
        let (code, out, err) = pl(&["down"], &repo, &state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        assert!(out.contains("app-production/pgdata on node-1"), "{out}");
        assert_eq!(container("app-production", "db"), "", "stopped");
        up("after pl down");
        notes_become(http, host_name, "first\nsecond\nthird", "pl down and pl up", &diagnose);

        // Isolation: another environment's container neither resolves `db` nor reaches the
        // database's address.
        let probe = container("probe-production", "sh");
        let db = container("app-production", "db");
        let db_ip = docker(
            &socket,
            &[
                "inspect",
                "--format",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                &db,
            ],
        );
        let from_probe = |args: &[&str]| -> (bool, String) {
            let mut all = vec!["exec", probe.as_str()];
            all.extend_from_slice(args);
            let o = Command::new("docker")
                .arg("-H")
                .arg(format!("unix://{}", socket.display()))
                .args(&all)
                .output()
                .expect("docker exec");
            (
                o.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
            )
        };
        for name in ["db", "db.app-production.internal"] {
            let (ok, out) = from_probe(&["/bin/busybox", "nslookup", name]);
            assert!(
                !ok || !out.contains(&db_ip),
                "{name} resolved from another environment: {out}"
            );
        }
        let (ok, out) = from_probe(&[
            "psql",
            "-X",
            &format!("host={db_ip} user=postgres dbname=postgres connect_timeout=3"),
            "-c",
            "select 1",
        ]);
        assert!(!ok, "another environment reached the database: {out}");
        // From the web role, the same address answers (so the refusal above is the firewall's).
        let web = container("app-production", "web");
        let web = web.lines().next().expect("a web replica");
        let o = docker(
            &socket,
            &[
                "exec",
                web,
                "psql",
                "-X",
                "-tAq",
                &format!("host={db_ip} user=postgres dbname=postgres connect_timeout=3"),
                "-c",
                "select count(*) from notes",
            ],
        );
        assert_eq!(o, "3");

        // A backup, the data destroyed, `pl restore`: the rows come back.
        let (code, out, err) = pl(
            &["backup", "app-production", "pgdata", "--local"],
            &repo,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        let snapshot = out
            .split("snapshot ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("snapshot id")
            .to_owned();
        // A restore drill proves that snapshot: PostgreSQL starts on a scratch copy and answers.
        let (code, out, err) = pl(
            &["backup", "app-production", "pgdata", "--verify", "--local"],
            &repo,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            out.contains(&format!(
                "verified app-production/pgdata on node-1: snapshot {snapshot} restored"
            )),
            "{out}"
        );
        let (code, out, _) = pl(&["backups", "app-production", "--local"], &repo, &state, &socket);
        assert_eq!(code, 0);
        assert!(
            out.contains("pgdata: restore last proven") && out.contains(&format!("(snapshot {snapshot})")),
            "{out}"
        );
        let (code, out, _) = pl(&["events", "--local"], &repo, &state, &socket);
        assert_eq!(code, 0);
        assert!(out.contains("backup-verified"), "{out}");
        assert_eq!(
            docker(&socket, &["ps", "-aq", "--filter", "name=_drill"]),
            "",
            "the scratch container is gone"
        );
        assert!(
            !docker(&socket, &["volume", "ls", "-q"]).contains("_pgdata_v0"),
            "the scratch copy is gone"
        );

        let o = Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", socket.display()))
            .args([
                "exec",
                &db,
                "psql",
                "-X",
                "-h",
                "/tmp",
                "-U",
                "postgres",
                "-c",
                "delete from notes",
            ])
            .output()
            .expect("docker exec");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // (Waited for, as the other reads are: one CGI request running psql can take over the
        // client's 2 s on a loaded 2-core machine, which failed a CI run once.)
        notes_become(http, host_name, "", "deleting every note", &diagnose);
        let (code, out, err) = pl(
            &[
                "restore",
                "app-production",
                "pgdata",
                "--snapshot",
                &snapshot,
                "--timeout",
                "240",
                "--local",
            ],
            &repo,
            &state,
            &socket,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        notes_become(http, host_name, "first\nsecond\nthird", "pl restore", &diagnose);
        assert_ne!(
            container("app-production", "db"),
            db,
            "a new container on the new generation"
        );

        // A corrupted repository: the drill fails, with restic's reason.
        let data = state.join("backups/example-app/data");
        let mut packs = 0;
        for dir in std::fs::read_dir(&data).expect("restic data").flatten() {
            for pack in std::fs::read_dir(dir.path()).expect("pack dir").flatten() {
                let mut bytes = std::fs::read(pack.path()).expect("pack");
                for b in bytes.iter_mut().take(4096) {
                    *b ^= 0xff;
                }
                std::fs::write(pack.path(), bytes).expect("pack");
                packs += 1;
            }
        }
        assert!(packs > 0, "no pack in {}", data.display());
        let (code, out, err) = pl(
            &["backup", "app-production", "pgdata", "--verify", "--local"],
            &repo,
            &state,
            &socket,
        );
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(
            err.contains("error[backup-verify-failed]") && err.contains("restoring snapshot"),
            "{err}"
        );
        assert!(
            !docker(&socket, &["volume", "ls", "-q"]).contains("_pgdata_v0"),
            "the scratch copy is gone after a failed drill too"
        );

        let (code, out, err) = pl(&["down"], &repo, &state, &socket);
        assert_eq!(code, 0, "pl down: {out}\n{err}");
        for v in docker(
            &socket,
            &[
                "volume",
                "ls",
                "-q",
                "--filter",
                "label=dev.pushleft.environment=app-production",
            ],
        )
        .lines()
        {
            docker(&socket, &["volume", "rm", v]);
        }
    });
}
