//! The Debian packages, built and installed for real (docs/install.md):
//! - `scripts/package` builds `pushleft`, `pushleft-reconciler` and `pushleft-agent` with
//!   cargo-deb from this build's binaries, and lintian (Debian's) reports no error on them;
//! - in a fresh Debian root (a copy of the one `scripts/test` made with debootstrap from this
//!   machine's release; nothing is fetched) dpkg installs the three; each binary answers
//!   `--version`, `man` shows pl's pages, the completions are where the shells look, and the
//!   packages' postinst made the system user `pushleft` from sysusers.d;
//! - inside a simulated host (a network namespace with a dockerd of its own, whose socket is
//!   where the agent's configuration names it in the root), the reconciler runs as its unit
//!   says (its `ExecStartPre` and `ExecStart` command lines, as its `User`) against a real
//!   repository with a signed commit; the installed `pl` reads its status and makes an
//!   enrolment token, the installed `pl-agent` enrols and runs as its unit says, and the
//!   release goes live (`pl wait`) with its replica running in the host's dockerd;
//! - an upgrade in place to packages of a higher version (both daemons stopped, dpkg, both
//!   started again, as the units' restart after an upgrade does) keeps the configurations
//!   the operator edited (conffiles), migrates a ledger that was one migration behind (the
//!   newest migration's tables or columns dropped and its row deleted, standing for an older release's
//!   ledger: both packages carry this build's binaries), keeps the accepted commit, and
//!   leaves the replica untouched: the same container, started at the same time, through the
//!   agent's restart and its drift rounds after it. (`KillMode=process` itself is systemd's
//!   to honour: no systemd runs here.)

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/debian.rs"]
mod debian;
#[path = "../../agent/tests/support/host.rs"]
mod host_support;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{free_port, rows};
use debian::{Root, Running, ok, package, unit_value, words, workspace};
use host_support::Host;
use repo_support::{Repo, environment};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A worker that serves on a port it does not declare (nothing routes to it).
fn project(image: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    worker:\n      kind: worker\n      replicas: 1\n      command: [/bin/busybox, httpd, -f, -p, '7000', -h, /www]\n"
    )
}

/// Every schema object of a SQLite ledger as `type name` (tables, views, triggers), every
/// column as `column table.name` and every index as `index table.name`: a migration may add
/// any of them.
const OBJECTS: &str = "SELECT type || ' ' || name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' AND type IN ('table', 'view', 'trigger') \
     UNION ALL SELECT 'column ' || m.name || '.' || p.name FROM sqlite_master m JOIN pragma_table_info(m.name) p \
     WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND m.name NOT LIKE '_sqlx%' \
     UNION ALL SELECT 'index ' || tbl_name || '.' || name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'";

/// What undoes `object` (one of [`OBJECTS`]'s): `DROP TABLE t`, a column's `ALTER TABLE t
/// DROP COLUMN c`, or an index's `DROP INDEX i`.
fn undo(object: &str) -> String {
    if let Some((_, index)) = object.strip_prefix("index ").and_then(|i| i.split_once('.')) {
        return format!("DROP INDEX {index}");
    }
    match object.strip_prefix("column ").and_then(|c| c.split_once('.')) {
        Some((table, column)) => format!("ALTER TABLE {table} DROP COLUMN {column}"),
        None => format!("DROP {object}"),
    }
}

/// The newest migration: its version and the objects (`type name`) it creates, found by
/// migrating two scratch ledgers, one without it.
fn newest_migration(scratch: &Path) -> (i64, Vec<String>) {
    let all = workspace().join("migrations/sqlite");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&all)
        .expect("migrations")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let newest = files.last().expect("a migration").clone();
    let version: i64 = newest
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('_').next())
        .and_then(|v| v.parse().ok())
        .expect("a numbered migration");
    let older = scratch.join("older-migrations");
    std::fs::create_dir_all(&older).expect("mkdir");
    for f in &files[..files.len() - 1] {
        std::fs::copy(f, older.join(f.file_name().expect("name"))).expect("copy");
    }
    let objects = |dir: PathBuf, db: &str| {
        let url = format!("sqlite://{}?mode=rwc", scratch.join(db).display());
        let u = url.clone();
        daemon_support::block_on(async move {
            let pool = sqlx::SqlitePool::connect(&u).await.expect("connect");
            let migrator = sqlx::migrate::Migrator::new(dir).await.expect("migrations");
            migrator.run(&pool).await.expect("migrate");
            pool.close().await;
        });
        rows(&url, OBJECTS)
    };
    let before = objects(older, "older.db");
    let after = objects(all, "all.db");
    let new: Vec<String> = after.into_iter().filter(|o| !before.contains(o)).collect();
    // A new table's columns and indexes go with it.
    let made = new
        .iter()
        .filter(|o| {
            o.strip_prefix("column ")
                .or_else(|| o.strip_prefix("index "))
                .and_then(|c| c.split_once('.'))
                .is_none_or(|(t, _)| !new.contains(&format!("table {t}")))
        })
        .cloned()
        .collect();
    (version, made)
}

#[test]
fn the_packages_install_serve_and_upgrade_in_a_fresh_debian() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let v1 = package(&scratch.path().join("v1"), "0.1.0-1");
    // lintian, Debian's own checker: warnings may stay, errors may not.
    let o = Command::new("lintian")
        .args(["--tag-display-limit", "0"])
        .args(&v1)
        .output()
        .expect("lintian");
    let report = String::from_utf8_lossy(&o.stdout).into_owned();
    let errors: Vec<&str> = report.lines().filter(|l| l.starts_with("E: ")).collect();
    assert!(errors.is_empty(), "lintian: {errors:?}\n{report}");
    let v2 = package(&scratch.path().join("v2"), "0.1.0-2");

    let base = PathBuf::from(format!("/tmp/plpkg-{}", std::process::id()));
    let host = Host::start(&format!("plhost-pkg-{}", std::process::id()), &base);
    let (registry, registry_port) = host.registry();
    let _registry = debian::Kill(vec![registry]);
    let image = host.image(registry_port, "worker", &[("/www/index.html", "worker\n")]);
    let socket = host.socket.clone();

    let mut root = Root::new("packages", None);
    root.bind(&host.socket, "/run/docker.sock");
    for (name, debs) in [("v1", &v1), ("v2", &v2)] {
        let dir = root.path(&format!("/tmp/debs/{name}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for d in debs.iter() {
            std::fs::copy(d, dir.join(d.file_name().expect("name"))).expect("copy");
        }
    }
    root.run(&["sh", "-c", "dpkg -i /tmp/debs/v1/*.deb"]);

    // What a person checks first.
    assert!(root.run(&["pl", "--version"]).starts_with("pl 0.1.0"));
    assert!(
        root.run(&["pl-reconciler", "--version"])
            .starts_with("pl-reconciler 0.1.0")
    );
    assert!(root.run(&["pl-agent", "--version"]).starts_with("pl-agent 0.1.0"));
    assert_eq!(
        root.run(&["dpkg-query", "-W", "-f", "${Version}", "pushleft"]),
        "0.1.0-1"
    );
    let page = root.run(&["env", "MANWIDTH=80", "man", "-P", "cat", "pl-plan"]);
    assert!(page.contains("pl-plan - Show what would change"), "{page}");
    let page = root.run(&["env", "MANWIDTH=80", "man", "-P", "cat", "pl-reconciler-snapshot-save"]);
    assert!(page.contains("pl-reconciler-snapshot-save"), "{page}");
    let bash =
        std::fs::read_to_string(root.path("/usr/share/bash-completion/completions/pl")).expect("bash completion");
    assert!(bash.contains("_pl()"), "a bash completion function");
    assert!(root.path("/usr/share/zsh/vendor-completions/_pl").exists());
    assert!(root.path("/usr/share/fish/vendor_completions.d/pl.fish").exists());
    let user = root.run(&["getent", "passwd", "pushleft"]);
    assert!(
        user.contains(":/var/lib/pushleft:"),
        "the system user from sysusers.d: {user}"
    );
    // Installed, not enabled (the example configurations hold placeholders).
    for unit in ["pl-reconciler", "pl-agent"] {
        assert!(
            !root
                .path(&format!("/etc/systemd/system/multi-user.target.wants/{unit}.service"))
                .exists()
        );
    }

    // The operator's part (docs/install.md): a CA and the API certificate, a token, a
    // repository with a signed commit, and the configuration edited to name them.
    let (api, agent_api) = (free_port(), free_port());
    let tls = root.run(&["pl-reconciler", "tls-init", "--dir", "/etc/pushleft/tls"]);
    let fingerprint = tls
        .split_whitespace()
        .find(|w| w.starts_with("SHA256:"))
        .unwrap_or_else(|| panic!("no fingerprint in {tls}"))
        .to_owned();
    let token_lines = root.run(&[
        "pl-reconciler",
        "token",
        "--name",
        "ops",
        "--role",
        "admin",
        "--out",
        "/root/ops.token",
    ]);
    std::fs::create_dir_all(root.path("/srv/pushleft")).expect("mkdir");
    let repo = Repo::new(&root.path("/srv/pushleft"));
    repo.write("projects/api.yaml", &project(&image));
    repo.write(
        "environments/api-production.yaml",
        &environment("api-production", "api"),
    );
    let sha = repo.commit("the first release", true);
    std::fs::write(
        root.path("/etc/pushleft/allowed_signers"),
        format!("{}\n", repo.signers),
    )
    .expect("signers");
    let config = format!(
        "[source]\npath = \"/srv/pushleft/state\"\nbranch = \"main\"\n\n[trust]\nallowed_signers = \"/etc/pushleft/allowed_signers\"\n\n\
         [ledger]\nurl = \"sqlite:///var/lib/pushleft/ledger.db\"\n\n[reconcile]\ninterval_seconds = 2\n\n\
         [control]\nca_cert = \"/etc/pushleft/tls/ca.crt\"\nca_key = \"/etc/pushleft/tls/ca.key\"\n\n\
         [agent_api]\nlisten = \"127.0.0.1:{agent_api}\"\n\n\
         [api]\nlisten = \"127.0.0.1:{api}\"\ntls_cert = \"/etc/pushleft/tls/api.crt\"\ntls_key = \"/etc/pushleft/tls/api.key\"\n\n{token_lines}"
    );
    std::fs::write(root.path("/etc/pushleft/reconciler.toml"), &config).expect("config");
    // What systemd does for the unit (StateDirectory=pushleft), and the keys and the
    // repository handed to the daemon's user.
    root.run(&[
        "install",
        "-d",
        "-o",
        "pushleft",
        "-g",
        "pushleft",
        "-m",
        "0700",
        "/var/lib/pushleft",
    ]);
    root.run(&["chown", "-R", "pushleft:pushleft", "/etc/pushleft/tls", "/srv/pushleft"]);
    let agent_config = format!(
        "control = \"https://localhost:{agent_api}\"\ndir = \"/var/lib/pushleft-agent\"\ndocker_socket = \"/run/docker.sock\"\n\
         secrets_dir = \"/run/pushleft-agent/secrets\"\nheartbeat_seconds = 1\ndrift_seconds = 1\nexecutors = [\"docker\", \"nftables\", \"routes\"]\n"
    );
    std::fs::write(root.path("/etc/pushleft-agent/agent.toml"), &agent_config).expect("agent config");

    let ledger = format!("sqlite://{}", root.path("/var/lib/pushleft/ledger.db").display());
    let (newest, made) = newest_migration(scratch.path());
    assert!(!made.is_empty(), "the newest migration makes something to check");
    let logs = scratch.path().to_owned();

    // Everything that listens or runs containers, inside the simulated host.
    host.run(move || {
        let unit = |name: &str| {
            std::fs::read_to_string(root.path(&format!("/usr/lib/systemd/system/{name}.service"))).expect("unit")
        };
        let reconciler_unit = unit("pl-reconciler");
        let agent_unit = unit("pl-agent");
        assert!(
            agent_unit.contains("\nKillMode=process\n"),
            "containers outlive an agent restart"
        );
        let server = [
            "--server".to_owned(),
            format!("https://127.0.0.1:{api}"),
            "--ca-cert".to_owned(),
            "/etc/pushleft/tls/ca.crt".to_owned(),
            "--token-file".to_owned(),
            "/root/ops.token".to_owned(),
        ];
        let pl = |args: &[&str]| {
            let mut all: Vec<&str> = vec!["pl"];
            all.extend_from_slice(args);
            all.extend(server.iter().map(String::as_str));
            root.command(&all).output().expect("pl")
        };
        let status = |want: &str| {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let o = pl(&["status"]);
                let out = String::from_utf8_lossy(&o.stdout).into_owned();
                if o.status.success() && out.contains(want) {
                    return out;
                }
                assert!(
                    Instant::now() < deadline,
                    "pl status never said {want:?}: {out}{}",
                    String::from_utf8_lossy(&o.stderr)
                );
                std::thread::sleep(Duration::from_millis(250));
            }
        };
        let serve = |log: &str| {
            let user = unit_value(&reconciler_unit, "User");
            let o = root
                .as_user(&user, &words(&unit_value(&reconciler_unit, "ExecStartPre")))
                .output()
                .expect("ExecStartPre");
            ok(&o, "the reconciler unit's ExecStartPre (check-config)");
            let log = std::fs::File::create(logs.join(log)).expect("log");
            let line = words(&unit_value(&reconciler_unit, "ExecStart"));
            Running(
                root.as_user(&user, &line)
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("ExecStart"),
            )
        };
        let run_agent = |log: &str| {
            // What systemd does for the unit: its runtime folder, then its ExecStartPre
            // (`+`: as root) and ExecStart (no User=: root).
            root.run(&["install", "-d", "-m", "0700", "/run/pushleft-agent"]);
            let o = root
                .as_user("root", &words(&unit_value(&agent_unit, "ExecStartPre")))
                .output()
                .expect("ExecStartPre");
            ok(&o, "the agent unit's ExecStartPre");
            let log = std::fs::File::create(logs.join(log)).expect("log");
            let line = words(&unit_value(&agent_unit, "ExecStart"));
            Running(
                root.as_user("root", &line)
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("ExecStart"),
            )
        };
        let replicas = || host_support::docker_at(&socket, &["ps", "-q", "--no-trunc"]);
        let started = |ids: &str| {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            let mut args = vec!["inspect", "--format", "{{.Id}} {{.State.Status}} {{.State.StartedAt}}"];
            args.extend(ids);
            host_support::docker_at(&socket, &args)
        };

        let daemon = serve("reconciler-v1.log");
        let first = status(&sha);
        assert!(first.contains("daemon      leader"), "{first}");
        // The node enrols with the installed pl-agent, its token from the installed pl.
        let token = ok(&pl(&["node", "token", "n1"]), "pl node token");
        let mut enrol = root
            .command(&[
                "pl-agent",
                "enroll",
                "--control",
                &format!("https://localhost:{api}"),
                "--ca-fingerprint",
                &fingerprint,
                "--node",
                "n1",
                "--dir",
                "/var/lib/pushleft-agent",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("enroll");
        {
            use std::io::Write;
            enrol
                .stdin
                .take()
                .expect("stdin")
                .write_all(token.trim().as_bytes())
                .expect("token");
        }
        ok(&enrol.wait_with_output().expect("enroll"), "pl-agent enroll");
        let agent = run_agent("agent-v1.log");
        let o = pl(&["wait", "--rev", &sha, "--timeout", "120s"]);
        ok(&o, "pl wait: the first release live");
        let before = started(&replicas());
        assert_eq!(before.lines().count(), 1, "one replica: {before}");
        assert!(before.contains(" running "), "{before}");
        let applied = rows(&ledger, "SELECT COUNT(*) FROM _sqlx_migrations");

        // The upgrade: both stopped, the ledger set one migration back (an older release's),
        // the new packages in place, both started again from the units' command lines.
        drop(agent);
        drop(daemon);
        for object in &made {
            daemon_support::execute(&ledger, &undo(object));
        }
        daemon_support::execute(
            &ledger,
            &format!("DELETE FROM _sqlx_migrations WHERE version = {newest}"),
        );
        root.run(&["sh", "-c", "dpkg -i /tmp/debs/v2/*.deb"]);
        for p in ["pushleft", "pushleft-reconciler", "pushleft-agent"] {
            assert_eq!(root.run(&["dpkg-query", "-W", "-f", "${Version}", p]), "0.1.0-2");
        }
        let kept = std::fs::read_to_string(root.path("/etc/pushleft/reconciler.toml")).expect("config");
        assert_eq!(kept, config, "the operator's configuration is kept over the package's");
        let kept = std::fs::read_to_string(root.path("/etc/pushleft-agent/agent.toml")).expect("agent config");
        assert_eq!(
            kept, agent_config,
            "the agent's configuration is kept over the package's"
        );
        let daemon = serve("reconciler-v2.log");
        let again = status(&sha);
        assert!(again.contains("daemon      leader"), "{again}");
        assert_eq!(
            rows(&ledger, "SELECT COUNT(*) FROM _sqlx_migrations"),
            applied,
            "migrated again"
        );
        let now = rows(&ledger, OBJECTS);
        for object in &made {
            assert!(now.contains(object), "{object} made again by the upgrade's migration");
        }
        let accepted = rows(&ledger, &format!("SELECT sha FROM revisions WHERE sha = '{sha}'"));
        assert_eq!(accepted, vec![sha.clone()], "the accepted commit survived the upgrade");
        let agent = run_agent("agent-v2.log");
        ok(
            &pl(&["wait", "--rev", &sha, "--timeout", "60s"]),
            "pl wait: still live after the upgrade",
        );
        // The agent's drift rounds (every second) have run a few times: nothing restarted.
        std::thread::sleep(Duration::from_secs(4));
        assert_eq!(
            started(&replicas()),
            before,
            "the replica is the same container, never restarted"
        );
        drop(agent);
        drop(daemon);
        drop(root);
    });
}
