//! `GET /v1/domains` (viewer): each custom domain's state, the DNS record it needs, what the
//! last check saw or missed, and its certificate. `serving` is `verified` once every node
//! serving its environment routed it (a publish made after the proof, and after its
//! certificate was issued, succeeded there): observed, not asked.

use crate::http::server::{authorize, internal};
use crate::store::{Ledger, now_ms};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use state_schema::deployment::DeploymentSpec;
use state_schema::model::Verification;

pub async fn list(ledger: &Ledger, tokens: &crate::auth::Tokens, headers: &axum::http::HeaderMap) -> Response {
    if let Some(r) = authorize(tokens, headers, crate::config::Role::Viewer) {
        return r;
    }
    match view(ledger).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => internal(e),
    }
}

async fn view(ledger: &Ledger) -> Result<serde_json::Value, crate::store::LedgerError> {
    let now = now_ms();
    let cp = ledger.control_plane().await?;
    let specs: Vec<DeploymentSpec> = ledger
        .rollouts()
        .await?
        .iter()
        .filter_map(|r| serde_json::from_str(&r.spec).ok())
        .collect();
    let certificates = ledger.certificates().await?;
    let mut out = Vec::new();
    for d in ledger.domains().await? {
        let spec = specs.iter().find(|s| s.environment.as_str() == d.environment);
        let own = spec.and_then(|s| s.own_hostname()).map(|h| h.to_string());
        let method = if d.method == "cname" {
            Verification::Cname
        } else {
            Verification::Txt
        };
        let (kind, name, value) = state_schema::domains::wanted_record(method, &cp, &d.hostname, own.as_deref());
        let brought = spec.is_some_and(|s| s.certificate(&d.hostname).is_some());
        let issued = certificates.iter().find(|c| c.hostname == d.hostname);
        let cert_valid = brought || issued.is_some_and(|c| c.chain.is_some() && c.not_after > now);
        // What the agents did, not what was asked: every node serving the environment
        // succeeded a publish made after the proof and, when the hostname has a certificate
        // of the control plane's, after that was issued (so the publish carried it).
        let since = d.verified_at.max(issued.map_or(0, |c| c.issued_at));
        let nodes = spec.map_or(0, |s| s.ingress_nodes.len());
        let routed = nodes > 0
            && ledger
                .published_on_since(&d.hostname, &d.environment, since)
                .await?
                .len()
                >= nodes
            && (cert_valid || !ledger.issues_certificates());
        let state = if d.state == "verified" && routed {
            "serving"
        } else {
            d.state.as_str()
        };
        out.push(json!({
            "hostname": d.hostname,
            "environment": d.environment,
            "method": d.method,
            "state": state,
            "record": {"type": kind, "name": name, "value": value},
            "seen": d.seen,
            "reason": d.reason,
            "checkedAtMs": d.checked_at,
            "nextCheckAtMs": d.next_check_at,
            "certificate": if brought {
                json!({"source": "brought"})
            } else {
                issued.map_or(serde_json::Value::Null, |c| json!({
                    "source": c.issuer,
                    "notAfterMs": c.not_after,
                    "failures": c.failures,
                    "lastError": c.last_error,
                }))
            },
        }));
    }
    Ok(json!({ "domains": out }))
}
