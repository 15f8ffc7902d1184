//! Custom domains: each one's state, the DNS record it needs, what the last check saw or
//! missed, and its certificate. `serving` is `verified` once every node serving its
//! environment routed it (a publish made after the proof, and after its certificate was
//! issued, succeeded there): observed, not asked.

use super::wire::Corrupt;
use super::{Answer, Ops};
use crate::store::now_ms;
use operator_proto::domains::{
    DnsRecord, Domain, DomainCertificate, DomainMethod, DomainState, Domains, IssuedSummary,
};
use state_schema::deployment::DeploymentSpec;
use state_schema::model::Verification;

impl Ops {
    /// `GET /v1/domains`.
    pub async fn domains(&self) -> Answer<Domains> {
        self.domains_of(None).await
    }

    /// The custom domains of one environment (the web view's), or of all: only the specs of
    /// the environments that have domains are read (every rollout's spec is megabytes at
    /// 10,000 environments).
    pub async fn domains_of(&self, environment: Option<&str>) -> Answer<Domains> {
        let ledger = &self.ledger;
        let now = now_ms();
        let rows: Vec<_> = ledger
            .domains()
            .domains()
            .await?
            .into_iter()
            .filter(|d| environment.is_none_or(|e| d.environment == e))
            .collect();
        if rows.is_empty() {
            return Ok(Domains { domains: Vec::new() });
        }
        let cp = ledger.control_plane().await?;
        let rollouts = match environment {
            Some(e) => ledger.certificates().rollout_of(e).await?.into_iter().collect(),
            None => ledger.certificates().rollouts().await?,
        };
        let specs: Vec<DeploymentSpec> = rollouts
            .iter()
            .filter_map(|r| serde_json::from_str(&r.spec).ok())
            .collect();
        let certificates = ledger.certificates().certificates().await?;
        let mut out = Vec::new();
        for d in rows {
            let spec = specs.iter().find(|s| s.environment.as_str() == d.environment);
            let own = spec.and_then(|s| s.own_hostname()).map(|h| h.to_string());
            let Some(wire_method) = DomainMethod::parse(&d.method) else {
                return Err(Corrupt {
                    what: "domain's method",
                    value: d.method,
                }
                .into());
            };
            let method = match wire_method {
                DomainMethod::Cname => Verification::Cname,
                DomainMethod::Txt => Verification::Txt,
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
                    .domains()
                    .published_on_since(&d.hostname, &d.environment, since)
                    .await?
                    .len()
                    >= nodes
                && (cert_valid || !self.issues_certificates);
            let Some(stored) = DomainState::parse(&d.state) else {
                return Err(Corrupt {
                    what: "domain's state",
                    value: d.state,
                }
                .into());
            };
            let state = if stored == DomainState::Verified && routed {
                DomainState::Serving
            } else {
                stored
            };
            out.push(Domain {
                hostname: d.hostname,
                environment: d.environment,
                method: wire_method,
                state,
                record: DnsRecord {
                    kind: kind.to_owned(),
                    name,
                    value,
                },
                seen: d.seen,
                reason: d.reason,
                checked_at_ms: d.checked_at,
                next_check_at_ms: d.next_check_at,
                certificate: if brought {
                    Some(DomainCertificate {
                        source: "brought".to_owned(),
                        issued: None,
                    })
                } else {
                    issued.map(|c| DomainCertificate {
                        source: c.issuer.clone(),
                        issued: Some(IssuedSummary {
                            not_after_ms: c.not_after,
                            failures: c.failures,
                            last_error: c.last_error.clone(),
                        }),
                    })
                },
            });
        }
        Ok(Domains { domains: out })
    }
}
