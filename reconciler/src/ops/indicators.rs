//! What the control plane's service levels are measured by (its SLIs), read from the ledger
//! for `/metrics`: each environment's sync and health as its agents report it, the counters
//! the ledger keeps (events by kind, jobs ended by kind, outcome and code, the commit-to-live
//! and route-publication histograms), each node's lease freshness, each mesh link's last
//! handshake, the outbox's oldest pending delivery and dead letters, and each volume's last
//! backup and last proven restore. Read at most every [`FRESH_FOR_MS`] (15 s) whatever the scrapes:
//! a flood of them costs one read.

use super::{Answer, Ops, now_ms, wire};
use crate::store::backups::BackupHealth;
use crate::store::tallies::Tally;
use operator_proto::{Deployment, DeploymentStatus};
use std::sync::Arc;

/// How long one reading serves scrapes: at 10,000 environments a reading takes 0.2 to 0.3 s
/// (the ui bench), so at most 2% of a core whatever the scrapes; the alerts' shortest window
/// is 5 minutes.
pub const FRESH_FOR_MS: i64 = 15_000;
/// Deployments read a statement: each read also parses every node's reported replicas once,
/// so the whole fleet's environments are read in as few statements as memory allows (10,000
/// environments is one).
const PAGE: u32 = 10_000;

/// One environment's standing, from what its agents report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    pub environment: String,
    /// `synced`, `progressing`, `held` (by a rollback) or `failed`.
    pub sync: &'static str,
    /// `healthy`, `degraded`, `missing` (none of its replicas runs) or `none` (it places none).
    pub health: &'static str,
}

/// One reading.
#[derive(Clone, Debug, Default)]
pub struct Indicators {
    pub at_ms: i64,
    pub environments: Vec<Standing>,
    pub tallies: Vec<Tally>,
    /// Every enrolled node that is not retired: its name and when it last leased or beat.
    pub nodes: Vec<(String, i64)>,
    /// Each mesh link not up, as the hub names them (at most `hub::MAX_NAMED_LINKS`): node,
    /// peer, Unix seconds of its last handshake (none: never).
    pub mesh: Vec<(String, String, Option<u64>)>,
    /// When the oldest pending delivery was made; how many are dead letters.
    pub outbox_oldest_ms: Option<i64>,
    pub outbox_dead: i64,
    pub backups: Vec<BackupHealth>,
    /// Scheduled snapshots: when the newest success was taken, once any was attempted.
    pub snapshot: Option<Option<i64>>,
}

impl Ops {
    /// The newest reading, read again when older than [`FRESH_FOR_MS`] (one reader at a time).
    pub async fn indicators(&self) -> Answer<Arc<Indicators>> {
        let mut slot = self.indicators.lock().await;
        if let Some(i) = slot.as_ref()
            && now_ms() - i.at_ms < FRESH_FOR_MS
        {
            return Ok(Arc::clone(i));
        }
        let fresh = Arc::new(self.read_indicators().await?);
        *slot = Some(Arc::clone(&fresh));
        Ok(fresh)
    }

    async fn read_indicators(&self) -> Answer<Indicators> {
        let now = now_ms();
        let mut environments = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let rows = self.ledger.views().deployments(after.as_deref(), PAGE, now).await?;
            let full = rows.len() == PAGE as usize;
            for r in rows {
                environments.push(standing(&wire::deployment(r)?));
            }
            if !full {
                break;
            }
            after = environments.last().map(|s| s.environment.clone());
        }
        // The handshake ages of the links `/metrics` names (those not up, at most
        // `hub::MAX_NAMED_LINKS`), read from those links' nodes only: every node's every link
        // would be two million series at 10,000 nodes, and reading the fleet's rows every
        // 15 s was most of this read's cost.
        let not_up = self.hub.mesh_links.lock().map(|l| l.not_up.clone()).unwrap_or_default();
        let of: std::collections::BTreeSet<&str> = not_up.iter().map(|(n, _, _)| n.as_str()).collect();
        let meshes = self
            .ledger
            .nodes()
            .mesh_states_of(&of.into_iter().collect::<Vec<_>>())
            .await?;
        let said: std::collections::BTreeMap<&str, Vec<operator_proto::nodes::MeshLink>> =
            meshes.iter().map(|(n, m)| (n.as_str(), wire::links(m))).collect();
        let mesh = not_up
            .iter()
            .map(|(node, peer, _)| {
                let last = said
                    .get(node.as_str())
                    .and_then(|links| links.iter().find(|l| &l.node == peer))
                    .and_then(|l| l.last_handshake);
                (node.clone(), peer.clone(), last)
            })
            .collect();
        let (outbox_oldest_ms, outbox_dead) = self.ledger.events().outbox_health().await?;
        let (snapshot_ok, _, snapshot_attempts) = self.ledger.backups().snapshot_health().await?;
        Ok(Indicators {
            at_ms: now,
            environments,
            tallies: self.ledger.events().tallies().await?,
            mesh,
            nodes: self.heard_from().await?,
            outbox_oldest_ms,
            outbox_dead,
            backups: self.ledger.backups().backup_health().await?,
            snapshot: (snapshot_attempts > 0).then_some(snapshot_ok),
        })
    }
}

/// An environment's sync and health, from its deployment as the agents report it.
pub fn standing(d: &Deployment) -> Standing {
    let sync = match d.status {
        _ if d.hold.as_ref().is_some_and(|h| !h.released) => "held",
        DeploymentStatus::Failed => "failed",
        DeploymentStatus::InProgress => "progressing",
        _ => "synced",
    };
    let health = match (d.replicas, d.running) {
        (0, _) => "none",
        (_, 0) => "missing",
        (placed, running) if running < placed => "degraded",
        _ => "healthy",
    };
    Standing {
        environment: d.environment.clone(),
        sync,
        health,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use operator_proto::{Action, Deployment, DeploymentStatus};

    fn d(status: DeploymentStatus, replicas: usize, running: usize) -> Deployment {
        Deployment {
            environment: "shop".into(),
            branch: "main".into(),
            generation: 2,
            action: Action::Rollout,
            status,
            step: 0,
            updated_at_ms: 0,
            asked: None,
            replicas,
            running,
            stale: 0,
            previous_generation: 1,
            waiting: vec![],
            hold: None,
            canary: None,
        }
    }

    #[test]
    fn standing_reads_status_hold_and_what_runs() {
        let s = |x: &Deployment| {
            let s = standing(x);
            (s.sync, s.health)
        };
        assert_eq!(s(&d(DeploymentStatus::Done, 2, 2)), ("synced", "healthy"));
        assert_eq!(s(&d(DeploymentStatus::Done, 2, 1)), ("synced", "degraded"));
        assert_eq!(s(&d(DeploymentStatus::InProgress, 2, 0)), ("progressing", "missing"));
        assert_eq!(s(&d(DeploymentStatus::Failed, 0, 0)), ("failed", "none"));
        let mut held = d(DeploymentStatus::Done, 1, 1);
        held.hold = Some(operator_proto::Hold {
            by: "ops".into(),
            at_ms: 0,
            from: 2,
            to: 1,
            generation: 3,
            git_hash: String::new(),
            released: false,
        });
        assert_eq!(s(&held), ("held", "healthy"));
        held.hold.as_mut().expect("hold").released = true;
        assert_eq!(s(&held), ("synced", "healthy"));
    }
}
