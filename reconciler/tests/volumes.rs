//! Volumes in the control plane, on both backends, with a real repository: a role's volume is
//! pinned to the node its role was first placed on, and placement never moves it (a draining
//! node keeps it; a lost one leaves it waiting with `volume-pinned`, never placed elsewhere);
//! a teardown keeps the row (its retention starts), and the environment back within it returns
//! to the same node; heartbeats' measurements land only on the reporting node's rows; once
//! its retention is over, a removal job goes to its node and the row is forgotten when it
//! succeeded.

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
use reconciler::reconcile::{Reconciler, volumes};
use reconciler::store::now_ms;
use reconciler::store::volumes::Measured;
use repo_support::{Repo, environment};
use std::path::Path;
use std::sync::Arc;

const POOL: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  placement: pack\n  nodes:\n    - {name: n1, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n2, capacity: {cpu: \"4\", memory: 8Gi}}\n";

fn project() -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@{}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}}}\n    db:\n      kind: service\n      ports: [5432]\n      volumes: [{{name: pgdata, path: /var/lib/postgresql/data, size: 1Gi, retainDays: 3}}]\n",
        repo_support::DIGEST
    )
}

/// Where each replica of the live deployment is, as `role/index@node`.
async fn placed(url: &str) -> Vec<String> {
    let r = rows(url, "SELECT spec FROM deployments WHERE action = 'rollout'").await;
    let Some(spec) = r.first() else { return Vec::new() };
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
    out
}

async fn scenario(url: String, dir: &Path) {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    // n1 is down at first: pack would prefer it, so the volume's first node is n2.
    repo.write("pools/main.yaml", POOL);
    repo.write("projects/api.yaml", &project());
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("web and a database", true);
    let ledger = reconciler::store::Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n2"]).await;
    let shared = Arc::new(
        Reconciler::new(Arc::new(config(dir, &repo.dir, &url)), Arc::new(ledger), Arc::default()).expect("shared"),
    );
    shared.pass().await.expect("pass");
    assert_eq!(placed(&url).await, ["db/0@n2", "web/0@n2"]);
    let volume_rows = || async {
        rows(
            &url,
            "SELECT environment, volume, role, node, generation, size_bytes, retain_days, CASE WHEN released_at IS NULL THEN 'live' ELSE 'released' END FROM volumes",
        )
        .await
    };
    let kept = ["api-production|pgdata|db|n2|1|1073741824|3|live"];
    assert_eq!(volume_rows().await, kept);

    // n1 comes up and the release changes: pack puts the web replica anywhere it likes, but
    // the database stays with its data.
    dump::nodes_up(&url, &["n1"]).await;
    repo.write("projects/api.yaml", &project().replace("port: 8080,", "port: 8081,"));
    repo.commit("a new web port", true);
    shared.pass().await.expect("pass");
    assert!(
        placed(&url).await.contains(&"db/0@n2".to_owned()),
        "{:?}",
        placed(&url).await
    );
    assert_eq!(volume_rows().await, kept, "the pin never moves");

    // n2 drains: the web replica may leave, the database stays (the drain waits for a move).
    repo.write(
        "pools/main.yaml",
        &POOL.replace("{name: n2,", "{name: n2, state: draining,"),
    );
    repo.commit("drain n2", true);
    shared.pass().await.expect("pass");
    let at = placed(&url).await;
    assert!(at.contains(&"db/0@n2".to_owned()), "{at:?}");
    assert!(at.contains(&"web/0@n1".to_owned()), "{at:?}");
    shared.pass().await.expect("pass");
    let pinned = || async { rows(&url, "SELECT subject, detail FROM events WHERE kind = 'volume-pinned'").await };
    let said = pinned().await;
    assert_eq!(said.len(), 1, "reported once: {said:?}");
    assert!(
        said[0].starts_with("api-production/pgdata|node n2 drains") && said[0].contains("pl volume move"),
        "{said:?}"
    );

    // n2 is lost: the database waits with `volume-pinned`; it is never placed on n1.
    repo.write("pools/main.yaml", POOL);
    repo.commit("n2 active again", true);
    shared.pass().await.expect("pass");
    settle(&shared, &["n1", "n2"]).await;
    assert_eq!(
        rows(&url, "SELECT COUNT(*) FROM volumes WHERE drain_blocked_at IS NULL").await,
        ["1"],
        "no longer draining: cleared"
    );
    set_last_seen(&url, "n2", 400_000).await;
    shared.pass().await.expect("pass");
    assert_eq!(placed(&url).await, ["web/0@n1"]);
    let waiting = rows(
        &url,
        "SELECT detail FROM events WHERE kind = 'placement-waiting' ORDER BY id",
    )
    .await;
    assert_eq!(waiting.last().map(String::as_str), Some("db/0: volume-pinned"));
    dump::nodes_up(&url, &["n2"]).await;
    shared.pass().await.expect("pass");
    assert!(placed(&url).await.contains(&"db/0@n2".to_owned()), "back with its data");

    // Heartbeats measure: only the holding node's report lands.
    let m = |bytes| Measured {
        environment: "api-production".into(),
        volume: "pgdata".into(),
        generation: 1,
        bytes,
    };
    shared
        .ledger
        .volumes()
        .record_volume_use("n1", &[m(7)], now_ms())
        .await
        .expect("n1");
    shared
        .ledger
        .volumes()
        .record_volume_use("n2", &[m(4096)], now_ms())
        .await
        .expect("n2");
    assert_eq!(rows(&url, "SELECT bytes FROM volumes").await, ["4096"]);

    // A teardown keeps the volume; its retention starts. Back within it: same node.
    repo.remove("envs/api-production.yaml");
    repo.commit("down", true);
    shared.pass().await.expect("pass");
    assert_eq!(
        volume_rows().await,
        ["api-production|pgdata|db|n2|1|1073741824|3|released"],
        "kept, released"
    );
    let teardown_keys = rows(&url, "SELECT key FROM jobs WHERE key LIKE 'vol%'").await;
    assert!(teardown_keys.is_empty(), "no job touches a volume: {teardown_keys:?}");
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("up again", true);
    shared.pass().await.expect("pass");
    assert!(
        placed(&url).await.contains(&"db/0@n2".to_owned()),
        "{:?}",
        placed(&url).await
    );
    assert_eq!(volume_rows().await, kept);
    settle(&shared, &["n1", "n2"]).await;

    // Down again, and its three days go by: a removal job on n2 (the only node that holds
    // it), and once it succeeded the row is forgotten with a `volume-removed` event.
    repo.remove("envs/api-production.yaml");
    repo.commit("down for good", true);
    shared.pass().await.expect("pass");
    settle(&shared, &["n1", "n2"]).await;
    let four_days_ago = now_ms() - 4 * 86_400_000;
    let ledger = reconciler::store::Ledger::connect(&url, 1).await.expect("connect");
    ledger
        .execute_raw(&format!("UPDATE volumes SET released_at = {four_days_ago}"))
        .await
        .expect("update");
    ledger.close().await;
    // (A pass sweeps once a minute; the sweep itself, now.)
    let sweep = || async { volumes::sweep(&shared.ledger, now_ms()).await.expect("sweep") };
    assert_eq!(
        sweep().await,
        volumes::Swept {
            forgotten: 0,
            pending: 1
        }
    );
    assert_eq!(
        rows(&url, "SELECT key FROM jobs WHERE key LIKE 'vol:%'").await,
        [format!("vol:api-production/pgdata:v1:t{four_days_ago}:remove@n2")]
    );
    assert_eq!(volume_rows().await.len(), 1, "kept until its node removed it");
    assert_eq!(sweep().await.pending, 1, "queued once, still under way");
    settle(&shared, &["n1", "n2"]).await;
    assert_eq!(
        sweep().await,
        volumes::Swept {
            forgotten: 1,
            pending: 0
        }
    );
    assert!(volume_rows().await.is_empty());
    assert_eq!(
        rows(&url, "SELECT detail FROM events WHERE kind = 'volume-removed'").await,
        ["generation 1 on n2"]
    );
    shared.ledger.close().await;
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
