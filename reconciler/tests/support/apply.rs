//! Applying judged states to a real ledger and running its jobs, for tests that compare what
//! `pl plan` says with what the reconciler does (`scaling.rs`, `rotation.rs`; each includes
//! `dump.rs` as `dump` beside it).

use reconciler::store::now_ms;
use reconciler::store::{Completion, Ledger, Outcome};
use state_repo::revision::Judgement;
use state_schema::parse::parse_file;
use state_schema::state::{Loaded, assemble};
use state_schema::synthetic::{Params, generate};

/// The generated repository of `p`, parsed and assembled (valid, or the test fails).
pub fn state_of(p: &Params) -> Loaded {
    let files = generate(p)
        .into_iter()
        .map(|(path, text)| parse_file(&path, text.as_bytes()))
        .collect();
    let loaded = assemble(files, Vec::new());
    assert!(loaded.is_valid(), "{:?}", loaded.diagnostics.first());
    loaded
}

/// An accepted judgement of `state` as commit `sha`.
pub fn judgement(sha: &str, state: Loaded) -> Judgement {
    Judgement {
        sha: sha.to_owned(),
        principals: Some("ops".into()),
        fingerprint: None,
        reasons: Vec::new(),
        state,
        committed_at_ms: 0,
    }
}

/// Runs every queued job to success and advances, until nothing is left.
pub async fn settle(ledger: &Ledger, url: &str) {
    for _ in 0..20 {
        let nodes = crate::dump::rows(url, "SELECT DISTINCT target_node FROM jobs WHERE state = 'queued'").await;
        if nodes.is_empty() {
            return;
        }
        for node in nodes {
            let leases = ledger.jobs().lease(&node, 1000, 60_000, now_ms()).await.expect("lease");
            let done: Vec<Completion> = leases
                .into_iter()
                .map(|l| Completion {
                    token: l.token,
                    outcome: Outcome::Succeeded,
                })
                .collect();
            ledger.jobs().complete(&done, now_ms()).await.expect("complete");
        }
        ledger.advance(now_ms(), &Default::default()).await.expect("advance");
    }
}
