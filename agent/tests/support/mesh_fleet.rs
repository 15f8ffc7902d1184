//! The whole mesh loop on one machine, for its test and its bench: two simulated hosts
//! (network namespaces, a dockerd each) joined only by a veth "LAN" (10.77.0.0/24, IPv6 off,
//! no route out), a control plane in host 1 whose agent API listens on every address of host 1
//! (host 2's agent reaches it through a relay on its own loopback, under the name its
//! certificate carries), and an agent on each host. Host 2's mesh address comes from Git
//! (`nodes[].address`); host 1's agent says its own. One image, pushed to host 1's registry and
//! served from a copy of its storage by host 2's, so both pull the same digest from their own
//! loopback. Everything is ended and removed when the fleet is dropped.
//!
//! `start_behind_nat` puts host 2 behind a third namespace, a router that masquerades it
//! onto the LAN and lets nothing in that host 2 did not start: host 2 has no address on the
//! LAN, Git declares none for n2, and its agent says none.
#![allow(dead_code)]

use crate::daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use crate::host::Host;
use crate::repo_support::{POOL, Repo};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Two hosts, their agents and the control plane.
pub struct Fleet {
    /// The agents and registries (ended first).
    pub procs: crate::support::KillGroups,
    daemon: Option<Daemon>,
    pub h1: Host,
    pub h2: Host,
    pub url: String,
    pub repo: Repo,
    /// The repository, ledger and agents' folders.
    _dir: tempfile::TempDir,
    pub logs: [PathBuf; 2],
    /// The control plane's id (mesh interfaces are named after it).
    pub cp: String,
    /// The app image on both hosts' registries.
    pub image: String,
    /// The pool as committed (n2's address declared).
    pub pool: String,
    pub viewer: String,
    pub operator: String,
    /// The operator API's port (in host 1).
    pub api: u16,
    base: PathBuf,
    /// The router namespace between host 2 and the LAN, when host 2 is behind NAT.
    pub router: Option<String>,
}

fn sh(cmd: &str) {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
}

impl Fleet {
    /// Starts it: `tag` names its namespaces and links (at most 4 characters), the agents
    /// heartbeat every `heartbeat_seconds`. Returns once both agents sent their keys.
    pub fn start(tag: &str, heartbeat_seconds: u64) -> Fleet {
        Self::start_with(tag, heartbeat_seconds, false)
    }

    /// As `start`, with host 2 behind a masquerading router (10.78.0.0/24 inside, the
    /// router's 10.77.0.254 on the LAN): nothing on the LAN can open a path to host 2.
    pub fn start_behind_nat(tag: &str, heartbeat_seconds: u64) -> Fleet {
        Self::start_with(tag, heartbeat_seconds, true)
    }

    fn start_with(tag: &str, heartbeat_seconds: u64, nat: bool) -> Fleet {
        let pid = std::process::id();
        let base = PathBuf::from(format!("/tmp/plmesh-{tag}-{pid}"));
        let h1 = Host::start(&format!("pl{tag}-1-{pid}"), &base.join("h1"));
        let h2 = Host::start(&format!("pl{tag}-2-{pid}"), &base.join("h2"));
        let router = nat.then(|| format!("pl{tag}-r-{pid}"));
        match &router {
            None => sh(&format!(
                "ip link add pl{tag}-l1 netns {0} type veth peer name pl{tag}-l2 netns {1} \
                 && ip netns exec {0} sysctl -qw net.ipv6.conf.pl{tag}-l1.disable_ipv6=1 \
                 && ip netns exec {1} sysctl -qw net.ipv6.conf.pl{tag}-l2.disable_ipv6=1 \
                 && ip -n {0} addr add 10.77.0.1/24 dev pl{tag}-l1 && ip -n {0} link set pl{tag}-l1 up \
                 && ip -n {1} addr add 10.77.0.2/24 dev pl{tag}-l2 && ip -n {1} link set pl{tag}-l2 up",
                h1.netns, h2.netns
            )),
            // The router forwards what host 2 starts (masqueraded as 10.77.0.254) and its
            // answers, and drops every other forward: a home or cloud NAT. Host 2 routes only
            // the LAN through it; the router has no route beyond its two links.
            Some(r) => sh(&format!(
                "ip netns del {r} 2>/dev/null; ip netns add {r} && ip -n {r} link set lo up \
                 && ip link add pl{tag}-l1 netns {0} type veth peer name pl{tag}-r1 netns {r} \
                 && ip link add pl{tag}-l2 netns {1} type veth peer name pl{tag}-r2 netns {r} \
                 && ip netns exec {0} sysctl -qw net.ipv6.conf.pl{tag}-l1.disable_ipv6=1 \
                 && ip netns exec {1} sysctl -qw net.ipv6.conf.pl{tag}-l2.disable_ipv6=1 \
                 && ip netns exec {r} sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
                 && ip netns exec {r} sysctl -qw net.ipv4.ip_forward=1 \
                 && ip -n {0} addr add 10.77.0.1/24 dev pl{tag}-l1 && ip -n {0} link set pl{tag}-l1 up \
                 && ip -n {r} addr add 10.77.0.254/24 dev pl{tag}-r1 && ip -n {r} link set pl{tag}-r1 up \
                 && ip -n {r} addr add 10.78.0.1/24 dev pl{tag}-r2 && ip -n {r} link set pl{tag}-r2 up \
                 && ip -n {1} addr add 10.78.0.2/24 dev pl{tag}-l2 && ip -n {1} link set pl{tag}-l2 up \
                 && ip -n {1} route add 10.77.0.0/24 via 10.78.0.1 \
                 && printf '%s\n' 'table ip nat {{' \
                   '  chain post {{ type nat hook postrouting priority srcnat; oifname \"pl{tag}-r1\" masquerade; }}' \
                   '}}' 'table ip filter {{' \
                   '  chain forward {{ type filter hook forward priority filter; policy drop;' \
                   '    ct state established,related accept; iifname \"pl{tag}-r2\" oifname \"pl{tag}-r1\" accept; }}' \
                   '}}' | ip netns exec {r} nft -f - \
                 && ip netns exec {r} sysctl -qw net.netfilter.nf_conntrack_udp_timeout=30 \
                 && ip netns exec {r} sysctl -qw net.netfilter.nf_conntrack_udp_timeout_stream=30",
                h1.netns, h2.netns
            )),
        }
        let (r1, port) = h1.registry();
        let image = h1.image(port, "app", &[("/www/index.html", "app\n")]);
        sh(&format!(
            "cp -a {} {}",
            h1.dir.join("registry").display(),
            h2.dir.join("registry").display()
        ));
        let (r2, _) = h2.registry();
        let mut procs = crate::support::KillGroups(vec![r1, r2]);

        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repo::new(dir.path());
        std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
        assert!(POOL.contains("n1") && POOL.contains("n2"));
        // The pool alone first: nodes enrol once a commit declaring them is accepted.
        let pool = if nat {
            POOL.to_owned()
        } else {
            POOL.replace("{name: n2, capacity", "{name: n2, address: 10.77.0.2, capacity")
        };
        repo.write("pools/main.yaml", &pool);
        repo.commit("the pool", true);
        let s = setup(dir.path());
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let (api, agent_api) = (free_port(), free_port());
        let cfg = config(
            &s,
            "d",
            &repo.dir,
            &url,
            api,
            &format!("{CONTROL_CA}age_identity = \"control.age\"\n\n[agent_api]\nlisten = \"0.0.0.0:{agent_api}\"\n"),
        );
        crate::support::age_keygen(&s.dir.join("control.age"));
        let root = dir.path().to_owned();
        let (operator, viewer) = (s.operator.clone(), s.viewer.clone());
        let op = operator.clone();
        let daemon = h1.run(move || {
            let mut d = Daemon::start(&s, &cfg, api);
            d.wait_ready(Duration::from_secs(20));
            let ca = std::fs::read_to_string(root.join("tls/ca.crt")).expect("ca");
            for node in ["n1", "n2"] {
                let token = d.enrolment_token(node, &op);
                pushleft_agent::enroll::enroll(
                    &format!("https://localhost:{api}"),
                    &crate::support::ca_pin(&ca),
                    node,
                    &root.join(node),
                    &token,
                )
                .expect("enrol");
            }
            d
        });
        let agent_config = |node: &str, host: &Host, lan: Option<&str>| {
            let path = dir.path().join(format!("{node}.toml"));
            std::fs::write(
                &path,
                format!(
                    "control = \"https://localhost:{agent_api}\"\ndir = \"{node}\"\ndocker_socket = {:?}\nsecrets_dir = \"secrets-{node}\"\nstate_dir = \"state-{node}\"\nheartbeat_seconds = {heartbeat_seconds}\ndrift_seconds = 1\nexecutors = [\"docker\", \"nftables\", \"routes\"]\n{}",
                    host.socket.display().to_string(),
                    lan.map(|a| format!("mesh_address = \"{a}\"\n")).unwrap_or_default()
                ),
            )
            .expect("agent config");
            path
        };
        let (c1, c2) = (
            agent_config("n1", &h1, Some("10.77.0.1")),
            agent_config("n2", &h2, None),
        );
        let logs = [dir.path().join("n1.log"), dir.path().join("n2.log")];
        let bin = env!("CARGO_BIN_EXE_pl-agent");
        let l1 = logs[0].clone();
        procs.0.push(h1.run(move || crate::support::spawn_agent(bin, &c1, &l1)));
        let l2 = logs[1].clone();
        procs.0.push(h2.run(move || {
            relay(agent_api, format!("10.77.0.1:{agent_api}").parse().expect("addr"));
            crate::support::spawn_agent(bin, &c2, &l2)
        }));
        let mut fleet = Fleet {
            procs,
            daemon: Some(daemon),
            h1,
            h2,
            url,
            repo,
            _dir: dir,
            logs,
            cp: String::new(),
            image,
            pool,
            viewer,
            operator,
            api,
            base,
            router,
        };
        // Both agents heartbeat (and sent their keys) before anything is placed.
        let deadline = Instant::now() + Duration::from_secs(30);
        while crate::support::sql(
            &fleet.url,
            "SELECT name FROM nodes WHERE mesh_key IS NOT NULL AND last_seen IS NOT NULL",
        )
        .len()
            < 2
        {
            assert!(
                Instant::now() < deadline,
                "agents never said their keys:\n{}",
                fleet.agent_logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        fleet.cp = crate::support::control_plane(&fleet.url);
        fleet
    }

    /// Both agents' logs, for a failure's message.
    pub fn agent_logs(&self) -> String {
        self.logs
            .iter()
            .map(|l| std::fs::read_to_string(l).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Each node's mesh as the ledger holds it, for a failure's message.
    pub fn meshes(&self) -> Vec<String> {
        crate::support::sql(
            &self.url,
            "SELECT node || ' g' || CAST(generation AS TEXT) || ' applied ' || CAST(applied AS TEXT) || ' ' || spec || ' ' || links FROM node_meshes",
        )
    }

    /// A GET of the control plane's API, from inside host 1.
    pub fn get(&mut self, path: &str, token: &str) -> (u16, String) {
        let d = self.daemon.take().expect("daemon");
        let (path, token) = (path.to_owned(), token.to_owned());
        let (d, answer) = self.h1.run(move || {
            let answer = d.get(&path, Some(&token));
            (d, answer)
        });
        self.daemon = Some(d);
        answer
    }

    /// A POST of the control plane's API with `token`, from inside host 1.
    pub fn post(&mut self, path: &str, token: &str) -> (u16, String) {
        let d = self.daemon.take().expect("daemon");
        let (path, auth) = (path.to_owned(), format!("Bearer {token}"));
        let (d, answer) = self.h1.run(move || {
            let answer = d.post(&path, &[("authorization", auth.as_str())], b"");
            (d, answer)
        });
        self.daemon = Some(d);
        answer
    }

    /// `pl` with `args`, run inside host 1 against the control plane as the operator.
    pub fn pl(&self, args: &[&str]) -> std::process::Output {
        let pl = crate::support::pl_binary();
        Command::new("ip")
            .args(["netns", "exec", &self.h1.netns])
            .arg(&pl)
            .args(args)
            .arg("--server")
            .arg(format!("https://localhost:{}", self.api))
            .arg("--ca-cert")
            .arg(self._dir.path().join("tls/ca.crt"))
            .env("PL_TOKEN", &self.operator)
            .output()
            .expect("pl")
    }

    /// Where the fleet's repository, ledger and agents' folders are.
    pub fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// A worker role `app` of `replicas` replicas, each serving its container's hostname over
    /// HTTP on 8080, committed (signed).
    pub fn commit_app(&self, replicas: u32, message: &str) {
        self.commit_roles(&[("app", replicas)], message);
    }

    /// Worker roles of project `app`, (name, replicas) each, every replica serving its
    /// container's hostname over HTTP on 8080, committed (signed).
    pub fn commit_roles(&self, roles: &[(&str, u32)], message: &str) {
        let roles: String = roles
            .iter()
            .map(|(name, replicas)| {
                format!(
                    "    {name}:\n      kind: worker\n      replicas: {replicas}\n      ports: [8080]\n      command: [/bin/busybox, sh, -c, 'mkdir -p /tmp/www && /bin/busybox hostname > /tmp/www/index.html && exec /bin/busybox httpd -f -p 8080 -h /tmp/www']\n"
                )
            })
            .collect();
        self.repo.write(
            "projects/app.yaml",
            &format!(
                "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: app}}\nspec:\n  image: {}\n  roles:\n{roles}",
                self.image
            ),
        );
        self.repo.write(
            "envs/app-production.yaml",
            &crate::repo_support::environment("app-production", "app"),
        );
        self.repo.commit(message, true);
    }

    /// Waits (at most `within`) until the environment's deployment is done.
    pub fn wait_done(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while crate::support::sql(&self.url, "SELECT status FROM deployments")
            .first()
            .map(String::as_str)
            != Some("done")
        {
            assert!(
                Instant::now() < deadline,
                "not done: {:?}\n{}",
                crate::support::sql(&self.url, "SELECT key || ' ' || state FROM jobs ORDER BY id"),
                self.agent_logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The replicas of `app` on `host`: (container name, address, hostname).
    pub fn replicas(host: &Host) -> Vec<(String, String, String)> {
        Self::replicas_of(host, "app")
    }

    /// The replicas of `role` on `host`: (container name, address, hostname).
    pub fn replicas_of(host: &Host, role: &str) -> Vec<(String, String, String)> {
        host.docker(&[
            "ps",
            "--format",
            "{{.Names}}",
            "--filter",
            &format!("label=dev.pushleft.role={role}"),
        ])
        .lines()
        .filter(|l| !l.is_empty())
        .map(|name| {
            let ip = host.docker(&[
                "inspect",
                "--format",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                name,
            ]);
            let id = host.docker(&["inspect", "--format", "{{.Config.Hostname}}", name]);
            (name.to_owned(), ip, id)
        })
        .collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.procs.0.drain(..).for_each(|mut c| {
            let _ = c.kill();
            let _ = c.wait();
        });
        drop(self.daemon.take());
        for iface in [
            agent_proto::mesh::mesh_interface(&self.cp, "n1"),
            agent_proto::mesh::mesh_interface(&self.cp, "n2"),
        ] {
            let _ = Command::new("pkill")
                .args(["-f", &format!("wireguard-go {iface}")])
                .status();
            let _ = std::fs::remove_file(format!("/var/run/wireguard/{iface}.sock"));
            for host in [&self.h1, &self.h2] {
                let _ = Command::new("ip")
                    .args(["-n", &host.netns, "link", "del", &iface])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.base);
        if let Some(r) = &self.router {
            let _ = Command::new("ip").args(["netns", "del", r]).status();
        }
    }
}

/// Relays `127.0.0.1:port` of the calling thread's namespace to `to`: a thread per
/// connection, for the process's life.
pub fn relay(port: u16, to: std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("relay bind");
    std::thread::spawn(move || {
        for inbound in listener.incoming().flatten() {
            let Ok(outbound) = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)) else {
                continue;
            };
            for (mut from, mut into) in [
                (
                    inbound.try_clone().expect("clone"),
                    outbound.try_clone().expect("clone"),
                ),
                (outbound, inbound),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut into);
                    let _ = into.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
}
