//! The control plane's ACME client (RFC 8555, `instant-acme`): `issuer = "acme"` in
//! `[certificates]`. One order per hostname, made here and nowhere else (docs/architecture.md,
//! "Certificates: who orders"); its HTTP-01 challenge is answered by every node serving the
//! hostname ([`Challenges`], `place-acme-challenge` jobs), so whichever node the CA reaches
//! answers. The account's key is kept in a 0600 file of its own, one per directory URL, and
//! is never logged; the certificate's key is made here (ECDSA P-256), its CSR names the
//! hostname alone.
//!
//! Every wait is bounded: each poll of the CA by [`POLL_TIMEOUT`], and the nodes' placement by
//! the caller's [`Challenges`]. A failure says why in the CA's words (the challenge's problem
//! document when validation failed), and the caller backs off.

use crate::issuer::{IssueError, Signed};
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, ExternalAccountKey, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use sha2::{Digest, Sha256};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;
use zeroize::Zeroizing;

/// Longest wait for the CA to validate an order, and then to issue it.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(90);

/// A future the challenge placement returns (boxed: the trait is used as `dyn`).
pub type Placing<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Who answers an order's HTTP-01 challenge: done when every node serving the hostname
/// serves `key_authorization` at `/.well-known/acme-challenge/<token>`; `Err` says which did
/// not, and why.
pub trait Challenges: Send + Sync {
    fn place<'a>(&'a self, token: &'a str, key_authorization: &'a str) -> Placing<'a>;
}

/// Where and as whom orders are made.
pub struct AcmeSettings {
    pub directory: String,
    /// `mailto:` URIs the CA may write to (expiry notices).
    pub contact: Vec<String>,
    /// External account binding: the key id and the HMAC key (its bytes).
    pub eab: Option<(String, Zeroizing<Vec<u8>>)>,
    /// A PEM root to trust for the directory instead of the system's (a private or test CA).
    pub ca_root: Option<PathBuf>,
    /// The folder the account's credentials are kept in (one 0600 file per directory).
    pub account_dir: PathBuf,
}

/// The ACME issuer: its settings, and its account once made or read.
pub struct Acme {
    settings: AcmeSettings,
    account: tokio::sync::Mutex<Option<Account>>,
}

fn failed(hostname: &str, message: impl std::fmt::Display) -> IssueError {
    IssueError::Name {
        hostname: hostname.to_owned(),
        message: message.to_string(),
    }
}

impl Acme {
    pub fn new(settings: AcmeSettings) -> Acme {
        // instant-acme's client builds its TLS configuration with the process's default
        // provider, and the dependency graph enables two (ring here, aws-lc-rs through another
        // crate), so rustls cannot pick one itself: ring, as everywhere else in Pushleft. An
        // error means a default is installed already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Acme {
            settings,
            account: tokio::sync::Mutex::new(None),
        }
    }

    /// The account's credentials file for this directory.
    fn account_file(&self) -> PathBuf {
        let digest = hex::encode(Sha256::digest(self.settings.directory.as_bytes()));
        self.settings
            .account_dir
            .join(format!("account-{}.json", &digest[..16]))
    }

    fn builder(&self) -> Result<instant_acme::AccountBuilder, instant_acme::Error> {
        match &self.settings.ca_root {
            Some(root) => Account::builder_with_root(root),
            None => Account::builder(),
        }
    }

    /// The account: read from its file, or registered (with EAB when configured) and kept.
    async fn account(&self) -> Result<Account, String> {
        let mut held = self.account.lock().await;
        if let Some(a) = held.as_ref() {
            return Ok(a.clone());
        }
        let file = self.account_file();
        let account = if file.exists() {
            pushleft_secrets::check_private_file(&file).map_err(|m| format!("{}: {m}", file.display()))?;
            let text = Zeroizing::new(std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?);
            let credentials: AccountCredentials =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
            self.builder()
                .map_err(|e| format!("the ACME client: {e}"))?
                .from_credentials(credentials)
                .await
                .map_err(|e| format!("the ACME account in {}: {e}", file.display()))?
        } else {
            let contact: Vec<&str> = self.settings.contact.iter().map(String::as_str).collect();
            let eab = self
                .settings
                .eab
                .as_ref()
                .map(|(kid, key)| ExternalAccountKey::new(kid.clone(), key));
            let (account, credentials) = self
                .builder()
                .map_err(|e| format!("the ACME client: {e}"))?
                .create(
                    &NewAccount {
                        contact: &contact,
                        terms_of_service_agreed: true,
                        only_return_existing: false,
                    },
                    self.settings.directory.clone(),
                    eab.as_ref(),
                )
                .await
                .map_err(|e| format!("registering with {}: {e}", self.settings.directory))?;
            let text = Zeroizing::new(serde_json::to_string(&credentials).map_err(|e| e.to_string())?);
            std::fs::create_dir_all(&self.settings.account_dir)
                .map_err(|e| format!("{}: {e}", self.settings.account_dir.display()))?;
            pushleft_secrets::write_private(&file, text.as_bytes()).map_err(|e| format!("{}: {e}", file.display()))?;
            tracing::info!(directory = %self.settings.directory, account = %account.id(), "ACME account registered");
            account
        };
        *held = Some(account.clone());
        Ok(account)
    }

    /// Orders a certificate for `hostname`: its HTTP-01 challenge answered by `challenges`,
    /// a new key's CSR, the chain the CA issues.
    pub async fn order(&self, hostname: &str, challenges: &dyn Challenges) -> Result<Signed, IssueError> {
        let account = self.account().await.map_err(|m| failed(hostname, m))?;
        let identifiers = [Identifier::Dns(hostname.to_owned())];
        let mut order = account
            .new_order(&NewOrder::new(&identifiers))
            .await
            .map_err(|e| failed(hostname, format!("the CA refused the order: {e}")))?;
        let mut authorizations = order.authorizations();
        while let Some(next) = authorizations.next().await {
            let mut authorization = next.map_err(|e| failed(hostname, e))?;
            match authorization.status {
                // Validated before (the CA reuses a recent validation).
                AuthorizationStatus::Valid => continue,
                AuthorizationStatus::Pending => {}
                other => return Err(failed(hostname, format!("the authorization is {other:?}"))),
            }
            let mut challenge = authorization
                .challenge(ChallengeType::Http01)
                .ok_or_else(|| failed(hostname, "the CA offers no http-01 challenge"))?;
            let key_authorization = challenge.key_authorization();
            challenges
                .place(&challenge.token, key_authorization.as_str())
                .await
                .map_err(|m| failed(hostname, format!("the challenge was not placed: {m}")))?;
            challenge.set_ready().await.map_err(|e| failed(hostname, e))?;
        }
        // A CA validates in tens of milliseconds when it can: ask soon, then back off (a
        // `Retry-After` from the CA takes precedence).
        let policy = RetryPolicy::new()
            .initial_delay(Duration::from_millis(40))
            .backoff(1.5)
            .timeout(POLL_TIMEOUT);
        match order.poll_ready(&policy).await {
            Ok(OrderStatus::Ready) => {}
            Ok(status) => return Err(failed(hostname, why_invalid(&mut order, status).await)),
            Err(e) => return Err(failed(hostname, format!("validation: {e}"))),
        }
        let key = rcgen::KeyPair::generate().map_err(|e| failed(hostname, e))?;
        let mut params = rcgen::CertificateParams::new(vec![hostname.to_owned()]).map_err(|e| failed(hostname, e))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        let csr = params.serialize_request(&key).map_err(|e| failed(hostname, e))?;
        order
            .finalize_csr(csr.der())
            .await
            .map_err(|e| failed(hostname, format!("finalizing: {e}")))?;
        let chain = order
            .poll_certificate(&policy)
            .await
            .map_err(|e| failed(hostname, format!("the certificate: {e}")))?;
        let (not_before_ms, not_after_ms) =
            validity(&chain).ok_or_else(|| failed(hostname, "the CA's chain does not parse"))?;
        Ok(Signed {
            chain,
            key: Zeroizing::new(key.serialize_pem()),
            not_before_ms,
            not_after_ms,
        })
    }
}

/// Why an order did not become ready: each failed challenge's problem, in the CA's words.
async fn why_invalid(order: &mut instant_acme::Order, status: OrderStatus) -> String {
    let mut reasons = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut a)) = authorizations.next().await {
        if a.refresh().await.is_err() {
            continue;
        }
        for c in &a.challenges {
            if let Some(p) = &c.error {
                reasons.push(format!(
                    "{}: {}",
                    p.r#type.as_deref().unwrap_or("problem"),
                    p.detail.as_deref().unwrap_or("no detail")
                ));
            }
        }
    }
    if reasons.is_empty() {
        format!("the order is {status:?}")
    } else {
        format!("validation failed: {}", reasons.join("; "))
    }
}

/// The leaf's validity (Unix ms) in a PEM chain.
fn validity(chain: &str) -> Option<(i64, i64)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let v = cert.validity();
    Some((
        v.not_before.timestamp().saturating_mul(1000),
        v.not_after.timestamp().saturating_mul(1000),
    ))
}
