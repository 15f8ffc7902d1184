//! The mesh's data path against its floor and its anchor (`cargo bench -p pushleft-agent
//! --bench mesh -- --rounds N`): two simulated hosts (network namespaces this bench makes,
//! joined only by a veth LAN, no route out), each with an environment's bridge and one
//! "container" (a namespace on the bridge). The same container pair talks over:
//!
//! - `bare`: the LAN, routed in the hosts' main tables (the floor: no tunnel, no filter);
//! - `wireguard-go by hand`: wireguard-go with `wg set` and main-table routes (the anchor);
//! - `pushleft mesh`: the agent's firewall table, routes and mesh executor, as a node runs them.
//!
//! Bridged traffic passes netfilter on every path (`bridge-nf-call-iptables`, as Docker sets it).
//! Each measures TCP throughput (256 MiB, one connection) and the p50/p99 latency of 2,000
//! 64-byte request/replies on one connection (`TCP_NODELAY`); rounds alternate the three. It
//! also times the node's share of the "placement to reachable" budget: from the mesh's apply
//! on the first host to the first connection accepted from the second.

use agent_proto::mesh::{MeshEnvironment, MeshPeer, MeshSpec, mesh_interface};
use pushleft_agent::firewall::{Firewall, Reachable};
use pushleft_agent::mesh::Mesh;
use pushleft_agent::routes::{Routes, bridge_name};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BYTES: usize = 256 << 20;
const PINGS: usize = 2_000;
const PORT: u16 = 5201;

fn sh(cmd: &str) {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
}

fn cp() -> String {
    format!("{:08x}", std::process::id())
}

fn ns(name: &str) -> String {
    format!("plmb-{name}-{}", std::process::id())
}

/// Runs `f` on a thread inside namespace `name`.
fn inside<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{}", ns(name));
    std::thread::spawn(move || {
        let f_ns = std::fs::File::open(path).expect("netns");
        nix::sched::setns(&f_ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("thread")
}

fn block<T: Send + 'static>(name: &str, f: impl std::future::Future<Output = T> + Send + 'static) -> T {
    inside(name, move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt")
            .block_on(f)
    })
}

struct Side {
    host: &'static str,
    container: &'static str,
    node: &'static str,
    lan: &'static str,
    subnet: &'static str,
}

const A: Side = Side {
    host: "ha",
    container: "ca",
    node: "n1",
    lan: "10.77.0.1",
    subnet: "10.208.1.0/24",
};
const B: Side = Side {
    host: "hb",
    container: "cb",
    node: "n2",
    lan: "10.77.0.2",
    subnet: "10.208.2.0/24",
};

impl Side {
    fn network(&self) -> String {
        agent_proto::host_object(&cp(), "api", self.node)
    }

    fn address(&self) -> String {
        self.subnet.replace(".0/24", ".10")
    }

    fn gateway(&self) -> String {
        self.subnet.replace(".0/24", ".1")
    }

    fn mesh(&self, state: &Path) -> Mesh {
        Mesh {
            control_plane: cp(),
            node: self.node.into(),
            state_dir: state.join(self.node),
            nft: "nft".into(),
            routes: tokio::sync::Mutex::new(()),
            applying: tokio::sync::Mutex::new(()),
        }
    }
}

/// The namespaces: hosts joined by the LAN, each with the environment's bridge and a container.
fn lab() {
    for s in [&A, &B] {
        for n in [s.host, s.container] {
            let _ = Command::new("ip")
                .args(["netns", "del", &ns(n)])
                .stderr(Stdio::null())
                .status();
            sh(&format!("ip netns add {0} && ip -n {0} link set lo up", ns(n)));
        }
        let (h, c, br) = (ns(s.host), ns(s.container), bridge_name(&s.network()));
        sh(&format!(
            "ip netns exec {h} sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 \
             && ip -n {h} link add {br} type bridge && ip -n {h} addr add {gw}/24 dev {br} && ip -n {h} link set {br} up \
             && ip -n {h} link add v-{n} type veth peer name eth0 netns {c} && ip -n {h} link set v-{n} master {br} up \
             && ip -n {c} addr add {addr}/24 dev eth0 && ip -n {c} link set eth0 up && ip -n {c} route add default via {gw}",
            gw = s.gateway(),
            n = s.node,
            addr = s.address(),
        ));
    }
    sh(&format!(
        "ip link add plmb-l1 netns {a} type veth peer name plmb-l2 netns {b} \
         && ip -n {a} addr add {la}/24 dev plmb-l1 && ip -n {a} link set plmb-l1 up \
         && ip -n {b} addr add {lb}/24 dev plmb-l2 && ip -n {b} link set plmb-l2 up",
        a = ns(A.host),
        b = ns(B.host),
        la = A.lan,
        lb = B.lan
    ));
}

fn unlab() {
    for s in [&A, &B] {
        let _ = Command::new("pkill")
            .args(["-f", &format!("wireguard-go (plmb|{})", mesh_interface(&cp(), s.node))])
            .status();
        for n in [s.host, s.container] {
            let _ = Command::new("ip").args(["netns", "del", &ns(n)]).status();
        }
    }
}

/// One configuration of the path between the containers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path3 {
    Bare,
    Anchor,
    Mesh,
}

impl Path3 {
    fn name(self) -> &'static str {
        match self {
            Path3::Bare => "bare veth (floor)",
            Path3::Anchor => "wireguard-go by hand (anchor)",
            Path3::Mesh => "pushleft mesh",
        }
    }
}

fn up(path: Path3, state: &Path) -> Duration {
    match path {
        Path3::Bare => {
            sh(&format!("ip -n {} route add {} via {}", ns(A.host), B.subnet, B.lan));
            sh(&format!("ip -n {} route add {} via {}", ns(B.host), A.subnet, A.lan));
            Duration::ZERO
        }
        Path3::Anchor => {
            for (me, dev) in [(&A, "plmb-wga"), (&B, "plmb-wgb")] {
                let key = state.join(format!("{dev}.key"));
                sh(&format!("umask 077; wg genkey > {}", key.display()));
                sh(&format!(
                    "ip netns exec {} wireguard-go {dev} >/dev/null 2>&1",
                    ns(me.host)
                ));
            }
            let pubkey = |dev: &str| {
                let o = Command::new("sh")
                    .arg("-c")
                    .arg(format!("wg pubkey < {}", state.join(format!("{dev}.key")).display()))
                    .output()
                    .expect("wg");
                String::from_utf8_lossy(&o.stdout).trim().to_owned()
            };
            for (me, peer, dev, pdev) in [(&A, &B, "plmb-wga", "plmb-wgb"), (&B, &A, "plmb-wgb", "plmb-wga")] {
                sh(&format!(
                    "ip netns exec {h} wg set {dev} private-key {key} listen-port 51820 peer {pk} endpoint {ep}:51820 allowed-ips {sub} \
                     && ip -n {h} link set {dev} mtu 1420 up && ip -n {h} route add {sub} dev {dev}",
                    h = ns(me.host),
                    key = state.join(format!("{dev}.key")).display(),
                    pk = pubkey(pdev),
                    ep = peer.lan,
                    sub = peer.subnet,
                ));
            }
            Duration::ZERO
        }
        Path3::Mesh => {
            let keys: Vec<String> = [&A, &B]
                .iter()
                .map(|s| s.mesh(state).public_key().expect("key"))
                .collect();
            for s in [&A, &B] {
                let fw = Firewall {
                    nft: "nft".into(),
                    control_plane: cp(),
                    node: s.node.into(),
                    state_dir: state.join(s.node),
                };
                let (network, subnet, addr) = (s.network(), s.subnet, s.address());
                block(s.host, async move {
                    let reach = Reachable {
                        ports: [(addr.parse().expect("ip"), PORT), (addr.parse().expect("ip"), PORT + 1)].into(),
                        ..Reachable::default()
                    };
                    fw.apply("api", subnet, 1, &reach).expect("firewall");
                    Routes::connect()
                        .expect("netlink")
                        .ensure(&network, subnet, None)
                        .await
                        .expect("routes");
                });
            }
            let spec = |me: &Side, peer: &Side, key: &str| MeshSpec {
                key_epoch: 0,
                generation: 1,
                port: 51820,
                peers: vec![MeshPeer {
                    node: peer.node.into(),
                    public_key: key.into(),
                    endpoint: Some(format!("{}:51820", peer.lan)),
                    keepalive: None,
                    subnets: vec![peer.subnet.into()],
                }],
                environments: vec![MeshEnvironment {
                    environment: "api".into(),
                    subnet: me.subnet.into(),
                    remote: vec![peer.subnet.into()],
                    names: Vec::new(),
                }],
            };
            // B first; then A's apply starts the clock that ends at B's first accepted
            // connection from A (the node's share of placement-to-reachable).
            let (sb, sa) = (spec(&B, &A, &keys[0]), spec(&A, &B, &keys[1]));
            let mb = B.mesh(state);
            block(B.host, async move { mb.apply(&sb).await.expect("mesh b") });
            let listener = inside(B.container, move || {
                TcpListener::bind(("0.0.0.0", PORT + 1)).expect("bind")
            });
            let ma = A.mesh(state);
            let start = Instant::now();
            block(A.host, async move { ma.apply(&sa).await.expect("mesh a") });
            let to = format!("{}:{}", B.address(), PORT + 1);
            let reached = inside(A.container, move || {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    if TcpStream::connect_timeout(&to.parse().expect("addr"), Duration::from_millis(200)).is_ok() {
                        return Instant::now();
                    }
                    assert!(Instant::now() < deadline, "never reachable");
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            drop(listener);
            reached - start
        }
    }
}

fn down(path: Path3, state: &Path) {
    match path {
        Path3::Bare => {
            sh(&format!("ip -n {} route del {}", ns(A.host), B.subnet));
            sh(&format!("ip -n {} route del {}", ns(B.host), A.subnet));
        }
        Path3::Anchor => {
            for (s, dev) in [(&A, "plmb-wga"), (&B, "plmb-wgb")] {
                sh(&format!("ip -n {} link del {dev}", ns(s.host)));
            }
        }
        Path3::Mesh => {
            for s in [&A, &B] {
                let m = s.mesh(state);
                block(s.host, async move { m.remove(2).await.expect("remove") });
                let fw = Firewall {
                    nft: "nft".into(),
                    control_plane: cp(),
                    node: s.node.into(),
                    state_dir: state.join(s.node),
                };
                let subnet = s.subnet;
                block(s.host, async move {
                    fw.remove("api", 2).expect("firewall");
                    Routes::connect()
                        .expect("netlink")
                        .remove(subnet)
                        .await
                        .expect("routes");
                });
                let _ = std::fs::remove_dir_all(state.join(s.node));
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
}

/// Throughput (MiB/s), and the p50 and p99 of request/replies.
type Measured = (f64, Duration, Duration);

/// Throughput (MiB/s) and the p50/p99 of request/replies, container A to container B.
fn measure() -> Measured {
    let server = std::thread::spawn(|| {
        inside(B.container, || {
            let l = TcpListener::bind(("0.0.0.0", PORT)).expect("bind");
            // The bulk connection: read to its end, then closed (the sender waits for that).
            {
                let (mut c, _) = l.accept().expect("accept");
                c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
                let mut buf = vec![0u8; 1 << 16];
                while c.read(&mut buf).is_ok_and(|n| n > 0) {}
            }
            // The ping connection: echo each 64 bytes.
            let (mut c, _) = l.accept().expect("accept");
            c.set_nodelay(true).expect("nodelay");
            c.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
            let mut m = [0u8; 64];
            for _ in 0..PINGS {
                if c.read_exact(&mut m).is_err() || c.write_all(&m).is_err() {
                    break;
                }
            }
        })
    });
    std::thread::sleep(Duration::from_millis(200));
    let to = format!("{}:{PORT}", B.address());
    let out = inside(A.container, move || {
        let addr = to.parse().expect("addr");
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        c.set_write_timeout(Some(Duration::from_secs(60))).expect("timeout");
        let chunk = vec![7u8; 1 << 16];
        let start = Instant::now();
        let mut sent = 0;
        while sent < BYTES {
            c.write_all(&chunk).expect("send");
            sent += chunk.len();
        }
        c.shutdown(std::net::Shutdown::Write).expect("shutdown");
        c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let mut sink = [0u8; 1];
        let _ = c.read(&mut sink);
        let mibs = (BYTES >> 20) as f64 / start.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(100));
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        c.set_nodelay(true).expect("nodelay");
        c.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut times = Vec::with_capacity(PINGS);
        let mut m = [1u8; 64];
        for _ in 0..PINGS {
            let t = Instant::now();
            c.write_all(&m).expect("ping");
            c.read_exact(&mut m).expect("pong");
            times.push(t.elapsed());
        }
        times.sort();
        (mibs, times[PINGS / 2], times[PINGS * 99 / 100])
    });
    server.join().expect("server");
    out
}

fn main() {
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let state = PathBuf::from(format!("/tmp/plmb-{}", std::process::id()));
    std::fs::create_dir_all(&state).expect("state");
    lab();
    let paths = [Path3::Bare, Path3::Anchor, Path3::Mesh];
    let mut results: Vec<(Path3, Vec<Measured>)> = paths.iter().map(|p| (*p, Vec::new())).collect();
    let mut reach = Vec::new();
    for round in 0..rounds {
        for (i, p) in paths.iter().enumerate() {
            let r = up(*p, &state);
            if *p == Path3::Mesh {
                reach.push(r);
            }
            let m = measure();
            eprintln!(
                "round {round} {}: {:.0} MiB/s, p50 {:?}, p99 {:?}",
                p.name(),
                m.0,
                m.1,
                m.2
            );
            results[i].1.push(m);
            down(*p, &state);
        }
    }
    unlab();
    let _ = std::fs::remove_dir_all(&state);
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let mut anchor = 0.0;
    println!("| path | throughput, MiB/s (median of {rounds}) | p50 | p99 |");
    println!("|---|---:|---:|---:|");
    for (p, ms) in &results {
        let mut t: Vec<f64> = ms.iter().map(|m| m.0).collect();
        let mut p50: Vec<f64> = ms.iter().map(|m| m.1.as_secs_f64() * 1e6).collect();
        let mut p99: Vec<f64> = ms.iter().map(|m| m.2.as_secs_f64() * 1e6).collect();
        let t = med(&mut t);
        if *p == Path3::Anchor {
            anchor = t;
        }
        println!(
            "| {} | {t:.0} | {:.0} µs | {:.0} µs |",
            p.name(),
            med(&mut p50),
            med(&mut p99)
        );
        if *p == Path3::Mesh && anchor > 0.0 {
            println!("\nmesh / anchor throughput: {:.2} (target ≥ 0.90)", t / anchor);
        }
    }
    reach.sort();
    println!(
        "the node's share of placement to reachable (apply on host 1 to a connection accepted on host 2), median: {:?}",
        reach[reach.len() / 2]
    );
}
