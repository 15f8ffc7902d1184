//! Heartbeats that scale, against `pl-reconciler run` as a real process and the agent's own
//! client: the control plane tells each node when to beat next, from the fleet's size and its
//! ceiling a second (`[control] heartbeats_per_second`, `heartbeat_min_seconds`), spread between
//! nodes; a node told a long interval keeps its standing while silent within it (the grace is
//! in the ledger, and `GET /v1/nodes` honours it), becomes unhealthy once it is late past it,
//! and a restart of the control plane marks no node that keeps its interval unhealthy or lost.

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;

use agent_proto::{FULL_CAPABILITIES, Heartbeat};
use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use pushleft_agent::client::AgentClient;
use repo_support::Repo;
use std::path::Path;
use std::time::Duration;
use support::sql;

/// Five nodes in the pool `main`.
const POOL: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n    - {name: n1, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n2, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n3, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n4, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n5, capacity: {cpu: \"4\", memory: 8Gi}}\n";

struct Fleet {
    s: daemon_support::Setup,
    url: String,
    d: Daemon,
    cfg: std::path::PathBuf,
    port: u16,
    nodes: Vec<(String, AgentClient)>,
}

/// A daemon with `control` added to its `[control]`, and `n` nodes enrolled.
fn fleet(dir: &Path, control: &str, n: usize) -> Fleet {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("pools/main.yaml", POOL);
    repo.commit("five nodes", true);
    let s = setup(dir);
    let url = format!("sqlite://{}", dir.join("ledger.db").display());
    let (port, agent_port) = (free_port(), free_port());
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        port,
        &format!("{CONTROL_CA}{control}\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n"),
    );
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let fingerprint = support::ca_pin(&std::fs::read_to_string(dir.join("tls/ca.crt")).expect("ca"));
    let mut nodes = Vec::new();
    for i in 1..=n {
        let name = format!("n{i}");
        let node_dir = dir.join(&name);
        let token = d.enrolment_token(&name, &s.operator);
        pushleft_agent::enroll::enroll(
            &format!("https://localhost:{port}"),
            &fingerprint,
            &name,
            &node_dir,
            &token,
        )
        .expect("enrol");
        let client = AgentClient::from_dir(&format!("https://localhost:{agent_port}"), &node_dir).expect("client");
        nodes.push((name, client));
    }
    Fleet {
        s,
        url,
        d,
        cfg,
        port,
        nodes,
    }
}

fn beat(c: &AgentClient) -> u64 {
    c.heartbeat(&Heartbeat::new("test", &FULL_CAPABILITIES))
        .expect("heartbeat")
        .next_heartbeat_ms
        .expect("the control plane says when to beat next")
}

/// `GET /v1/nodes`: each node's state.
fn states(f: &Fleet) -> Vec<(String, String)> {
    let (status, body) = f.d.get("/v1/nodes", Some(&f.s.viewer));
    assert_eq!(status, 200, "{body}");
    let v: operator_proto::nodes::Nodes = serde_json::from_str(&body).expect("json");
    v.nodes
        .into_iter()
        .map(|n| (n.name, n.state.as_str().to_owned()))
        .collect()
}

#[test]
fn the_interval_follows_the_fleet_and_the_ceiling_and_is_spread() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Five nodes at one beat a second: five seconds each, at the least.
    let f = fleet(dir.path(), "heartbeats_per_second = 1\n", 5);
    let told: Vec<u64> = f.nodes.iter().map(|(_, c)| beat(c)).collect();
    assert!(
        told.iter().all(|t| (5_000..7_500).contains(t)),
        "within [1, 1.5) of 5 nodes / 1 a second: {told:?}"
    );
    let again: Vec<u64> = f.nodes.iter().map(|(_, c)| beat(c)).collect();
    let distinct: std::collections::BTreeSet<u64> = told.iter().chain(&again).copied().collect();
    assert!(
        distinct.len() >= 8,
        "spread, not one interval for all: {told:?} {again:?}"
    );
    // Intervals under the thresholds' own need no grace.
    assert_eq!(
        sql(&f.url, "SELECT DISTINCT CAST(beat_grace_ms AS TEXT) FROM nodes"),
        ["0"]
    );
}

#[test]
fn a_node_silent_within_its_interval_stays_and_one_late_past_it_does_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A long interval (as a large fleet's would be): 100 to 150 s.
    let mut f = fleet(dir.path(), "heartbeat_min_seconds = 100\n", 3);
    let told: Vec<u64> = f.nodes.iter().map(|(_, c)| beat(c)).collect();
    assert!(told.iter().all(|t| (100_000..150_000).contains(t)), "{told:?}");
    let grace = |node: &str| -> i64 {
        sql(
            &f.url,
            &format!("SELECT CAST(beat_grace_ms AS TEXT) FROM nodes WHERE name = '{node}'"),
        )[0]
        .parse()
        .expect("grace")
    };
    assert_eq!(
        grace("n1"),
        told[0] as i64 - 10_000,
        "the grace is the interval past the thresholds' 10 s"
    );
    // n1 silent for 100 s, past the 90 s after which a node told 10 s is unhealthy, but
    // within the interval it was told: active. n2 late by 100 s past its interval: unhealthy.
    let now = sql(&f.url, "SELECT CAST(MAX(last_seen) AS TEXT) FROM nodes")[0]
        .parse::<i64>()
        .expect("now");
    sql(
        &f.url,
        &format!("UPDATE nodes SET last_seen = {} WHERE name = 'n1'", now - 100_000),
    );
    sql(
        &f.url,
        &format!(
            "UPDATE nodes SET last_seen = {} WHERE name = 'n2'",
            now - told[1] as i64 - 100_000
        ),
    );
    let before = states(&f);
    assert!(before.contains(&("n1".into(), "active".into())), "{before:?}");
    assert!(before.contains(&("n2".into(), "unhealthy".into())), "{before:?}");
    assert!(before.contains(&("n3".into(), "active".into())), "{before:?}");

    // A restart: what the nodes were told stays in the ledger, so none that keeps its
    // interval is unhealthy or lost after it, and none is announced lost.
    f.d.kill9();
    let mut d = Daemon::start(&f.s, &f.cfg, f.port);
    d.wait_ready(Duration::from_secs(20));
    f.d = d;
    std::thread::sleep(Duration::from_secs(2));
    let after = states(&f);
    assert_eq!(before, after, "a restart changes no node's standing");
    assert!(
        sql(
            &f.url,
            "SELECT CAST(COUNT(*) AS TEXT) FROM events WHERE kind = 'node-lost'"
        ) == ["0"],
        "no node announced lost"
    );
}
