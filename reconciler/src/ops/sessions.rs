//! The web view's sign-in as use cases: a pasted token or a one-time link becomes a session
//! (a random id the browser keeps; the ledger keeps its SHA-256), signing out ends it, and an
//! action asked from the view that writes nothing else is recorded as an event naming the
//! token. Which role a session has is judged by the caller against the configured tokens on
//! every request, so removing a token ends its sessions.

use super::{Answer, OpError, Ops, now_ms};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// How long a session lasts from its sign-in (a working day); signing in again makes another.
pub const SESSION_MS: i64 = 12 * 3600 * 1000;
/// How long a one-time sign-in link may wait to be used.
pub const LINK_MS: i64 = 10 * 60 * 1000;

/// A session just opened: its id (only the browser keeps it) and until when it holds.
pub struct Opened {
    pub id: Zeroizing<String>,
    pub token_name: String,
    pub expires_at_ms: i64,
}

/// A live session's token (by hash and name).
pub struct Session {
    pub token_hash: String,
    pub token_name: String,
    pub expires_at_ms: i64,
}

/// 256 random bits, hex.
fn random_hex() -> Answer<Zeroizing<String>> {
    let mut bytes = Zeroizing::new([0u8; 32]);
    getrandom::fill(&mut *bytes).map_err(OpError::unavailable)?;
    Ok(Zeroizing::new(hex::encode(*bytes)))
}

/// What the ledger keeps of an id or a code.
pub fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

impl Ops {
    /// Opens a session for a token the caller has checked.
    pub async fn open_session(&self, token_hash: &str, token_name: &str, how: &str) -> Answer<Opened> {
        let id = random_hex()?;
        let now = now_ms();
        let expires_at_ms = now + SESSION_MS;
        let sessions = self.ledger.sessions();
        sessions
            .open_session(&digest(&id), token_hash, token_name, now, expires_at_ms)
            .await?;
        self.ledger
            .events()
            .record(
                now,
                "ui-signed-in",
                token_name,
                &format!("signed in to the web view ({how}) as {token_name}"),
            )
            .await?;
        self.hub.wrote.notify_waiters();
        tracing::info!(token = %token_name, how, "web view: signed in");
        Ok(Opened {
            id,
            token_name: token_name.to_owned(),
            expires_at_ms,
        })
    }

    /// The live session a browser's id names, if any.
    pub async fn session(&self, id: &str) -> Answer<Option<Session>> {
        Ok(self
            .ledger
            .sessions()
            .session(&digest(id), now_ms())
            .await?
            .map(|r| Session {
                token_hash: r.token_hash,
                token_name: r.token_name,
                expires_at_ms: r.expires_at,
            }))
    }

    /// Ends a session.
    pub async fn sign_out(&self, id: &str) -> Answer<bool> {
        Ok(self.ledger.sessions().revoke_session(&digest(id), now_ms()).await?)
    }

    /// Ends every session of a token.
    pub async fn sign_out_everywhere(&self, token_hash: &str) -> Answer<u64> {
        Ok(self.ledger.sessions().revoke_sessions_of(token_hash, now_ms()).await?)
    }

    /// A one-time sign-in code for the caller's token; the caller makes the link.
    pub async fn sign_in_link(&self, token_hash: &str, token_name: &str) -> Answer<(Zeroizing<String>, i64)> {
        let code = random_hex()?;
        let expires = now_ms() + LINK_MS;
        self.ledger
            .sessions()
            .add_link(&digest(&code), token_hash, token_name, expires)
            .await?;
        tracing::info!(token = %token_name, "web view: one-time sign-in link made");
        Ok((code, expires))
    }

    /// Uses a one-time code: the token (hash, name) it signs in as, or `None` when it is
    /// unknown, used or expired.
    pub async fn use_link(&self, code: &str) -> Answer<Option<(String, String)>> {
        Ok(self.ledger.sessions().use_link(&digest(code), now_ms()).await?)
    }

    /// Records an action asked from the web view that writes no event of its own.
    pub async fn record_asked(&self, who: &str, kind: &str, subject: &str, detail: &str) -> Answer<()> {
        self.ledger
            .events()
            .record(now_ms(), kind, subject, &format!("{detail} (by {who})"))
            .await?;
        self.hub.wrote.notify_waiters();
        Ok(())
    }
}
