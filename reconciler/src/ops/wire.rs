//! The store's rows on the operator's typed wire (`operator_proto`): every mapping from a row
//! to what the API answers, here and nowhere else (wire and row types stay apart). A state the
//! wire does not know is the ledger's corruption, said as such ([`Corrupt`]), never passed on
//! as text.

use crate::store::Event;
use crate::store::backups::BackupRow;
use crate::store::kept::KeptRow;
use crate::store::views::{DeploymentRow, JobRow, RevisionRow};
use crate::store::volumes::VolumeRow;
use operator_proto::backups::{Backup, BackupStatus};
use operator_proto::domains::{Certificate, CertificateState};
use operator_proto::events::{OutboxEntry, OutboxState};
use operator_proto::jobs::{Job, JobState};
use operator_proto::nodes::{MeshLink, Node, NodeMesh, NodeState};
use operator_proto::revisions::{Reason, Revision, Rewrite, Verdict};
use operator_proto::volumes::{Kept, Volume, VolumeState};
use operator_proto::{Action, Canary, Deployment, DeploymentStatus, Hold, Waiting};
use state_schema::rollout::advance::{StepState, canary_standing};

/// A row whose text the wire does not know.
#[derive(Debug, thiserror::Error)]
#[error("a {what} row says {value:?}")]
pub struct Corrupt {
    pub what: &'static str,
    pub value: String,
}

fn spelled<T>(what: &'static str, value: &str, parse: fn(&str) -> Option<T>) -> Result<T, Corrupt> {
    parse(value).ok_or_else(|| Corrupt {
        what,
        value: value.to_owned(),
    })
}

pub fn revision(r: RevisionRow) -> Result<Revision, Corrupt> {
    Ok(Revision {
        id: r.id,
        verdict: spelled("revision's verdict", &r.verdict, Verdict::parse)?,
        branch: r.branch,
        sha: r.sha,
        principals: r.principals,
        reasons: serde_json::from_str::<Vec<ReasonRow>>(&r.reasons)
            .map_err(|_| Corrupt {
                what: "revision's reasons",
                value: r.reasons.clone(),
            })?
            .into_iter()
            .map(|x| Reason {
                code: x.code,
                message: x.message,
            })
            .collect(),
        seen_at_ms: r.seen_at_ms,
    })
}

/// A rejection's reason as the ledger keeps it (JSON text).
#[derive(serde::Deserialize)]
struct ReasonRow {
    code: String,
    message: String,
}

pub fn job(r: JobRow) -> Result<Job, Corrupt> {
    Ok(Job {
        id: r.id,
        state: spelled("job's state", &r.state, JobState::parse)?,
        key: r.key,
        target_node: r.target_node,
        attempts: r.attempts,
        max_attempts: r.max_attempts,
        environment: r.environment,
        generation: r.generation,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        reason: r.reason,
    })
}

pub fn event(e: &Event) -> operator_proto::events::Event {
    operator_proto::events::Event {
        id: e.id,
        at_ms: e.at_ms,
        kind: e.kind.clone(),
        subject: e.subject.clone(),
        detail: e.detail.clone(),
    }
}

pub fn node(r: crate::store::fleet::NodeRow, mesh: Option<&crate::store::mesh::MeshRow>) -> Result<Node, Corrupt> {
    Ok(Node {
        state: spelled("node's state", &r.state, NodeState::parse)?,
        name: r.name,
        pool: r.pool,
        cpu_millis: r.cpu_millis,
        memory_bytes: r.memory_bytes,
        last_seen_ms: r.last_seen_ms,
        agent_version: r.agent_version,
        agent_protocol: r.agent_protocol,
        older_agent: r.older_agent,
        instances: r.instances,
        running: r.running,
        reserved_cpu_millis: r.reserved_cpu_millis,
        reserved_memory_bytes: r.reserved_memory_bytes,
        capabilities: r.capabilities,
        certificate_ca: r.certificate_ca,
        mesh: mesh.map(node_mesh),
    })
}

/// A node's mesh row: its links and the peers judged down are JSON text the agent's
/// heartbeat and the health pass wrote (unreadable text reads as none).
pub fn node_mesh(m: &crate::store::mesh::MeshRow) -> NodeMesh {
    NodeMesh {
        generation: m.generation,
        applied: m.applied,
        links: links(m),
        down: down(m),
    }
}

pub fn links(m: &crate::store::mesh::MeshRow) -> Vec<MeshLink> {
    serde_json::from_str::<Vec<agent_proto::mesh::MeshLink>>(&m.links)
        .unwrap_or_default()
        .into_iter()
        .map(|l| MeshLink {
            node: l.node,
            last_handshake: l.last_handshake,
        })
        .collect()
}

pub fn down(m: &crate::store::mesh::MeshRow) -> Vec<String> {
    serde_json::from_str(&m.down).unwrap_or_default()
}

/// A certificate's state, judged now: `expired` past its end whatever its renewals.
pub fn certificate(r: &crate::store::certificates::CertificateRow, now: i64) -> Certificate {
    let state = match (r.chain.is_some(), r.failures > 0) {
        (true, _) if now > r.not_after => CertificateState::Expired,
        (true, false) => CertificateState::Valid,
        (true, true) => CertificateState::RenewalFailing,
        (false, false) => CertificateState::Pending,
        (false, true) => CertificateState::Failing,
    };
    Certificate {
        hostname: r.hostname.clone(),
        issuer: r.issuer.clone(),
        state,
        not_before_ms: r.not_before,
        not_after_ms: r.not_after,
        renew_after_ms: r.renew_after,
        issued: r.issued,
        failures: r.failures,
        retry_at_ms: r.retry_at,
        last_error: r.last_error.clone(),
    }
}

pub fn rewrite(r: crate::store::rewrites::RewriteRow) -> Rewrite {
    Rewrite {
        branch: r.branch,
        sha: r.sha,
        accepted_sha: r.accepted_sha,
        seen_at_ms: r.seen_at_ms,
        approved_by: r.approved_by,
        approved_at_ms: r.approved_at_ms,
    }
}

pub fn outbox(r: crate::store::outbox::OutboxRow) -> Result<OutboxEntry, Corrupt> {
    Ok(OutboxEntry {
        state: spelled("notification's state", &r.state, OutboxState::parse)?,
        id: r.id,
        target: r.target,
        event_id: r.event_id,
        kind: r.kind,
        payload: r.payload,
        attempts: r.attempts,
        next_at: r.next_at,
        last_error: r.last_error,
        created_at: r.created_at,
        updated_at: r.updated_at,
    })
}

/// Rows on the wire, or the first corrupt one.
pub fn all<R, T>(rows: Vec<R>, f: impl Fn(R) -> Result<T, Corrupt>) -> Result<Vec<T>, Corrupt> {
    rows.into_iter().map(f).collect()
}

pub fn counts(c: crate::store::views::Counts) -> operator_proto::status::Counts {
    operator_proto::status::Counts {
        jobs: c.jobs,
        deployments: c.deployments,
        revisions: c.revisions,
        queue_age_ms: c.queue_age_ms,
        last_event: c.last_event,
        at_ms: c.at_ms,
    }
}

/// A store row on the wire; an action or status the wire does not know is the ledger's
/// corruption, said as such.
pub fn deployment(r: DeploymentRow) -> Result<Deployment, Corrupt> {
    let action = match r.action.as_str() {
        "rollout" => Action::Rollout,
        "teardown" => Action::Teardown,
        other => {
            return Err(Corrupt {
                what: "deployment's action",
                value: other.to_owned(),
            });
        }
    };
    let status = match r.status.as_str() {
        "in-progress" => DeploymentStatus::InProgress,
        "done" => DeploymentStatus::Done,
        "failed" => DeploymentStatus::Failed,
        other => {
            return Err(Corrupt {
                what: "deployment's status",
                value: other.to_owned(),
            });
        }
    };
    // A canary's standing, read by the same code that decides how it advances.
    let state = StepState::from_row(&r.step_state, r.step_due).ok_or_else(|| Corrupt {
        what: "deployment's step state",
        value: r.step_state.clone(),
    })?;
    let canary = match status {
        DeploymentStatus::InProgress => canary_standing(u8::try_from(r.share).unwrap_or(0), state),
        _ => None,
    };
    Ok(Deployment {
        environment: r.environment,
        branch: r.branch,
        generation: r.generation,
        action,
        status,
        step: r.step,
        updated_at_ms: r.updated_at_ms,
        asked: Some(r.asked),
        replicas: r.replicas,
        running: r.running,
        stale: r.stale,
        previous_generation: r.previous_generation,
        waiting: r
            .waiting
            .into_iter()
            .map(|w| Waiting {
                role: w.role.to_string(),
                index: w.index,
                reason: w.reason,
            })
            .collect(),
        hold: r.hold.map(|h| Hold {
            by: h.by,
            at_ms: h.at_ms,
            from: h.from,
            to: h.to,
            generation: h.generation,
            git_hash: h.git_hash,
            released: h.released,
        }),
        canary: canary.map(|c| Canary {
            weight: c.weight,
            waits_for_promote: c.waits_for_promote,
            next_at_ms: c.next_at_ms,
        }),
    })
}

/// A volume and its kept generations (`kept` holds every volume's).
pub fn volume(r: &VolumeRow, kept: &[KeptRow]) -> Volume {
    let kept = kept
        .iter()
        .filter(|k| k.environment == r.environment && k.volume == r.volume)
        .map(|k| Kept {
            generation: k.generation,
            node: k.node.clone(),
            kept_at_ms: k.kept_at,
        })
        .collect();
    Volume {
        environment: r.environment.clone(),
        volume: r.volume.clone(),
        role: r.role.clone(),
        node: r.node.clone(),
        generation: r.generation,
        state: match r.released_at {
            None => VolumeState::InUse,
            Some(_) => VolumeState::Retained,
        },
        size_bytes: r.size_bytes,
        used_bytes: r.bytes,
        measured_at_ms: (r.measured_at > 0).then_some(r.measured_at),
        created_at_ms: r.created_at,
        released_at_ms: r.released_at,
        remove_after_ms: r.released_at.map(|t| t + r.retain_days * 86_400_000),
        moving_to: r.moving_to.clone(),
        move_asked_at_ms: r.move_asked_at,
        moved_from: r.moved_from.clone(),
        moved_up_at_ms: r.moved_up_at,
        move_failure: r.move_failure.clone(),
        kept,
    }
}

pub fn backup(r: BackupRow) -> Result<Backup, Corrupt> {
    Ok(Backup {
        status: BackupStatus::parse(&r.status).ok_or_else(|| Corrupt {
            what: "backup's status",
            value: r.status.clone(),
        })?,
        environment: r.environment,
        volume: r.volume,
        generation: r.generation,
        node: r.node,
        job: r.job_key,
        finished_at_ms: r.finished_at,
        snapshot: r.snapshot,
        bytes: r.bytes,
        data_added: r.data_added,
        reason: r.reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rollbacks::Hold as RowHold;
    use crate::store::views::DeploymentRow;

    fn row() -> DeploymentRow {
        DeploymentRow {
            environment: "api-production".into(),
            branch: "main".into(),
            generation: 4,
            action: "rollout".into(),
            status: "in-progress".into(),
            step: 3,
            updated_at_ms: 1_796_000_000_000,
            asked: 3,
            replicas: 2,
            running: 1,
            stale: 1,
            previous_generation: 3,
            waiting: vec![state_schema::placement::Waiting {
                role: state_schema::values::Name::new("web").expect("name"),
                index: 2,
                reason: "no-capacity".into(),
            }],
            hold: Some(RowHold {
                by: "ops".into(),
                at_ms: 1_796_000_000_001,
                from: 4,
                to: 3,
                generation: 5,
                git_hash: "abc".into(),
                released: false,
            }),
            step_state: "awaits-promote".into(),
            step_due: 0,
            share: 10,
            revision_sha: Some("0123456789ab".into()),
            signer: Some("ops-alice".into()),
            placed: Vec::new(),
        }
    }

    #[test]
    fn the_typed_wire_is_the_documented_json_field_for_field() {
        // The store's row was the wire before the types moved to `operator_proto`: the same
        // bytes, in the same order, with and without the optional parts.
        let mut r = row();
        for canary in [r#","canary":{"weight":10,"waitsForPromote":true}"#, ""] {
            let before = serde_json::to_string(&r).expect("row json");
            let typed = serde_json::to_string(&deployment(r.clone()).expect("typed")).expect("typed json");
            // The canary's standing is read from the step's columns, not kept on the row.
            assert_eq!(
                typed,
                format!("{}{canary}}}", before.strip_suffix('}').expect("an object"))
            );
            // And back: what `pl` reads is what was sent.
            let back: Deployment = serde_json::from_str(&typed).expect("reads back");
            assert_eq!(back, deployment(r.clone()).expect("typed"));
            (r.hold, r.step_state, r.share, r.waiting) = (None, "running".into(), 0, Vec::new());
        }
    }

    #[test]
    fn an_unknown_status_is_the_ledger_s_corruption_not_a_guess() {
        let mut r = row();
        r.status = "paused".into();
        assert!(deployment(r).is_err_and(|e| e.value == "paused"));
    }
}
