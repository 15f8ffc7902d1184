//! Bench (a binary): a 200 MB image (a 180 MB base layer and a 20 MB layer, incompressible) to
//! three nodes, each with a dockerd of its own, by three paths side by side in one run:
//!
//! - **Pushleft, an archive**: `docker save | pl image push app --input -` to a real daemon's
//!   store (`[images]`), then the three engines pull it through their agents' loopback
//!   endpoints (`image_proxy`, over each node's mutual-TLS agent API), in parallel;
//! - **Pushleft, the engine's push**: `pl image push TAG --name NAME`, which has the engine push
//!   to the same store, then the same pulls: the engine remembers which compressed layers the
//!   store has, so a second push sends the changed layer alone without exporting the rest;
//! - **save/load**: `docker save | docker load` to each node, in parallel (as `docker save |
//!   ssh node docker load` would);
//! - **push/pull**: `docker push` to a registry on loopback (Debian's `docker-registry`), then
//!   `docker pull` on each node, in parallel.
//!
//! Each path does a first delivery to nodes that hold nothing, then a second of an image whose
//! 20 MB layer changed. Bytes moved: what the push sent plus what the nodes fetched (Pushleft:
//! the store's answer to the push and the agents' endpoints' counts; save/load: the archive
//! once per node; push/pull: the registry's compressed blobs, pushed once and pulled by each
//! node). The targets: the second Pushleft push moves under 15 % of the first's bytes,
//! and takes at most 0.5x the save/load path's time.
//!
//! `cargo bench -p pushleft-agent --bench image_push` (needs what `scripts/test` installs, a
//! dockerd, and root to start the nodes' dockerds; `-- --rounds N`, default 3). Every packet
//! stays on loopback; the nodes' engines have no bridge and touch no firewall.

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../tests/support/docker.rs"]
mod docker_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
#[path = "../tests/support/mod.rs"]
mod support;

use agent_proto::{FULL_CAPABILITIES, Heartbeat};
use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use docker_support::{Registry, docker, require_dockerd};
use pushleft_agent::client::AgentClient;
use pushleft_agent::image_proxy::StoreProxy;
use repo_support::Repo;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BASE_BYTES: usize = 180 << 20;
const TOP_BYTES: usize = 20 << 20;

/// A node's engine: a dockerd of its own (no bridge, no firewall rules), stopped when dropped.
struct NodeEngine {
    child: Child,
    dir: tempfile::TempDir,
}

impl NodeEngine {
    fn start(i: usize) -> NodeEngine {
        let dir = tempfile::Builder::new()
            .prefix(&format!("plbench-node{i}-"))
            .tempdir_in("/var/tmp")
            .expect("node folder");
        let root = dir.path().to_owned();
        let p = |s: &str| root.join(s);
        let log = std::fs::File::create(p("dockerd.log")).expect("log");
        let child = Command::new("dockerd")
            .arg("--data-root")
            .arg(p("data"))
            .arg("--exec-root")
            .arg(p("exec"))
            .arg("--pidfile")
            .arg(p("docker.pid"))
            .arg("-H")
            .arg(format!("unix://{}", p("docker.sock").display()))
            .args([
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--log-level=error",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("dockerd");
        let node = NodeEngine { child, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !node
            .cli()
            .arg("info")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                Instant::now() < deadline,
                "node {i}'s dockerd did not start: see {}",
                p("dockerd.log").display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        node
    }

    fn cli(&self) -> Command {
        let mut c = Command::new("docker");
        c.arg("--config")
            .arg(self.dir.path().join("cli"))
            .arg("-H")
            .arg(format!("unix://{}", self.dir.path().join("docker.sock").display()));
        c
    }

    /// Logs this node's docker CLI in to its agent's endpoint, as the agent hands the engine
    /// its credentials with each pull.
    fn login(&self, proxy: &StoreProxy) {
        let mut child = self
            .cli()
            .args(["login", "-u", &proxy.username, "--password-stdin", &proxy.server()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker login");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(proxy.password.as_bytes())
            .expect("password");
        assert!(child.wait().expect("login").success(), "docker login");
    }

    fn run(&self, args: &[&str]) {
        let o = self.cli().args(args).output().expect("docker");
        assert!(
            o.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Forgets every image (what a path delivered), so the next path starts from nothing.
    fn wipe(&self) {
        let o = self.cli().args(["images", "-aq"]).output().expect("images");
        let ids: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        if !ids.is_empty() {
            let mut args = vec!["rmi", "-f"];
            args.extend(ids.iter().map(String::as_str));
            let _ = self.cli().args(&args).output();
        }
    }
}

impl Drop for NodeEngine {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

/// Incompressible bytes (xorshift from `seed`).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = vec![0u8; len];
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    out
}

/// Two images on the machine's dockerd sharing a 180 MB base: `(first, second)` tags.
fn images(sample: u64) -> (String, String) {
    let dir = tempfile::tempdir().expect("context");
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("data")).expect("root");
    std::fs::write(root.join("data/base"), noise(sample * 3 + 1, BASE_BYTES)).expect("base");
    let tar = dir.path().join("base.tar");
    assert!(
        Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .expect("tar")
            .success()
    );
    let base = format!("plbench/base:{sample}");
    docker(&["import", &tar.to_string_lossy(), &base]);
    let mut tags = Vec::new();
    for (n, seed) in [(1, sample * 3 + 2), (2, sample * 3 + 3)] {
        let ctx = dir.path().join(format!("v{n}"));
        std::fs::create_dir_all(&ctx).expect("context");
        std::fs::write(ctx.join("top"), noise(seed, TOP_BYTES)).expect("top");
        std::fs::write(ctx.join("Dockerfile"), format!("FROM {base}\nCOPY top /data/top\n")).expect("dockerfile");
        let tag = format!("plbench/app:{sample}-v{n}");
        let o = Command::new("docker")
            .args(["build", "-q", "-t", &tag])
            .arg(&ctx)
            .env("DOCKER_BUILDKIT", "0")
            .output()
            .expect("docker build");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        tags.push(tag);
    }
    (tags[0].clone(), tags[1].clone())
}

/// One delivery's time and bytes moved.
#[derive(Clone, Copy, Default)]
struct Delivery {
    seconds: f64,
    bytes: u64,
}

struct Pushleft {
    setup: daemon_support::Setup,
    port: u16,
    proxies: Vec<StoreProxy>,
    repo: Repo,
    url: String,
    /// Set to stop the nodes' heartbeats.
    stop: Arc<std::sync::atomic::AtomicBool>,
    _rt: tokio::runtime::Runtime,
    _daemon: Daemon,
}

impl Drop for Pushleft {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A project running `image` on each of the three nodes (one replica a node).
fn spread_worker(image: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: app}}\nspec:\n  image: {image}\n  roles:\n    work: {{kind: worker, replicas: 3, command: [/bin/sleep, \"600\"], resources: {{cpu: 100m, memory: 32Mi, pids: 16}}}}\n"
    )
}

impl Pushleft {
    /// Commits `reference` as what `app` runs, and waits until each node has work of it: the
    /// store serves a node only the images of its own work (`image-not-placed`). Not timed:
    /// the commit is the user's step on every path.
    fn place(&self, reference: &str) {
        self.repo.write("projects/app.yaml", &spread_worker(reference));
        // The environment comes once the three nodes beat, so its replicas spread over them
        // (placement is sticky after).
        self.repo
            .write("envs/app.yaml", &repo_support::environment("app-production", "app"));
        self.repo.commit("app runs the pushed image", true);
        let digest = reference.rsplit_once('@').expect("digest").1;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let spec = support::sql(
                &self.url,
                &format!(
                    "SELECT CAST(COUNT(*) AS TEXT) FROM deployments WHERE environment = 'app-production' AND spec LIKE '%{digest}%'"
                ),
            );
            let nodes = support::sql(
                &self.url,
                "SELECT CAST(COUNT(DISTINCT target_node) AS TEXT) FROM jobs WHERE state = 'queued' AND task LIKE '%\"environment\":\"app-production\"%'",
            );
            if spec.first().map(String::as_str) == Some("1") && nodes.first().map(String::as_str) == Some("3") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "app was never placed on the three nodes: spec {spec:?}, nodes with work {nodes:?}, events {:?}",
                support::sql(
                    &self.url,
                    "SELECT target_node || ' ' || state || ' ' || task FROM jobs ORDER BY id DESC LIMIT 12"
                )
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A daemon with a store and the three nodes enrolled, each with its agent's endpoint.
fn pushleft(dir: &Path) -> Pushleft {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write(
        "pools/main.yaml",
        &repo_support::POOL.replace(
            "    - {name: n2,",
            "    - {name: n3, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n2,",
        ),
    );
    repo.write(
        "projects/app.yaml",
        &spread_worker(&format!("registry.example.invalid/none@sha256:{}", "0".repeat(64))),
    );
    repo.commit("a project", true);
    let s = setup(dir);
    let url = format!("sqlite://{}", dir.join("ledger.db").display());
    let (port, agent_port) = (free_port(), free_port());
    let store = dir.join("images");
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        port,
        &format!(
            "{CONTROL_CA}\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n\n[images]\ndir = {store:?}\nquota_bytes = 8589934592\n"
        ),
    );
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let fingerprint = support::ca_pin(&std::fs::read_to_string(dir.join("tls/ca.crt")).expect("ca"));
    let rt = support::runtime();
    let mut proxies = Vec::new();
    let mut beating = Vec::new();
    for node in ["n1", "n2", "n3"] {
        let node_dir = dir.join(node);
        let token = d.enrolment_token(node, &s.operator);
        pushleft_agent::enroll::enroll(
            &format!("https://localhost:{port}"),
            &fingerprint,
            node,
            &node_dir,
            &token,
        )
        .expect("enrol");
        let client = AgentClient::from_dir(&format!("https://localhost:{agent_port}"), &node_dir).expect("client");
        client
            .heartbeat(&Heartbeat::new("bench", &FULL_CAPABILITIES))
            .expect("heartbeat");
        beating.push(AgentClient::from_dir(&format!("https://localhost:{agent_port}"), &node_dir).expect("client"));
        proxies.push(
            rt.block_on(pushleft_agent::image_proxy::start(Arc::new(client)))
                .expect("endpoint"),
        );
    }
    // The nodes stay live (placement takes ready nodes only) for as long as the bench runs.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    std::thread::spawn(move || {
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            for c in &beating {
                let _ = c.heartbeat(&Heartbeat::new("bench", &FULL_CAPABILITIES));
            }
            std::thread::sleep(Duration::from_secs(5));
        }
    });
    Pushleft {
        setup: s,
        port,
        proxies,
        repo,
        url,
        stop,
        _rt: rt,
        _daemon: d,
    }
}

/// `docker save TAG | pl image push app`, then the three pulls: (time, bytes).
fn deliver_pushleft(p: &Pushleft, nodes: &[NodeEngine], tag: &str) -> Delivery {
    let served: u64 = p.proxies.iter().map(StoreProxy::bytes_served).sum();
    let started = Instant::now();
    let mut save = Command::new("docker")
        .args(["save", tag])
        .stdout(Stdio::piped())
        .spawn()
        .expect("save");
    let o = Command::new(support::pl_binary())
        .args(["image", "push", "app", "--input", "-", "--server"])
        .arg(format!("https://localhost:{}", p.port))
        .arg("--ca-cert")
        .arg(p.setup.dir.join("tls/ca.crt"))
        .env("PL_TOKEN", &p.setup.operator)
        .stdin(save.stdout.take().expect("pipe"))
        .output()
        .expect("pl image push");
    assert!(save.wait().expect("save").success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let reference = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let digest = reference.rsplit_once('@').expect("digest").1.to_owned();
    let pushed = started.elapsed().as_secs_f64();
    p.place(&reference);
    let pulling = Instant::now();
    std::thread::scope(|scope| {
        for (node, proxy) in nodes.iter().zip(&p.proxies) {
            let local = format!("{}/app@{digest}", proxy.addr);
            scope.spawn(move || node.run(&["pull", "-q", &local]));
        }
    });
    let seconds = pushed + pulling.elapsed().as_secs_f64();
    eprintln!(
        "pushleft: pushed in {pushed:.2} s, pulled by three nodes in {:.2} s",
        seconds - pushed
    );
    let sent: u64 = err
        .split("blobs sent (")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the push's byte count");
    let fetched = p.proxies.iter().map(StoreProxy::bytes_served).sum::<u64>() - served;
    Delivery {
        seconds,
        bytes: sent + fetched,
    }
}

/// `pl image push TAG --name NAME` (the engine pushes to the store), then the three pulls
/// through the agents: (time, bytes: the store's growth for the push, the endpoints' counts
/// for the pulls).
fn deliver_engine_push(p: &Pushleft, store: &Path, nodes: &[NodeEngine], tag: &str, name: &str) -> Delivery {
    let served: u64 = p.proxies.iter().map(StoreProxy::bytes_served).sum();
    let before = du(store);
    let started = Instant::now();
    let o = Command::new(support::pl_binary())
        .args(["image", "push", tag, "--name", name, "--server"])
        .arg(format!("https://localhost:{}", p.port))
        .arg("--ca-cert")
        .arg(p.setup.dir.join("tls/ca.crt"))
        .env("PL_TOKEN", &p.setup.operator)
        .output()
        .expect("pl image push");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reference = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let digest = reference.rsplit_once('@').expect("digest").1.to_owned();
    let pushed = started.elapsed().as_secs_f64();
    p.place(&reference);
    let pulling = Instant::now();
    std::thread::scope(|scope| {
        for (node, proxy) in nodes.iter().zip(&p.proxies) {
            let local = format!("{}/{name}@{digest}", proxy.addr);
            scope.spawn(move || node.run(&["pull", "-q", &local]));
        }
    });
    let seconds = pushed + pulling.elapsed().as_secs_f64();
    let fetched = p.proxies.iter().map(StoreProxy::bytes_served).sum::<u64>() - served;
    Delivery {
        seconds,
        bytes: du(store).saturating_sub(before) + fetched,
    }
}

/// Counts what passes from `from` to `to`.
fn pipe(mut from: impl Read, mut to: impl Write) -> u64 {
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0;
    loop {
        let got = from.read(&mut buf).expect("read");
        if got == 0 {
            return n;
        }
        to.write_all(&buf[..got]).expect("write");
        n += got as u64;
    }
}

/// `docker save TAG | docker load` to each node, in parallel.
fn deliver_save_load(nodes: &[NodeEngine], tag: &str) -> Delivery {
    let started = Instant::now();
    let bytes: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|node| {
                scope.spawn(move || {
                    let mut save = Command::new("docker")
                        .args(["save", tag])
                        .stdout(Stdio::piped())
                        .spawn()
                        .expect("save");
                    let mut load = node
                        .cli()
                        .args(["load", "-q"])
                        .stdin(Stdio::piped())
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("load");
                    let n = pipe(save.stdout.take().expect("out"), load.stdin.take().expect("in"));
                    assert!(save.wait().expect("save").success() && load.wait().expect("load").success());
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("node")).sum()
    });
    Delivery {
        seconds: started.elapsed().as_secs_f64(),
        bytes,
    }
}

/// `docker push` to the loopback registry, then `docker pull` on each node, in parallel. Bytes:
/// the blobs the registry gained (pushed once), and those each node lacked (pulled each).
fn deliver_push_pull(registry: &Registry, data: &Path, nodes: &[NodeEngine], tag: &str, name: &str) -> Delivery {
    let remote = format!("127.0.0.1:{}/{name}", registry.port);
    docker(&["tag", tag, &remote]);
    let before = du(data);
    let started = Instant::now();
    docker(&["push", "-q", &remote]);
    std::thread::scope(|scope| {
        for node in nodes {
            let remote = remote.clone();
            scope.spawn(move || node.run(&["pull", "-q", &remote]));
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    let pushed = du(data) - before;
    Delivery {
        seconds,
        // Each node lacked what the registry lacked (the nodes and the registry saw the same
        // images before), so it pulled the same blobs.
        bytes: pushed * (1 + nodes.len() as u64),
    }
}

/// The bytes of the files under `dir`.
fn du(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![PathBuf::from(dir)];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => pending.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: u64 = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    require_dockerd();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = pushleft(dir.path());
    let nodes: Vec<NodeEngine> = (1..=3).map(NodeEngine::start).collect();
    for (node, proxy) in nodes.iter().zip(&p.proxies) {
        node.login(proxy);
    }
    let registry = Registry::start();
    let registry_data = registry.data_dir();
    // Per path: (first, second) deliveries of each round.
    let mut results: [Vec<(Delivery, Delivery)>; 4] = Default::default();
    for round in 0..rounds {
        let sample = std::process::id() as u64 * 100 + round;
        let (one, two) = images(sample);
        for (i, path) in results.iter_mut().enumerate() {
            for n in &nodes {
                n.wipe();
            }
            let deliver = |tag: &str| match i {
                0 => deliver_pushleft(&p, &nodes, tag),
                1 => deliver_save_load(&nodes, tag),
                3 => deliver_engine_push(&p, &dir.path().join("images"), &nodes, tag, &format!("app{sample}")),
                _ => deliver_push_pull(&registry, &registry_data, &nodes, tag, &format!("plbench/app{sample}")),
            };
            let first = deliver(&one);
            let second = deliver(&two);
            path.push((first, second));
        }
        for t in [&one, &two] {
            let _ = Command::new("docker").args(["rmi", "-f", t]).output();
        }
        let _ = Command::new("docker")
            .args(["rmi", "-f", &format!("plbench/base:{sample}")])
            .output();
        eprintln!("round {} of {rounds} done", round + 1);
    }
    for n in &nodes {
        n.wipe();
    }
    let names = [
        "pushleft (pl image push --input, agents pull)",
        "docker save | docker load",
        "docker push, pull (loopback registry)",
        "pushleft (pl image push IMAGE, agents pull)",
    ];
    let mut first_s = [0.0; 4];
    let mut second_s = [0.0; 4];
    let mut first_b = [0.0; 4];
    let mut second_b = [0.0; 4];
    for (i, r) in results.iter().enumerate() {
        first_s[i] = median(r.iter().map(|(a, _)| a.seconds).collect());
        second_s[i] = median(r.iter().map(|(_, b)| b.seconds).collect());
        first_b[i] = median(r.iter().map(|(a, _)| a.bytes as f64).collect());
        second_b[i] = median(r.iter().map(|(_, b)| b.bytes as f64).collect());
        println!(
            "{:<40} first {:>6.2} s {:>7.1} MB   second (20 MB layer changed) {:>6.2} s {:>7.1} MB",
            names[i],
            first_s[i],
            first_b[i] / 1e6,
            second_s[i],
            second_b[i] / 1e6
        );
    }
    for (i, how) in [(0, "pl image push --input"), (3, "pl image push IMAGE")] {
        let share = second_b[i] / first_b[i];
        let vs_load = second_s[i] / second_s[1];
        println!(
            "pushleft ({how}): the second delivery moves {:.1} % of the first's bytes (target under 15 %): {}; takes {:.2}x save/load's (target at most 0.5x): {}",
            share * 100.0,
            if share < 0.15 { "met" } else { "NOT met" },
            vs_load,
            if vs_load <= 0.5 { "met" } else { "NOT met" }
        );
    }
    println!(
        "first delivery: pl image push --input {:.2}x save/load, {:.2}x push/pull; pl image push IMAGE {:.2}x push/pull; second: {:.2}x and {:.2}x push/pull",
        first_s[0] / first_s[1],
        first_s[0] / first_s[2],
        first_s[3] / first_s[2],
        second_s[0] / second_s[2],
        second_s[3] / second_s[2]
    );
}
