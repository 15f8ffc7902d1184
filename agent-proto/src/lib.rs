//! The agent protocol's wire types, owned by this crate alone: the reconciler serves them and
//! the agent's client sends them, and neither sees the other's domain or row types. Every
//! refusal is a stable code from [`Refusal`]; codes are only ever added.
//!
//! Architecture invariant: no I/O, no SQL, no TLS here: types, their JSON form, and pure
//! functions of them (names, a certificate's fingerprint).

use serde::{Deserialize, Serialize};

pub mod codes;
mod execution;
mod heartbeat;
pub mod images;
mod logs;
pub mod mesh;
pub mod task;
pub use execution::*;
pub use heartbeat::*;
pub use logs::*;
pub use task::{Capability, Task, is_acme_token};

/// A certificate's fingerprint as the protocol names it everywhere (the CA pin, the agent
/// API's peer, revocations): SHA-256 of its DER, lowercase hex.
pub fn cert_fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(der))
}

/// Length of a control plane's id: hex digits, made at random once per ledger.
pub const CONTROL_PLANE_ID_LEN: usize = 8;

/// Whether `id` is a control plane's id: [`CONTROL_PLANE_ID_LEN`] lowercase hex digits.
pub fn valid_control_plane(id: &str) -> bool {
    id.len() == CONTROL_PLANE_ID_LEN && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The name of an environment's objects on a node's machine: its Docker network and its
/// nftables table (`pl_<control plane>_<environment>_<node>`; its bridge is named from this).
/// The control plane's id is part of it because several control planes may share a machine
/// (two repositories' `pl up`, two fleets on one node) with the same environment and node
/// names; the node because several agents of one control plane may share a machine as several
/// nodes (`pl up` with two nodes, a drain rehearsal). Ids are hex and names are DNS labels, so
/// `_` separates them unambiguously.
pub fn host_object(control_plane: &str, environment: &str, node: &str) -> String {
    format!("pl_{control_plane}_{environment}_{node}")
}

/// The container of one replica (`instance`) at one generation, or of a generation's run of a
/// role (`None`): `pl_<control plane>_<environment>_<role>_<instance>_g<generation>` or
/// `pl_<control plane>_<environment>_<role>_run_g<generation>`. Environment and role names are
/// DNS labels and the control plane's id is hex, none ever contains `_`, so the name reads back
/// to exactly one identity: with `-` between them, an environment `a-web` with role `web` and
/// an environment `a` with role `web-web` once spelled the same container, and one
/// environment's rollout removed the other's replica. The agent still decides ownership by the
/// container's labels, never by its name.
pub fn container_name(
    control_plane: &str,
    environment: &str,
    role: &str,
    instance: Option<u32>,
    generation: u64,
) -> String {
    match instance {
        Some(i) => format!("pl_{control_plane}_{environment}_{role}_{i}_g{generation}"),
        None => format!("pl_{control_plane}_{environment}_{role}_run_g{generation}"),
    }
}

/// The container of replica `index` of `role` that moved `moves` times within `generation`
/// (`state_schema::deployment::Instance::moves`): [`container_name`] when it never moved,
/// else `pl_<control plane>_<environment>_<role>_<index>m<moves>_g<generation>`. A moved
/// replica's new container and the one it replaces run side by side for a moment, on one
/// engine when two nodes share it, so their names differ.
pub fn replica_name(
    control_plane: &str,
    environment: &str,
    role: &str,
    index: u32,
    moves: u32,
    generation: u64,
) -> String {
    match moves {
        0 => container_name(control_plane, environment, role, Some(index), generation),
        m => format!("pl_{control_plane}_{environment}_{role}_{index}m{m}_g{generation}"),
    }
}

/// Largest enrolment request accepted, in bytes.
pub const MAX_ENROLL_BYTES: usize = 16 * 1024;

/// `POST /v1/enroll`: a node declared in Git asks for its first client certificate, with the
/// one-time token an operator made for it (`pl node token NODE`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrollRequest {
    pub node: String,
    /// The one-time enrolment token (`ple_…`).
    pub token: String,
    /// A PKCS#10 certificate signing request (PEM) for the node's own TLS key; its subject's
    /// common name is the node's name.
    pub csr: String,
    /// The node's age recipient (`age1…`): secrets reach the node sealed to it.
    pub age_recipient: String,
}

/// The answer to an accepted enrolment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrollResponse {
    /// The node's client certificate (PEM), signed by the control CA.
    pub certificate: String,
    /// The control CA (PEM), to verify the control plane with from now on.
    pub ca: String,
    /// When the certificate expires, milliseconds since the epoch.
    pub not_after_ms: i64,
    /// The control plane's id ([`valid_control_plane`]), which every host object the node's
    /// agent makes names (empty from a control plane older than the id).
    #[serde(default)]
    pub control_plane: String,
}

/// Most jobs one lease call may take.
pub const MAX_LEASE_BATCH: u32 = 8;
/// Longest a lease call may wait for work, in milliseconds.
pub const MAX_LEASE_WAIT_MS: u64 = 30_000;
/// Largest agent request accepted (heartbeats, completions), in bytes.
pub const MAX_AGENT_BODY_BYTES: usize = 64 * 1024;
/// Largest `detail` a completion may carry (a log tail), in bytes.
pub const MAX_DETAIL_BYTES: usize = 16 * 1024;

/// `POST /v1/agent/lease`: up to `max` jobs targeted at the calling node, waiting up to
/// `wait_ms` for one to be queued.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRequest {
    pub max: u32,
    #[serde(default)]
    pub wait_ms: u64,
    /// The newest mesh generation the agent holds (applied or being applied), when it is in
    /// the mesh: a newer one comes with the lease, and wakes a long poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh_applied: Option<u64>,
}

/// What proves a lease: present it to renew or complete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseProof {
    pub job_id: i64,
    pub lease_token: String,
    pub fencing_token: i64,
}

/// One leased job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeasedJob {
    pub key: String,
    /// What to do: a closed, typed task.
    pub task: Task,
    /// Everything the task needs to run (what with): the agent reads nothing else.
    pub execution: Execution,
    pub attempt: i64,
    pub proof: LeaseProof,
    pub expires_at_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseResponse {
    pub jobs: Vec<LeasedJob>,
    /// The node's mesh, when it is newer than the request's `meshApplied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<mesh::MeshSpec>,
}

/// `POST /v1/agent/renew`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewRequest {
    pub proof: LeaseProof,
}

/// The answer to a renewed lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewResponse {
    /// When the lease now expires, milliseconds since the epoch.
    pub expires_at_ms: i64,
}

/// The answer to `POST /v1/agent/complete`: the outcome was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompleteResponse {
    pub completed: bool,
}

/// How a job ended, as the agent reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Succeeded,
    Retryable,
    Permanent,
}

/// `POST /v1/agent/complete`: one job's end, with its proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteRequest {
    pub proof: LeaseProof,
    pub outcome: Outcome,
    /// A bounded log tail or reason; never a secret.
    #[serde(default)]
    pub detail: String,
    /// What a succeeded `backup-volume` saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupReport>,
    /// What a succeeded `measure-canary` measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<CanaryMeasure>,
}

/// `POST /v1/agent/complete-batch`: several jobs' ends in one request (at most
/// [`MAX_LEASE_BATCH`]), each judged on its own: what one lease handed out can come back at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteBatch {
    pub completions: Vec<CompleteRequest>,
    /// The caller's next lease, taken once the completions are recorded: one round trip per
    /// lease cycle instead of two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseRequest>,
}

/// The answer to a [`CompleteBatch`]: per completion, in order, `None` when it was recorded or
/// the refusal that recorded nothing for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteBatchResponse {
    pub results: Vec<Option<RefusalBody>>,
    /// The lease asked for with the completions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leased: Option<LeaseResponse>,
    /// Why that lease was refused (`node-draining`, `node-retired`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_refused: Option<RefusalBody>,
}

/// `POST /v1/agent/certificate`: a node renews its certificate before it expires, with a new
/// key; the answer is an [`EnrollResponse`]. The old certificate is revoked when the new one
/// is first used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewCertificateRequest {
    pub csr: String,
}

/// Why the control plane refused an agent's request. Each refusal records nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Refusal {
    /// No enrolment token matches.
    TokenUnknown,
    /// The token was used already.
    TokenUsed,
    /// The token's 15 minutes have passed.
    TokenExpired,
    /// The token was made for another node.
    TokenWrongNode,
    /// No node of that name is declared in the applied branch's accepted state.
    NodeNotDeclared,
    /// The node is retired in Git.
    NodeRetired,
    /// The signing request does not parse, or its signature does not verify.
    CsrInvalid,
    /// The signing request names another node.
    CsrNameMismatch,
    /// The age recipient is not an `age1…` X25519 recipient.
    RecipientInvalid,
    /// The control plane holds no CA to sign with (`control.ca_cert`, `control.ca_key`).
    NoControlCa,
    /// The request body is not the expected JSON.
    MalformedRequest,
    /// The client certificate is not one the control plane issued, or was revoked.
    CertificateRevoked,
    /// The client certificate's validity has ended.
    CertificateExpired,
    /// The node is draining in Git: it gets no new work.
    NodeDraining,
    /// The job is another node's.
    NotYourJob,
    /// The lease was taken over (expired and leased again) or ended: its fencing token is stale.
    StaleFencingToken,
    /// A completion's detail looks like a secret (age ciphertext or an identity).
    SecretInResult,
    /// The log stream is over (its reader left, or it was never opened for this node).
    LogStreamGone,
}

impl Refusal {
    /// The stable code, as JSON carries it.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::TokenUnknown => "token-unknown",
            Refusal::TokenUsed => "token-used",
            Refusal::TokenExpired => "token-expired",
            Refusal::TokenWrongNode => "token-wrong-node",
            Refusal::NodeNotDeclared => "node-not-declared",
            Refusal::NodeRetired => "node-retired",
            Refusal::CsrInvalid => "csr-invalid",
            Refusal::CsrNameMismatch => "csr-name-mismatch",
            Refusal::RecipientInvalid => "recipient-invalid",
            Refusal::NoControlCa => "no-control-ca",
            Refusal::MalformedRequest => "malformed-request",
            Refusal::CertificateRevoked => "certificate-revoked",
            Refusal::CertificateExpired => "certificate-expired",
            Refusal::NodeDraining => "node-draining",
            Refusal::NotYourJob => "not-your-job",
            Refusal::StaleFencingToken => "stale-fencing-token",
            Refusal::SecretInResult => "secret-in-result",
            Refusal::LogStreamGone => "log-stream-gone",
        }
    }
}

/// A refusal as it travels: the code and a message with no secret in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalBody {
    pub code: Refusal,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_json_form() {
        for r in [
            Refusal::TokenUnknown,
            Refusal::TokenUsed,
            Refusal::TokenExpired,
            Refusal::TokenWrongNode,
            Refusal::NodeNotDeclared,
            Refusal::NodeRetired,
            Refusal::CsrInvalid,
            Refusal::CsrNameMismatch,
            Refusal::RecipientInvalid,
            Refusal::NoControlCa,
            Refusal::MalformedRequest,
            Refusal::CertificateRevoked,
            Refusal::CertificateExpired,
            Refusal::NodeDraining,
            Refusal::NotYourJob,
            Refusal::StaleFencingToken,
            Refusal::SecretInResult,
            Refusal::LogStreamGone,
        ] {
            let json = serde_json::to_string(&r).expect("json");
            assert_eq!(json, format!("\"{}\"", r.code()));
            assert_eq!(serde_json::from_str::<Refusal>(&json).expect("back"), r);
        }
        let unknown = r#"{"node":"n1","token":"t","csr":"c","ageRecipient":"a","extra":1}"#;
        assert!(
            serde_json::from_str::<EnrollRequest>(unknown).is_err(),
            "unknown fields refused"
        );
    }
}

#[cfg(test)]
mod names {
    use super::*;

    #[test]
    fn container_names_are_one_identity_each() {
        // The collision the hardening review found: environment `a-web` + role `web` against
        // environment `a` + role `web-web`.
        assert_ne!(
            container_name("0123abcd", "a-web", "web", Some(0), 1),
            container_name("0123abcd", "a", "web-web", Some(0), 1)
        );
        // Two control planes with the same environment, role and instance.
        assert_ne!(
            container_name("0123abcd", "a", "web", Some(0), 1),
            container_name("89abcdef", "a", "web", Some(0), 1)
        );
        assert_ne!(host_object("0123abcd", "a", "n1"), host_object("89abcdef", "a", "n1"));
        assert!(valid_control_plane("0123abcd"));
        for bad in ["", "0123abc", "0123ABCD", "0123abcde", "0123_bcd"] {
            assert!(!valid_control_plane(bad), "{bad}");
        }
        // Every split of a run of labels into (environment, role), with instances, runs and
        // generations, gives a distinct name.
        let labels = ["a", "web", "a-web", "web-web", "a-web-web", "0", "run", "g1", "1-g1"];
        let mut seen = std::collections::BTreeMap::new();
        for env in labels {
            for role in labels {
                for instance in [None, Some(0), Some(1), Some(10)] {
                    for moves in [0, 1, 11] {
                        for generation in [1, 10, 11] {
                            let name = match instance {
                                Some(i) => replica_name("0123abcd", env, role, i, moves, generation),
                                None if moves == 0 => container_name("0123abcd", env, role, None, generation),
                                None => continue,
                            };
                            let identity = (env, role, instance, moves, generation);
                            if let Some(other) = seen.insert(name.clone(), identity) {
                                panic!("{name} names both {other:?} and {identity:?}");
                            }
                        }
                    }
                }
            }
        }
    }
}
