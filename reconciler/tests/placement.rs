//! Capacity-aware placement against a live fleet, on both backends, with a real repository:
//! replicas spread over nodes that heartbeat and never past a node's capacity; what does not
//! fit waits with a `placement-waiting` event (once) and is placed as a scale when room
//! appears; an unhealthy node keeps its replicas; a lost node (a `node-lost` event, once, and
//! `node-back` when it returns) has its replicas move, a scale at the same generation; a
//! draining node's replicas move the same way, the old ones' removals held until the new ones
//! run, and the replicas on other nodes untouched.

#[path = "support/dump.rs"]
mod dump;
#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/postgres.rs"]
mod postgres_support;
#[path = "support/repo.rs"]
mod repo_support;

use dump::rows;
use fleet::{config, set_last_seen, settle};
use reconciler::reconcile::Reconciler;
use reconciler::store::now_ms;
use repo_support::{Repo, environment};
use std::path::Path;
use std::sync::Arc;

const POOL: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n    - {name: n1, capacity: {cpu: \"1\", memory: 2Gi}}\n    - {name: n2, capacity: {cpu: \"1\", memory: 2Gi}}\n    - {name: n3, capacity: {cpu: \"1\", memory: 2Gi}}\n";

fn project(replicas: u32) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@{}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}, replicas: {replicas}, resources: {{cpu: 500m, memory: 256Mi}}}}\n",
        repo_support::DIGEST
    )
}

/// Where each replica is, as `role/index@node`, and the generation.
async fn placed(url: &str) -> (String, Vec<String>) {
    let r = rows(url, "SELECT generation, spec FROM deployments").await;
    let (g, spec) = r[0].split_once('|').expect("row");
    let spec: serde_json::Value = serde_json::from_str(spec).expect("spec");
    let mut out: Vec<String> = spec["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .map(|i| {
            format!(
                "{}/{}@{}",
                i["role"].as_str().unwrap_or(""),
                i["index"],
                i["node"].as_str().unwrap_or("")
            )
        })
        .collect();
    out.sort();
    (g.to_owned(), out)
}

async fn no_node_over_capacity(shared: &Reconciler) {
    for n in reconciler::ops::nodes::node_rows(&shared.ledger, "main", now_ms(), state_schema::placement::LOST_AFTER_MS)
        .await
        .expect("nodes")
    {
        assert!(
            n.reserved_cpu_millis <= n.cpu_millis && n.reserved_memory_bytes <= n.memory_bytes,
            "{} holds {} of {} millicores",
            n.name,
            n.reserved_cpu_millis,
            n.cpu_millis
        );
    }
}

/// The mesh between n1 and n2 (which share the environment), decided from placement once
/// their keys are known, stored by generation, handed out until applied, and not decided anew
/// while nothing changes.
async fn mesh_follows_placement(shared: &Arc<Reconciler>, url: &str) {
    const K1: &str = "IjG2NTSQc3r9k/tNQfief6CqU2RRvmgCObP0GErpnAc=";
    const K2: &str = "xXPrkhFakfvfKd0n1YE1zPho/eReHYkNeL802VQx0SI=";
    shared.pass().await.expect("pass");
    assert!(
        rows(url, "SELECT node FROM node_meshes").await.is_empty(),
        "no keys, no mesh"
    );
    shared
        .ledger
        .execute_raw(&format!(
            "UPDATE nodes SET mesh_key = '{K1}', mesh_port = 51820, mesh_address = '10.77.0.1' WHERE name = 'n1'"
        ))
        .await
        .expect("n1 key");
    shared
        .ledger
        .execute_raw(&format!(
            "UPDATE nodes SET mesh_key = '{K2}', mesh_port = 51821 WHERE name = 'n2'"
        ))
        .await
        .expect("n2 key");
    shared.pass().await.expect("pass");
    let subnet = |node: &str| {
        let url = url.to_owned();
        let node = node.to_owned();
        async move {
            let r = rows(&url, &format!("SELECT idx FROM subnets WHERE node = '{node}'")).await;
            let i: i64 = r[0].parse().expect("idx");
            format!("10.{}.{}.0/24", 208 + i / 256, i % 256)
        }
    };
    let (s1, s2) = (subnet("n1").await, subnet("n2").await);
    assert_ne!(s1, s2);
    let meshes = rows(url, "SELECT node, generation, spec FROM node_meshes ORDER BY node").await;
    assert_eq!(meshes.len(), 2, "{meshes:?}");
    let spec = |row: &str| -> serde_json::Value {
        serde_json::from_str(row.splitn(3, '|').nth(2).expect("spec")).expect("json")
    };
    let (m1, m2) = (spec(&meshes[0]), spec(&meshes[1]));
    assert!(meshes[0].starts_with("n1|1|"), "{}", meshes[0]);
    // n1 reaches n2 where n2 is (no address: n2 reaches out), and the other way round at
    // n1's address; every link has keepalives (NAT, and health).
    assert_eq!(m1["port"], 51820);
    assert_eq!(m1["peers"][0]["node"], "n2");
    assert_eq!(m1["peers"][0]["publicKey"], K2);
    assert_eq!(m1["peers"][0]["endpoint"], serde_json::Value::Null);
    assert_eq!(m1["peers"][0]["keepalive"], 25);
    assert_eq!(m1["peers"][0]["subnets"], serde_json::json!([s2]));
    assert_eq!(m1["environments"][0]["remote"], serde_json::json!([s2]));
    assert_eq!(m2["port"], 51821);
    assert_eq!(m2["peers"][0]["endpoint"], "10.77.0.1:51820");
    assert_eq!(m2["peers"][0]["keepalive"], 25);
    assert_eq!(m2["environments"][0]["subnet"], serde_json::json!(s2));
    // Handed out until applied; a pass with nothing changed decides nothing anew.
    let (g, _) = shared
        .ledger
        .nodes()
        .mesh_beat("n2", 0, "[]", now_ms())
        .await
        .expect("beat")
        .expect("a mesh to apply");
    assert_eq!(g, 1);
    assert!(
        shared
            .ledger
            .nodes()
            .mesh_beat("n2", 1, "[{\"node\":\"n1\"}]", now_ms())
            .await
            .expect("beat")
            .is_none()
    );
    shared.pass().await.expect("pass");
    assert_eq!(
        rows(url, "SELECT node, generation, applied FROM node_meshes ORDER BY node").await,
        ["n1|1|0", "n2|1|1"]
    );
    // Health: n2 applied just now and has not met n1 yet (connecting, no event); its link
    // said stale is down, once; a fresh handshake brings it up, once.
    use reconciler::reconcile::mesh_health;
    let events = |kind: &'static str| {
        let url = url.to_owned();
        async move {
            rows(
                &url,
                &format!("SELECT subject || ' ' || detail FROM events WHERE kind = '{kind}' ORDER BY id"),
            )
            .await
        }
    };
    // The links as the hub keeps them: (up, connecting, down) counted, those not up named,
    // down ones first.
    let state = |links: reconciler::hub::MeshLinks| -> ((u64, u64, u64), Vec<String>) {
        let named = links
            .not_up
            .iter()
            .map(|(node, peer, down)| format!("{node}>{peer} {}", if *down { "down" } else { "connecting" }))
            .collect();
        ((links.up, links.connecting, links.down), named)
    };
    let now = now_ms();
    let links = mesh_health::check(&shared.ledger, now).await.expect("check");
    assert_eq!(
        state(links),
        (
            (0, 2, 0),
            vec!["n1>n2 connecting".to_owned(), "n2>n1 connecting".to_owned()]
        )
    );
    assert!(events("mesh-link-down").await.is_empty());
    let stale = format!("[{{\"node\":\"n1\",\"lastHandshake\":{}}}]", now / 1000 - 400);
    shared
        .ledger
        .nodes()
        .mesh_beat("n2", 1, &stale, now)
        .await
        .expect("beat");
    for _ in 0..2 {
        let links = mesh_health::check(&shared.ledger, now).await.expect("check");
        assert_eq!(
            state(links),
            ((0, 1, 1), vec!["n2>n1 down".to_owned(), "n1>n2 connecting".to_owned()])
        );
    }
    assert_eq!(
        events("mesh-link-down").await,
        ["n2 the link from n2 to n1 is down: its last handshake was 400 s ago"]
    );
    // `/metrics`' handshake ages: those of the links the hub names, read from their nodes.
    let links = mesh_health::check(&shared.ledger, now).await.expect("check");
    *shared.hub.mesh_links.lock().expect("hub") = links;
    let ops = reconciler::ops::Ops {
        ledger: Arc::clone(&shared.ledger),
        hub: Arc::clone(&shared.hub),
        branch: "main".into(),
        lost_after_ms: state_schema::placement::LOST_AFTER_MS,
        issues_certificates: false,
        repo_dir: None,
        plans: tokio::sync::Semaphore::new(1),
        indicators: Default::default(),
        images: None,
        images_grace_hours: 24,
        fleet_cursors: Default::default(),
    };
    let read = ops.indicators().await.expect("indicators");
    assert_eq!(
        read.mesh,
        [
            ("n2".to_owned(), "n1".to_owned(), Some((now / 1000 - 400) as u64)),
            ("n1".to_owned(), "n2".to_owned(), None)
        ]
    );
    assert_eq!(
        rows(url, "SELECT down FROM node_meshes WHERE node = 'n2'").await,
        ["[\"n1\"]"]
    );
    let fresh = format!("[{{\"node\":\"n1\",\"lastHandshake\":{}}}]", now / 1000 - 3);
    shared
        .ledger
        .nodes()
        .mesh_beat("n2", 1, &fresh, now)
        .await
        .expect("beat");
    let links = mesh_health::check(&shared.ledger, now).await.expect("check");
    assert_eq!(
        state(links),
        ((1, 1, 0), vec!["n1>n2 connecting".to_owned()]),
        "up: counted, not named"
    );
    assert_eq!(events("mesh-link-up").await, ["n2 the link from n2 to n1 is up again"]);
    assert_eq!(events("mesh-link-down").await.len(), 1);
}

async fn scenario(url: String, dir: &Path) {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("pools/main.yaml", POOL);
    repo.write("projects/api.yaml", &project(3));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("three replicas", true);
    let ledger = reconciler::store::Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n1", "n2"]).await;
    let shared = Arc::new(
        Reconciler::new(
            std::sync::Arc::new(config(dir, &repo.dir, &url)),
            std::sync::Arc::new(ledger),
            std::sync::Arc::default(),
        )
        .expect("shared"),
    );

    // Spread over the two nodes that heartbeat; n3 has never been heard from.
    shared.pass().await.expect("pass");
    assert_eq!(
        placed(&url).await,
        (
            "1".into(),
            vec!["web/0@n1".into(), "web/1@n2".into(), "web/2@n1".into()]
        )
    );
    settle(&shared, &["n1", "n2"]).await;
    no_node_over_capacity(&shared).await;
    mesh_follows_placement(&shared, &url).await;

    // Five replicas: n1 is full, n2 takes one more, the fifth waits, announced once.
    repo.write("projects/api.yaml", &project(5));
    repo.commit("five replicas", true);
    shared.pass().await.expect("pass");
    let (g, at) = placed(&url).await;
    assert_eq!(g, "1", "a scale, not a release");
    assert_eq!(at, ["web/0@n1", "web/1@n2", "web/2@n1", "web/3@n2"]);
    let waiting = || async {
        rows(
            &url,
            "SELECT detail FROM events WHERE kind = 'placement-waiting' ORDER BY id",
        )
        .await
    };
    assert_eq!(waiting().await, ["web/4: no-capacity"]);
    settle(&shared, &["n1", "n2"]).await;
    shared.pass().await.expect("pass");
    assert_eq!(waiting().await.len(), 1, "a wait is announced once");
    no_node_over_capacity(&shared).await;

    // n3 comes up: the waiting replica is placed there, at the same generation.
    dump::nodes_up(&url, &["n3"]).await;
    shared.pass().await.expect("pass");
    assert_eq!(
        placed(&url).await,
        (
            "1".into(),
            vec![
                "web/0@n1".into(),
                "web/1@n2".into(),
                "web/2@n1".into(),
                "web/3@n2".into(),
                "web/4@n3".into()
            ]
        )
    );
    assert_eq!(rows(&url, "SELECT waiting FROM deployments").await, ["[]"]);
    settle(&shared, &["n1", "n2", "n3"]).await;

    // n1 falls silent for two minutes: unhealthy, it keeps its replicas.
    set_last_seen(&url, "n1", 120_000).await;
    shared.pass().await.expect("pass");
    assert_eq!(placed(&url).await.0, "1");
    assert_eq!(
        reconciler::ops::nodes::node_rows(&shared.ledger, "main", now_ms(), state_schema::placement::LOST_AFTER_MS)
            .await
            .expect("nodes")[0]
            .state,
        "unhealthy"
    );
    set_last_seen(&url, "n1", 0).await;

    // n2 is lost (silent past 300 s): its replicas move, a scale at the same generation (the
    // replicas on n1 and n3 stay as they are); one fits on n3, the other waits. The old ones
    // are removed on n2 when it returns (held until the new one ran): a replica that moved
    // leaves nothing behind.
    set_last_seen(&url, "n2", 400_000).await;
    shared.pass().await.expect("pass");
    assert_eq!(
        placed(&url).await,
        (
            "1".into(),
            vec![
                "web/0@n1".into(),
                "web/1@n3".into(),
                "web/2@n1".into(),
                "web/4@n3".into()
            ]
        )
    );
    assert_eq!(waiting().await.last().map(String::as_str), Some("web/3: no-capacity"));
    no_node_over_capacity(&shared).await;
    // Lost is an event, once (webhooks take it); n1's two silent minutes were not one.
    shared.pass().await.expect("pass");
    let lost = rows(&url, "SELECT subject, detail FROM events WHERE kind = 'node-lost'").await;
    assert!(
        lost.len() == 1 && lost[0].starts_with("n2|not heard from for 400 s (lost after 300 s)"),
        "{lost:?}"
    );
    // n2 comes back before the replica that replaces web/1 ran on n3: its removals are still
    // held, and the waiting web/3 is placed on n2 again (a second scale). The held removals of
    // what that scale puts back (web/3's teardown, n2's network and routes) are cancelled:
    // released later, they would remove what it made. web/1's teardown stays held.
    dump::nodes_up(&url, &["n2"]).await;
    shared.pass().await.expect("pass");
    assert_eq!(
        placed(&url).await,
        (
            "1".into(),
            vec![
                "web/0@n1".into(),
                "web/1@n3".into(),
                "web/2@n1".into(),
                "web/3@n2".into(),
                "web/4@n3".into()
            ]
        )
    );
    let on_n2 = |state: &'static str| {
        let url = url.clone();
        async move {
            rows(
                &url,
                &format!("SELECT key FROM jobs WHERE target_node = 'n2' AND state = '{state}' AND key LIKE '%#r%' ORDER BY key"),
            )
            .await
            .iter()
            .map(|k| k.split('#').next().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
        }
    };
    let cancelled = on_n2("cancelled").await;
    assert!(
        cancelled.contains(&"app:api-production/web/3:g1:teardown@n2".to_owned())
            && cancelled.contains(&"net:api-production:g1:remove@n2".to_owned()),
        "{cancelled:?}"
    );
    assert!(!cancelled.iter().any(|k| k.contains("web/1")), "{cancelled:?}");
    settle(&shared, &["n1", "n2", "n3"]).await;
    assert_eq!(
        rows(&url, "SELECT subject, detail FROM events WHERE kind = 'node-back'").await,
        ["n2|heard from again"]
    );
    let torn: Vec<String> = on_n2("succeeded")
        .await
        .into_iter()
        .filter(|k| k.contains(":teardown@"))
        .collect();
    assert_eq!(
        torn,
        ["app:api-production/web/1:g1:teardown@n2"],
        "the replica that moved away is removed from n2 once it is back; web/3 stays"
    );
    assert!(
        on_n2("succeeded")
            .await
            .contains(&"app:api-production/web/3:g1:ensure@n2".to_owned())
    );
    assert_eq!(
        rows(&url, "SELECT retired FROM deployments").await,
        ["[]"],
        "every scale's jobs ended"
    );

    // n1 drains (a reviewed commit): its replicas move; one fits on n2, the other waits, at
    // the same generation, and the replicas on n2 and n3 are in no job. The old ones' removals
    // are held until the new replicas ran and were published: n1 gets nothing before that.
    let before = placed(&url).await.1;
    repo.write(
        "pools/main.yaml",
        &POOL.replace("{name: n1,", "{name: n1, state: draining,"),
    );
    repo.commit("drain n1", true);
    shared.pass().await.expect("pass");
    let (g, at) = placed(&url).await;
    assert_eq!(g, "1", "a drain is a scale");
    assert!(at.iter().all(|i| !i.ends_with("@n1")), "{at:?}");
    assert_eq!(at.iter().filter(|i| i.ends_with("@n2")).count(), 2, "{at:?}");
    for stays in before.iter().filter(|i| !i.ends_with("@n1")) {
        assert!(at.contains(stays), "{stays} stays: {at:?}");
        let slot = stays.split('@').next().unwrap_or_default();
        let node = stays.split('@').nth(1).unwrap_or_default();
        let jobs = rows(
            &url,
            &format!("SELECT key FROM jobs WHERE key LIKE 'app:api-production/{slot}:%@{node}#r%' AND state IN ('queued', 'leased')"),
        )
        .await;
        assert!(jobs.is_empty(), "{stays} is in no job: {jobs:?}");
    }
    no_node_over_capacity(&shared).await;
    let held = || {
        let url = url.clone();
        async move {
            rows(
                &url,
                "SELECT key FROM jobs WHERE target_node = 'n1' AND state = 'queued' AND held = 1 ORDER BY id",
            )
            .await
        }
    };
    let waiting_on_n1 = held().await;
    assert!(
        waiting_on_n1.iter().any(|k| k.contains(":teardown@n1#r"))
            && waiting_on_n1.iter().any(|k| k.starts_with("net:")),
        "{waiting_on_n1:?}"
    );
    assert!(
        shared
            .ledger
            .jobs()
            .lease("n1", 100, 30_000, now_ms())
            .await
            .expect("lease")
            .is_empty(),
        "nothing of n1's is due while the new replicas are not up"
    );
    // The new replicas on n2 run: the removals come due, and n1 removes its replicas.
    settle(&shared, &["n2", "n3"]).await;
    assert!(held().await.is_empty(), "released");
    assert_eq!(
        rows(
            &url,
            "SELECT subject FROM events WHERE kind = 'scale-removals-released'"
        )
        .await
        .last()
        .map(String::as_str),
        Some("api-production")
    );
    settle(&shared, &["n1", "n2", "n3"]).await;
    let torn = rows(
        &url,
        "SELECT key FROM jobs WHERE key LIKE 'app:%:teardown@n1#r%' AND state = 'succeeded'",
    )
    .await;
    assert_eq!(
        torn.len(),
        before.iter().filter(|i| i.ends_with("@n1")).count(),
        "{torn:?}"
    );
    assert!(
        rows(&url, "SELECT key FROM jobs WHERE key LIKE 'app:%:stop@n1%'")
            .await
            .is_empty(),
        "nothing kept stopped on n1"
    );
    // Once the scale's jobs are done, the spec it replaced is retired for good.
    assert_eq!(rows(&url, "SELECT retired FROM deployments").await, ["[]"]);
    disjoint_pools_share_subnet_indices(&shared, &repo, &url).await;
    shared.ledger.close().await;
}

/// A second pool sharing no node with `main`: its environment's subnets start again at the
/// pool's first /24 (they can never meet `main`'s on a node), while within `main` every
/// subnet stayed distinct.
async fn disjoint_pools_share_subnet_indices(shared: &Arc<Reconciler>, repo: &Repo, url: &str) {
    repo.write(
        "pools/edge.yaml",
        "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: edge}\nspec:\n  region: eu\n  nodes:\n    - {name: n4, capacity: {cpu: \"1\", memory: 2Gi}}\n",
    );
    repo.write(
        "projects/jobs.yaml",
        &format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: jobs}}\nspec:\n  image: registry.example.invalid/jobs@{}\n  roles:\n    work: {{kind: worker, replicas: 1, command: [/bin/true], resources: {{cpu: 100m, memory: 64Mi}}}}\n",
            repo_support::DIGEST
        ),
    );
    repo.write(
        "envs/jobs-production.yaml",
        "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: jobs-production}\nspec: {project: jobs, stage: production, pool: edge}\n",
    );
    repo.commit("jobs on the edge pool", true);
    dump::nodes_up(url, &["n4"]).await;
    shared.pass().await.expect("pass");
    let main = rows(
        url,
        "SELECT idx FROM subnets WHERE environment = 'api-production' ORDER BY idx",
    )
    .await;
    let mut distinct = main.clone();
    distinct.dedup();
    assert_eq!(main, distinct, "one environment's subnets are distinct");
    assert_eq!(main.first().map(String::as_str), Some("0"));
    assert_eq!(
        rows(
            url,
            "SELECT node, idx FROM subnets WHERE environment = 'jobs-production'"
        )
        .await,
        ["n4|0"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    scenario(url, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let pg = postgres_support::Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    scenario(pg.url(), dir.path()).await;
}
