//! Custom domains (`[domains]`: how they are proven in DNS and rechecked) and the certificates
//! the control plane issues (`[certificates]`: the local CA or ACME, and its limits).

use serde::Deserialize;
use std::path::PathBuf;

/// `[domains]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainsConfig {
    /// Who custom domains are looked up through: `"system"` (`/etc/resolv.conf`) or DNS
    /// servers (`["ip:port", …]`). Unset: no lookups at all, and Domains stay pending with that
    /// reason (nothing leaves the machine unless the operator says where it may go).
    #[serde(default)]
    pub resolver: Option<ResolverSetting>,
    /// How often a domain not proven yet (or failing) is looked up again.
    #[serde(default = "default_pending_recheck")]
    pub pending_recheck_seconds: u64,
    /// How often a proven domain is looked up again (an hour by default).
    #[serde(default = "default_recheck_seconds")]
    pub recheck_seconds: u64,
}

/// `domains.resolver`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum ResolverSetting {
    /// `"system"`.
    System(SystemResolver),
    /// `["ip:port", …]`.
    Servers(Vec<std::net::SocketAddr>),
}

/// The word `system`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SystemResolver {
    System,
}

fn default_pending_recheck() -> u64 {
    60
}

fn default_recheck_seconds() -> u64 {
    3600
}

/// `[certificates]`: who issues the certificates of hostnames that bring none.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificatesConfig {
    pub issuer: IssuerKind,
    /// The age identity (X25519) issued keys are kept sealed to and resealed with; default
    /// `control.age_identity`. (`pl up` makes one of its own, since a user's identity for
    /// Secrets may be an SSH key, whose recipient is not in its file.)
    pub identity: Option<PathBuf>,
    /// `local`: the CA's certificate and key, made at the first start when neither exists.
    #[serde(default = "default_local_ca_cert")]
    pub local_ca_cert: PathBuf,
    #[serde(default = "default_local_ca_key")]
    pub local_ca_key: PathBuf,
    /// `local`: names are issued as `<hostname><local_suffix>`, under `.localhost`.
    #[serde(default = "default_local_suffix")]
    pub local_suffix: String,
    /// `local`: how long a certificate is valid (renewed after two thirds of it).
    #[serde(default = "default_lifetime_hours")]
    pub lifetime_hours: i64,
    /// `acme`: the CA and the account orders are made with.
    #[serde(default)]
    pub acme: AcmeConfig,
}

/// Which issuer: `local` (the control plane's own CA, for `pl up` and trials) or `acme` (an
/// ACME CA, Let's Encrypt by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IssuerKind {
    Local,
    Acme,
}

/// `[certificates.acme]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// The CA's directory URL (`https://` only); default Let's Encrypt's production one.
    pub directory: Option<String>,
    /// Let's Encrypt's staging directory instead (untrusted certificates, high rate limits).
    #[serde(default)]
    pub staging: bool,
    /// `mailto:` addresses the CA may write to about the account's certificates.
    #[serde(default)]
    pub contact: Vec<String>,
    /// External account binding (CAs such as ZeroSSL or a corporate CA ask for it): the key id,
    /// and a 0600 file holding the base64url HMAC key (never in this file, never logged).
    pub eab_kid: Option<String>,
    pub eab_hmac_key_file: Option<PathBuf>,
    /// A PEM root to trust for the directory's HTTPS instead of the system's (a private CA, or
    /// pebble in tests).
    pub ca_root: Option<PathBuf>,
    /// Where the account's credentials are kept (0600, one file per directory).
    #[serde(default = "default_acme_account_dir")]
    pub account_dir: PathBuf,
    /// Orders in flight at once; more due hostnames wait for the next check.
    #[serde(default = "default_acme_max_orders")]
    pub max_orders: usize,
}

/// Let's Encrypt's production directory: the default.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// Let's Encrypt's staging directory (`staging = true`): untrusted certificates, high limits.
pub const LETS_ENCRYPT_STAGING: &str = "https://acme-staging-v02.api.letsencrypt.org/directory";

fn default_acme_account_dir() -> PathBuf {
    "acme".into()
}

fn default_acme_max_orders() -> usize {
    4
}

fn default_local_ca_cert() -> PathBuf {
    "ingress-ca/ca.crt".into()
}

fn default_local_ca_key() -> PathBuf {
    "ingress-ca/ca.key".into()
}

fn default_local_suffix() -> String {
    ".localhost".into()
}

fn default_lifetime_hours() -> i64 {
    24 * 30
}

impl Default for DomainsConfig {
    fn default() -> Self {
        DomainsConfig {
            resolver: None,
            pending_recheck_seconds: default_pending_recheck(),
            recheck_seconds: default_recheck_seconds(),
        }
    }
}

impl Default for AcmeConfig {
    fn default() -> Self {
        AcmeConfig {
            directory: None,
            staging: false,
            contact: Vec::new(),
            eab_kid: None,
            eab_hmac_key_file: None,
            ca_root: None,
            account_dir: default_acme_account_dir(),
            max_orders: default_acme_max_orders(),
        }
    }
}

impl AcmeConfig {
    /// The directory orders go to.
    pub fn directory_url(&self) -> &str {
        match (&self.directory, self.staging) {
            (Some(d), _) => d,
            (None, true) => LETS_ENCRYPT_STAGING,
            (None, false) => LETS_ENCRYPT,
        }
    }
}
