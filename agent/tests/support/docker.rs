//! What the Docker tests share: the real dockerd the test command starts, a registry of our own
//! on a free loopback port (Debian's `docker-registry`), and images made here from the static
//! busybox (`docker import`), pushed there so the agent pulls them by digest. Nothing reaches
//! beyond the machine: no image comes from Docker Hub and the containers only serve.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Replica `instance` of web role `role` of `control_plane`'s environment `env`: busybox's httpd
/// on 8080 serving `/www` (the images [`Registry::image`] makes), healthy at `/healthz` within
/// 10 s, small limits, no secret. Tests change the fields they are about.
pub fn web_replica(
    control_plane: &str,
    env: &str,
    role: &str,
    instance: u32,
    image: &str,
    generation: u64,
    net: &agent_proto::NetworkSpec,
) -> agent_proto::ApplicationSpec {
    agent_proto::ApplicationSpec {
        resume: None,
        image_trust: None,
        environment: env.into(),
        deployment: env.into(),
        role: role.into(),
        role_kind: "web".into(),
        instance: Some(instance),
        generation,
        spec_hash: format!("hash-{role}-g{generation}"),
        container: agent_proto::container_name(control_plane, env, role, Some(instance), generation),
        image: image.into(),
        command: ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]
            .map(String::from)
            .to_vec(),
        env: Default::default(),
        cpu_millis: 250,
        memory_bytes: 64 << 20,
        pids: 64,
        port: Some(8080),
        ports: Vec::new(),
        health: Some(agent_proto::HealthSpec {
            path: "/healthz".into(),
            timeout_seconds: 10,
        }),
        network: net.clone(),
        secrets: Vec::new(),
        log_max_bytes: 10 << 20,
        log_max_files: 3,
        volumes: Vec::new(),
    }
}

/// `docker ARGS`, its stdout; panics with stderr when it fails.
pub fn docker(args: &[&str]) -> String {
    let o = Command::new("docker").args(args).output().expect("the docker CLI");
    assert!(
        o.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// `docker ARGS`, whether it succeeded.
pub fn docker_ok(args: &[&str]) -> bool {
    Command::new("docker")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Fails at once, naming the fix, when no dockerd answers (`scripts/test` starts one).
pub fn require_dockerd() {
    assert!(
        docker_ok(&["info"]),
        "no Docker engine answers on /var/run/docker.sock: run the tests through scripts/test, which starts dockerd"
    );
}

#[path = "../../../tests-support/registry.rs"]
mod served;

/// A registry on 127.0.0.1 (plain HTTP, which dockerd allows for loopback), storing under a
/// temporary folder; stopped when dropped.
pub struct Registry {
    served: served::Registry,
    pub port: u16,
    /// With credentials: the docker CLI's configuration folder that is logged in to it.
    login: Option<PathBuf>,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::serve(None)
    }

    /// A registry that wants `user:password` (htpasswd, as `pl up`'s does); the test's own
    /// pushes log in with a docker CLI configuration of their own.
    pub fn with_credentials(user: &str, password: &str) -> Registry {
        let mut r = Registry::serve(Some(format!("{user}:{}\n", bcrypt::hash(password, 4).expect("bcrypt"))));
        let login = r.served.dir().join("docker-cli");
        let mut child = Command::new("docker")
            .arg("--config")
            .arg(&login)
            .args([
                "login",
                "-u",
                user,
                "--password-stdin",
                &format!("127.0.0.1:{}", r.port),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker login");
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(password.as_bytes())
            .expect("password");
        assert!(child.wait().expect("login").success(), "docker login");
        r.login = Some(login);
        r
    }

    fn serve(htpasswd: Option<String>) -> Registry {
        let served = served::registry_with_auth(htpasswd.as_deref());
        Registry {
            port: served.port,
            served,
            login: None,
        }
    }

    /// Where the registry keeps its blobs.
    #[allow(dead_code)]
    pub fn data_dir(&self) -> PathBuf {
        self.served.dir().join("data")
    }

    /// An image of the static busybox with `files` added (those under a `cgi-bin/` folder
    /// executable), pushed as `name`: its reference by digest. The local copy is removed, so the agent's pull is real.
    pub fn image(&self, name: &str, files: &[(&str, &str)]) -> String {
        let root = tempfile::tempdir().expect("tempdir");
        let bin = root.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        std::fs::copy(busybox(), bin.join("busybox")).expect("busybox");
        for applet in ["sh", "httpd", "sleep", "cat", "echo"] {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("applet");
        }
        for (path, text) in files {
            let p = root.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().expect("parent")).expect("dir");
            std::fs::write(&p, text).expect("file");
            // CGI scripts run.
            if path.contains("/cgi-bin/") {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            }
        }
        let tar = root.path().with_extension("tar");
        let o = Command::new("tar")
            .arg("-C")
            .arg(root.path())
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .expect("tar");
        assert!(o.status.success());
        let tag = format!("127.0.0.1:{}/pl-test/{name}:latest", self.port);
        docker(&["import", &tar.to_string_lossy(), &tag]);
        let _ = std::fs::remove_file(&tar);
        match &self.login {
            Some(login) => {
                let config = login.to_string_lossy();
                docker(&["--config", &config, "push", "-q", &tag]);
            }
            None => {
                docker(&["push", "-q", &tag]);
            }
        }
        let digest = docker(&["inspect", "--format", "{{index .RepoDigests 0}}", &tag]);
        docker(&["rmi", "-f", &tag]);
        let _ = docker_ok(&["rmi", "-f", &digest]);
        digest
    }
}

/// The static busybox (Debian's busybox-static).
fn busybox() -> PathBuf {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("no static busybox: install busybox-static (scripts/test does)");
}

/// Removes every container and network a test made (by a label value unique to it): networks
/// named as the tests name them, or labelled with the environment (as the agent makes them).
pub fn clean(environment: &str) {
    let labelled = docker(&[
        "network",
        "ls",
        "-q",
        "--filter",
        &format!("label=dev.pushleft.environment={environment}"),
    ]);
    let mut networks = vec![format!("pl_{environment}")];
    networks.extend(labelled.lines().filter(|l| !l.is_empty()).map(str::to_owned));
    let mut filters = vec![format!("label=dev.pushleft.environment={environment}")];
    filters.extend(networks.iter().map(|n| format!("network={n}")));
    for filter in filters {
        let ids = docker(&["ps", "-aq", "--filter", &filter]);
        for id in ids.lines().filter(|l| !l.is_empty()) {
            let _ = docker_ok(&["rm", "-f", id]);
        }
    }
    for n in &networks {
        let _ = docker_ok(&["network", "rm", n]);
    }
    let volumes = docker(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label=dev.pushleft.environment={environment}"),
    ]);
    for v in volumes.lines().filter(|l| !l.is_empty()) {
        let _ = docker_ok(&["volume", "rm", v]);
    }
}

/// An engine on the machine's dockerd as `control_plane`'s node `n1`, its secrets, identity
/// and pulled-image list under `dir`.
#[allow(dead_code)]
pub async fn engine_n1(dir: &Path, control_plane: &str) -> pushleft_agent::docker::Engine {
    pushleft_agent::docker::Engine::connect(
        Path::new("/var/run/docker.sock"),
        control_plane,
        "n1",
        dir.join("secrets"),
        dir.join("age.key"),
        dir.join("state/images-pulled"),
    )
    .await
    .expect("docker")
}
