//! `GET /v1/fleet` in pages (`ops::fleet_pages`): every page of one snapshot, however the
//! fleet changes between them, adding up to the whole; a cursor that is not kept, or not
//! well formed, refused with its code.

#[path = "support/apply.rs"]
#[allow(dead_code)] // `settle`: this test runs no jobs
mod apply;
#[path = "support/dump.rs"]
mod dump;

use apply::judgement;
use reconciler::ops::{Kind, Ops};
use reconciler::store::{Ledger, now_ms};
use state_schema::parse::parse_file;
use state_schema::replacement::Snapshot;
use state_schema::state::{Loaded, assemble};
use state_schema::synthetic::{Params, generate};
use std::sync::Arc;

fn state_of(environments: usize) -> Loaded {
    let files = generate(&Params::new(environments))
        .into_iter()
        .map(|(path, text)| parse_file(&path, text.as_bytes()))
        .collect();
    let loaded = assemble(files, Vec::new());
    assert!(loaded.is_valid(), "{:?}", loaded.diagnostics.first());
    loaded
}

fn environments(s: &Snapshot) -> Vec<String> {
    s.running.iter().map(|r| r.spec.environment.to_string()).collect()
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
                    &mut judgement(sha, state_of(n)),
                    now_ms(),
                    state_schema::placement::LOST_AFTER_MS,
                )
                .await
                .expect("apply");
        }
    };
    apply("a", 7).await;
    let ops = Ops {
        ledger: Arc::clone(&ledger),
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
    };
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
