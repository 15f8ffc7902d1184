//! The enrolment routes of the API: the node's agent trades the one-time token an operator
//! asked for (`POST /v1/nodes/{node}/token`, made by `ops::nodes`) for a client certificate
//! (`POST /v1/enroll`), and anyone may read the control CA (`GET /v1/ca`) to check it against
//! the fingerprint they were given. Every check comes before any write, the cheap ones first.

use crate::config::Config;
use crate::http::server::{internal, read_body, refused};
use crate::pki::{PkiError, sign_node_csr};
use crate::store::fleet::Enrolment;
use crate::store::{Ledger, now_ms};
use agent_proto::{EnrollRequest, EnrollResponse, MAX_ENROLL_BYTES, Refusal};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use state_schema::declared::Declared;
use std::sync::Arc;

/// Enrolment's own state.
pub struct Enrol {
    pub config: Arc<Config>,
    pub ledger: Arc<Ledger>,
}

/// Enrolment's routes, on the operator API.
pub fn router(state: Arc<Enrol>) -> axum::Router {
    axum::Router::new()
        .route("/v1/enroll", axum::routing::post(enroll))
        .route("/v1/ca", axum::routing::get(ca))
        .with_state(state)
}

async fn declared(s: &Enrol, node: &str) -> Result<(), Response> {
    match crate::ops::nodes::declared_node(&s.ledger, &s.config.source.branch, node).await {
        Ok(Declared::Yes { .. } | Declared::Draining { .. }) => Ok(()),
        Ok(Declared::Retired) => Err(refused(Refusal::NodeRetired, "the node is retired in Git")),
        Ok(Declared::No) => Err(refused(
            Refusal::NodeNotDeclared,
            "no node of that name is declared in the accepted state",
        )),
        Err(e) => Err(internal(e)),
    }
}

/// `POST /v1/enroll`: a token, a signing request and an age recipient in; a certificate out.
pub async fn enroll(State(s): State<Arc<Enrol>>, body: axum::body::Body) -> Response {
    let body = match read_body(body, MAX_ENROLL_BYTES).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let Ok(req) = serde_json::from_slice::<EnrollRequest>(&body) else {
        return refused(Refusal::MalformedRequest, "expected {node, token, csr, ageRecipient}");
    };
    let now = now_ms();
    // The token first: it costs one indexed read, and nothing else is looked at without it.
    match s.ledger.nodes().check_enrolment_token(&req.node, &req.token, now).await {
        Ok(None) => {}
        Ok(Some(r)) => {
            tracing::warn!(node = %req.node, code = r.code(), "enrolment refused");
            return refused(r, "the enrolment token does not admit this node");
        }
        Err(e) => return internal(e),
    }
    if let Err(r) = declared(&s, &req.node).await {
        return r;
    }
    if !req.age_recipient.starts_with("age1") || pushleft_secrets::parse_recipient(&req.age_recipient).is_err() {
        return refused(
            Refusal::RecipientInvalid,
            "the age recipient is not an age1… X25519 recipient",
        );
    }
    let (Some(ca_cert), Some(ca_key)) = (&s.config.control.ca_cert, &s.config.control.ca_key) else {
        return refused(Refusal::NoControlCa, "the control plane has no CA configured");
    };
    let issued = match sign_node_csr(&req.csr, &req.node, s.config.control.node_cert_hours, ca_cert, ca_key) {
        Ok(i) => i,
        Err(PkiError::Refused(message, r)) => return refused(r, message),
        Err(e) => return internal(e),
    };
    let e = Enrolment {
        node: &req.node,
        token: &req.token,
        age_recipient: &req.age_recipient,
        fingerprint: &issued.fingerprint,
        ca: &issued.ca_fingerprint,
        not_after_ms: issued.not_after_ms,
    };
    // The CA bundle the node trusts from now on: during a rotation, the new CA and the ones
    // still trusted, so it verifies the control plane whichever of them its certificate has.
    let bundle = match s.config.control.ca_bundle() {
        Ok(b) => b,
        Err(e) => return internal(e),
    };
    let control_plane = match s.ledger.control_plane().await {
        Ok(id) => id,
        Err(e) => return internal(e),
    };
    match s.ledger.nodes().enroll(&e, now).await {
        Ok(None) => {
            tracing::info!(node = %req.node, fingerprint = %issued.fingerprint, "node enrolled");
            axum::Json(EnrollResponse {
                certificate: issued.pem,
                ca: bundle,
                not_after_ms: issued.not_after_ms,
                control_plane,
            })
            .into_response()
        }
        Ok(Some(r)) => refused(r, "the enrolment token was used meanwhile"),
        Err(e) => internal(e),
    }
}

/// `GET /v1/ca`: the control CA certificate, public, for an agent to check against the
/// fingerprint it was given before it trusts anything else.
pub async fn ca(State(s): State<Arc<Enrol>>) -> Response {
    if s.config.control.ca_cert.is_none() {
        return refused(Refusal::NoControlCa, "the control plane has no CA configured");
    }
    match s.config.control.ca_bundle() {
        Ok(pem) => ([("content-type", "application/x-pem-file")], pem).into_response(),
        Err(e) => internal(e),
    }
}
