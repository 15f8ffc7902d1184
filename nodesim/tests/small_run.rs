//! The simulator's small run (50 nodes, 30 s) against `pl-reconciler run` as a real process:
//! every node enrols with its own one-time token and certificate, beats, leases the work of an
//! environment placed over the fleet and completes it, renewing its certificate on the way; the
//! report counts every call kind with
//! its latencies, no refusal and no transport error, and no node shown unhealthy or lost while
//! it beat. The ledger agrees: every node beat, and every replica is reported running. A node
//! told to fall silent (`--silence-file`) beats no more, and the others go on.

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;

use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use repo_support::Repo;
use std::time::Duration;

const NODES: usize = 50;

/// A pool declaring `sim-00001` … `sim-000NN`.
fn pool(n: usize) -> String {
    let mut s = String::from(
        "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n",
    );
    for i in 1..=n {
        s.push_str(&format!(
            "    - {{name: sim-{i:05}, capacity: {{cpu: \"4\", memory: 8Gi}}}}\n"
        ));
    }
    s
}

/// A worker role with `replicas`, spread over the pool.
fn project(replicas: u32) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: app}}\nspec:\n  image: registry.example.invalid/app@{}\n  roles:\n    work: {{kind: worker, replicas: {replicas}, command: [/bin/true], resources: {{cpu: 100m, memory: 32Mi, pids: 16}}}}\n",
        repo_support::DIGEST
    )
}

fn sql(url: &str, q: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(url).await.expect("ledger");
        let v: String = sqlx::query_scalar(sqlx::AssertSqlSafe(q.to_owned()))
            .fetch_one(&pool)
            .await
            .expect("row");
        v
    })
}

#[test]
fn fifty_simulated_nodes_enrol_beat_lease_and_complete_for_thirty_seconds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("pools/main.yaml", &pool(NODES));
    repo.write("projects/app.yaml", &project(100));
    repo.write("envs/app.yaml", &repo_support::environment("app-production", "app"));
    repo.commit("a fleet of fifty and an environment over it", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (port, agent_port) = (free_port(), free_port());
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        port,
        &format!("{CONTROL_CA}\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n"),
    );
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));

    let report_path = dir.path().join("report.json");
    let silence = dir.path().join("silence");
    let sim = std::process::Command::new(env!("CARGO_BIN_EXE_pl-nodesim"))
        .args([
            "--nodes",
            "50",
            "--seconds",
            "30",
            "--heartbeat-seconds",
            "2",
            "--renew-seconds",
            "20",
            "--mesh",
            "--control",
        ])
        .arg(format!("https://localhost:{port}"))
        .arg("--agent-api")
        .arg(format!("https://localhost:{agent_port}"))
        .arg("--ca-cert")
        .arg(dir.path().join("tls/ca.crt"))
        .arg("--dir")
        .arg(dir.path().join("nodes"))
        .arg("--report")
        .arg(&report_path)
        .arg("--silence-file")
        .arg(&silence)
        .env("PL_TOKEN", &s.operator)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("pl-nodesim");
    // Twenty seconds in (the work done), one node falls silent: it beats no more.
    std::thread::sleep(Duration::from_secs(20));
    let silenced_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    std::fs::write(&silence, "sim-00050\n").expect("silence");
    let o = sim.wait_with_output().expect("pl-nodesim");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).expect("report")).expect("json");
    assert_eq!(report["nodes"], 50);
    for call in ["enrol", "firstBeat", "heartbeat", "lease", "renew"] {
        let c = &report["calls"][call];
        assert!(c["count"].as_u64().unwrap_or(0) > 0, "{call}: {report}");
        assert!(c["p99Ms"].as_f64().unwrap_or(-1.0) > 0.0, "{call}: {report}");
    }
    assert_eq!(report["calls"]["enrol"]["count"], 50, "every node enrolled once");
    assert_eq!(
        report["calls"]["firstBeat"]["count"], 50,
        "each node's first beat, apart"
    );
    // Fifty nodes beating every 2 s for 30 s: about 750 beats, spread.
    assert!(
        report["calls"]["heartbeat"]["count"].as_u64().unwrap_or(0) >= 500,
        "{report}"
    );
    assert_eq!(report["refusals"], serde_json::json!({}), "{report}");
    assert_eq!(report["transportErrors"], 0, "{report}");
    assert_eq!(report["markedWhileBeating"], 0, "{report}");
    // In the mesh: each node took the meshes it was handed, peering with the nodes its
    // environment shares (here the whole fleet, one environment over it).
    assert!(report["meshesApplied"].as_u64().unwrap_or(0) >= 50, "{report}");
    let peers = report["largestPeerSet"].as_u64().unwrap_or(0);
    assert!((1..50).contains(&peers), "{report}");
    assert!(report["cost"]["rssBytesPerNode"].as_u64().unwrap_or(0) > 0, "{report}");
    // The ledger saw what the nodes did: all fifty beat, and the replicas they completed are
    // what they report running.
    assert_eq!(
        sql(
            &url,
            "SELECT CAST(COUNT(*) AS TEXT) FROM nodes WHERE last_seen IS NOT NULL"
        ),
        "50"
    );
    let done = sql(
        &url,
        "SELECT CAST(COUNT(*) AS TEXT) FROM jobs WHERE state = 'succeeded' AND task LIKE '%ensure-application%'",
    );
    assert_eq!(done, "100", "every replica's job completed: {err}");
    // The silenced node's last beat came before its silence (with 0.5 s for a beat under
    // way); the others beat on after it.
    assert!(err.contains("pl-nodesim: sim-00050 falls silent"), "{err}");
    let last = |q: &str| sql(&url, q).parse::<u128>().expect("a time");
    let silent_last = last("SELECT CAST(last_seen AS TEXT) FROM nodes WHERE name = 'sim-00050'");
    let others_last = last("SELECT CAST(MAX(last_seen) AS TEXT) FROM nodes WHERE name <> 'sim-00050'");
    assert!(silent_last < silenced_ms + 500, "sim-00050 beat after its silence");
    assert!(others_last > silenced_ms + 4_000, "the others beat on");
    d.kill9();
}
