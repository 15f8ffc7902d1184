//! The enrolment routes of the API: the node's agent trades the one-time token an operator
//! asked for (`POST /v1/nodes/{node}/token`, made by `ops::nodes`) for a client certificate
//! (`POST /v1/enroll`), and anyone may read the control CA (`GET /v1/ca`) to check it against
//! the fingerprint they were given. Every check comes before any write, the cheap ones first.

use crate::config::Config;
use crate::http::server::{internal, read_body, refused};
use crate::store::{Ledger, now_ms};
use agent_proto::{EnrollRequest, MAX_ENROLL_BYTES, Refusal};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
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

/// `POST /v1/enroll`: a token, a signing request and an age recipient in; a certificate out.
pub async fn enroll(State(s): State<Arc<Enrol>>, body: axum::body::Body) -> Response {
    let body = match read_body(body, MAX_ENROLL_BYTES).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let Ok(req) = serde_json::from_slice::<EnrollRequest>(&body) else {
        return refused(Refusal::MalformedRequest, "expected {node, token, csr, ageRecipient}");
    };
    let ask = crate::ops::agents::Enrol {
        node: &req.node,
        token: &req.token,
        csr: &req.csr,
        age_recipient: &req.age_recipient,
    };
    let branch = &s.config.source.branch;
    crate::http::server::certified(
        crate::ops::agents::enrol(&s.ledger, &s.config.control, branch, &ask, now_ms()).await,
    )
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
