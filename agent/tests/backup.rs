//! Backups against a real dockerd and Debian's `restic`: a volume saved with its container
//! paused (and running again after), a command's output saved instead (`cat`, standing in for
//! `pg_dump`), a failing command leaving no snapshot, what Pushleft wrote read back with the
//! `restic` CLI itself, a restore into a new volume generation (never into one that exists),
//! retention by tags, and a wrong password refused for good. The same through an
//! S3-compatible backend (moto's S3 server on loopback, from `scripts/test`'s tools): the
//! backend's keys reach restic from the repository's environment, never its arguments; and
//! through SFTP (Debian's dropbear with OpenSSH's sftp-server on loopback, restic's own `ssh`
//! with the agent user's `~/.ssh`, which the test gives a private `/root` of its own so the
//! machine's is never read or written).

#[path = "support/docker.rs"]
mod docker_support;
mod support;

use agent_proto::{ApplicationSpec, NetworkSpec, VolumeMount};
use docker_support::{Registry, clean, docker, require_dockerd};
use pushleft_agent::docker::BackupOf;
use pushleft_agent::restic::{Repository, Restic};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn replica(env: &str, image: &str, net: &NetworkSpec) -> ApplicationSpec {
    ApplicationSpec {
        command: [
            "/bin/sh",
            "-c",
            "echo first > /data/log && mkdir -p /data/sub && echo nested > /data/sub/file && echo ok > /data/healthz && exec /bin/httpd -f -p 8080 -h /data",
        ]
        .map(String::from)
        .to_vec(),
        volumes: vec![VolumeMount {
            volume: "data".into(),
            generation: 1,
            path: "/data".into(),
            load: None,
        }],
        ..docker_support::web_replica(support::TEST_CONTROL_PLANE, env, "db", 0, image, 1, net)
    }
}

/// The `restic` CLI on the repository, as a user would run it: its trimmed output.
fn restic_cli(repo: &Path, password: &Path, args: &[&str]) -> String {
    let o = Command::new("restic")
        .args([
            "--repo",
            &repo.to_string_lossy(),
            "--password-file",
            &password.to_string_lossy(),
        ])
        .args(args)
        .env_remove("RESTIC_PASSWORD")
        .output()
        .expect("the restic CLI");
    assert!(
        o.status.success(),
        "restic {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

#[test]
fn a_volume_is_backed_up_consistently_read_by_restic_and_restored_into_a_new_generation() {
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image("backup", &[("/www/healthz", "ok\n")]);
    let env = "pltest-backup".to_owned();
    clean(&env);
    let dir = tempfile::tempdir().expect("tempdir");
    let password = dir.path().join("password");
    std::fs::write(&password, "correct horse battery staple\n").expect("password");
    let repo = Repository {
        location: dir.path().join("repo").to_string_lossy().into_owned(),
        password_file: password.clone(),
        env: Default::default(),
        cache_dir: dir.path().join("cache"),
    };
    let restic = Restic {
        program: "restic".into(),
        timeout: Duration::from_secs(120),
    };
    let tags = vec![format!("pl-environment={env}"), "pl-volume=data".to_owned()];
    let rt = support::runtime();
    rt.block_on(async {
        let engine = docker_support::engine_n1(dir.path(), support::TEST_CONTROL_PLANE).await;
        let net = NetworkSpec {
            environment: env.clone(),
            network: format!("pl_{env}"),
            subnet: "10.208.244.0/24".into(),
        };
        engine.ensure_network(&net).await.expect("network");
        let app = replica(&env, &image, &net);
        engine.ensure_application(&app).await.expect("replica");
        let mount = app.volumes[0].clone();

        // Files, with the container paused while they are read; it runs again after.
        let of = |command: Option<&'static [String]>| BackupOf {
            environment: &env,
            mount: &mount,
            container: Some(&app.container),
            command,
            tags: &tags,
        };
        let files = engine.backup_volume(&restic, &repo, &of(None)).await.expect("backup");
        assert!(files.bytes >= "first\nnested\nok\n".len() as u64, "{files:?}");
        assert_eq!(
            docker(&["inspect", "--format", "{{.State.Status}}", &app.container]),
            "running"
        );
        let repo_dir = Path::new(&repo.location);
        assert_eq!(
            restic_cli(repo_dir, &password, &["dump", &files.snapshot_id, "/log"]),
            "first"
        );
        assert_eq!(
            restic_cli(repo_dir, &password, &["dump", &files.snapshot_id, "/sub/file"]),
            "nested"
        );
        let listed = restic_cli(repo_dir, &password, &["snapshots", "--json"]);
        assert!(
            listed.contains("\"hostname\":\"n1\"") && listed.contains(&format!("pl-environment={env}")),
            "{listed}"
        );

        // A command's output instead: what it printed is the snapshot's one file.
        let cat: &'static [String] = Box::leak(Box::new(["/bin/cat".to_owned(), "/data/log".to_owned()]));
        let dumped = engine
            .backup_volume(&restic, &repo, &of(Some(cat)))
            .await
            .expect("command backup");
        assert_eq!(
            restic_cli(repo_dir, &password, &["dump", &dumped.snapshot_id, "/data.dump"]),
            "first"
        );

        // A command that fails: no snapshot is left, and the reason says what it wrote.
        let before = engine_snapshots(&restic, &repo, &tags).await;
        let failing: &'static [String] = Box::leak(Box::new([
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            "echo half a dump; echo disk on fire >&2; exit 3".to_owned(),
        ]));
        let f = engine
            .backup_volume(&restic, &repo, &of(Some(failing)))
            .await
            .expect_err("fails");
        assert_eq!(f.code, "backup-command-failed");
        assert!(
            f.detail.contains("exited with 3") && f.detail.contains("disk on fire"),
            "{}",
            f.detail
        );
        assert_eq!(
            engine_snapshots(&restic, &repo, &tags).await,
            before,
            "no half dump kept"
        );

        // A restore goes into generation 2, made empty here; generation 1 is untouched.
        docker(&["exec", &app.container, "/bin/sh", "-c", "echo later > /data/log"]);
        let g2 = VolumeMount {
            generation: 2,
            ..mount.clone()
        };
        engine
            .restore_volume(&restic, &repo, &env, &g2, &files.snapshot_id)
            .await
            .expect("restore");
        let g2_name = engine.volume_name(&env, &g2);
        let mountpoint = docker(&["volume", "inspect", "--format", "{{.Mountpoint}}", &g2_name]);
        assert_eq!(
            std::fs::read_to_string(Path::new(&mountpoint).join("log")).expect("log"),
            "first\n"
        );
        assert_eq!(
            std::fs::read_to_string(Path::new(&mountpoint).join("sub/file")).expect("file"),
            "nested\n"
        );
        assert_eq!(docker(&["exec", &app.container, "/bin/cat", "/data/log"]), "later");
        let again = engine
            .restore_volume(&restic, &repo, &env, &g2, &files.snapshot_id)
            .await
            .expect_err("exists");
        assert_eq!(again.code, "volume-exists");

        // Retention by the volume's tags: the newest one stays.
        restic.retain(&repo, &tags, 1).await.expect("retain");
        let kept = engine_snapshots(&restic, &repo, &tags).await;
        assert_eq!(kept, std::slice::from_ref(&dumped.snapshot_id));

        // A wrong password is refused for good (not retried).
        let wrong = dir.path().join("wrong");
        std::fs::write(&wrong, "nope\n").expect("wrong");
        let bad = Repository {
            password_file: wrong,
            ..repo.clone()
        };
        let refused = engine
            .backup_volume(&restic, &bad, &of(None))
            .await
            .expect_err("wrong password");
        assert_eq!(
            (refused.code, refused.outcome),
            ("restic-failed", agent_proto::Outcome::Permanent),
            "{}",
            refused.detail
        );
        assert!(refused.detail.contains("wrong password"), "{}", refused.detail);
        assert_eq!(
            docker(&["inspect", "--format", "{{.State.Status}}", &app.container]),
            "running"
        );
    });
    clean(&env);
}

/// moto's S3 server on a loopback port of its own, stopped when dropped.
struct S3Server {
    child: std::process::Child,
    port: u16,
}

impl S3Server {
    fn start() -> S3Server {
        let port = support::free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("moto_server (scripts/test installs it into /opt/pushleft-tools)");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "moto_server did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        S3Server { child, port }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_s3_compatible_repository_holds_what_the_restic_cli_reads_and_restores() {
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image("backup-s3", &[("/www/healthz", "ok\n")]);
    let env = "pltest-backup-s3".to_owned();
    clean(&env);
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let password = dir.path().join("password");
    std::fs::write(&password, "s3 password\n").expect("password");
    let keys: std::collections::BTreeMap<String, String> = [
        ("AWS_ACCESS_KEY_ID", "pushleft"),
        ("AWS_SECRET_ACCESS_KEY", "not-a-real-secret"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let location = format!("s3:http://127.0.0.1:{}/pl-backups", s3.port);
    let repo = Repository {
        location: location.clone(),
        password_file: password.clone(),
        env: keys.clone(),
        cache_dir: dir.path().join("cache"),
    };
    let restic = Restic {
        program: "restic".into(),
        timeout: Duration::from_secs(120),
    };
    let tags = vec![format!("pl-environment={env}"), "pl-volume=data".to_owned()];
    let rt = support::runtime();
    rt.block_on(async {
        let engine = docker_support::engine_n1(dir.path(), support::TEST_CONTROL_PLANE).await;
        let net = NetworkSpec {
            environment: env.clone(),
            network: format!("pl_{env}"),
            subnet: "10.208.245.0/24".into(),
        };
        engine.ensure_network(&net).await.expect("network");
        let app = replica(&env, &image, &net);
        engine.ensure_application(&app).await.expect("replica");
        let mount = app.volumes[0].clone();
        let of = BackupOf {
            environment: &env,
            mount: &mount,
            container: Some(&app.container),
            command: None,
            tags: &tags,
        };
        // The repository is made in the bucket on first use, then written.
        let saved = engine.backup_volume(&restic, &repo, &of).await.expect("backup to S3");
        // The restic CLI reads it with the same keys, from the environment.
        let o = Command::new("restic")
            .args(["--repo", &location, "--password-file", &password.to_string_lossy()])
            .args(["dump", &saved.snapshot_id, "/sub/file"])
            .envs(&keys)
            .env_remove("RESTIC_PASSWORD")
            .output()
            .expect("the restic CLI");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "nested\n");
        // Restored from the bucket into generation 2.
        let g2 = VolumeMount {
            generation: 2,
            ..mount.clone()
        };
        engine
            .restore_volume(&restic, &repo, &env, &g2, &saved.snapshot_id)
            .await
            .expect("restore from S3");
        let mountpoint = docker(&[
            "volume",
            "inspect",
            "--format",
            "{{.Mountpoint}}",
            &engine.volume_name(&env, &g2),
        ]);
        assert_eq!(
            std::fs::read_to_string(Path::new(&mountpoint).join("log")).expect("log"),
            "first\n"
        );
    });
    clean(&env);
}

/// `program ARGS…` with `home` mounted over `/root` in a mount namespace of its own: what the
/// agent user's `~/.ssh` holds for that process alone.
fn with_root_at(home: &Path, program: &str) -> Command {
    let mut c = Command::new("unshare");
    c.args([
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        r#"mount --bind "$0" /root && exec "$@""#,
    ])
    .arg(home)
    .arg(program);
    c
}

/// An SFTP server (dropbear, public keys only, root's `authorized_keys` from `home`) on a
/// loopback port; stopped when dropped.
struct SftpServer {
    child: std::process::Child,
    port: u16,
}

impl SftpServer {
    fn start(dir: &Path, home: &Path) -> SftpServer {
        let port = support::free_port();
        let host_key = dir.join("host_key");
        let made = Command::new("dropbearkey")
            .args(["-t", "ed25519", "-f"])
            .arg(&host_key)
            .output()
            .expect("dropbearkey (scripts/test installs dropbear-bin)");
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let child = with_root_at(home, "dropbear")
            .args(["-F", "-E", "-s", "-p", &format!("127.0.0.1:{port}"), "-r"])
            .arg(&host_key)
            .args(["-P", &dir.join("dropbear.pid").to_string_lossy()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("dropbear");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "dropbear did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        SftpServer { child, port }
    }
}

impl Drop for SftpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_sftp_repository_holds_what_the_restic_cli_reads_and_restores() {
    use std::os::unix::fs::PermissionsExt;
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image("backup-sftp", &[("/www/healthz", "ok\n")]);
    let env = "pltest-backup-sftp".to_owned();
    clean(&env);
    let dir = tempfile::tempdir().expect("tempdir");
    // The agent user's home as restic's ssh and the server see it: a key pair, the server's
    // authorized key, and a client configuration that trusts the server on first use.
    let home = dir.path().join("home");
    let ssh = home.join(".ssh");
    std::fs::create_dir_all(&ssh).expect("ssh dir");
    for d in [&home, &ssh] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).expect("mode");
    }
    let keygen = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(ssh.join("id_ed25519"))
        .output()
        .expect("ssh-keygen");
    assert!(keygen.status.success(), "{}", String::from_utf8_lossy(&keygen.stderr));
    std::fs::copy(ssh.join("id_ed25519.pub"), ssh.join("authorized_keys")).expect("authorized key");
    let server = SftpServer::start(dir.path(), &home);
    std::fs::write(
        ssh.join("config"),
        format!(
            "Host 127.0.0.1\n  Port {}\n  User root\n  IdentityFile /root/.ssh/id_ed25519\n  UserKnownHostsFile /root/.ssh/known_hosts\n  StrictHostKeyChecking accept-new\n  BatchMode yes\n",
            server.port
        ),
    )
    .expect("ssh config");
    // restic as the agent runs it, in that home.
    let wrapper = dir.path().join("restic-in-home");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec unshare -m --propagation private sh -c 'mount --bind \"$0\" /root && exec restic \"$@\"' '{}' \"$@\"\n",
            home.display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("mode");
    let password = dir.path().join("password");
    std::fs::write(&password, "sftp password\n").expect("password");
    let location = format!("sftp:root@127.0.0.1:{}", dir.path().join("sftp-repo").display());
    let repo = Repository {
        location: location.clone(),
        password_file: password.clone(),
        env: Default::default(),
        cache_dir: dir.path().join("cache"),
    };
    let restic = Restic {
        program: wrapper.clone(),
        timeout: Duration::from_secs(120),
    };
    let tags = vec![format!("pl-environment={env}"), "pl-volume=data".to_owned()];
    let rt = support::runtime();
    rt.block_on(async {
        let engine = docker_support::engine_n1(dir.path(), support::TEST_CONTROL_PLANE).await;
        let net = NetworkSpec {
            environment: env.clone(),
            network: format!("pl_{env}"),
            subnet: "10.208.246.0/24".into(),
        };
        engine.ensure_network(&net).await.expect("network");
        let app = replica(&env, &image, &net);
        engine.ensure_application(&app).await.expect("replica");
        let mount = app.volumes[0].clone();
        let of = BackupOf {
            environment: &env,
            mount: &mount,
            container: Some(&app.container),
            command: None,
            tags: &tags,
        };
        let saved = engine
            .backup_volume(&restic, &repo, &of)
            .await
            .expect("backup over SFTP");
        // The repository is on the server's disk, and the restic CLI reads it over SFTP too.
        assert!(
            dir.path().join("sftp-repo/config").exists(),
            "written through the server"
        );
        let o = Command::new(&wrapper)
            .args(["--repo", &location, "--password-file", &password.to_string_lossy()])
            .args(["dump", &saved.snapshot_id, "/sub/file"])
            .env_remove("RESTIC_PASSWORD")
            .output()
            .expect("the restic CLI");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "nested\n");
        let g2 = VolumeMount {
            generation: 2,
            ..mount.clone()
        };
        engine
            .restore_volume(&restic, &repo, &env, &g2, &saved.snapshot_id)
            .await
            .expect("restore over SFTP");
        let mountpoint = docker(&[
            "volume",
            "inspect",
            "--format",
            "{{.Mountpoint}}",
            &engine.volume_name(&env, &g2),
        ]);
        assert_eq!(
            std::fs::read_to_string(Path::new(&mountpoint).join("log")).expect("log"),
            "first\n"
        );
    });
    drop(server);
    clean(&env);
}

/// The short ids of the snapshots carrying `tags`, oldest first.
async fn engine_snapshots(restic: &Restic, repo: &Repository, tags: &[String]) -> Vec<String> {
    restic
        .snapshots(repo, tags)
        .await
        .expect("snapshots")
        .into_iter()
        .map(|s| s.short_id)
        .collect()
}
