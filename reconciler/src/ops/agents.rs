//! The agents' use cases: a heartbeat judged against what the ledger held of its node (does
//! placement see the node differently now? did a replica go missing? does a watched release
//! fail on it?) and recorded with its volumes and mesh; enrolment and a certificate's
//! renewal (signed by the node CA, `pki`, then recorded); a lease renewed. Leases and
//! completions go through the group commit (`ops::group`). The agent API (`http::agent`,
//! `http::enrolment`) parses and authorises, calls these, and answers.

use crate::config::ControlConfig;
use crate::hub::Hub;
use crate::pki::{Issued, PkiError, sign_node_csr};
use crate::store::fleet::{Beat, BeatRow, CertRecord, Enrolment, TokenRecord};
use crate::store::volumes::Measured;
use crate::store::{LeaseToken, Ledger, LedgerError, Refused};
use agent_proto::Refusal;
use agent_proto::RunningInstance;
use state_schema::declared::Declared;
use state_schema::generations::Status;
use state_schema::placement::Liveness;
use state_schema::watch::Seen;
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

/// What one heartbeat brings, checked and bounded by the agent API.
pub struct Heartbeat<'a> {
    pub beat: Beat<'a>,
    /// The volumes the node measured: only rows naming this node are updated.
    pub volumes: &'a [Measured],
    /// The mesh generation the node applied and its links as it says (JSON), when it is in
    /// the mesh.
    pub mesh: Option<(u64, &'a str)>,
}

/// Records `node`'s heartbeat at `now_ms`: its volumes' sizes, its repairs as events, each
/// release watched with replicas there judged on it (`state_schema::watch::judge`), what
/// changed judged ([`judge`]), the row written, then its mesh's applied generation and links.
/// A replica gone missing marks drift suspected (the loop's next drift check looks); a node
/// placement sees differently, or a failed watch, wakes the loop now. Returns the node's
/// newer mesh (generation, spec), if it has not applied the newest yet.
pub async fn heartbeat(
    ledger: &Ledger,
    hub: &Hub,
    lost_after_ms: i64,
    node: &str,
    hb: &Heartbeat<'_>,
    now_ms: i64,
) -> Result<Option<(i64, String)>, LedgerError> {
    let beat = &hb.beat;
    ledger.volumes().record_volume_use(node, hb.volumes, now_ms).await?;
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
    let watch_failed = now_ms < until && watch_beat(ledger, node, &now, now_ms).await?;
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
    if watch_failed || judged.replace {
        // The node is ready (again) or can run other things, or a release is to be rolled
        // back: the loop looks now, not at its next interval.
        hub.hint.notify_one();
    }
    match hb.mesh {
        Some((applied, links)) => ledger.nodes().mesh_beat(node, applied, links, now_ms).await,
        None => Ok(None),
    }
}

/// Judges node `node`'s heartbeat (`observed`, at `at_ms`) against every generation under
/// watch with replicas there (`state_schema::watch::judge`); records the first failure of
/// each. Whether one was recorded.
async fn watch_beat(
    ledger: &Ledger,
    node: &str,
    observed: &[RunningInstance],
    at_ms: i64,
) -> Result<bool, LedgerError> {
    let seen: Vec<Seen<'_>> = observed
        .iter()
        .map(|i| Seen {
            environment: &i.environment,
            role: &i.role,
            instance: i.instance,
            generation: i.generation,
            healthy: i.healthy,
        })
        .collect();
    let mut failed = false;
    for w in ledger.deployments().watched(at_ms).await? {
        let generation = u64::try_from(w.generation).unwrap_or(0);
        // Watched while in progress: a canary, between its first share and its switch.
        let canary = w.status == Status::InProgress;
        if let Some(why) = state_schema::watch::judge(&w.spec, generation, w.watch_from, node, at_ms, &seen, canary) {
            failed |= ledger
                .deployments()
                .record_watch_failure(&w.environment, w.generation, &why)
                .await?;
        }
    }
    Ok(failed)
}

/// Extends the caller's leases by `ttl_ms`: each one's new expiry, or why not.
pub async fn renew_leases(
    ledger: &Ledger,
    tokens: &[LeaseToken],
    ttl_ms: i64,
    now_ms: i64,
) -> Result<Vec<Result<i64, Refused>>, LedgerError> {
    ledger.jobs().renew(tokens, ttl_ms, now_ms).await
}

/// Why enrolment or a renewal gave no certificate.
#[derive(Debug)]
pub enum NotIssued {
    /// Refused, with the agent wire's code and the daemon's words.
    Refused(Refusal, &'static str),
    /// The node CA could not sign (its files), or the ledger failed.
    Failed(String),
}

impl From<LedgerError> for NotIssued {
    fn from(e: LedgerError) -> Self {
        NotIssued::Failed(e.to_string())
    }
}

fn signed(control: &ControlConfig, csr: &str, node: &str) -> Result<Issued, NotIssued> {
    let (Some(ca_cert), Some(ca_key)) = (&control.ca_cert, &control.ca_key) else {
        return Err(NotIssued::Refused(
            Refusal::NoControlCa,
            "the control plane has no CA configured",
        ));
    };
    match sign_node_csr(csr, node, control.node_cert_hours, ca_cert, ca_key) {
        Ok(i) => Ok(i),
        Err(PkiError::Refused(message, r)) => Err(NotIssued::Refused(r, message)),
        Err(e) => Err(NotIssued::Failed(e.to_string())),
    }
}

/// A certificate issued to a node, with what its answer carries besides: the CA bundle it
/// trusts from now on (during a rotation, the new CA and the ones still trusted, so it
/// verifies the control plane whichever of them its certificate has) and the control plane's
/// id. Both are read before anything is written.
pub struct Certified {
    pub issued: Issued,
    pub bundle: String,
    pub control_plane: String,
}

/// What the answer needs besides the certificate.
async fn answer(ledger: &Ledger, control: &ControlConfig) -> Result<(String, String), NotIssued> {
    let bundle = control.ca_bundle().map_err(|e| NotIssued::Failed(e.to_string()))?;
    Ok((bundle, ledger.control_plane().await?))
}

/// What enrolment asks, checked for shape by the API.
pub struct Enrol<'a> {
    pub node: &'a str,
    pub token: &'a str,
    pub csr: &'a str,
    pub age_recipient: &'a str,
}

/// Enrols a node: its one-time token first (one indexed read; nothing else is looked at
/// without it), then that `branch` declares it and has not retired it, that its recipient is
/// an age X25519 one, then its signing request signed by the node CA; the node, its
/// recipient and certificate are recorded in one transaction that spends the token. Every
/// refusal comes before the write and records nothing.
pub async fn enrol(
    ledger: &Ledger,
    control: &ControlConfig,
    branch: &str,
    ask: &Enrol<'_>,
    now_ms: i64,
) -> Result<Certified, NotIssued> {
    let token = ledger.nodes().enrolment_token(ask.token).await?;
    if let Some(r) = token_refusal(token.as_ref(), ask.node, now_ms) {
        tracing::warn!(node = %ask.node, code = r.code(), "enrolment refused");
        return Err(NotIssued::Refused(r, "the enrolment token does not admit this node"));
    }
    match super::nodes::declared_node(ledger, branch, ask.node).await? {
        Declared::Yes { .. } | Declared::Draining { .. } => {}
        Declared::Retired => {
            return Err(NotIssued::Refused(Refusal::NodeRetired, "the node is retired in Git"));
        }
        Declared::No => {
            return Err(NotIssued::Refused(
                Refusal::NodeNotDeclared,
                "no node of that name is declared in the accepted state",
            ));
        }
    }
    if !ask.age_recipient.starts_with("age1") || pushleft_secrets::parse_recipient(ask.age_recipient).is_err() {
        return Err(NotIssued::Refused(
            Refusal::RecipientInvalid,
            "the age recipient is not an age1… X25519 recipient",
        ));
    }
    let issued = signed(control, ask.csr, ask.node)?;
    let (bundle, control_plane) = answer(ledger, control).await?;
    let e = Enrolment {
        node: ask.node,
        token: ask.token,
        age_recipient: ask.age_recipient,
        fingerprint: &issued.fingerprint,
        ca: &issued.ca_fingerprint,
        not_after_ms: issued.not_after_ms,
    };
    match ledger.nodes().enroll(&e, now_ms).await? {
        None => {
            tracing::info!(node = %ask.node, fingerprint = %issued.fingerprint, "node enrolled");
            Ok(Certified {
                issued,
                bundle,
                control_plane,
            })
        }
        Some(r) => Err(NotIssued::Refused(r, "the enrolment token was used meanwhile")),
    }
}

/// Renews `node`'s certificate (`old`, the one it called with) from a new key's signing
/// request, signed by the node CA and recorded.
pub async fn renew_certificate(
    ledger: &Ledger,
    control: &ControlConfig,
    node: &str,
    old: &str,
    csr: &str,
    now_ms: i64,
) -> Result<Certified, NotIssued> {
    let issued = signed(control, csr, node)?;
    let (bundle, control_plane) = answer(ledger, control).await?;
    ledger
        .nodes()
        .add_renewed_certificate(node, old, &issued, now_ms)
        .await?;
    tracing::info!(node = %node, fingerprint = %issued.fingerprint, "certificate renewed");
    Ok(Certified {
        issued,
        bundle,
        control_plane,
    })
}

/// Why an enrolment token does not admit `node` at `now_ms` (checked without writing; the
/// enrolment's write spends it only if it still is unused and live): unknown, used, expired,
/// or another node's.
pub fn token_refusal(token: Option<&TokenRecord>, node: &str, now_ms: i64) -> Option<Refusal> {
    let Some(t) = token else {
        return Some(Refusal::TokenUnknown);
    };
    if t.used_at.is_some() {
        Some(Refusal::TokenUsed)
    } else if t.expires_at <= now_ms {
        Some(Refusal::TokenExpired)
    } else if t.node != node {
        Some(Refusal::TokenWrongNode)
    } else {
        None
    }
}

/// Why a client certificate does not admit a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertRefusal {
    Unknown,
    Revoked,
    Expired,
}

/// Whether a certificate's record (one this control plane issued) admits its node at `now_ms`:
/// not revoked, not expired.
pub fn certificate_refusal(c: &CertRecord, now_ms: i64) -> Option<CertRefusal> {
    if c.revoked_at.is_some() {
        Some(CertRefusal::Revoked)
    } else if c.not_after <= now_ms {
        Some(CertRefusal::Expired)
    } else {
        None
    }
}

/// The node a client certificate (by fingerprint) admits, and until when; the first use of a
/// renewed certificate revokes the one it replaced.
pub async fn admit(
    ledger: &Ledger,
    fingerprint: &str,
    now_ms: i64,
) -> Result<Result<(String, i64), CertRefusal>, LedgerError> {
    let Some(c) = ledger.nodes().certificate_record(fingerprint).await? else {
        return Ok(Err(CertRefusal::Unknown));
    };
    if let Some(why) = certificate_refusal(&c, now_ms) {
        return Ok(Err(why));
    }
    if let (Some(old), None) = (&c.replaces, c.replaced_revoked) {
        ledger.nodes().revoke_replaced(&c.node, old, now_ms).await?;
    }
    Ok(Ok((c.node, c.not_after)))
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

    #[test]
    fn a_token_admits_its_own_node_once_before_it_expires() {
        let t = |node: &str, used_at| TokenRecord {
            node: node.into(),
            expires_at: 2_000,
            used_at,
        };
        assert_eq!(token_refusal(None, "n1", 1_000), Some(Refusal::TokenUnknown));
        assert_eq!(
            token_refusal(Some(&t("n1", Some(5))), "n1", 1_000),
            Some(Refusal::TokenUsed)
        );
        assert_eq!(
            token_refusal(Some(&t("n1", None)), "n1", 2_000),
            Some(Refusal::TokenExpired)
        );
        assert_eq!(
            token_refusal(Some(&t("n2", None)), "n1", 1_000),
            Some(Refusal::TokenWrongNode)
        );
        assert_eq!(token_refusal(Some(&t("n1", None)), "n1", 1_999), None);
    }

    #[test]
    fn a_certificate_admits_only_while_unrevoked_and_valid() {
        let c = |revoked_at| CertRecord {
            node: "n1".into(),
            not_after: 2_000,
            revoked_at,
            replaces: None,
            replaced_revoked: None,
        };
        assert_eq!(certificate_refusal(&c(Some(1)), 1_000), Some(CertRefusal::Revoked));
        assert_eq!(certificate_refusal(&c(None), 2_000), Some(CertRefusal::Expired));
        assert_eq!(certificate_refusal(&c(None), 1_999), None);
    }
}
