//! A simulated host for whole-loop tests: a network namespace this test makes, with a dockerd
//! of its own inside it (its own data root and socket), so the agent's every executor (Docker
//! networks and containers, the nftables table, routes, Caddy) works for real and touches
//! nothing of the machine's: bridges, tables, rules and routes all live in the namespace, which
//! has no route out of the machine. The test's own body runs on a thread that entered the
//! namespace ([`Host::run`]); processes it starts there are in it too.
//!
//! `ip netns exec` would give dockerd a fresh /sys without the cgroup mounts it needs, so the
//! dockerd enters the namespace with `nsenter --net` only.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `docker -H unix://SOCKET ARGS`.
fn engine_cli(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .arg("-H")
        .arg(format!("unix://{}", socket.display()))
        .args(args)
        .output()
        .expect("docker CLI")
}

/// The CLI of the engine at `socket` (a host's, from a thread that holds only its socket):
/// its trimmed output, empty when it fails.
pub fn docker_at(socket: &Path, args: &[&str]) -> String {
    String::from_utf8_lossy(&engine_cli(socket, args).stdout)
        .trim()
        .to_owned()
}

pub struct Host {
    pub netns: String,
    /// The inner dockerd's socket (`DOCKER_HOST` for the CLI, `docker_socket` for the agent).
    pub socket: PathBuf,
    pub dir: PathBuf,
    dockerd: Child,
}

fn sh(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

impl Host {
    /// A fresh namespace `netns` with a dockerd in it, its state under `dir` (short: the
    /// daemon's sockets live there).
    pub fn start(netns: &str, dir: &Path) -> Host {
        let _ = Command::new("ip")
            .args(["netns", "del", netns])
            .stderr(Stdio::null())
            .status();
        sh(&format!("ip netns add {netns} && ip -n {netns} link set lo up"));
        std::fs::create_dir_all(dir).expect("host dir");
        let socket = dir.join("docker.sock");
        let log = std::fs::File::create(dir.join("dockerd.log")).expect("log");
        let dockerd = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .arg("dockerd")
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("x"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", socket.display()))
            // No default bridge: only the agent's networks exist.
            .arg("--bridge=none")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("dockerd");
        let host = Host {
            netns: netns.to_owned(),
            socket,
            dir: dir.to_owned(),
            dockerd,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !host.docker_ok(&["info"]) {
            assert!(
                Instant::now() < deadline,
                "the host's dockerd did not start: {}",
                std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        host
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        engine_cli(&self.socket, args)
    }

    /// The inner engine's CLI; panics with its error when it fails.
    pub fn docker(&self, args: &[&str]) -> String {
        let o = self.cli(args);
        assert!(
            o.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    pub fn docker_ok(&self, args: &[&str]) -> bool {
        self.cli(args).status.success()
    }

    /// Runs `f` on a thread inside the namespace (the machine's own threads stay outside).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.netns);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(path).expect("netns");
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// A registry inside the namespace, on its loopback; an image of the static busybox with
    /// `files`, built by the inner engine and pushed there: its reference by digest (the local
    /// copy removed, so the agent's pull is real).
    pub fn image(&self, registry_port: u16, name: &str, files: &[(&str, &str)]) -> String {
        let root = self.dir.join(format!("image-{name}"));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("bin")).expect("bin");
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static");
        for (path, text) in files {
            let p = root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().expect("parent")).expect("dir");
            std::fs::write(&p, text).expect("file");
        }
        let tar = root.with_extension("tar");
        sh(&format!("tar -C {} -cf {} .", root.display(), tar.display()));
        let tag = format!("127.0.0.1:{registry_port}/pl-host/{name}:latest");
        self.docker(&["import", &tar.to_string_lossy(), &tag]);
        self.docker(&["push", &tag]);
        let digest = self.docker(&["inspect", "--format", "{{index .RepoDigests 0}}", &tag]);
        self.docker(&["rmi", "-f", &tag]);
        let _ = self.docker_ok(&["rmi", "-f", &digest]);
        digest
    }

    /// Starts a registry on the namespace's loopback; its port.
    pub fn registry(&self) -> (Child, u16) {
        let port = 5000 + (std::process::id() % 1000) as u16;
        let config = self.dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                self.dir.join("registry").display()
            ),
        )
        .expect("registry config");
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .args(["docker-registry", "serve"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry");
        self.run(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "the registry did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        (child, port)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Containers first (a dockerd that stops leaves none running, but be sure), then the
        // engine (it unmounts its layers), then the namespace.
        let ids = self.cli(&["ps", "-aq"]);
        for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
            let _ = self.cli(&["rm", "-f", id]);
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.dockerd.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.dockerd.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.dockerd.kill();
        let _ = self.dockerd.wait();
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
