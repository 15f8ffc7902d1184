//! The mesh executor between two simulated hosts: network namespaces this test makes, each
//! with a dockerd of its own, joined only by a veth "LAN" (10.77.0.0/24, no route out). Each
//! host runs environment `api` and environment `other` (their networks, tables and routes made
//! by the agent's own executors) with one container each serving its name over HTTP. Once
//! both apply their mesh (userspace wireguard-go here: this kernel has no WireGuard module):
//!
//! - `api` on host 1 gets `api` on host 2's answer, and the LAN carries WireGuard only (the
//!   capture holds UDP to the mesh's port and never the answer's bytes);
//! - `api` on host 1 reaches neither `other` on host 2 nor host 2 itself (a server on its
//!   gateway address), while `other` on host 1 reaches `other` on host 2;
//! - the private key stays on its node (0600) and its public key is what `wg` derives;
//! - a spec without the peer cuts the link and takes its routes; a stale generation is
//!   refused; a table of ours' name that is not ours is left alone; removal leaves no
//!   interface, table, Docker rule or wireguard-go behind.
//!
//! And the whole loop (`a_control_plane_joins_its_nodes_environments_across_hosts`): a
//! control plane in host 1, an agent on each host, a worker role with two replicas spread
//! over both (host 2's address declared in Git, host 1's said by its agent); the agents send
//! their public keys, the control plane decides each node's mesh from placement and hands it
//! over with the lease each agent waits on (heartbeats come only every 20 s here), the replica
//! on host 1 reaches the one on host 2 and finds both replicas by the role's name, both links
//! are judged up (`/metrics`, `/v1/status`), and a node retired in Git loses every peer.

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "support/host.rs"]
mod host;
#[path = "support/mesh_fleet.rs"]
mod mesh_fleet;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;

use agent_proto::NetworkSpec;
use agent_proto::mesh::{MeshEnvironment, MeshPeer, MeshSpec, mesh_interface, mesh_table};
use host::Host;
use mesh_fleet::Fleet;
use pushleft_agent::firewall::{Firewall, Reachable};
use pushleft_agent::mesh::Mesh;
use pushleft_agent::routes::Routes;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PORT: u16 = 51820;

/// This run's control plane: its interfaces' names (and wireguard-go's sockets, which all
/// namespaces share) are its own, whatever an earlier run left.
fn cp() -> String {
    format!("{:08x}", std::process::id())
}

fn sh(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// One simulated node: its host, name, state folder and environments' subnets.
struct Node {
    host: Host,
    name: &'static str,
    state: PathBuf,
    lan: &'static str,
    subnets: [(&'static str, &'static str); 2],
}

impl Node {
    fn mesh(&self) -> Mesh {
        Mesh {
            control_plane: cp(),
            node: self.name.into(),
            state_dir: self.state.clone(),
            nft: "nft".into(),
            routes: tokio::sync::Mutex::new(()),
            applying: tokio::sync::Mutex::new(()),
        }
    }

    fn firewall(&self) -> Firewall {
        Firewall {
            nft: "nft".into(),
            control_plane: cp(),
            node: self.name.into(),
            state_dir: self.state.clone(),
        }
    }

    /// Runs `f` inside the host's namespace with a runtime of its own there.
    fn block<T: Send + 'static>(&self, f: impl std::future::Future<Output = T> + Send + 'static) -> T {
        self.host.run(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt")
                .block_on(f)
        })
    }

    fn container(&self, env: &str) -> String {
        format!("mesh-{}-{env}", self.name)
    }

    fn address(&self, env: &str) -> String {
        let subnet = self.subnets.iter().find(|(e, _)| *e == env).expect("env").1;
        subnet.replace(".0/24", ".10")
    }

    /// One bounded HTTP GET from this node's container of `env` (busybox nc, 2 s; the static
    /// busybox's wget crashes): the body, or `None`.
    fn get(&self, env: &str, to: &str) -> Option<String> {
        use std::io::Write;
        let (addr, port) = to.split_once(':').expect("address:port");
        let mut child = Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", self.host.socket.display()))
            .args([
                "exec",
                "-i",
                &self.container(env),
                "busybox",
                "timeout",
                "3",
                "busybox",
                "nc",
                "-w",
                "2",
                addr,
                port,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker exec");
        let _ = child.stdin.take().expect("stdin").write_all(b"GET / HTTP/1.0\r\n\r\n");
        let o = child.wait_with_output().expect("nc");
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        text.starts_with("HTTP/1.")
            .then(|| text.split("\r\n\r\n").nth(1).unwrap_or_default().trim().to_owned())
    }

    /// This node's mesh spec towards `peer` (none: no peers), at `generation`.
    fn spec(&self, peer: Option<(&Node, String)>, generation: u64) -> MeshSpec {
        MeshSpec {
            generation,
            key_epoch: 0,
            port: PORT,
            peers: peer
                .iter()
                .map(|(p, key)| MeshPeer {
                    node: p.name.into(),
                    public_key: key.clone(),
                    endpoint: Some(format!("{}:{PORT}", p.lan)),
                    keepalive: None,
                    subnets: p.subnets.iter().map(|(_, s)| (*s).to_owned()).collect(),
                })
                .collect(),
            environments: self
                .subnets
                .iter()
                .map(|(env, s)| MeshEnvironment {
                    environment: (*env).into(),
                    subnet: (*s).into(),
                    remote: peer
                        .iter()
                        .flat_map(|(p, _)| p.subnets.iter().filter(|(e, _)| e == env).map(|(_, s)| (*s).to_owned()))
                        .collect(),
                    names: Vec::new(),
                })
                .collect(),
        }
    }
}

/// The busybox image every container runs, imported into `host`'s engine as `tag`, serving
/// `body` at `/`.
fn image(host: &Host, tag: &str, body: &str) {
    let root = host.dir.join(format!("image-{tag}"));
    std::fs::create_dir_all(root.join("bin")).expect("bin");
    std::fs::create_dir_all(root.join("www")).expect("www");
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static");
    std::fs::write(root.join("www/index.html"), body).expect("index");
    let tar = root.with_extension("tar");
    sh(&format!("tar -C {} -cf {} .", root.display(), tar.display()));
    host.docker(&["import", &tar.to_string_lossy(), tag]);
}

fn setup(name: &'static str, lan: &'static str, subnets: [(&'static str, &'static str); 2], base: &Path) -> Node {
    let dir = base.join(name);
    let host = Host::start(&format!("plmesh-{name}-{}", std::process::id()), &dir);
    let node = Node {
        host,
        name,
        state: dir.join("state"),
        lan,
        subnets,
    };
    for (env, subnet) in subnets {
        image(&node.host, &format!("mesh-{env}"), &format!("{env} on {name}\n"));
        let (socket, state, fw) = (node.host.socket.clone(), node.state.clone(), node.firewall());
        let net = NetworkSpec {
            environment: env.into(),
            network: agent_proto::host_object(&cp(), env, name),
            subnet: subnet.into(),
        };
        let address = node.address(env);
        node.block(async move {
            let engine = pushleft_agent::docker::Engine::connect(
                &socket,
                &cp(),
                name,
                state.join("secrets"),
                state.join("age"),
                state.join("pulled"),
            )
            .await
            .expect("engine");
            engine.ensure_network(&net).await.expect("network");
            let reach = Reachable {
                ports: [(address.parse().expect("ip"), 8080)].into(),
                ..Reachable::default()
            };
            fw.apply(env, subnet, 1, &reach).expect("firewall");
            Routes::connect()
                .expect("netlink")
                .ensure(&net.network, subnet, None)
                .await
                .expect("routes");
        });
        node.host.docker(&[
            "run",
            "-d",
            "--name",
            &node.container(env),
            "--network",
            &agent_proto::host_object(&cp(), env, name),
            "--ip",
            &node.address(env),
            &format!("mesh-{env}"),
            "busybox",
            "httpd",
            "-f",
            "-p",
            "8080",
            "-h",
            "/www",
        ]);
    }
    node
}

/// `ARGS` started in namespace `ns`, its output discarded (the test ends it).
fn spawn_in(ns: &str, args: &[&str]) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// What the node's mesh looks like, for a failure's message.
fn diagnose(node: &Node) -> String {
    let ns = &node.host.netns;
    let run = |cmd: String| {
        let o = Command::new("sh").arg("-c").arg(&cmd).output().expect("sh");
        format!(
            "$ {cmd}\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    [
        run(format!("wg show {}", mesh_interface(&cp(), node.name))),
        run(format!("ip -n {ns} -br addr; ip -n {ns} rule; ip -n {ns} route show table all | grep -v local")),
        run(format!(
            "ip netns exec {ns} sysctl net.ipv4.ip_forward net.ipv4.conf.all.rp_filter; ip -n {ns} route get 10.208.2.10 from 10.208.1.10 iif {}",
            pushleft_agent::routes::bridge_name(&agent_proto::host_object(&cp(), "api", node.name))
        )),
        run(format!("ip netns exec {ns} nft list ruleset")),
    ]
    .join("\n")
}

/// Every wireguard-go of this test's interfaces is ended, whatever happened.
struct Reaper(Vec<String>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for iface in &self.0 {
            let _ = Command::new("pkill")
                .args(["-f", &format!("wireguard-go {iface}")])
                .status();
            let _ = std::fs::remove_file(format!("/var/run/wireguard/{iface}.sock"));
        }
    }
}

fn wireguard_go_running(iface: &str) -> bool {
    let o = Command::new("pgrep")
        .args(["-f", &format!("^wireguard-go {iface}$")])
        .output()
        .expect("pgrep");
    // A process that ended but is not reaped yet is no longer running.
    String::from_utf8_lossy(&o.stdout).split_whitespace().any(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split_whitespace().nth(2).is_some_and(|state| state != "Z"))
    })
}

#[test]
fn two_hosts_reach_each_other_by_environment_over_wireguard_only() {
    let base = PathBuf::from(format!("/tmp/plmesh-{}", std::process::id()));
    let _reaper = Reaper(vec![mesh_interface(&cp(), "h1"), mesh_interface(&cp(), "h2")]);
    let h1 = setup(
        "h1",
        "10.77.0.1",
        [("api", "10.208.1.0/24"), ("other", "10.208.4.0/24")],
        &base,
    );
    let h2 = setup(
        "h2",
        "10.77.0.2",
        [("api", "10.208.2.0/24"), ("other", "10.208.3.0/24")],
        &base,
    );
    // IPv4 only on the LAN (no link-local IPv6 chatter in the capture).
    sh(&format!(
        "ip link add plmesh-l1 netns {} type veth peer name plmesh-l2 netns {} \
         && ip netns exec {0} sysctl -qw net.ipv6.conf.plmesh-l1.disable_ipv6=1 \
         && ip netns exec {1} sysctl -qw net.ipv6.conf.plmesh-l2.disable_ipv6=1 \
         && ip -n {0} addr add 10.77.0.1/24 dev plmesh-l1 && ip -n {0} link set plmesh-l1 up \
         && ip -n {1} addr add 10.77.0.2/24 dev plmesh-l2 && ip -n {1} link set plmesh-l2 up",
        h1.host.netns, h2.host.netns
    ));
    // Host 2 itself serves HTTP on every address (its gateways too): never reached through
    // the mesh.
    let www = base.join("h2-www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("index.html"), "host h2\n").expect("index");
    let mut host_server = spawn_in(
        &h2.host.netns,
        &["busybox", "httpd", "-f", "-p", "8080", "-h", &www.to_string_lossy()],
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        sh(&format!(
            "ip netns exec {} python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/', timeout=2).read().decode().strip())\"",
            h2.host.netns
        )),
        "host h2",
        "host 2's server answers on every address"
    );

    // Keys: made on the node, 0600, the public half what `wg pubkey` derives.
    let (k1, k2) = (
        h1.mesh().public_key().expect("key 1"),
        h2.mesh().public_key().expect("key 2"),
    );
    let private = h1.state.join("mesh/private.key");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&private).expect("key file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(sh(&format!("wg pubkey < {}", private.display())), k1);
    assert_eq!(h1.mesh().public_key().expect("again"), k1, "the key is made once");

    // Before the mesh: islands.
    assert_eq!(h1.get("api", &format!("{}:8080", h2.address("api"))), None);

    let (s1, s2) = (h1.spec(Some((&h2, k2.clone())), 1), h2.spec(Some((&h1, k1.clone())), 1));
    let m1 = h1.mesh();
    let note = h1.block(async move { m1.apply(&s1).await.expect("mesh 1") });
    assert!(note.contains("wireguard-go") && note.contains("1 peers"), "{note}");
    let m2 = h2.mesh();
    h2.block(async move { m2.apply(&s2).await.expect("mesh 2") });

    // The LAN, captured while the environments talk.
    let pcap = base.join("lan.pcap");
    let mut capture = spawn_in(
        &h1.host.netns,
        &["tcpdump", "-i", "plmesh-l1", "-U", "-w", &pcap.to_string_lossy()],
    );
    std::thread::sleep(Duration::from_millis(500));
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        if let Some(a) = h1.get("api", &format!("{}:8080", h2.address("api"))) {
            break a;
        }
        assert!(
            Instant::now() < deadline,
            "api on h1 never reached api on h2:\n{}\n{}",
            diagnose(&h1),
            diagnose(&h2)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(answer, "api on h2");
    assert_eq!(
        h2.get("api", &format!("{}:8080", h1.address("api"))).as_deref(),
        Some("api on h1")
    );
    assert_eq!(
        h1.get("other", &format!("{}:8080", h2.address("other"))).as_deref(),
        Some("other on h2")
    );
    // Isolation across nodes: not another environment, not the other host.
    assert_eq!(h1.get("api", &format!("{}:8080", h2.address("other"))), None);
    assert_eq!(h1.get("api", "10.208.2.1:8080"), None, "host 2 through its api gateway");
    assert_eq!(
        h1.get("api", "10.208.3.1:8080"),
        None,
        "host 2 through its other gateway"
    );
    assert_eq!(h1.get("api", "10.77.0.2:8080"), None, "host 2 on the LAN");
    std::thread::sleep(Duration::from_millis(300));
    let _ = Command::new("kill").args(["-INT", &capture.id().to_string()]).status();
    let _ = capture.wait();
    let bytes = std::fs::read(&pcap).expect("capture");
    assert!(
        !bytes.windows(9).any(|w| w == b"api on h2"),
        "the answer crossed the LAN in plaintext"
    );
    let lines = sh(&format!("tcpdump -nn -r {} 2>/dev/null", pcap.display()));
    let packets: Vec<&str> = lines.lines().collect();
    assert!(packets.len() >= 4, "{lines}");
    let wireguard = |l: &str| l.contains(&format!(".{PORT}: UDP")) || l.contains(&format!(".{PORT} > "));
    let other: Vec<&&str> = packets.iter().filter(|l| !wireguard(l) && !l.contains("ARP")).collect();
    assert!(other.is_empty(), "the LAN carried more than WireGuard: {other:?}");

    // Health: each side has shaken hands with the other.
    let links = h1.mesh().links();
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].node, "h2");
    assert!(links[0].last_handshake.is_some(), "{links:?}");

    // Docker's FORWARD policy is passed by one rule of ours, named for this node.
    let docker_user = sh(&format!(
        "ip netns exec {} nft list chain ip filter DOCKER-USER",
        h1.host.netns
    ));
    assert!(
        docker_user.contains(&format!("pushleft mesh {} h1", cp())),
        "{docker_user}"
    );

    // Drift: the interface deleted by hand (wireguard-go ends with it) comes back at the next
    // round, and the environments talk again.
    let iface1 = mesh_interface(&cp(), "h1");
    sh(&format!("ip -n {} link del {iface1}", h1.host.netns));
    let m1 = h1.mesh();
    let repaired = h1.block(async move { m1.repair().await });
    assert!(matches!(&repaired, Some(Ok(_))), "{repaired:?}");
    let m1 = h1.mesh();
    assert!(
        h1.block(async move { m1.repair().await }).is_none(),
        "nothing left to repair"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while h1.get("api", &format!("{}:8080", h2.address("api"))).is_none() {
        assert!(Instant::now() < deadline, "no path after the repair");
        std::thread::sleep(Duration::from_millis(200));
    }

    // A stale generation is refused, and changes nothing.
    let m1 = h1.mesh();
    let stale = h1.spec(None, 0);
    let err = h1.block(async move { m1.apply(&stale).await.expect_err("stale") });
    assert_eq!(err.code, "stale-generation");
    assert!(h1.get("api", &format!("{}:8080", h2.address("api"))).is_some());

    // Host 1 no longer shares anything with host 2: its peer and routes go.
    let m1 = h1.mesh();
    let alone = h1.spec(None, 2);
    h1.block(async move { m1.apply(&alone).await.expect("alone") });
    assert_eq!(h1.get("api", &format!("{}:8080", h2.address("api"))), None);
    let table = sh(&format!("ip -n {} route show table 10001", h1.host.netns));
    assert!(!table.contains("10.208.2.0"), "{table}");

    // A table named like the mesh's that is not ours is left alone.
    let ours = mesh_table(&cp(), "h2");
    sh(&format!("ip netns exec {} nft delete table inet {ours}", h2.host.netns));
    sh(&format!("ip netns exec {} nft add table inet {ours}", h2.host.netns));
    let m2 = h2.mesh();
    let again = h2.spec(Some((&h1, k1.clone())), 2);
    let err = h2.block(async move { m2.apply(&again).await.expect_err("foreign") });
    assert_eq!(err.code, "foreign-table");
    sh(&format!("ip netns exec {} nft delete table inet {ours}", h2.host.netns));

    // Removal: no interface, table, Docker rule or wireguard-go left.
    for node in [&h1, &h2] {
        let m = node.mesh();
        node.block(async move { m.remove(3).await.expect("remove") });
        let iface = mesh_interface(&cp(), node.name);
        let links = sh(&format!("ip -n {} -o link show", node.host.netns));
        assert!(!links.contains(&iface), "{links}");
        let tables = sh(&format!("ip netns exec {} nft list tables", node.host.netns));
        assert!(!tables.contains("__mesh_"), "{tables}");
        let docker_user = sh(&format!(
            "ip netns exec {} nft list chain ip filter DOCKER-USER",
            node.host.netns
        ));
        assert!(!docker_user.contains("pushleft mesh"), "{docker_user}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while wireguard_go_running(&iface) {
            assert!(Instant::now() < deadline, "wireguard-go for {iface} still runs");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let _ = host_server.kill();
    let _ = host_server.wait();
    drop((h1, h2));
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_control_plane_joins_its_nodes_environments_across_hosts() {
    // Heartbeats every 20 s: each mesh reaches its node with the lease the node waits on,
    // woken when the control plane changed it.
    let mut fleet = Fleet::start("ml", 20);
    let url = fleet.url.clone();
    // Two replicas, spread: one on each node. Each serves its own container's name.
    fleet.commit_app(2, "app");

    // Done: both replicas healthy, one on each node.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let row = support::sql(&url, "SELECT status FROM deployments");
        if row.first().map(String::as_str) == Some("done") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not done: {:?}\n{:?}\n{}",
            support::sql(&url, "SELECT key || ' ' || state FROM jobs ORDER BY id"),
            support::sql(
                &url,
                "SELECT j.key || ' ' || r.detail FROM job_results r JOIN jobs j ON j.id = r.job_id"
            ),
            fleet.agent_logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let one = |host: &Host| {
        Fleet::replicas(host)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no replica on {}", host.netns))
    };
    let ((n1_name, n1_ip, _), (_, n2_ip, n2_id)) = (one(&fleet.h1), one(&fleet.h2));
    assert_ne!(n1_ip, n2_ip, "one subnet per node, none shared: {n1_ip} {n2_ip}");

    // The mesh: decided from placement, taken with the leases, applied by both agents; then
    // the replica on host 1 gets the answer of the one on host 2.
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let o = Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", fleet.h1.socket.display()))
            .args(["exec", &n1_name, "/bin/busybox", "sh", "-c"])
            .arg(format!(
                "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox timeout 3 /bin/busybox nc -w 2 {n2_ip} 8080"
            ))
            .output()
            .expect("exec");
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        if text.starts_with("HTTP/1.") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no answer across the mesh: {:?}\n{}",
            fleet.meshes(),
            fleet.agent_logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(answer.trim_end().ends_with(&n2_id), "{answer}");
    // By name: the role's name answers with its replicas on both nodes (this node's, and the
    // other's as the mesh carries them), through Docker's resolver and the agent's server.
    let resolves = |host: &Host, container: &str| {
        let out = host::docker_at(
            &host.socket,
            &[
                "exec",
                container,
                "/bin/busybox",
                "timeout",
                "5",
                "/bin/busybox",
                "nslookup",
                "-type=a",
                "app",
            ],
        );
        let mut got = support::nslookup_addresses(&out);
        got.sort();
        got
    };
    let mut want = vec![n1_ip.clone(), n2_ip.clone()];
    want.sort();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = resolves(&fleet.h1, &n1_name);
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "app resolves to {got:?}, not {want:?}: {:?}\n{}",
            fleet.meshes(),
            fleet.agent_logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // What the ledger holds: each node applied its newest mesh, with the other as its peer
    // and a handshake (heartbeats bring the links).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows = support::sql(
            &url,
            "SELECT node || ' ' || CAST(generation - applied AS TEXT) || ' ' || links FROM node_meshes ORDER BY node",
        );
        if rows.len() == 2 && rows.iter().all(|r| r.contains(" 0 ") && r.contains("lastHandshake")) {
            break;
        }
        assert!(Instant::now() < deadline, "{rows:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // n2's endpoint is the address Git declares (its agent said none), and n1 reaches it
    // there rather than waiting for n2 to reach out; keepalives on every link.
    let n1_spec = support::sql(&url, "SELECT spec FROM node_meshes WHERE node = 'n1'");
    assert!(n1_spec[0].contains("\"endpoint\":\"10.77.0.2:51820\""), "{n1_spec:?}");
    assert!(n1_spec[0].contains("\"keepalive\":25"), "{n1_spec:?}");
    // `pl nodes` reads it from the API: each node's mesh applied, its peer and a handshake.
    let viewer = fleet.viewer.clone();
    let (code, body) = fleet.get("/v1/nodes", &viewer);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    for (node, peer) in [("n1", "n2"), ("n2", "n1")] {
        let n = v["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["name"] == node)
            .expect("node");
        assert_eq!(n["mesh"]["generation"], n["mesh"]["applied"], "{n}");
        assert_eq!(n["mesh"]["links"][0]["node"], peer, "{n}");
        assert!(n["mesh"]["links"][0]["lastHandshake"].as_u64().is_some(), "{n}");
        assert_eq!(n["mesh"]["down"], serde_json::json!([]), "{n}");
    }
    // Health: both links judged up (`/metrics` counts them, and names only links not up),
    // none down (`pl status`).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, metrics) = fleet.get("/metrics", &viewer);
        assert_eq!(code, 200, "{metrics}");
        if metrics.contains("pushleft_mesh_links{state=\"up\"} 2")
            && metrics.contains("pushleft_mesh_links{state=\"down\"} 0")
            && !metrics.contains("pushleft_mesh_link_up{")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (_, status) = fleet.get("/v1/status", &viewer);
    let status: serde_json::Value = serde_json::from_str(&status).expect("json");
    assert_eq!(
        status["mesh"],
        serde_json::json!({"links": 2, "downTotal": 0, "down": []}),
        "{status}"
    );
    // Key rotation of n2, asked while n1's replica calls n2's (each request given 2 s and one
    // retry): not one request fails. n2 makes the pair itself; the control plane learns the
    // public key from its heartbeat and n1's mesh names it at once.
    let key_file = fleet.dir().join("state-n2/mesh/private.key");
    let (old_private, old_public) = (
        std::fs::read_to_string(&key_file).expect("n2's key"),
        support::sql(&url, "SELECT mesh_key FROM nodes WHERE name = 'n2'")[0].clone(),
    );
    let caller = {
        let (socket, name, ip) = (fleet.h1.socket.clone(), n1_name.clone(), n2_ip.clone());
        std::thread::spawn(move || {
            let o = Command::new("docker")
                .arg("-H")
                .arg(format!("unix://{}", socket.display()))
                .args(["exec", &name, "/bin/busybox", "sh", "-c"])
                .arg(format!(
                    "get() {{ printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox timeout 3 /bin/busybox nc -w 2 {ip} 8080 | /bin/busybox tail -n 1; }}; \
                     for i in $(/bin/busybox seq 50); do \
                       a=$(get); [ -n \"$a\" ] || a=$(get); echo \"${{a:-FAILED}}\"; /bin/busybox sleep 0.1; \
                     done"
                ))
                .output()
                .expect("exec");
            String::from_utf8_lossy(&o.stdout).into_owned()
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    // `pl node rotate-mesh-key` returns once n2 applied it and n1 handshook with it since.
    let rotated = fleet.pl(&["node", "rotate-mesh-key", "n2", "--timeout", "90"]);
    assert!(
        rotated.status.success(),
        "{}\n{:?}\n{}",
        String::from_utf8_lossy(&rotated.stderr),
        fleet.meshes(),
        fleet.agent_logs()
    );
    assert!(
        String::from_utf8_lossy(&rotated.stdout).contains("n2: new mesh key pair in use"),
        "{rotated:?}"
    );
    let operator = fleet.operator.clone();
    let (code, body) = fleet.post("/v1/nodes/n9/mesh-key", &operator);
    assert_eq!((code, body.contains("mesh-not-joined")), (404, true), "{body}");
    let (code, _) = fleet.post("/v1/nodes/n2/mesh-key", &viewer);
    assert_eq!(code, 403, "a viewer may not");
    let answers = caller.join().expect("caller");
    assert!(
        !answers.contains("FAILED"),
        "{answers}\n{:?}\n{}",
        fleet.meshes(),
        fleet.agent_logs()
    );
    assert_eq!(answers.lines().filter(|l| l.trim() == n2_id).count(), 50, "{answers}");
    let new_public = support::sql(&url, "SELECT mesh_key FROM nodes WHERE name = 'n2'")[0].clone();
    assert_ne!(new_public, old_public, "n2's heartbeat brought its new public key");
    assert_ne!(std::fs::read_to_string(&key_file).expect("n2's key"), old_private);
    let n1_spec = support::sql(&url, "SELECT spec FROM node_meshes WHERE node = 'n1'");
    assert!(n1_spec[0].contains(&new_public), "{n1_spec:?}");
    // And traffic flows under the new key after the rotation is done.
    let after = Command::new("docker")
        .arg("-H")
        .arg(format!("unix://{}", fleet.h1.socket.display()))
        .args(["exec", &n1_name, "/bin/busybox", "sh", "-c"])
        .arg(format!(
            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox timeout 3 /bin/busybox nc -w 2 {n2_ip} 8080 | /bin/busybox tail -n 1"
        ))
        .output()
        .expect("exec");
    assert_eq!(String::from_utf8_lossy(&after.stdout).trim(), n2_id);
    assert!(
        support::sql(&url, "SELECT detail FROM events WHERE kind = 'mesh-key-rotation'")[0]
            .contains("asked n2 for a new mesh key pair (epoch 1)")
    );

    // n2 retired in Git: its replica moves to n1, and n1's mesh loses its only peer (no
    // interface, no listener left on n1).
    fleet.repo.write(
        "pools/main.yaml",
        &fleet
            .pool
            .replace("{name: n2, address", "{name: n2, state: retired, address"),
    );
    fleet.repo.commit("n2 retired", true);
    let iface1 = mesh_interface(&fleet.cp, "n1");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mesh = support::sql(
            &url,
            "SELECT CAST(generation - applied AS TEXT) || ' ' || spec FROM node_meshes WHERE node = 'n1'",
        );
        let links = Command::new("ip")
            .args(["-n", &fleet.h1.netns, "link", "show", &iface1])
            .output()
            .expect("ip");
        if mesh
            .first()
            .is_some_and(|m| m.starts_with("0 ") && m.contains("\"peers\":[]"))
            && !links.status.success()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "n1 still peers with the retired n2: {mesh:?}\n{:?}\n{:?}\n{}",
            support::sql(&url, "SELECT key || ' ' || state FROM jobs ORDER BY id"),
            fleet.meshes(),
            fleet.agent_logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_replica_moved_by_a_drain_is_reachable_at_its_new_place_by_name() {
    // `api` has one replica; `client` two, one on each node. The node that runs `api` is
    // drained: `api` moves to the other node, whose `client` calls it by name all along.
    let fleet = Fleet::start("md", 10);
    fleet.commit_roles(&[("api", 1), ("client", 2)], "api and its clients");
    fleet.wait_done(Duration::from_secs(120));
    let on = |role: &str, host: &Host| Fleet::replicas_of(host, role);
    let (from, to, from_name) = if on("api", &fleet.h1).is_empty() {
        (&fleet.h2, &fleet.h1, "n2")
    } else {
        (&fleet.h1, &fleet.h2, "n1")
    };
    let (_, _, old_id) = on("api", from).pop().expect("api");
    let (client, _, _) = on("client", to).pop().expect("a client on the other node");
    // The client finds `api` on the other node by name first.
    let call = "get() { printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox timeout 3 /bin/busybox nc -w 2 api 8080 | /bin/busybox tail -n 1; }".to_owned();
    let exec = |script: String| {
        Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", to.socket.display()))
            .args(["exec", &client, "/bin/busybox", "sh", "-c", &script])
            .output()
            .expect("exec")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while String::from_utf8_lossy(&exec(format!("{call}; get")).stdout).trim() != old_id {
        assert!(
            Instant::now() < deadline,
            "api never answered by name across the mesh: {:?}\n{}",
            fleet.meshes(),
            fleet.agent_logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // Calls for 15 s (at most 300), each given 2 s and one retry, each line the second it
    // was answered and by whom.
    let caller = {
        let (socket, client) = (to.socket.clone(), client.clone());
        std::thread::spawn(move || {
            let o = Command::new("docker")
                .arg("-H")
                .arg(format!("unix://{}", socket.display()))
                .args(["exec", &client, "/bin/busybox", "sh", "-c"])
                .arg(format!(
                    "{call}; end=$(( $(/bin/busybox date +%s) + 15 )); i=0; \
                     while [ $(/bin/busybox date +%s) -lt $end ] && [ $i -lt 300 ]; do \
                       a=$(get); [ -n \"$a\" ] || a=$(get); echo \"$(/bin/busybox date +%s) ${{a:-FAILED}}\"; \
                       i=$((i + 1)); /bin/busybox sleep 0.1; \
                     done"
                ))
                .output()
                .expect("exec");
            String::from_utf8_lossy(&o.stdout).into_owned()
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let drained_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    fleet.repo.write(
        "pools/main.yaml",
        &fleet.pool.replace(
            &format!("{{name: {from_name}, "),
            &format!("{{name: {from_name}, state: draining, "),
        ),
    );
    fleet.repo.commit(&format!("{from_name} drained"), true);
    let answers = caller.join().expect("caller");
    let lines: Vec<(u64, &str)> = answers
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(t, who)| (t.parse().expect("a second"), who))
        .collect();
    assert!(
        lines.iter().all(|(_, who)| *who != "FAILED"),
        "{answers}\n{:?}\n{}",
        fleet.meshes(),
        fleet.agent_logs()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !from
        .docker(&["ps", "-q", "--filter", "label=dev.pushleft.role=api"])
        .is_empty()
    {
        assert!(Instant::now() < deadline, "api never left the drained node: {answers}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, _, new_id) = on("api", to).pop().expect("api on the other node");
    assert_eq!(lines.last().map(|l| l.1), Some(new_id.as_str()), "{answers}");
    // The bound: by name at its new place within 8 s of the drain's commit (its placement,
    // start and first accepted connection, the mesh; measured: about 1 s).
    let first_new = lines.iter().find(|(_, who)| *who == new_id).expect("the new place").0;
    eprintln!(
        "{} calls, none failed; the new place answered {} s after the drain's commit",
        lines.len(),
        first_new - drained_at
    );
    assert!(
        first_new <= drained_at + 8,
        "answered at its new place {} s after the drain: {answers}",
        first_new - drained_at
    );
}

#[test]
fn a_node_behind_nat_is_reached_through_the_path_it_keeps_open() {
    // Host 2 is behind a masquerading router: no address on the LAN, none in Git, none said
    // by its agent. Its agent reaches out to host 1 and keeps the path open; host 1's
    // replica calls host 2's through that path, the direction the router lets nothing in.
    let fleet = Fleet::start_behind_nat("mn", 10);
    fleet.commit_app(2, "app");
    fleet.wait_done(Duration::from_secs(120));
    let one = |host: &Host| {
        Fleet::replicas(host)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no replica on {}", host.netns))
    };
    let ((n1_name, n1_ip, n1_id), (n2_name, n2_ip, n2_id)) = (one(&fleet.h1), one(&fleet.h2));
    // No way in but the mesh: host 1 has no route to host 2's side of the router.
    let route = Command::new("ip")
        .args(["-n", &fleet.h1.netns, "route", "get", "10.78.0.2"])
        .output()
        .expect("ip");
    assert!(!route.status.success(), "host 1 routes to host 2: {route:?}");
    // The plan: n1 knows no endpoint for n2 (it waits to be reached); n2 reaches n1 at the
    // address n1's agent said, with keepalives.
    let spec = |node: &str| {
        support::sql(
            &fleet.url,
            &format!("SELECT spec FROM node_meshes WHERE node = '{node}'"),
        )
    };
    let (n1_spec, n2_spec) = (spec("n1"), spec("n2"));
    assert!(n1_spec[0].contains("\"endpoint\":null"), "{n1_spec:?}");
    assert!(n2_spec[0].contains("\"endpoint\":\"10.77.0.1:51820\""), "{n2_spec:?}");
    assert!(n2_spec[0].contains("\"keepalive\":25"), "{n2_spec:?}");

    let get = |host: &Host, from: &str, to: &str| {
        let o = Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", host.socket.display()))
            .args(["exec", from, "/bin/busybox", "sh", "-c"])
            .arg(format!(
                "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox timeout 3 /bin/busybox nc -w 2 {to} 8080 | /bin/busybox tail -n 1"
            ))
            .output()
            .expect("exec");
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    for (host, from, to, want) in [
        (&fleet.h1, &n1_name, &n2_ip, &n2_id),
        (&fleet.h2, &n2_name, &n1_ip, &n1_id),
    ] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(host, from, to) != *want {
            assert!(
                Instant::now() < deadline,
                "{from} never got {to}'s answer through the NAT: {:?}\n{}",
                fleet.meshes(),
                fleet.agent_logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    // Host 1 learnt n2's endpoint from n2's handshakes: the router's outside address.
    let iface = agent_proto::mesh::mesh_interface(&fleet.cp, "n1");
    let endpoints = sh(&format!("ip netns exec {} wg show {iface} endpoints", fleet.h1.netns));
    assert!(endpoints.contains("10.77.0.254:"), "{endpoints}");
    // The path stays open with nothing to send: the router forgets a UDP flow after 30 s
    // without a packet (a common NAT's figure, set in its namespace), and nothing crosses the
    // mesh for 40 s but keepalives (every 25 s). Without them the router would have dropped
    // n2's mapping and host 1's call with it. (Seen while writing this: with a router that
    // forgets after 10 s, host 1 reaches host 2 only when n2's next keepalive happens to get
    // the same outside port back: such NATs are not supported, docs/agent.md.)
    std::thread::sleep(Duration::from_secs(40));
    assert_eq!(get(&fleet.h1, &n1_name, &n2_ip), n2_id, "{:?}", fleet.meshes());
}

/// A drift repair takes its turn with applies: it read the applied generation, an apply of
/// the next one ran meanwhile, and the repair applied the older one again over it (the node
/// stayed on its peer's old key until a key rotation timed out). While an apply holds the
/// turn, a repair waits, and reads what is applied once it has it.
#[test]
fn a_mesh_repair_waits_for_an_apply_under_way() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh = std::sync::Arc::new(Mesh {
        control_plane: cp(),
        node: "n1".into(),
        state_dir: dir.path().to_path_buf(),
        nft: "nft".into(),
        routes: tokio::sync::Mutex::new(()),
        applying: tokio::sync::Mutex::new(()),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let apply_turn = mesh.applying.lock().await;
        let m = std::sync::Arc::clone(&mesh);
        let repair = tokio::spawn(async move { m.repair().await.is_none() });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !repair.is_finished(),
            "the repair went ahead while an apply held the turn"
        );
        drop(apply_turn);
        let nothing = tokio::time::timeout(Duration::from_secs(5), repair)
            .await
            .expect("the repair ends once the turn is free")
            .expect("joined");
        assert!(nothing, "nothing applied: nothing to repair");
    });
}
