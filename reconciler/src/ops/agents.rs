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
use state_schema::placement::{Liveness, heartbeats};
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
    /// The node's age recipient as it says (checked by [`valid_recipient`]): kept only when
    /// the ledger holds none for the node, as after a re-admission ([`readmit`]).
    pub age_recipient: Option<&'a str>,
    /// The node's environment networks as (environment, pool index): kept as the ledger's
    /// subnets while a rebuild waits for its nodes (`Hub::rebuilding`), ignored otherwise.
    pub networks: &'a [(String, i64)],
}

/// Whether `r` is an age X25519 recipient (`age1…`), the only kind a node's secrets are
/// sealed to.
pub fn valid_recipient(r: &str) -> bool {
    r.len() <= 128 && r.starts_with("age1") && pushleft_secrets::parse_recipient(r).is_ok()
}

/// Records `node`'s heartbeat at `now_ms`: its volumes' sizes, its repairs as events, each
/// release watched with replicas there judged on it (`state_schema::watch::judge`), what
/// changed judged ([`judge`]), the row written, then its mesh's applied generation and links.
/// A replica gone missing marks drift suspected (the loop's next drift check looks); a node
/// placement sees differently, or a failed watch, wakes the loop now. The node is told when to
/// beat next (`cadence`: the fleet's ceiling a second and the shortest interval, in ms; the
/// interval from the fleet's size, spread by a stagger drawn here), and the row keeps the
/// grace that interval gives it.
pub async fn heartbeat(
    ledger: &Ledger,
    hub: &Hub,
    (lost_after_ms, cadence): (i64, (u32, i64)),
    node: &str,
    hb: &Heartbeat<'_>,
    now_ms: i64,
) -> Result<Beaten, LedgerError> {
    let nodes = match hub.fleet_size.get(now_ms) {
        Some(n) => n,
        None => {
            let n = ledger.nodes().enrolled_count().await?;
            hub.fleet_size.set(n, now_ms);
            n
        }
    };
    let mean = heartbeats::mean_interval_ms(nodes, cadence.0, cadence.1);
    let next_ms = heartbeats::told_interval_ms(mean, stagger());
    let beat = &Beat {
        grace_ms: heartbeats::grace_ms(next_ms),
        ..hb.beat
    };
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
    // Before the beat is recorded: a rebuild's wait ends once every node is heard from, and
    // its plan must find the subnets the node has.
    // A rebuild's wait trusts its nodes (certificates of nodes Git declares) for what they
    // hold, each for itself only: subnets and volume generations with valid names.
    if hub.rebuilding.load(Ordering::Relaxed) {
        if !hb.networks.is_empty() {
            ledger.nodes().adopt_subnets(node, hb.networks).await?;
        }
        let named = |s: &str| state_schema::values::Name::new(s).is_ok();
        let volumes: Vec<Measured> = hb
            .volumes
            .iter()
            .filter(|v| named(&v.environment) && named(&v.volume))
            .cloned()
            .collect();
        if !volumes.is_empty() {
            ledger.volumes().adopt_volumes(node, &volumes, now_ms).await?;
        }
    }
    // A node whose mesh the ledger never heard of that has applied one (a ledger rebuilt
    // under it): its next mesh is numbered after the one it holds, which it would otherwise
    // ignore as older.
    if let (Some(b), Some((applied, _))) = (&before, hb.mesh)
        && b.mesh_key.is_none()
        && applied > 0
    {
        ledger.nodes().mesh_floor(node, applied).await?;
    }
    ledger.nodes().record_beat(node, beat, now_ms).await?;
    // A re-admitted node's recipient: the ledger learns it from the node's first heartbeat.
    if let (Some(b), Some(r)) = (&before, hb.age_recipient)
        && b.age_recipient.is_empty()
    {
        ledger.nodes().learn_recipient(node, r, now_ms).await?;
    }

    if watch_failed || judged.replace {
        // The node is ready (again) or can run other things, or a release is to be rolled
        // back: the loop looks now, not at its next interval.
        hub.hint.notify_one();
    }
    let mesh = match hb.mesh {
        Some((applied, links)) => ledger.nodes().mesh_beat(node, applied, links, now_ms).await?,
        None => None,
    };
    Ok(Beaten { mesh, next_ms })
}

/// What a heartbeat answers: the node's newer mesh (generation, spec), if it has not applied
/// the newest yet, and when to beat next.
#[derive(Debug)]
pub struct Beaten {
    pub mesh: Option<(i64, String)>,
    pub next_ms: i64,
}

/// A stagger in `[0, 1)` for one node's next interval (the middle when randomness fails:
/// beats stay under the ceiling either way).
fn stagger() -> f64 {
    let mut b = [0u8; 4];
    match getrandom::fill(&mut b) {
        Ok(()) => f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.5,
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
    if !valid_recipient(ask.age_recipient) {
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
/// renewed certificate revokes the one it replaced. With `readmission` (a control plane
/// rebuilt without its ledger), a certificate the ledger does not hold is judged by
/// [`readmission`] from what it says of itself (`der`, verified by the TLS handshake) and,
/// when admitted, recorded.
pub async fn admit(
    ledger: &Ledger,
    fingerprint: &str,
    der: &[u8],
    readmit: Option<&Readmission>,
    now_ms: i64,
) -> Result<Result<(String, i64), CertRefusal>, LedgerError> {
    let Some(c) = ledger.nodes().certificate_record(fingerprint).await? else {
        return match readmit {
            Some(r) => readmit_presented(ledger, r, fingerprint, der, now_ms).await,
            None => Ok(Err(CertRefusal::Unknown)),
        };
    };
    if let Some(why) = certificate_refusal(&c, now_ms) {
        return Ok(Err(why));
    }
    if let (Some(old), None) = (&c.replaces, c.replaced_revoked) {
        ledger.nodes().revoke_replaced(&c.node, old, now_ms).await?;
    }
    Ok(Ok((c.node, c.not_after)))
}

/// How a control plane rebuilt without its ledger re-admits its nodes
/// (`control.readmit_nodes`): the applied branch, whose accepted state must declare a node,
/// and the control CAs a certificate may come from, as (fingerprint, DER).
pub struct Readmission {
    pub branch: String,
    pub cas: Vec<(String, Vec<u8>)>,
}

/// What a client certificate the ledger does not hold says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Presented {
    /// Its common name: the node it was issued to (`pki::sign_node_csr` writes it so).
    pub node: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
    /// The fingerprint of the control CA whose key signed it, when one of them did.
    pub ca: Option<String>,
}

/// Reads `der` as a certificate and finds which of `cas` signed it; `None` when it does not
/// parse or names no node.
pub fn presented(der: &[u8], cas: &[(String, Vec<u8>)]) -> Option<Presented> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let node = cert.subject().iter_common_name().next()?.as_str().ok()?.to_owned();
    let ca = cas.iter().find_map(|(fingerprint, ca_der)| {
        let (_, ca) = X509Certificate::from_der(ca_der).ok()?;
        cert.verify_signature(Some(ca.public_key()))
            .is_ok()
            .then(|| fingerprint.clone())
    });
    Some(Presented {
        node,
        not_before_ms: cert.validity().not_before.timestamp().saturating_mul(1000),
        not_after_ms: cert.validity().not_after.timestamp().saturating_mul(1000),
        ca,
    })
}

/// The decision, pure: whether a certificate the ledger does not hold re-admits its node,
/// given what the accepted state declares of that node. Only a certificate a control CA
/// signed, valid now, for a node Git declares (active or draining); whether the ledger knew
/// the node is the write's to check (`store::fleet::Nodes::readmit` writes only a node it
/// never knew).
pub fn readmission(p: &Presented, declared: &Declared, now_ms: i64) -> Result<(), CertRefusal> {
    if p.ca.is_none() || p.not_before_ms > now_ms {
        return Err(CertRefusal::Unknown);
    }
    if p.not_after_ms <= now_ms {
        return Err(CertRefusal::Expired);
    }
    match declared {
        Declared::Yes { .. } | Declared::Draining { .. } => Ok(()),
        Declared::No | Declared::Retired => Err(CertRefusal::Unknown),
    }
}

/// Judges and, when it passes, records a certificate the ledger does not hold.
async fn readmit_presented(
    ledger: &Ledger,
    r: &Readmission,
    fingerprint: &str,
    der: &[u8],
    now_ms: i64,
) -> Result<Result<(String, i64), CertRefusal>, LedgerError> {
    let Some(p) = presented(der, &r.cas) else {
        return Ok(Err(CertRefusal::Unknown));
    };
    if p.node.is_empty() || p.node.len() > 63 {
        return Ok(Err(CertRefusal::Unknown));
    }
    let declared = super::nodes::declared_node(ledger, &r.branch, &p.node).await?;
    if let Err(why) = readmission(&p, &declared, now_ms) {
        return Ok(Err(why));
    }
    let written = ledger
        .nodes()
        .readmit(
            &crate::store::fleet::Readmitted {
                node: &p.node,
                fingerprint,
                ca: p.ca.as_deref().unwrap_or_default(),
                issued_at_ms: p.not_before_ms,
                not_after_ms: p.not_after_ms,
            },
            now_ms,
        )
        .await?;
    if !written {
        return Ok(Err(CertRefusal::Unknown));
    }
    tracing::warn!(node = %p.node, fingerprint, "a node the ledger did not know re-admitted by its certificate");
    Ok(Ok((p.node, p.not_after_ms)))
}

/// The executors a heartbeat offers that are names (lowercase and `-`, at most 32 bytes): the
/// others are left out, not refused.
pub fn offered(hb: &agent_proto::Heartbeat) -> Vec<String> {
    hb.capabilities
        .iter()
        .filter(|c| !c.is_empty() && c.len() <= 32 && c.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'))
        .cloned()
        .collect()
}

/// Why a heartbeat is refused whole: more than its limits, a host that is no machine id, a
/// mesh that is not a WireGuard public key, a port and an address.
pub fn malformed(hb: &agent_proto::Heartbeat) -> Option<&'static str> {
    if hb.running.len() > agent_proto::MAX_HEARTBEAT_INSTANCES
        || hb.capabilities.len() > 16
        || hb.repaired.len() > agent_proto::MAX_HEARTBEAT_REPAIRS
    {
        return Some("the heartbeat reports more than its limits");
    }
    if !hb.running.iter().all(agent_proto::RunningInstance::bounded) {
        return Some("the heartbeat reports an image, signer or fingerprint longer than its limit");
    }
    if hb.host.as_deref().is_some_and(|h| !agent_proto::valid_host(h)) {
        return Some("the heartbeat's host is not a machine id");
    }
    if hb.taken_subnets.len() > agent_proto::MAX_TAKEN_SUBNETS {
        return Some("the heartbeat reports more taken subnets than the pool has");
    }
    if hb.networks.len() > agent_proto::MAX_HEARTBEAT_NETWORKS {
        return Some("the heartbeat reports more networks than its limit");
    }
    if hb.volumes.len() > agent_proto::MAX_HEARTBEAT_VOLUMES {
        return Some("the heartbeat reports more volumes than its limit");
    }
    if hb.mesh.as_ref().is_some_and(|m| !m.valid()) {
        return Some("the heartbeat's mesh is not a WireGuard public key, a port and an IP address");
    }
    if hb.age_recipient.as_deref().is_some_and(|r| !valid_recipient(r)) {
        return Some("the heartbeat's age recipient is not an age1… X25519 recipient");
    }
    None
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
            protocol: agent_proto::PROTOCOL,
            capabilities: caps,
            host: None,
            observed: "[]",
            repaired: &[],
            taken_subnets: "",
            mesh,
            grace_ms: 0,
        }
    }

    fn row(last_seen: i64, caps: &str, key: Option<&str>) -> BeatRow {
        BeatRow {
            last_seen: Some(last_seen),
            capabilities: caps.into(),
            observed: None,
            mesh_key: key.map(Into::into),
            mesh_names: key.map(|_| "[]".into()),
            age_recipient: "age1x".into(),
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

    /// A CA and a node certificate it signed (common name `node`), as DER.
    fn signed(node: &str) -> (Vec<u8>, Vec<u8>) {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "Pushleft control CA");
        let ca_cert = ca.self_signed(&ca_key).expect("ca");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(vec![node.to_owned()]).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, node);
        let cert = p.signed_by(&key, &issuer).expect("signed");
        (ca_cert.der().to_vec(), cert.der().to_vec())
    }

    #[test]
    fn a_presented_certificate_names_its_node_and_the_ca_that_signed_it() {
        let (ca, cert) = signed("n1");
        let (other_ca, _) = signed("n1");
        let cas = vec![("other".to_owned(), other_ca), ("ours".to_owned(), ca)];
        let p = presented(&cert, &cas).expect("parses");
        assert_eq!(p.node, "n1");
        assert_eq!(
            p.ca.as_deref(),
            Some("ours"),
            "the CA whose key signed it, not one with the same name"
        );
        assert!(p.not_before_ms < p.not_after_ms);
        assert_eq!(presented(&cert, &cas[..1]).expect("parses").ca, None);
        assert_eq!(presented(b"not a certificate", &cas), None);
    }

    #[test]
    fn readmission_takes_a_valid_certificate_of_a_declared_node_only() {
        let p = Presented {
            node: "n1".into(),
            not_before_ms: 1_000,
            not_after_ms: 5_000,
            ca: Some("ours".into()),
        };
        let yes = Declared::Yes { pool: "main".into() };
        let draining = Declared::Draining { pool: "main".into() };
        assert_eq!(readmission(&p, &yes, 2_000), Ok(()));
        assert_eq!(readmission(&p, &draining, 2_000), Ok(()));
        assert_eq!(readmission(&p, &Declared::No, 2_000), Err(CertRefusal::Unknown));
        assert_eq!(readmission(&p, &Declared::Retired, 2_000), Err(CertRefusal::Unknown));
        assert_eq!(readmission(&p, &yes, 5_000), Err(CertRefusal::Expired));
        assert_eq!(readmission(&p, &yes, 999), Err(CertRefusal::Unknown), "not valid yet");
        let unsigned = Presented { ca: None, ..p };
        assert_eq!(readmission(&unsigned, &yes, 2_000), Err(CertRefusal::Unknown));
    }
}
