//! Who may call the operator API and the push webhooks. Bearer tokens are stored as SHA-256
//! hashes and compared in constant time; webhooks are checked with each forge's own scheme
//! (GitHub's and Gitea's HMAC-SHA256 of the body, GitLab's shared token). Nothing here logs or
//! returns a token.

use crate::config::{Role, TokenConfig};
use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// Why a request was refused. Refusals happen before anything is read or written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer …`, or a token that matches none.
    BadToken,
    /// A known token whose role is below what the endpoint needs.
    InsufficientRole,
    /// A webhook whose signature or token does not check out.
    BadSignature,
    /// A webhook for a forge that is not configured.
    WebhookNotConfigured,
}

impl Denied {
    pub fn code(self) -> &'static str {
        match self {
            Denied::BadToken => "bad-token",
            Denied::InsufficientRole => "insufficient-role",
            Denied::BadSignature => "bad-webhook-signature",
            Denied::WebhookNotConfigured => "webhook-not-configured",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Denied::BadToken => "missing or unknown bearer token",
            Denied::InsufficientRole => "the token's role does not allow this",
            Denied::BadSignature => "the webhook's signature or token does not match",
            Denied::WebhookNotConfigured => "this webhook is not configured",
        }
    }
}

/// Hex SHA-256 of a token, as the configuration stores it.
pub fn token_hash(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Equal-length byte comparison whose time does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new random token (256 bits, `plt_` and hex) and its hash.
pub fn new_token() -> Result<(Zeroizing<String>, String), getrandom::Error> {
    let mut bytes = Zeroizing::new([0u8; 32]);
    getrandom::fill(&mut *bytes)?;
    let token = Zeroizing::new(format!("plt_{}", hex(&*bytes)));
    let hash = token_hash(&token);
    Ok((token, hash))
}

/// The configured tokens, by hash.
pub struct Tokens {
    entries: Vec<(Vec<u8>, Role, String)>,
}

impl Tokens {
    pub fn new(config: &[TokenConfig]) -> Tokens {
        Tokens {
            entries: config
                .iter()
                .filter_map(|t| Some((unhex(&t.sha256.to_ascii_lowercase())?, t.role, t.name.clone())))
                .collect(),
        }
    }

    /// Checks an `Authorization` header value against the role an endpoint needs. Returns the
    /// token's name (for logs) when allowed.
    pub fn authorize(&self, header: Option<&str>, needs: Role) -> Result<&str, Denied> {
        let token = header
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(Denied::BadToken)?;
        let digest = Sha256::digest(token.as_bytes());
        // Compare with every entry, so timing says nothing about which one matched.
        let mut found: Option<(Role, &str)> = None;
        for (hash, role, name) in &self.entries {
            if constant_time_eq(hash, &digest) {
                found = Some((*role, name));
            }
        }
        let (role, name) = found.ok_or(Denied::BadToken)?;
        if role < needs {
            return Err(Denied::InsufficientRole);
        }
        Ok(name)
    }

    /// A pasted token (the web view's sign-in): its hash, role and name when it is one of
    /// the configured tokens. Compared with every entry, as [`Tokens::authorize`].
    pub fn identify(&self, token: &str) -> Option<(String, Role, &str)> {
        let token = token.trim();
        if token.is_empty() {
            return None;
        }
        let digest = Sha256::digest(token.as_bytes());
        let mut found = None;
        for (hash, role, name) in &self.entries {
            if constant_time_eq(hash, &digest) {
                found = Some((hex(&digest), *role, name.as_str()));
            }
        }
        found
    }

    /// The role and name of the configured token with this hash (a session's), or `None`
    /// once it is no longer configured.
    pub fn by_hash(&self, hash_hex: &str) -> Option<(Role, &str)> {
        let want = unhex(&hash_hex.to_ascii_lowercase())?;
        let mut found = None;
        for (hash, role, name) in &self.entries {
            if constant_time_eq(hash, &want) {
                found = Some((*role, name.as_str()));
            }
        }
        found
    }
}

/// Which forge sent a push webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forge {
    GitHub,
    Gitea,
    GitLab,
}

/// Checks a webhook. GitHub sends `X-Hub-Signature-256: sha256=<hex hmac>`, Gitea
/// `X-Gitea-Signature: <hex hmac>`, both HMAC-SHA256 of the raw body with the shared secret;
/// GitLab sends the shared token itself in `X-Gitlab-Token`.
pub fn verify_webhook(forge: Forge, secret: &[u8], header: Option<&str>, body: &[u8]) -> Result<(), Denied> {
    let header = header.ok_or(Denied::BadSignature)?.trim();
    match forge {
        Forge::GitHub | Forge::Gitea => {
            let hex_sig = match forge {
                Forge::GitHub => header.strip_prefix("sha256=").ok_or(Denied::BadSignature)?,
                _ => header,
            };
            let sig = unhex(&hex_sig.to_ascii_lowercase()).ok_or(Denied::BadSignature)?;
            let mut mac = hmac::Hmac::<Sha256>::new_from_slice(secret).map_err(|_| Denied::BadSignature)?;
            mac.update(body);
            mac.verify_slice(&sig).map_err(|_| Denied::BadSignature)
        }
        Forge::GitLab => {
            let a = Sha256::digest(header.as_bytes());
            let b = Sha256::digest(secret);
            if constant_time_eq(&a, &b) {
                Ok(())
            } else {
                Err(Denied::BadSignature)
            }
        }
    }
}

/// HMAC-SHA256 of a body as GitHub signs it (tests and tools use it to send webhooks).
pub fn github_signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex(&mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> (Tokens, String, String) {
        let (viewer, vh) = new_token().expect("random");
        let (operator, oh) = new_token().expect("random");
        let t = Tokens::new(&[
            TokenConfig {
                name: "dash".into(),
                role: Role::Viewer,
                sha256: vh,
            },
            TokenConfig {
                name: "ci".into(),
                role: Role::Operator,
                sha256: oh,
            },
        ]);
        (t, viewer.to_string(), operator.to_string())
    }

    #[test]
    fn roles_are_ordered_and_tokens_checked() {
        let (t, viewer, operator) = tokens();
        assert_eq!(t.authorize(Some(&format!("Bearer {viewer}")), Role::Viewer), Ok("dash"));
        assert_eq!(
            t.authorize(Some(&format!("Bearer {viewer}")), Role::Operator),
            Err(Denied::InsufficientRole)
        );
        assert_eq!(t.authorize(Some(&format!("Bearer {operator}")), Role::Viewer), Ok("ci"));
        assert_eq!(
            t.authorize(Some(&format!("Bearer {operator}")), Role::Admin),
            Err(Denied::InsufficientRole)
        );
        assert_eq!(
            t.authorize(Some("Bearer plt_nope"), Role::Viewer),
            Err(Denied::BadToken)
        );
        assert_eq!(
            t.authorize(Some(&viewer), Role::Viewer),
            Err(Denied::BadToken),
            "scheme required"
        );
        assert_eq!(t.authorize(None, Role::Viewer), Err(Denied::BadToken));
    }

    #[test]
    fn webhooks_check_each_forges_scheme() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let sig = github_signature(b"s3cret", body);
        assert_eq!(verify_webhook(Forge::GitHub, b"s3cret", Some(&sig), body), Ok(()));
        assert_eq!(
            verify_webhook(Forge::GitHub, b"other", Some(&sig), body),
            Err(Denied::BadSignature)
        );
        assert_eq!(
            verify_webhook(Forge::GitHub, b"s3cret", Some(&sig), b"{}"),
            Err(Denied::BadSignature),
            "a changed body fails"
        );
        let gitea = sig.trim_start_matches("sha256=");
        assert_eq!(verify_webhook(Forge::Gitea, b"s3cret", Some(gitea), body), Ok(()));
        assert_eq!(verify_webhook(Forge::GitLab, b"tok", Some("tok"), body), Ok(()));
        assert_eq!(
            verify_webhook(Forge::GitLab, b"tok", Some("tok2"), body),
            Err(Denied::BadSignature)
        );
        assert_eq!(
            verify_webhook(Forge::GitLab, b"tok", None, body),
            Err(Denied::BadSignature)
        );
    }
}
