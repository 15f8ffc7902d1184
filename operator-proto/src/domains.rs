//! Custom domains and certificates: `GET /v1/domains` and `GET /v1/certificates` (viewer).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

spelled! {
    /// Where a custom domain stands. `serving` is `verified` and routed by every node serving
    /// its environment (observed, not asked).
    pub enum DomainState {
        /// Its DNS record is not seen yet.
        Pending = "pending",
        Verified = "verified",
        /// Its record was seen, and is not any more (or never right).
        Failing = "failing",
        Serving = "serving",
    }
}

spelled! {
    /// How a custom domain proves it is the owner's.
    pub enum DomainMethod {
        Cname = "cname",
        Txt = "txt",
    }
}

/// The DNS record a domain needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DnsRecord {
    /// `CNAME` or `TXT`.
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub value: String,
}

/// One custom domain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Domain {
    pub hostname: String,
    pub environment: String,
    pub method: DomainMethod,
    pub state: DomainState,
    pub record: DnsRecord,
    /// What DNS answered at the last check.
    pub seen: Option<String>,
    /// Why the last check did not prove it.
    pub reason: Option<String>,
    pub checked_at_ms: i64,
    pub next_check_at_ms: i64,
    /// Its certificate: brought in Git, or issued by the control plane (null: none yet).
    pub certificate: Option<DomainCertificate>,
}

/// A domain's certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainCertificate {
    /// `brought` (in Git), or the issuer that issued it.
    pub source: String,
    /// An issued one's validity and failures (absent for one brought in Git).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub issued: Option<IssuedSummary>,
}

/// An issued certificate, as a domain shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuedSummary {
    pub not_after_ms: i64,
    pub failures: i64,
    pub last_error: Option<String>,
}

/// `GET /v1/domains`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Domains {
    pub domains: Vec<Domain>,
}

spelled! {
    /// Where an issued certificate stands.
    pub enum CertificateState {
        Valid = "valid",
        /// Valid, and its renewal is failing.
        RenewalFailing = "renewal-failing",
        Expired = "expired",
        /// None issued yet.
        Pending = "pending",
        /// None issued, and issuance failing.
        Failing = "failing",
    }
}

/// A certificate the control plane issued (never its key, nor the chain).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Certificate {
    pub hostname: String,
    pub issuer: String,
    pub state: CertificateState,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
    pub renew_after_ms: i64,
    /// How many times it was issued.
    pub issued: i64,
    /// Failed issuances in a row.
    pub failures: i64,
    pub retry_at_ms: i64,
    pub last_error: Option<String>,
}

/// `GET /v1/certificates`, by hostname.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Certificates {
    pub certificates: Vec<Certificate>,
}
