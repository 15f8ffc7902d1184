//! The agents' use cases that are decisions, not transport: a heartbeat judged against what
//! the ledger held of its node (does placement see the node differently now? did a replica
//! go missing? does a watched release fail on it?) and then recorded. The agent API
//! (`http::agent`) parses and authorises, calls these, and answers.

use crate::hub::Hub;
use crate::store::fleet::{Beat, BeatRow};
use crate::store::{Ledger, LedgerError};
use agent_proto::RunningInstance;
use state_schema::placement::Liveness;
use std::sync::atomic::Ordering;

/// What a heartbeat changes, judged against what the ledger held of its node before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Judged {
    /// Placement sees the node differently: it was not ready, its capabilities changed, or
    /// its mesh key or names did (every node's mesh is planned again).
    pub replace: bool,
    /// A replica the node reported before is missing from this report: drift to look at.
    pub lost_replica: bool,
}

/// The decision, pure: `before` is the ledger's row (`None`: never heard from), `had` what it
/// reported running then, `now` what it reports now.
pub fn judge(
    before: Option<&BeatRow>,
    had: &[RunningInstance],
    now: &[RunningInstance],
    beat: &Beat<'_>,
    now_ms: i64,
    lost_after_ms: i64,
) -> Judged {
    let Some(b) = before else {
        return Judged::default();
    };
    let same = |n: &RunningInstance, h: &RunningInstance| {
        (&n.environment, &n.role, n.instance, n.generation) == (&h.environment, &h.role, h.instance, h.generation)
    };
    Judged {
        lost_replica: had.iter().any(|h| !now.iter().any(|n| same(n, h))),
        replace: Liveness::of(b.last_seen, now_ms, lost_after_ms) != Liveness::Ready
            || b.capabilities != beat.capabilities.join(",")
            // A new mesh key (a node's first, or a rotation) re-plans every node's mesh.
            || b.mesh_key.as_deref() != beat.mesh.map(|m| m.0)
            // So do a node's names: other nodes' answers add them.
            || b.mesh_names.as_deref() != beat.mesh.map(|m| m.3),
    }
}

/// Records `node`'s heartbeat at `now_ms`: its repairs as events, each release watched with
/// replicas there judged on it (`state_schema::watch::judge`), what changed judged
/// ([`judge`]), then the row written. A replica gone missing marks drift suspected (the
/// loop's next drift check looks). Returns whether the loop should re-place now (the node
/// changed for placement, or a watch failed and its release is to be rolled back).
pub async fn heartbeat(
    ledger: &Ledger,
    hub: &Hub,
    lost_after_ms: i64,
    node: &str,
    beat: &Beat<'_>,
    now_ms: i64,
) -> Result<bool, LedgerError> {
    ledger.nodes().record_repairs(node, beat.repaired, now_ms).await?;
    let before = ledger.nodes().beat_row(node).await?;
    let now: Vec<RunningInstance> = serde_json::from_str(beat.observed).unwrap_or_default();
    // A release under watch with replicas here: this heartbeat may fail it. Nothing is read
    // while nothing is watched.
    let until = match hub.watching.get(now_ms) {
        Some(until) => until,
        None => {
            let until = ledger.deployments().watched_until().await?;
            hub.watching.set(until, now_ms);
            until
        }
    };
    let watch_failed = now_ms < until
        && ledger
            .deployments()
            .watch_beat(node, &now, now_ms, state_schema::watch::judge)
            .await?;
    let had: Vec<RunningInstance> = before
        .as_ref()
        .and_then(|b| b.observed.as_deref())
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    let judged = judge(before.as_ref(), &had, &now, beat, now_ms, lost_after_ms);
    if judged.lost_replica {
        hub.drift_suspected.store(true, Ordering::Relaxed);
    }
    ledger.nodes().record_beat(node, beat, now_ms).await?;
    Ok(watch_failed || judged.replace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(role: &str, generation: u64) -> RunningInstance {
        serde_json::from_value(serde_json::json!({
            "environment": "web-prod", "role": role, "instance": 0, "generation": generation,
            "healthy": true,
        }))
        .expect("a replica")
    }

    fn beat<'a>(caps: &'a [String], mesh: Option<(&'a str, u16, Option<&'a str>, &'a str)>) -> Beat<'a> {
        Beat {
            agent_version: "1",
            capabilities: caps,
            host: None,
            observed: "[]",
            repaired: &[],
            taken_subnets: "",
            mesh,
        }
    }

    fn row(last_seen: i64, caps: &str, key: Option<&str>) -> BeatRow {
        BeatRow {
            last_seen: Some(last_seen),
            capabilities: caps.into(),
            observed: None,
            mesh_key: key.map(Into::into),
            mesh_names: key.map(|_| "[]".into()),
        }
    }

    #[test]
    fn a_heartbeat_changes_placement_only_when_the_node_does() {
        let caps = vec!["docker".to_owned()];
        let now = 1_000_000;
        let lost = 300_000;
        let same = row(now - 1_000, "docker", Some("k"));
        let b = beat(&caps, Some(("k", 51820, None, "[]")));
        assert_eq!(judge(Some(&same), &[], &[], &b, now, lost), Judged::default());
        // Never heard from: nothing to compare with.
        assert_eq!(judge(None, &[], &[], &b, now, lost), Judged::default());
        // Silent long enough to be unhealthy, a capability more, a new mesh key: re-place.
        let silent = row(now - 200_000, "docker", Some("k"));
        assert!(judge(Some(&silent), &[], &[], &b, now, lost).replace);
        let fewer = row(now - 1_000, "", Some("k"));
        assert!(judge(Some(&fewer), &[], &[], &b, now, lost).replace);
        let rotated = row(now - 1_000, "docker", Some("old"));
        assert!(judge(Some(&rotated), &[], &[], &b, now, lost).replace);
    }

    #[test]
    fn a_replica_left_out_of_a_report_is_suspected_drift() {
        let caps = vec!["docker".to_owned()];
        let before = row(999_000, "docker", None);
        let b = beat(&caps, None);
        let had = [replica("web", 2), replica("worker", 2)];
        let j = judge(Some(&before), &had, &[replica("web", 2)], &b, 1_000_000, 300_000);
        assert!(j.lost_replica && !j.replace);
        // A new generation replacing the old one is a replica missing too (the old one).
        assert!(judge(Some(&before), &had[..1], &[replica("web", 3)], &b, 1_000_000, 300_000).lost_replica);
        assert!(!judge(Some(&before), &had, &had, &b, 1_000_000, 300_000).lost_replica);
    }
}
