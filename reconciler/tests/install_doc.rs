//! docs/install.md, run: every `sh` block of the page, in order, as root in `/root` of the host
//! it names, on three fresh Debian roots (`support/debian.rs`) with this build's packages:
//! `control` in a network namespace of its own, `node-1` and `node-2` each a simulated host
//! (`agent/tests/support/host.rs`: a namespace with a dockerd of its own, its socket at the
//! root's `/run/docker.sock`). A bridge in the control host's namespace joins the three on
//! 192.0.2.0/24 (documentation addresses, no route out); `/etc/hosts` names the control host.
//! The image (`IMAGE`) is a static busybox pushed to a registry on each node's loopback, the
//! same digest on both. `systemctl enable --now` is played by the test (no systemd runs
//! here). At the end both nodes are heard from and the release's two replicas run.

#[path = "support/debian.rs"]
mod debian;
#[path = "../../agent/tests/support/host.rs"]
mod host_support;

use debian::{Kill, Root, ok, package, workspace};
use host_support::Host;
use std::path::Path;
use std::process::Command;

/// One `sh` block: the host it runs on, the files it first copies from the control host, and
/// its text.
struct Block {
    on: String,
    from_control: Vec<String>,
    script: String,
}

/// The page's `sh` blocks, in order. Every shell block must say where it runs: a block the
/// test would skip is refused.
fn blocks(page: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else { continue };
        if info.is_empty() {
            // A fence that closes, or an untyped block: skip to its end.
            for l in lines.by_ref() {
                if l.starts_with("```") {
                    break;
                }
            }
            continue;
        }
        let mut words = info.split_whitespace();
        let lang = words.next().unwrap_or_default();
        let on = words.find_map(|w| w.strip_prefix("on=")).map(str::to_owned);
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        if !["sh", "bash", "shell", "console"].contains(&lang) {
            continue;
        }
        let on = on.unwrap_or_else(|| panic!("a shell block without on=HOST: {body:?}"));
        let from_control = body
            .iter()
            .find_map(|l| l.strip_prefix("# from control:"))
            .map(|files| files.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        out.push(Block {
            on,
            from_control,
            script: body.join("\n"),
        });
    }
    out
}

/// A network namespace with a bridge (the control host's, and the segment the nodes join).
struct Segment(String);

impl Segment {
    fn new(name: &str) -> Segment {
        let _ = Command::new("ip")
            .args(["netns", "del", name])
            .stderr(std::process::Stdio::null())
            .status();
        for cmd in [
            format!("ip netns add {name}"),
            format!("ip -n {name} link set lo up"),
            format!("ip -n {name} link add br0 type bridge"),
            format!("ip -n {name} addr add 192.0.2.10/24 dev br0"),
            format!("ip -n {name} link set br0 up"),
        ] {
            let o = Command::new("sh").args(["-c", &cmd]).output().expect("ip");
            ok(&o, &cmd);
        }
        Segment(name.to_owned())
    }

    /// Joins `netns` to the segment at `address` (its link `eth0`).
    fn join(&self, netns: &str, link: &str, address: &str) {
        let s = &self.0;
        for cmd in [
            format!("ip -n {s} link add {link} type veth peer name eth0 netns {netns}"),
            format!("ip -n {s} link set {link} master br0 up"),
            format!("ip -n {netns} addr add {address}/24 dev eth0"),
            format!("ip -n {netns} link set eth0 up"),
        ] {
            let o = Command::new("sh").args(["-c", &cmd]).output().expect("ip");
            ok(&o, &cmd);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Stops the units the page started on each root (before the roots are removed).
struct Units<'a>(Vec<&'a Root>);
impl Drop for Units<'_> {
    fn drop(&mut self) {
        for r in &self.0 {
            r.stop_units();
        }
    }
}

#[test]
fn the_install_page_runs_as_written_on_three_hosts() {
    let page = std::fs::read_to_string(workspace().join("docs/install.md")).expect("docs/install.md");
    let blocks = blocks(&page);
    assert!(blocks.len() >= 6, "the page's blocks: {}", blocks.len());
    let scratch = tempfile::tempdir().expect("tempdir");
    let debs = package(&scratch.path().join("debs"), "0.1.0-1");
    let pid = std::process::id();

    // The hosts and their network.
    let segment = Segment::new(&format!("plctl-{pid}"));
    let node_hosts: Vec<Host> = (1..=2)
        .map(|n| Host::start(&format!("plnode{n}-{pid}"), Path::new(&format!("/tmp/pln{n}-{pid}"))))
        .collect();
    for (n, h) in node_hosts.iter().enumerate() {
        segment.join(&h.netns, &format!("vnode{}", n + 1), &format!("192.0.2.1{}", n + 1));
    }
    // The application's image: built once, the same bytes pushed to each node's registry.
    let mut registries = Kill(Vec::new());
    let (r1, port) = node_hosts[0].registry();
    registries.0.push(r1);
    let image = node_hosts[0].image(port, "hello", &[("/www/index.html", "hello\n")]);
    let saved = scratch.path().join("hello.tar");
    node_hosts[0].docker(&["pull", &image]);
    node_hosts[0].docker(&["save", "-o", &saved.to_string_lossy(), &image]);
    let (r2, port2) = node_hosts[1].registry();
    assert_eq!(port, port2, "one reference for both nodes");
    registries.0.push(r2);
    let loaded = node_hosts[1].docker(&["load", "-q", "-i", &saved.to_string_lossy()]);
    let id = loaded.rsplit(' ').next().expect("loaded image id").to_owned();
    let tag = format!("127.0.0.1:{port}/pl-host/hello:latest");
    node_hosts[1].docker(&["tag", &id, &tag]);
    node_hosts[1].docker(&["push", &tag]);
    let digest = node_hosts[1].docker(&["inspect", "--format", "{{index .RepoDigests 0}}", &tag]);
    assert_eq!(digest, image, "the same image by digest on both nodes");
    node_hosts[1].docker(&["rmi", "-f", &tag]);

    // The roots: packages in /root, the control host's name in /etc/hosts, systemd played.
    let control = Root::new("install-control", Some(&segment.0));
    let nodes: Vec<Root> = node_hosts
        .iter()
        .enumerate()
        .map(|(n, h)| {
            let mut r = Root::new(&format!("install-node-{}", n + 1), Some(&h.netns));
            r.bind(&h.socket, "/run/docker.sock");
            // wireguard-go's device (no kernel WireGuard on this machine).
            std::fs::create_dir_all(r.path("/dev/net")).expect("mkdir");
            let o = Command::new("mknod")
                .arg(r.path("/dev/net/tun"))
                .args(["c", "10", "200"])
                .output()
                .expect("mknod");
            ok(&o, "mknod /dev/net/tun");
            r
        })
        .collect();
    let hosts_file = |me: &str| format!("127.0.0.1\tlocalhost {me}\n192.0.2.10\tcontrol.example.internal\n");
    std::fs::write(
        control.path("/etc/hosts"),
        "127.0.0.1\tlocalhost control.example.internal\n",
    )
    .expect("hosts");
    for (n, r) in nodes.iter().enumerate() {
        std::fs::write(r.path("/etc/hosts"), hosts_file(&format!("node-{}", n + 1))).expect("hosts");
    }
    for r in std::iter::once(&control).chain(nodes.iter()) {
        r.play_systemd();
        for d in &debs {
            std::fs::copy(d, r.path("/root").join(d.file_name().expect("name"))).expect("copy");
        }
    }
    let units = Units(std::iter::once(&control).chain(nodes.iter()).collect());

    // The page, block by block.
    let mut last = String::new();
    for (i, b) in blocks.iter().enumerate() {
        let root = match b.on.as_str() {
            "control" => &control,
            "node-1" => &nodes[0],
            "node-2" => &nodes[1],
            other => panic!("block {i}: no host {other}"),
        };
        for f in &b.from_control {
            std::fs::copy(control.path("/root").join(f), root.path("/root").join(f))
                .unwrap_or_else(|e| panic!("block {i}: copying {f} from control: {e}"));
        }
        let o = root
            .command(&["/bin/sh", "-euc", &format!("cd /root\n{}", b.script)])
            .env("IMAGE", &image)
            .output()
            .expect("sh");
        let logs = |r: &Root| {
            ["pl-reconciler", "pl-agent"]
                .iter()
                .map(|u| std::fs::read_to_string(r.path(&format!("/var/log/{u}.log"))).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert!(
            o.status.success(),
            "block {i} on {} failed:\n{}\n--- stdout\n{}\n--- stderr\n{}\n--- logs\n{}",
            b.on,
            b.script,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            logs(root)
        );
        last = String::from_utf8_lossy(&o.stdout).into_owned();
    }

    // The last block listed the nodes and the status: both heard from, and the release's two
    // replicas run on the nodes' engines (wherever placement put them).
    assert!(last.contains("node-1") && last.contains("node-2"), "{last}");
    // `pl status` counts the nodes enrolled a moment ago (read now, not `/metrics`' reading).
    assert!(last.contains("of 2 nodes enrolled"), "{last}");
    let running: Vec<String> = node_hosts
        .iter()
        .flat_map(|h| {
            h.docker(&["ps", "--format", "{{.Image}} {{.Status}}"])
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(running.len(), 2, "the two replicas: {running:?}");
    let repository = image.split('@').next().unwrap_or_default();
    assert!(
        running.iter().all(|r| r.starts_with(repository) && r.contains(" Up ")),
        "{running:?}"
    );
    drop(units);
    drop(nodes);
    drop(control);
    drop(registries);
}
