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
use docker_support::{Registry, clean, docker, docker_ok, require_dockerd};
use pushleft_agent::docker::BackupOf;
use pushleft_agent::restic::{Repository, Restic};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn replica(env: &str, image: &str, net: &NetworkSpec) -> ApplicationSpec {
    ApplicationSpec {
        resume: None,
        image_trust: None,
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

        // The volume's root belongs to the role's user (999, PostgreSQL's), with a mode and an
        // extended attribute of its own: all three come back with a restore.
        let g1_dir = docker(&[
            "volume",
            "inspect",
            "--format",
            "{{.Mountpoint}}",
            &engine.volume_name(&env, &mount),
        ]);
        let g1_dir = Path::new(&g1_dir);
        std::os::unix::fs::chown(g1_dir, Some(999), Some(999)).expect("chown");
        std::fs::set_permissions(g1_dir, std::os::unix::fs::PermissionsExt::from_mode(0o2775)).expect("chmod");
        rustix::fs::setxattr(g1_dir, "user.pushleft-test", b"kept", rustix::fs::XattrFlags::empty()).expect("xattr");

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
        {
            use std::os::unix::fs::MetadataExt;
            let root = std::fs::metadata(&mountpoint).expect("root");
            assert_eq!(
                (root.uid(), root.gid(), root.mode() & 0o7777),
                (999, 999, 0o2775),
                "the root's owner and mode, as saved"
            );
            let mut value = [0u8; 16];
            let n = rustix::fs::getxattr(Path::new(&mountpoint), "user.pushleft-test", &mut value[..]).expect("xattr");
            assert_eq!(&value[..n], b"kept");
            // The role's user writes at the top of its restored volume.
            docker(&[
                "run",
                "--rm",
                "--network",
                "none",
                "--user",
                "999:999",
                "-v",
                &format!("{g2_name}:/data"),
                "--entrypoint",
                "/bin/sh",
                &image,
                "-c",
                "echo written > /data/by-999",
            ]);
            assert_eq!(
                std::fs::read_to_string(Path::new(&mountpoint).join("by-999")).expect("written"),
                "written\n"
            );
        }
        let again = engine
            .restore_volume(&restic, &repo, &env, &g2, &files.snapshot_id)
            .await
            .expect_err("exists");
        assert_eq!(again.code, "volume-exists");
        assert!(
            docker_ok(&["volume", "inspect", &g2_name]),
            "a refused restore keeps what was there"
        );
        // A snapshot restic does not have: the restore fails, and the generation it made for
        // it is gone again (nothing would ever list or remove it).
        let g3 = VolumeMount {
            generation: 3,
            ..mount.clone()
        };
        let missing = engine
            .restore_volume(&restic, &repo, &env, &g3, "deadbeef")
            .await
            .expect_err("no such snapshot");
        assert!(!missing.code.is_empty(), "{missing:?}");
        assert!(
            !docker_ok(&["volume", "inspect", &engine.volume_name(&env, &g3)]),
            "a failed restore leaves no volume"
        );

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

/// A server of the test's own on a loopback port, stopped when dropped.
struct Server {
    child: std::process::Child,
}

impl Server {
    /// Spawns `cmd` (which listens on 127.0.0.1:`port`) and waits until it accepts.
    fn spawn(mut cmd: Command, port: u16, what: &str) -> Server {
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{what} (scripts/test installs it): {e}"));
        let server = Server { child };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "{what} did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One backend's round trip: a replica's volume saved into `repo` (paused while read), its
/// `/sub/file` read back by the `restic` CLI (`cli` runs it with the arguments after the
/// repository's), and the snapshot restored into the volume's generation 2.
fn round_trip(
    name: &str,
    subnet: &str,
    repo: &Repository,
    restic: &Restic,
    cli: impl Fn(&[&str]) -> std::process::Output,
) {
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image(name, &[("/www/healthz", "ok\n")]);
    let env = format!("pltest-{name}");
    clean(&env);
    let dir = tempfile::tempdir().expect("tempdir");
    let tags = vec![format!("pl-environment={env}"), "pl-volume=data".to_owned()];
    support::runtime().block_on(async {
        let engine = docker_support::engine_n1(dir.path(), support::TEST_CONTROL_PLANE).await;
        let net = NetworkSpec {
            environment: env.clone(),
            network: format!("pl_{env}"),
            subnet: subnet.into(),
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
        // The repository is made on first use, then written.
        let saved = engine.backup_volume(restic, repo, &of).await.expect("backup");
        let o = cli(&["dump", &saved.snapshot_id, "/sub/file"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "nested\n");
        let g2 = VolumeMount {
            generation: 2,
            ..mount.clone()
        };
        engine
            .restore_volume(restic, repo, &env, &g2, &saved.snapshot_id)
            .await
            .expect("restore");
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

#[test]
fn an_s3_compatible_repository_holds_what_the_restic_cli_reads_and_restores() {
    let port = support::free_port();
    let mut moto = Command::new("moto_server");
    moto.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
    let _s3 = Server::spawn(moto, port, "moto_server");
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
    let location = format!("s3:http://127.0.0.1:{port}/pl-backups");
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
    // The restic CLI reads it with the same keys, from its environment.
    round_trip("backup-s3", "10.208.245.0/24", &repo, &restic, |args| {
        Command::new("restic")
            .args(["--repo", &location, "--password-file", &password.to_string_lossy()])
            .args(args)
            .envs(&keys)
            .env_remove("RESTIC_PASSWORD")
            .output()
            .expect("the restic CLI")
    });
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

#[test]
fn an_sftp_repository_holds_what_the_restic_cli_reads_and_restores() {
    use std::os::unix::fs::PermissionsExt;
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
    // The server: dropbear, public keys only, root's `authorized_keys` from that home.
    let host_key = dir.path().join("host_key");
    let made = Command::new("dropbearkey")
        .args(["-t", "ed25519", "-f"])
        .arg(&host_key)
        .output()
        .expect("dropbearkey (scripts/test installs dropbear-bin)");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let port = support::free_port();
    let mut dropbear = with_root_at(&home, "dropbear");
    dropbear
        .args(["-F", "-E", "-s", "-p", &format!("127.0.0.1:{port}"), "-r"])
        .arg(&host_key)
        .args(["-P", &dir.path().join("dropbear.pid").to_string_lossy()]);
    let _server = Server::spawn(dropbear, port, "dropbear");
    std::fs::write(
        ssh.join("config"),
        format!(
            "Host 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile /root/.ssh/id_ed25519\n  UserKnownHostsFile /root/.ssh/known_hosts\n  StrictHostKeyChecking accept-new\n  BatchMode yes\n"
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
    round_trip("backup-sftp", "10.208.246.0/24", &repo, &restic, |args| {
        Command::new(&wrapper)
            .args(["--repo", &location, "--password-file", &password.to_string_lossy()])
            .args(args)
            .env_remove("RESTIC_PASSWORD")
            .output()
            .expect("the restic CLI")
    });
    // The repository is on the server's disk: written through it.
    assert!(dir.path().join("sftp-repo/config").exists());
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
