//! Fleet-wide paths, made to hold ten thousand nodes. `GET /v1/fleet` in pages
//! (`ops::fleet_pages`): every page of one snapshot, however the fleet changes between them,
//! adding up to the whole; a cursor that is not kept, or not well formed, refused with its
//! code. The nodes' meshes made one at a time and written in chunks (`reconcile::mesh`):
//! the same rows as in one write, and nothing written again when nothing changed.

#[path = "support/apply.rs"]
#[allow(dead_code)] // `settle`: this test runs no jobs
mod apply;
#[path = "support/dump.rs"]
mod dump;

use apply::{judgement, state_of};
use reconciler::ops::{Kind, Ops};
use reconciler::store::{Ledger, now_ms};
use state_schema::replacement::Snapshot;
use state_schema::synthetic::Params;
use std::sync::Arc;

fn environments(s: &Snapshot) -> Vec<String> {
    s.running.iter().map(|r| r.spec.environment.to_string()).collect()
}

/// The operator layer over `ledger`, as the daemon builds it (no certificates, no images).
fn ops_of(ledger: &Arc<Ledger>) -> Ops {
    Ops {
        ledger: Arc::clone(ledger),
        hub: Arc::default(),
        branch: "main".into(),
        lost_after_ms: state_schema::placement::LOST_AFTER_MS,
        issues_certificates: false,
        repo_dir: None,
        plans: tokio::sync::Semaphore::new(1),
        indicators: Default::default(),
        images: None,
        images_grace_hours: 24,
        fleet_cursors: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_one_snapshot_add_up_to_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("l.db").display());
    let ledger = Arc::new(Ledger::connect(&url, 2).await.expect("connect"));
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &dump::SYNTHETIC_NODES).await;
    let apply = |sha: &'static str, n: usize| {
        let ledger = Arc::clone(&ledger);
        async move {
            ledger
                .apply_revision(
                    "main",
                    false,
                    &mut judgement(sha, state_of(&Params::new(n))),
                    now_ms(),
                    state_schema::placement::LOST_AFTER_MS,
                )
                .await
                .expect("apply");
        }
    };
    apply("a", 7).await;
    let ops = ops_of(&ledger);
    let whole = ops.fleet().await.expect("the whole snapshot");
    assert_eq!(whole.running.len(), 7);

    // Three pages of three: the first carries the nodes; each names the next.
    let first = ops.fleet_page(None, 3).await.expect("first page");
    assert_eq!(first.snapshot.running.len(), 3);
    assert_eq!(first.snapshot.nodes, whole.nodes, "the first page carries the nodes");
    let cursor = first.next.clone().expect("a next page");
    // The fleet changes between pages: an eighth environment is released.
    apply("b", 8).await;
    assert_eq!(ops.fleet().await.expect("whole").running.len(), 8);
    let second = ops.fleet_page(Some(&cursor), 3).await.expect("second page");
    assert!(second.snapshot.nodes.is_empty(), "only the first carries the nodes");
    let third = ops.fleet_page(second.next.as_deref(), 3).await.expect("third page");
    assert_eq!(third.next, None, "the last page names none");
    let mut pages: Vec<String> = Vec::new();
    for p in [&first, &second, &third] {
        assert_eq!(p.snapshot.at_ms, first.snapshot.at_ms, "one moment");
        pages.extend(environments(&p.snapshot));
    }
    assert_eq!(
        pages,
        environments(&whole),
        "the pages are the snapshot before the change"
    );

    // A cursor not kept, or not one at all: refused, with its code.
    let refused = ops
        .fleet_page(Some("0123456789abcdef.3"), 3)
        .await
        .expect_err("unknown cursor");
    assert_eq!((refused.kind, refused.code), (Kind::NotFound, "fleet-cursor-unknown"));
    let refused = ops.fleet_page(Some("3"), 3).await.expect_err("malformed cursor");
    assert_eq!(refused.kind, Kind::Malformed);
    // A fleet that fits one page names no next page and keeps nothing.
    let one = ops.fleet_page(None, 1_000).await.expect("one page");
    assert_eq!((one.snapshot.running.len(), one.next), (8, None));
    ledger.close().await;
}

/// A SQLite ledger in `dir` with the synthetic nodes (each with a mesh key and an address)
/// and `environments` environments placed on them.
async fn placed_ledger(dir: &std::path::Path, environments: usize) -> (Ledger, String) {
    let url = format!("sqlite://{}", dir.join("l.db").display());
    let ledger = Ledger::connect(&url, 2).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(&url, &dump::SYNTHETIC_NODES).await;
    dump::rows(
        &url,
        "UPDATE nodes SET mesh_key = 'key-' || name, mesh_address = '10.77.0.1'",
    )
    .await;
    let mut judged = judgement("a", state_of(&Params::new(environments)));
    ledger
        .apply_revision(
            "main",
            false,
            &mut judged,
            now_ms(),
            state_schema::placement::LOST_AFTER_MS,
        )
        .await
        .expect("apply");
    (ledger, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshes_written_in_chunks_are_the_meshes_written_at_once() {
    use reconciler::reconcile::mesh::refresh;
    let (a, b) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let (chunked, chunked_url) = placed_ledger(a.path(), 7).await;
    let (whole, whole_url) = placed_ledger(b.path(), 7).await;
    let none = std::collections::BTreeMap::new();
    // Chunks of three over sixteen nodes: five full chunks and a last one of one.
    let changed = refresh(&chunked, &[], &none, 3, now_ms())
        .await
        .expect("refresh in chunks");
    let at_once = refresh(&whole, &[], &none, 10_000, now_ms())
        .await
        .expect("refresh at once");
    assert_eq!(
        changed.len(),
        dump::SYNTHETIC_NODES.len(),
        "every keyed node's mesh is new"
    );
    assert_eq!(changed, at_once);
    let rows = "SELECT node, generation, spec FROM node_meshes ORDER BY node";
    let written = dump::rows(&chunked_url, rows).await;
    assert_eq!(written.len(), dump::SYNTHETIC_NODES.len());
    assert!(
        written.iter().any(|r| r.contains("\"peers\":[{")),
        "some node has peers: {written:?}"
    );
    assert_eq!(written, dump::rows(&whole_url, rows).await);
    // Nothing changed: nothing written, no generation raised.
    let again = refresh(&chunked, &[], &none, 3, now_ms()).await.expect("refresh again");
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(dump::rows(&chunked_url, rows).await, written);
    chunked.close().await;
    whole.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_every_down_link_and_names_a_bounded_few() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("l.db").display());
    let ledger = Arc::new(Ledger::connect(&url, 2).await.expect("connect"));
    ledger.migrate().await.expect("migrate");
    // 600 nodes' meshes, more than one read of 512: each reports two links, both down.
    let rows: Vec<String> = (0..600)
        .map(|i| format!("('n{i:03}', 1, '', '', '[{{\"node\":\"a\"}},{{\"node\":\"b\"}}]', '[\"a\",\"b\"]')"))
        .collect();
    dump::rows(
        &url,
        &format!(
            "INSERT INTO node_meshes (node, generation, hash, spec, links, down) VALUES {}",
            rows.join(", ")
        ),
    )
    .await;
    let status = ops_of(&ledger).status().await.expect("status");
    assert_eq!((status.mesh.links, status.mesh.down_total), (1_200, 1_200));
    assert_eq!(status.mesh.down.len(), reconciler::hub::MAX_NAMED_LINKS);
    assert_eq!(
        (status.mesh.down[0].node.as_str(), status.mesh.down[0].peer.as_str()),
        ("n000", "a")
    );
    ledger.close().await;
}
