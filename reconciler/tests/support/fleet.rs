//! What the fleet tests share: a daemon's configuration over a repository and a ledger, every
//! due job run to success, and a node's last heartbeat set back in time.

use reconciler::config::Config;
use reconciler::reconcile::Reconciler;
use reconciler::store::{Completion, Outcome, now_ms};
use std::path::Path;
use std::sync::Arc;

/// A daemon reading `repo` (trusting `dir/allowed_signers`) into the ledger at `url`.
pub fn config(dir: &Path, repo: &Path, url: &str) -> Config {
    let text = format!(
        "[source]\npath = {repo:?}\n\n[trust]\nallowed_signers = \"allowed_signers\"\n\n[ledger]\nurl = {url:?}\n\n[api]\nlisten = \"127.0.0.1:0\"\ntls_cert = \"api.crt\"\ntls_key = \"api.key\"\n"
    );
    let path = dir.join("reconciler.toml");
    std::fs::write(&path, text).expect("config");
    Config::load(&path).expect("config loads")
}

/// Runs every due job of every node that can lease to success, passing between rounds,
/// until nothing is left that those nodes could take.
pub async fn settle(shared: &Arc<Reconciler>, nodes: &[&str]) {
    for _ in 0..12 {
        let mut any = false;
        for node in nodes {
            let leases = shared
                .ledger
                .jobs()
                .lease(node, 100, 30_000, now_ms())
                .await
                .expect("lease");
            any |= !leases.is_empty();
            let done: Vec<Completion> = leases
                .into_iter()
                .map(|l| Completion {
                    token: l.token,
                    outcome: Outcome::Succeeded,
                })
                .collect();
            shared.ledger.jobs().complete(&done, now_ms()).await.expect("complete");
        }
        shared.pass().await.expect("pass");
        if !any {
            return;
        }
    }
}

/// Makes `node`'s last heartbeat `ago_ms` old.
pub async fn set_last_seen(url: &str, node: &str, ago_ms: i64) {
    let ledger = reconciler::store::Ledger::connect(url, 1).await.expect("connect");
    ledger
        .execute_raw(&format!(
            "UPDATE nodes SET last_seen = {} WHERE name = '{node}'",
            now_ms() - ago_ms
        ))
        .await
        .expect("update");
    ledger.close().await;
}
