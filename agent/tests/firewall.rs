//! The firewall executor, proved with packets inside network namespaces this test makes (veth
//! pairs, a bridge, no route out of the machine): a simulated node forwards between an
//! environment's two containers, another environment, and an "outside" namespace that holds
//! the test's public (203.0.113.10), metadata (169.254.169.254) and private (10.99.0.10)
//! hosts. Once the node applies the environment's table: inside the environment, public
//! egress and ingress from the node pass; the host, the other environment, metadata and the
//! private range do not, nor does ingress from outside. The machine's own rules are unchanged
//! before and after; a stale generation, a foreign table and a deleted rule are handled.

use pushleft_agent::firewall::{Firewall, Reachable};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const NAMESPACES: [&str; 5] = ["plfw-node", "plfw-a", "plfw-a2", "plfw-b", "plfw-out"];

fn sh(cmd: &str) {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
}

fn host_ruleset() -> String {
    let o = Command::new("nft").args(["list", "ruleset"]).output().expect("nft");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The namespaces and their servers; all removed when dropped.
struct Lab {
    servers: Vec<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        for ns in NAMESPACES {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn lab(www: &Path) -> Lab {
    for ns in NAMESPACES {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
        sh(&format!("ip netns add {ns} && ip -n {ns} link set lo up"));
    }
    sh("ip netns exec plfw-node sysctl -qw net.ipv4.ip_forward=1");
    // Environment A: a bridge on the node with two containers.
    sh(
        "ip -n plfw-node link add br-a type bridge && ip -n plfw-node addr add 10.208.1.1/24 dev br-a && ip -n plfw-node link set br-a up",
    );
    for (ns, veth, addr) in [("plfw-a", "va1", "10.208.1.2"), ("plfw-a2", "va2", "10.208.1.3")] {
        sh(&format!(
            "ip -n plfw-node link add {veth} type veth peer name eth0 netns {ns} && ip -n plfw-node link set {veth} master br-a up \
             && ip -n {ns} addr add {addr}/24 dev eth0 && ip -n {ns} link set eth0 up && ip -n {ns} route add default via 10.208.1.1"
        ));
    }
    // Environment B.
    sh(
        "ip -n plfw-node link add vb type veth peer name eth0 netns plfw-b && ip -n plfw-node addr add 10.208.2.1/24 dev vb && ip -n plfw-node link set vb up \
        && ip -n plfw-b addr add 10.208.2.2/24 dev eth0 && ip -n plfw-b link set eth0 up && ip -n plfw-b route add default via 10.208.2.1",
    );
    // The outside: a public host, the metadata address and a private host, all test-made.
    sh(
        "ip -n plfw-node link add vo type veth peer name eth0 netns plfw-out && ip -n plfw-node addr add 203.0.113.1/24 dev vo && ip -n plfw-node link set vo up \
        && ip -n plfw-out addr add 203.0.113.10/24 dev eth0 && ip -n plfw-out link set eth0 up \
        && ip -n plfw-out addr add 169.254.169.254/32 dev lo && ip -n plfw-out addr add 10.99.0.10/32 dev lo \
        && ip -n plfw-out route add default via 203.0.113.1 \
        && ip -n plfw-node route add 169.254.169.254/32 via 203.0.113.10 && ip -n plfw-node route add 10.99.0.10/32 via 203.0.113.10",
    );
    let servers = ["plfw-out", "plfw-b", "plfw-node", "plfw-a", "plfw-a2"]
        .iter()
        .map(|ns| (*ns, "8080"))
        // The node also serves HTTP on TCP 53 (where the agent's name server listens).
        .chain([("plfw-node", "53")])
        .map(|(ns, port)| {
            Command::new("ip")
                .args(["netns", "exec", ns, "busybox", "httpd", "-f", "-p", port, "-h"])
                .arg(www)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("httpd")
        })
        .collect();
    // UDP echo on the node, at every address, on port 53 (where service names are asked) and
    // another port: bounded to the test's life by the lab's kill.
    let mut servers: Vec<_> = servers;
    for port in ["53", "5353"] {
        servers.push(
            Command::new("ip")
                .args(["netns", "exec", "plfw-node", "python3", "-c"])
                .arg(format!(
                    "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('0.0.0.0', {port}))\nfor _ in range(1000):\n    d, a = s.recvfrom(512)\n    s.sendto(d, a)\n"
                ))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("udp echo"),
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    Lab { servers }
}

/// One UDP datagram from namespace `from` to `to`:`port` (2 s at most): whether it came back.
fn echoes(from: &str, to: &str, port: u16) -> bool {
    Command::new("ip")
        .args(["netns", "exec", from, "python3", "-c"])
        .arg(format!(
            "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.settimeout(2)\ns.sendto(b'ping', ('{to}', {port}))\ntry:\n    sys.exit(0 if s.recvfrom(64)[0] == b'ping' else 1)\nexcept OSError:\n    sys.exit(1)\n"
        ))
        .status()
        .is_ok_and(|s| s.success())
}

/// One bounded HTTP request from namespace `from` (busybox nc, 2 s at most): whether it was
/// answered.
fn reaches(from: &str, to: &str) -> bool {
    reaches_port(from, to, 8080)
}

/// [`reaches`] at `port`.
fn reaches_port(from: &str, to: &str, port: u16) -> bool {
    use std::io::Write;
    let Ok(mut child) = Command::new("ip")
        .args(["netns", "exec", from, "busybox", "nc", "-w", "2", to, &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"GET / HTTP/1.0\r\n\r\n");
    }
    child
        .wait_with_output()
        .is_ok_and(|o| o.stdout.starts_with(b"HTTP/1.1 200"))
}

#[test]
fn an_environments_table_allows_and_denies_what_it_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("index.html"), "ok\n").expect("index");
    let nft = dir.path().join("nft-in-node");
    std::fs::write(&nft, "#!/bin/sh\nexec ip netns exec plfw-node nft \"$@\"\n").expect("wrapper");
    sh(&format!("chmod 0755 {}", nft.display()));
    let before = host_ruleset();
    let _lab = lab(&www);
    let fw = Firewall {
        control_plane: "0123abcd".into(),
        node: "n1".into(),
        nft: nft.clone(),
        state_dir: dir.path().join("state"),
    };
    let matrix = || {
        [
            ("inside the environment", reaches("plfw-a", "10.208.1.3")),
            ("public egress", reaches("plfw-a", "203.0.113.10")),
            ("ingress from the node", reaches("plfw-node", "10.208.1.2")),
            ("the host", reaches("plfw-a", "10.208.1.1")),
            ("another environment", reaches("plfw-a", "10.208.2.2")),
            ("metadata", reaches("plfw-a", "169.254.169.254")),
            ("a private range", reaches("plfw-a", "10.99.0.10")),
            ("ingress from outside", reaches("plfw-out", "10.208.1.2")),
            ("names on its gateway", echoes("plfw-a", "10.208.1.1", 53)),
            (
                "names on its gateway over TCP",
                reaches_port("plfw-a", "10.208.1.1", 53),
            ),
            ("another port of its gateway", echoes("plfw-a", "10.208.1.1", 5353)),
            ("names on another gateway", echoes("plfw-a", "10.208.2.1", 53)),
        ]
    };
    // Without the table everything passes: the denials below are the table's doing.
    assert!(matrix().iter().all(|(_, ok)| *ok), "{:?}", matrix());

    // The other container of the environment serves 8080, which it declared.
    let a2: std::net::Ipv4Addr = "10.208.1.3".parse().expect("addr");
    let reach = Reachable {
        ports: [(a2, 8080)].into(),
        open: Default::default(),
    };
    let by_env = std::collections::HashMap::from([("env-a".to_owned(), reach.clone())]);
    let note = fw.apply("env-a", "10.208.1.0/24", 3, &reach).expect("apply");
    assert!(note.contains("read back"), "{note}");
    assert_eq!(
        matrix(),
        [
            ("inside the environment", true),
            ("public egress", true),
            ("ingress from the node", true),
            ("the host", false),
            ("another environment", false),
            ("metadata", false),
            ("a private range", false),
            ("ingress from outside", false),
            ("names on its gateway", true),
            ("names on its gateway over TCP", true),
            ("another port of its gateway", false),
            ("names on another gateway", false),
        ]
    );
    // Only declared ports inside the environment: the sets change without a new table.
    let port_of_a2 = |port: u16| {
        fw.set_reachable(
            "env-a",
            &Reachable {
                ports: [(a2, port)].into(),
                open: Default::default(),
            },
        )
        .expect("sets");
        reaches("plfw-a", "10.208.1.3")
    };
    assert!(!port_of_a2(9090), "8080 is not declared: refused");
    assert!(port_of_a2(8080));
    fw.set_reachable("env-a", &Reachable::default()).expect("none");
    assert!(!reaches("plfw-a", "10.208.1.3"), "nothing declared: nothing reachable");
    fw.set_reachable(
        "env-a",
        &Reachable {
            ports: Default::default(),
            open: [a2].into(),
        },
    )
    .expect("open");
    assert!(
        reaches("plfw-a", "10.208.1.3"),
        "a container without a ports label: every port"
    );
    assert!(
        fw.matches("env-a", "10.208.1.0/24").expect("read"),
        "elements are not drift"
    );
    fw.set_reachable("env-a", &reach).expect("back");
    assert!(reaches("plfw-a", "10.208.1.3"));
    // Idempotent; an older generation is refused and changes nothing.
    fw.apply("env-a", "10.208.1.0/24", 3, &reach).expect("again");
    assert_eq!(
        fw.apply("env-a", "10.208.1.0/24", 2, &reach).expect_err("stale").code,
        "stale-generation"
    );
    // A rule deleted by hand is drift; applying again repairs it.
    sh(&format!(
        "{} -a list chain inet pl_0123abcd_env-a_n1 forward | grep 169.254 | sed 's/.*handle //' | xargs -I{{}} {} delete rule inet pl_0123abcd_env-a_n1 forward handle {{}}",
        nft.display(),
        nft.display()
    ));
    assert!(!fw.matches("env-a", "10.208.1.0/24").expect("read"));
    assert!(
        reaches("plfw-a", "169.254.169.254"),
        "the deleted rule no longer denies"
    );
    let repaired = fw.repair(&by_env);
    assert_eq!(repaired.len(), 1, "{repaired:?}");
    assert_eq!(repaired[0].0, "env-a");
    assert!(fw.matches("env-a", "10.208.1.0/24").expect("read"));
    assert!(!reaches("plfw-a", "169.254.169.254"));
    assert!(fw.repair(&by_env).is_empty(), "nothing left to repair");
    fw.apply("env-a", "10.208.1.0/24", 3, &reach)
        .expect("applying again is idempotent");

    // A table with our name that is not ours is refused and left alone.
    sh(&format!("{} add table inet pl_0123abcd_env-x_n1", nft.display()));
    assert_eq!(
        fw.apply("env-x", "10.208.9.0/24", 1, &reach).expect_err("foreign").code,
        "foreign-table"
    );
    assert_eq!(fw.remove("env-x", 2).expect_err("foreign").code, "foreign-table");
    sh(&format!("{} list table inet pl_0123abcd_env-x_n1", nft.display()));

    // Removed: everything passes again, and the old generation cannot come back.
    assert!(fw.remove("env-a", 4).expect("remove").contains("removed"));
    assert!(fw.remove("env-a", 4).expect("again").contains("already gone"));
    assert!(reaches("plfw-a", "169.254.169.254"));
    assert_eq!(
        fw.apply("env-a", "10.208.1.0/24", 3, &reach).expect_err("fenced").code,
        "stale-generation"
    );

    // The machine's own rules never changed.
    assert_eq!(host_ruleset(), before);
}
