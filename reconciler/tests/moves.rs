//! Volume moves in the control plane, on both backends, with a real repository and the jobs
//! run by hand (what the agents would report): a move is refused before any write when it
//! cannot work; asked, its role's drift repair holds off and a release meanwhile places it
//! nowhere, the volume's save on its node leads
//! to a restore on the target, the restore moves the row (node and generation) and placement
//! follows with a new generation there, and the role healthy there ends the move with its
//! downtime, the generation it left kept on the old node (until an admin removes it). A save
//! that fails for good ends the move with its reason, the volume untouched.

#[path = "support/dump.rs"]
mod dump;
#[path = "support/fleet.rs"]
#[allow(dead_code)] // (its lost-node helper is other tests')
mod fleet;
#[path = "support/postgres.rs"]
mod postgres_support;
#[path = "support/repo.rs"]
mod repo_support;

use dump::rows;
use fleet::{config, settle};
use reconciler::reconcile::Reconciler;
use reconciler::store::backups::Saved;
use reconciler::store::moves::MoveRefusal;
use reconciler::store::{Completion, Outcome, now_ms};
use repo_support::Repo;
use std::path::Path;
use std::sync::Arc;

const POOL: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  placement: pack\n  nodes:\n    - {name: n1, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n2, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n3, capacity: {cpu: \"1\", memory: 8Gi}}\n";

fn project() -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@{}\n  roles:\n    db:\n      kind: service\n      resources: {{cpu: \"2\", memory: 1Gi}}\n      volumes: [{{name: pgdata, path: /var/lib/postgresql/data, backup: {{schedule: \"0 0 1 1 *\", keep: 3}}}}]\n",
        repo_support::DIGEST
    )
}

const ENVIRONMENT: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: api-production}\nspec:\n  project: api\n  stage: production\n  pool: main\n  backups: {repository: /var/backups/pushleft/api, secret: backups}\n";

/// Where each replica of the live deployment is, as `role/index@node`.
async fn placed(url: &str) -> Vec<String> {
    let r = rows(url, "SELECT spec FROM deployments WHERE action = 'rollout'").await;
    let Some(spec) = r.first() else { return Vec::new() };
    let spec: serde_json::Value = serde_json::from_str(spec).expect("spec");
    spec["instances"]
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
        .collect()
}

/// Leases `node`'s jobs and completes the one whose key has `part` with `outcome` (the others
/// succeed). Returns that job's key.
async fn run_one(shared: &Arc<Reconciler>, node: &str, part: &str, outcome: Outcome) -> String {
    let leases = shared
        .ledger
        .jobs()
        .lease(node, 100, 30_000, now_ms())
        .await
        .expect("lease");
    let keys: Vec<String> = leases.iter().map(|l| l.key.clone()).collect();
    let mut found = None;
    let done: Vec<Completion> = leases
        .into_iter()
        .map(|l| {
            let outcome = if l.key.contains(part) {
                found = Some(l.key.clone());
                outcome.clone()
            } else {
                Outcome::Succeeded
            };
            Completion {
                token: l.token,
                outcome,
            }
        })
        .collect();
    shared.ledger.jobs().complete(&done, now_ms()).await.expect("complete");
    found.unwrap_or_else(|| panic!("no job with {part} on {node}: {keys:?}"))
}

async fn scenario(url: String, dir: &Path) {
    let repo = Repo::new(dir);
    std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("pools/main.yaml", POOL);
    repo.write("projects/api.yaml", &project());
    repo.write("envs/api-production.yaml", ENVIRONMENT);
    // examples/app's placeholder Secret (a password sealed to a recipient whose identity was
    // thrown away) as the control recipient's: no job here is delivered, so none is opened.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/app");
    let secret = std::fs::read_to_string(example.join("secrets/app-backups.yaml")).expect("example secret");
    let recipient = secret
        .lines()
        .find_map(|l| l.trim().strip_prefix("- age1"))
        .map(|r| format!("age1{r}"))
        .expect("recipient");
    repo.write(
        "secrets/backups.yaml",
        &secret.replace("name: app-backups", "name: backups"),
    );
    repo.write(
        "pushleft.yaml",
        &repo_support::ROOT.replace(
            "ttlHours: 24}",
            &format!("ttlHours: 24}}, controlRecipient: {recipient}"),
        ),
    );
    repo.commit("a database with backups", true);
    let ledger = reconciler::store::Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &["n1", "n2", "n3"]).await;
    let shared = Arc::new(
        Reconciler::new(Arc::new(config(dir, &repo.dir, &url)), Arc::new(ledger), Arc::default()).expect("shared"),
    );
    shared.pass().await.expect("pass");
    settle(&shared, &["n1", "n2", "n3"]).await;
    assert_eq!(
        placed(&url).await,
        ["db/0@n1"],
        "{:?}",
        rows(&url, "SELECT kind, detail FROM events ORDER BY id").await
    );
    let ledger = &shared.ledger;
    let ops = reconciler::ops::Ops {
        ledger: shared.ledger.clone(),
        hub: shared.hub.clone(),
        branch: "main".into(),
        lost_after_ms: shared.config.control.lost_after_ms(),
        issues_certificates: shared.config.issues_certificates(),
        repo_dir: None,
        plans: tokio::sync::Semaphore::new(1),
        images: None,
        images_grace_hours: 24,
        indicators: Default::default(),
        fleet_cursors: Default::default(),
    };
    let move_to = |to: &str| operator_proto::volumes::MoveVolume {
        environment: "api-production".into(),
        volume: "pgdata".into(),
        to: to.into(),
    };
    let ops = &ops;
    let ask = |to: &'static str| async move { ops.ask_move(&move_to(to), now_ms()).await.expect("move") };
    let row = || async {
        rows(
            &url,
            "SELECT node, generation, COALESCE(moving_to, '-'), COALESCE(moved_from, '-'), CASE WHEN moved_up_at IS NULL THEN 'down' ELSE 'up' END, COALESCE(move_failure, '-') FROM volumes",
        )
        .await
    };

    // Refused, nothing written: where it is, a node too small for the role, one not declared.
    assert_eq!(ask("n1").await, Err(MoveRefusal::AlreadyThere));
    assert_eq!(ask("n3").await, Err(MoveRefusal::Unplaceable("no-capacity".into())));
    assert_eq!(
        ask("n9").await,
        Err(MoveRefusal::Unplaceable("node-not-eligible".into()))
    );
    assert_eq!(row().await, ["n1|1|-|-|down|-"]);

    // Asked: the save goes to n1, and a second ask is refused while it is under way.
    let moving = ask("n2").await.expect("asked");
    assert_eq!(
        (moving.from.as_str(), moving.to.as_str(), moving.role.as_str()),
        ("n1", "n2", "db")
    );
    assert!(
        moving.job.starts_with("backup:api-production/pgdata:move") && moving.job.ends_with("@n1"),
        "{moving:?}"
    );
    assert_eq!(ask("n2").await, Err(MoveRefusal::Moving("n2".into())));
    assert_eq!(row().await, ["n1|1|n2|-|down|-"]);
    // A release during the move places the role nowhere (its data is on its way): nothing
    // starts it on n1 again while its files are saved.
    repo.write("projects/api.yaml", &project().replace("memory: 1Gi", "memory: 2Gi"));
    repo.commit("more memory for the database", true);
    shared.pass().await.expect("pass");
    assert_eq!(placed(&url).await, Vec::<String>::new());
    let waiting = rows(
        &url,
        "SELECT detail FROM events WHERE kind = 'placement-waiting' ORDER BY id",
    )
    .await;
    assert_eq!(waiting.last().map(String::as_str), Some("db/0: volume-moving"));
    let saved = Saved {
        snapshot: "0123abcd".into(),
        bytes: 4096,
        data_added: 4096,
    };
    run_one(&shared, "n1", ":move", Outcome::Saved(saved)).await;
    assert_eq!(
        rows(&url, "SELECT status, snapshot FROM backups").await,
        ["moved|0123abcd"],
        "listed as a move's snapshot, not a backup to restore from"
    );
    // The restore of that snapshot goes to n2, into generation 2.
    let restore = run_one(&shared, "n2", ":restore", Outcome::Succeeded).await;
    assert!(
        restore.starts_with("vol:api-production/pgdata:v2:") && restore.ends_with("@n2"),
        "{restore}"
    );
    assert_eq!(
        row().await,
        ["n2|2|n2|n1|down|-"],
        "the row moved; the role is not up yet"
    );
    // Placement follows the volume: a new generation with db on n2, mounting generation 2.
    shared.pass().await.expect("pass");
    assert_eq!(placed(&url).await, ["db/0@n2"]);
    let spec = rows(&url, "SELECT spec FROM deployments WHERE action = 'rollout'").await;
    assert!(
        spec[0].contains("\"generation\":2"),
        "mounts the restored generation: {}",
        spec[0]
    );
    settle(&shared, &["n1", "n2", "n3"]).await;
    assert_eq!(row().await, ["n2|2|-|n1|up|-"], "healthy on n2: the move is done");
    let done = rows(&url, "SELECT detail FROM events WHERE kind = 'volume-move-done'").await;
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(done[0].starts_with("on n2 (from n1); db was down at most "), "{done:?}");
    for kind in ["volume-move-requested", "volume-move-saved", "volume-moved"] {
        assert_eq!(
            rows(&url, &format!("SELECT COUNT(*) FROM events WHERE kind = '{kind}'")).await,
            ["1"],
            "{kind}"
        );
    }

    // The generation it left is kept on n1 until an admin removes it.
    let kept = ledger.deployments().kept_generations().await.expect("kept");
    assert_eq!(
        kept.iter()
            .map(|k| format!("{}/{} g{} on {}", k.environment, k.volume, k.generation, k.node))
            .collect::<Vec<_>>(),
        ["api-production/pgdata g1 on n1"]
    );
    use reconciler::store::kept::KeptRefusal;
    assert_eq!(
        ledger
            .deployments()
            .kept_generation("api-production", "pgdata", 2)
            .await
            .expect("read"),
        Err(KeptRefusal::Current)
    );
    assert_eq!(
        ledger
            .deployments()
            .kept_generation("api-production", "pgdata", 7)
            .await
            .expect("read"),
        Err(KeptRefusal::Unknown)
    );
    let g1 = ledger
        .deployments()
        .kept_generation("api-production", "pgdata", 1)
        .await
        .expect("read")
        .expect("kept");
    assert!(
        ledger
            .deployments()
            .forget_generation(&g1, now_ms())
            .await
            .expect("forget")
    );
    assert!(ledger.deployments().kept_generations().await.expect("kept").is_empty());

    // A save that fails for good ends the move: the volume stays on n2 at generation 2.
    let back = ask("n1").await.expect("asked back");
    run_one(
        &shared,
        "n2",
        ":move",
        Outcome::Permanent("restic-failed: disk on fire".into()),
    )
    .await;
    assert_eq!(
        row().await,
        ["n2|2|-|-|down|saving it on n2 failed: restic-failed: disk on fire"]
    );
    // Asked again within the same second, the move's job key is taken: refused, nothing
    // written (a move without its job would never end).
    let again = ops.ask_move(&move_to("n1"), back.asked_at).await.expect("move");
    assert!(
        matches!(&again, Err(MoveRefusal::Moving(why)) if why.contains("this same second")),
        "{again:?}"
    );
    assert_eq!(
        row().await[0],
        "n2|2|-|-|down|saving it on n2 failed: restic-failed: disk on fire"
    );
    let failed = rows(&url, "SELECT detail FROM events WHERE kind = 'volume-move-failed'").await;
    assert!(
        failed[0].contains("disk on fire") && failed[0].contains("stays where it was"),
        "{failed:?}"
    );
    shared.pass().await.expect("pass");
    assert_eq!(placed(&url).await, ["db/0@n2"], "nothing moved");
    assert!(
        rows(
            &url,
            "SELECT key FROM jobs WHERE key LIKE 'vol:%:restore%' AND target_node = 'n1'"
        )
        .await
        .is_empty(),
        "no restore after a failed save"
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
