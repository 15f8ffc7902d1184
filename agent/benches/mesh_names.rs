//! Bench (a binary): from a replica's placement on a new node to its service name answering
//! with it from another node (the target: under 2 s), side by side with the same name
//! answering on the replica's own node (the floor: what running the replica costs, with no
//! mesh in the path).
//!
//! The whole loop of `tests/support/mesh_fleet.rs`: two simulated hosts joined by a veth LAN,
//! a control plane in host 1, an agent on each, heartbeats at their default 10 s (a mesh
//! reaches its node with the lease the node waits on). Each round scales role `app` from one
//! replica to two (the second placed on the other node, spread), takes the placement time from
//! the ledger (the new replica's first job), and from then on watches two things every 5 ms:
//! the ledger, for the new node's heartbeat naming the new replica (the floor: the replica
//! runs, passed its checks and its own node serves its name), and the other node's name
//! server, asked for `app` over UDP from inside the replica there (the server answers its
//! environment's containers only), for the new replica's address (the target). Then it scales
//! back to one and waits until the other node's server forgets it. The first round (an image
//! pull and a network) is not counted.
//!
//! `cargo bench -p pushleft-agent --bench mesh_names` (needs wireguard-go and wg, as the mesh
//! test does; `-- --rounds N`, default 5).

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../tests/support/host.rs"]
mod host;
#[path = "../tests/support/mesh_fleet.rs"]
mod mesh_fleet;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
#[path = "../tests/support/mod.rs"]
mod support;

use hickory_proto::op::Message;
use hickory_proto::rr::{Name, RData, RecordType};
use mesh_fleet::Fleet;
use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The addresses `server` (a name server on an environment's gateway) answers for `app`.
fn ask(server: Ipv4Addr) -> Vec<Ipv4Addr> {
    let Ok(socket) = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) else {
        return Vec::new();
    };
    let _ = socket.set_read_timeout(Some(Duration::from_millis(200)));
    let mut query = Message::query();
    query.add_query(hickory_proto::op::Query::query(
        Name::from_ascii("app.").expect("name"),
        RecordType::A,
    ));
    let Ok(bytes) = query.to_vec() else { return Vec::new() };
    if socket.send_to(&bytes, (server, 53)).is_err() {
        return Vec::new();
    }
    let mut buf = [0u8; 1500];
    let Ok(n) = socket.recv(&mut buf) else {
        return Vec::new();
    };
    let Ok(answer) = Message::from_vec(&buf[..n]) else {
        return Vec::new();
    };
    answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

/// From inside `container`'s network namespace (a replica on `host`: the server answers its
/// environment's own containers only), asks `server` every 5 ms (at most 60 s) until `done`
/// holds of its answer; returns when (Unix ms).
fn until(
    host: &host::Host,
    container: &str,
    server: Ipv4Addr,
    done: impl Fn(&[Ipv4Addr]) -> bool + Send + 'static,
) -> i64 {
    let pid = host.docker(&["inspect", "--format", "{{.State.Pid}}", container]);
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("the replica's netns");
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if done(&ask(server)) {
                return now_ms();
            }
            assert!(Instant::now() < deadline, "{server} never answered as wanted");
            std::thread::sleep(Duration::from_millis(5));
        }
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Polls the ledger every 5 ms (at most 60 s) until `node`'s own names (as its heartbeat
/// said them) hold an address inside `subnet_prefix`; returns when (Unix ms).
fn reported(fleet: &Fleet, node: &str, subnet_prefix: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let names = support::sql(
            &fleet.url,
            &format!("SELECT COALESCE(mesh_names, '') FROM nodes WHERE name = '{node}'"),
        );
        if names.first().is_some_and(|n| n.contains(subnet_prefix)) {
            return now_ms();
        }
        assert!(Instant::now() < deadline, "{node} never reported its new name");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The gateway of `node`'s subnet of the environment (where its name server listens).
fn gateway(fleet: &Fleet, node: &str) -> Ipv4Addr {
    let idx: u32 = support::sql(
        &fleet.url,
        &format!("SELECT CAST(idx AS TEXT) FROM subnets WHERE node = '{node}'"),
    )
    .first()
    .unwrap_or_else(|| panic!("no subnet on {node}"))
    .parse()
    .expect("idx");
    Ipv4Addr::new(10, (208 + idx / 256) as u8, (idx % 256) as u8, 1)
}

fn wait_done(fleet: &Fleet) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while support::sql(&fleet.url, "SELECT status FROM deployments")
        .first()
        .map(String::as_str)
        != Some("done")
    {
        assert!(Instant::now() < deadline, "not done:\n{}", fleet.agent_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let fleet = Fleet::start("mb", 10);
    fleet.commit_app(1, "one replica");
    wait_done(&fleet);
    let first = support::sql(&fleet.url, "SELECT node FROM subnets")
        .first()
        .unwrap_or_else(|| {
            panic!(
                "not placed: {:?}",
                support::sql(&fleet.url, "SELECT kind || ' ' || detail FROM events ORDER BY id")
            )
        })
        .clone();
    let (home, new) = if first == "n1" { ("n1", "n2") } else { ("n2", "n1") };
    let host = |n: &str| if n == "n1" { &fleet.h1 } else { &fleet.h2 };
    let mut local = Vec::new();
    let mut remote = Vec::new();
    let mut placing = Vec::new();
    for round in 0..=rounds {
        let last_job: i64 = support::sql(&fleet.url, "SELECT CAST(COALESCE(MAX(id), 0) AS TEXT) FROM jobs")[0]
            .parse()
            .expect("id");
        let committed = now_ms();
        fleet.commit_app(2, &format!("two replicas, round {round}"));
        // The new replica's node has a subnet once it is placed there (the first round).
        let deadline = Instant::now() + Duration::from_secs(60);
        let placed: i64 = loop {
            let row = support::sql(
                &fleet.url,
                &format!(
                    "SELECT COALESCE(CAST(MIN(created_at) AS TEXT), '') FROM jobs WHERE id > {last_job} AND target_node = '{new}'"
                ),
            );
            if let Some(t) = row.first().and_then(|t| t.parse().ok()) {
                break t;
            }
            assert!(Instant::now() < deadline, "never placed on {new}");
            std::thread::sleep(Duration::from_millis(2));
        };
        let (home_gw, new_gw) = (gateway(&fleet, home), gateway(&fleet, new));
        let new_net = move |a: &Ipv4Addr| a.octets()[..3] == new_gw.octets()[..3];
        let prefix = format!(
            "\"{}.{}.{}.",
            new_gw.octets()[0],
            new_gw.octets()[1],
            new_gw.octets()[2]
        );
        // The home replica asks its server while the ledger is watched for the new node's
        // report of its own name.
        let caller = Fleet::replicas(host(home))[0].0.clone();
        let (at_local, at_remote) = std::thread::scope(|s| {
            let r = s.spawn(|| until(host(home), &caller, home_gw, move |a| a.iter().any(new_net)));
            let l = reported(&fleet, new, &prefix);
            (l, r.join().expect("remote"))
        });
        wait_done(&fleet);
        if std::env::var_os("MESH_NAMES_JOBS").is_some() {
            eprintln!("  placed at {placed}, named on {new} at {at_local}, on {home} at {at_remote} (Unix ms)");
            for j in support::sql(
                &fleet.url,
                &format!(
                    "SELECT key || ' +' || CAST(created_at - {placed} AS TEXT) || ' ended +' || CAST(updated_at - {placed} AS TEXT) FROM jobs WHERE id > {last_job} ORDER BY id"
                ),
            ) {
                eprintln!("  {j}");
            }
            let log = std::fs::read_to_string(&fleet.logs[if new == "n1" { 0 } else { 1 }]).unwrap_or_default();
            for l in log.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev() {
                eprintln!("  | {l}");
            }
        }
        if round > 0 {
            placing.push(placed - committed);
            local.push(at_local - placed);
            remote.push(at_remote - placed);
        }
        eprintln!(
            "round {round}: commit to placed {} ms; placed to named on {new} {} ms, on {home} {} ms",
            placed - committed,
            at_local - placed,
            at_remote - placed
        );
        fleet.commit_app(1, &format!("one replica, round {round}"));
        until(host(home), &caller, home_gw, move |a| !a.iter().any(new_net));
        // And the new node no longer reports it (its next address may be the same).
        let deadline = Instant::now() + Duration::from_secs(60);
        while support::sql(
            &fleet.url,
            &format!("SELECT COALESCE(mesh_names, '') FROM nodes WHERE name = '{new}'"),
        )
        .first()
        .is_some_and(|n| n.contains(&prefix))
        {
            assert!(Instant::now() < deadline, "{new} still reports the replica");
            std::thread::sleep(Duration::from_millis(20));
        }
        // And its teardown ended (no job of it left), so the next placement starts afresh.
        wait_done(&fleet);
        while !support::sql(
            &fleet.url,
            &format!("SELECT key FROM jobs WHERE target_node = '{new}' AND state IN ('queued', 'leased')"),
        )
        .is_empty()
        {
            assert!(Instant::now() < deadline, "{new} never ended its teardown");
            std::thread::sleep(Duration::from_millis(20));
        }
        wait_done(&fleet);
    }
    let median = |v: &mut Vec<i64>| {
        v.sort();
        v[v.len() / 2]
    };
    let max = |v: &[i64]| v.iter().copied().max().unwrap_or(0);
    println!("placement to reachable by name, {rounds} rounds (median / worst, ms):");
    println!(
        "  commit to placement            {:>6} / {:>6}",
        median(&mut placing),
        max(&placing)
    );
    println!(
        "  named on its own node (floor)  {:>6} / {:>6}",
        median(&mut local),
        max(&local)
    );
    let mut share: Vec<i64> = remote.iter().zip(&local).map(|(r, l)| r - l).collect();
    println!(
        "  from the other node (target)   {:>6} / {:>6}   (target: under 2,000)",
        median(&mut remote),
        max(&remote)
    );
    println!(
        "  the mesh's share (difference)  {:>6} / {:>6}",
        median(&mut share),
        max(&share)
    );
}
