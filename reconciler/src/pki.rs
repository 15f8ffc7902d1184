//! The control CA at work: signing a node's certificate signing request into a short-lived
//! client certificate. The CA's files are read when needed (`control.ca_cert`,
//! `control.ca_key`, the key private to the daemon's user), never logged.

use agent_proto::Refusal;
use rcgen::{CertificateSigningRequestParams, DnType, DnValue, ExtendedKeyUsagePurpose, KeyUsagePurpose};
use std::path::Path;

/// A signed node certificate.
pub struct Issued {
    pub pem: String,
    pub ca_pem: String,
    /// SHA-256 of the signing CA's DER, hex.
    pub ca_fingerprint: String,
    /// SHA-256 of the certificate's DER, hex: how the agent API will know it.
    pub fingerprint: String,
    pub not_after_ms: i64,
}

/// Why a certificate could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{0}")]
    Refused(&'static str, Refusal),
    #[error("the control CA: {0}")]
    Ca(String),
}

/// The SHA-256 fingerprint (hex) of a PEM certificate's DER.
pub fn fingerprint_of_pem(pem: &str) -> Option<String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).ok()?;
    Some(agent_proto::cert_fingerprint(der.as_ref()))
}

/// Signs `csr_pem` for `node`, valid `hours` from now (and five minutes before, for clocks), with the CA in `ca_cert` and
/// `ca_key`. The request's signature must verify (rcgen checks it when parsing) and its
/// subject's common name must be the node's name; the certificate names the node as its common
/// name and DNS name, for client authentication only.
pub fn sign_node_csr(csr_pem: &str, node: &str, hours: i64, ca_cert: &Path, ca_key: &Path) -> Result<Issued, PkiError> {
    let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|_| PkiError::Refused("the signing request does not parse or verify", Refusal::CsrInvalid))?;
    let cn = csr
        .params
        .distinguished_name
        .get(&DnType::CommonName)
        .and_then(|v| match v {
            DnValue::Utf8String(s) => Some(s.clone()),
            DnValue::PrintableString(s) => Some(s.as_str().to_owned()),
            _ => None,
        });
    if cn.as_deref() != Some(node) {
        return Err(PkiError::Refused(
            "the signing request's common name is not the node's name",
            Refusal::CsrNameMismatch,
        ));
    }
    let ca_pem = std::fs::read_to_string(ca_cert).map_err(|e| PkiError::Ca(format!("{}: {e}", ca_cert.display())))?;
    let key_pem = zeroize::Zeroizing::new(
        std::fs::read_to_string(ca_key).map_err(|e| PkiError::Ca(format!("{}: {e}", ca_key.display())))?,
    );
    let key = rcgen::KeyPair::from_pem(&key_pem).map_err(|e| PkiError::Ca(format!("the CA key: {e}")))?;
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&ca_pem, key).map_err(|e| PkiError::Ca(format!("the CA certificate: {e}")))?;
    let now = time::OffsetDateTime::now_utc();
    let p = &mut csr.params;
    p.not_before = now - time::Duration::minutes(5);
    p.not_after = now + time::Duration::hours(hours);
    p.is_ca = rcgen::IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.subject_alt_names =
        vec![rcgen::SanType::DnsName(node.try_into().map_err(|_| {
            PkiError::Refused("the node name is not a DNS name", Refusal::CsrNameMismatch)
        })?)];
    let not_after_ms = p.not_after.unix_timestamp().saturating_mul(1000);
    let cert = csr
        .signed_by(&issuer)
        .map_err(|e| PkiError::Ca(format!("signing: {e}")))?;
    let pem = cert.pem();
    Ok(Issued {
        fingerprint: fingerprint_of_pem(&pem).unwrap_or_default(),
        pem,
        ca_fingerprint: fingerprint_of_pem(&ca_pem).unwrap_or_default(),
        ca_pem,
        not_after_ms,
    })
}
