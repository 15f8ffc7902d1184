//! The agent protocol's wire types, owned by this crate alone: the reconciler serves them and
//! the agent's client sends them, and neither sees the other's domain or row types. Every
//! refusal is a stable code from [`Refusal`]; codes are only ever added.
//!
//! Architecture invariant: no I/O, no SQL, no TLS here: types and their JSON form only.

use serde::{Deserialize, Serialize};

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
}

/// `POST /v1/nodes/{node}/token` (operator): a one-time enrolment token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenResponse {
    pub node: String,
    pub token: String,
    pub expires_at_ms: i64,
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
