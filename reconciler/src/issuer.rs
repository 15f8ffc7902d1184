//! Who signs the certificates the control plane issues for the hostnames it serves
//! (`[certificates]` in the daemon's configuration). One issuer per control plane, so a
//! hostname served by several nodes gets one certificate, ordered once, and every node gets it
//! sealed (see docs/architecture.md, "Certificates").
//!
//! `local`: a CA of the control plane's own, made at first start, for `pl up` and for trying
//! Pushleft out. It is name-constrained to `localhost` (RFC 5280 name constraints, which
//! browsers and rustls enforce), so trusting it in a browser cannot make it vouch for a real
//! domain; it signs `<hostname><suffix>` (`pl up`'s routes are `<hostname>.localhost`).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, NameConstraints,
};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// A certificate just signed: its chain (leaf first, PEM), its key (PEM), and its validity
/// (Unix ms).
pub struct Signed {
    pub chain: String,
    pub key: Zeroizing<String>,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
}

/// Why a certificate was not issued (said in the `certificate-failed` event: never a key).
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("the local CA {path}: {message}")]
    Ca { path: PathBuf, message: String },
    #[error("{hostname} cannot be issued: {message}")]
    Name { hostname: String, message: String },
}

/// What signs a hostname's certificate: the control plane's issuers implement it, so the
/// issuance loop is one whatever signs (and a test can make it fail).
pub trait Signer: Send + Sync {
    /// The issuer's name, as the ledger and events show it.
    fn issuer(&self) -> &'static str;
    /// A new key's certificate for `hostname`.
    fn sign(&self, hostname: &str) -> Result<Signed, IssueError>;
}

impl Signer for LocalCa {
    fn issuer(&self) -> &'static str {
        "local"
    }

    fn sign(&self, hostname: &str) -> Result<Signed, IssueError> {
        LocalCa::sign(self, hostname)
    }
}

/// The control plane's local CA (`issuer = "local"`).
pub struct LocalCa {
    issuer: Issuer<'static, KeyPair>,
    chain_tail: String,
    suffix: String,
    lifetime: time::Duration,
}

/// The suffix names are issued under, and the one subtree the local CA may sign.
pub const LOCAL_SUBTREE: &str = "localhost";

fn ca_error(path: &Path, message: impl std::fmt::Display) -> IssueError {
    IssueError::Ca {
        path: path.to_owned(),
        message: message.to_string(),
    }
}

impl LocalCa {
    /// The CA in `cert` and `key`, made there first when neither exists (the key 0600).
    /// Certificates it signs are valid for `lifetime_hours` and name `<hostname><suffix>`;
    /// `suffix` must end in `.localhost`.
    pub fn open_or_create(cert: &Path, key: &Path, suffix: &str, lifetime_hours: i64) -> Result<LocalCa, IssueError> {
        if !suffix.ends_with(&format!(".{LOCAL_SUBTREE}")) {
            return Err(ca_error(
                cert,
                format!("the local CA signs names under `{LOCAL_SUBTREE}` only; local_suffix {suffix:?} is not"),
            ));
        }
        if !cert.exists() && !key.exists() {
            Self::create(cert, key)?;
        }
        let cert_pem = std::fs::read_to_string(cert).map_err(|e| ca_error(cert, e))?;
        pushleft_secrets::check_private_file(key).map_err(|m| ca_error(key, m))?;
        let key_pem = Zeroizing::new(std::fs::read_to_string(key).map_err(|e| ca_error(key, e))?);
        let pair = KeyPair::from_pem(&key_pem).map_err(|e| ca_error(key, e))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, pair).map_err(|e| ca_error(cert, e))?;
        Ok(LocalCa {
            issuer,
            chain_tail: cert_pem,
            suffix: suffix.to_owned(),
            lifetime: time::Duration::hours(lifetime_hours.clamp(1, 24 * 397)),
        })
    }

    fn create(cert: &Path, key: &Path) -> Result<(), IssueError> {
        let pair = KeyPair::generate().map_err(|e| ca_error(key, e))?;
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| ca_error(cert, e))?;
        p.distinguished_name
            .push(DnType::CommonName, "Pushleft local ingress CA");
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.name_constraints = Some(NameConstraints {
            permitted_subtrees: vec![GeneralSubtree::DnsName(LOCAL_SUBTREE.to_owned())],
            excluded_subtrees: Vec::new(),
        });
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::minutes(5);
        p.not_after = now + time::Duration::days(3650);
        let signed = p.self_signed(&pair).map_err(|e| ca_error(cert, e))?;
        if let Some(dir) = key.parent() {
            std::fs::create_dir_all(dir).map_err(|e| ca_error(key, e))?;
        }
        pushleft_secrets::write_private(key, pair.serialize_pem().as_bytes()).map_err(|e| ca_error(key, e))?;
        std::fs::write(cert, signed.pem()).map_err(|e| ca_error(cert, e))
    }

    /// The name a hostname is issued under.
    pub fn name_of(&self, hostname: &str) -> String {
        format!("{hostname}{}", self.suffix)
    }

    /// Signs a new key's certificate for `hostname` (as [`Self::name_of`]), valid from five
    /// minutes ago for the lifetime.
    pub fn sign(&self, hostname: &str) -> Result<Signed, IssueError> {
        let name = self.name_of(hostname);
        let bad = |e: rcgen::Error| IssueError::Name {
            hostname: hostname.to_owned(),
            message: e.to_string(),
        };
        let pair = KeyPair::generate().map_err(bad)?;
        let mut p = CertificateParams::new(vec![name.clone()]).map_err(bad)?;
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::minutes(5);
        p.not_after = now + self.lifetime;
        let cert = p.signed_by(&pair, &self.issuer).map_err(bad)?;
        let ms = |t: time::OffsetDateTime| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
        Ok(Signed {
            chain: format!("{}{}", cert.pem(), self.chain_tail),
            key: Zeroizing::new(pair.serialize_pem()),
            not_before_ms: ms(p.not_before),
            not_after_ms: ms(p.not_after),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_ca_is_made_once_and_signs_under_localhost_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        assert!(LocalCa::open_or_create(&cert, &key, ".example.com", 24).is_err());
        let ca = LocalCa::open_or_create(&cert, &key, ".localhost", 24).expect("made");
        let first = std::fs::read_to_string(&cert).expect("ca");
        let again = LocalCa::open_or_create(&cert, &key, ".localhost", 24).expect("opened");
        assert_eq!(std::fs::read_to_string(&cert).expect("ca"), first, "made once");
        let signed = again.sign("api.example.com").expect("signed");
        assert!(signed.chain.ends_with(&first), "the chain ends with the CA");
        assert!(signed.not_after_ms - signed.not_before_ms >= 24 * 3_600_000);
        let (_, leaf) = x509_parser::pem::parse_x509_pem(signed.chain.as_bytes()).expect("pem");
        let leaf = leaf.parse_x509().expect("leaf");
        let names: Vec<String> = leaf
            .subject_alternative_name()
            .expect("san")
            .expect("san")
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(names, ["DNSName(api.example.com.localhost)"]);
        assert_eq!(ca.name_of("a.b"), "a.b.localhost");
    }
}
