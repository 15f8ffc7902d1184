//! Who calls the agent API: the node a client certificate was issued to, if the control plane
//! still holds that certificate valid. Used by the agent API and by `pl logs`' agent side.

use crate::http::server::{PeerCert, internal, refused};
use crate::hub::Hub;
use crate::ops::agents::{CertRefusal, Readmission};
use crate::store::{Ledger, now_ms};
use agent_proto::Refusal;
use axum::response::Response;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long an admitted certificate is admitted without asking the ledger again. Revocations
/// this daemon makes (a retired node, a renewed certificate's first use) clear it at once; one
/// another daemon makes takes effect here within this bound.
pub const CERTIFICATE_CACHE_MS: u64 = 5_000;

/// Who calls the agent API: a node, known by its client certificate. Admitted certificates
/// are cached for a short while to keep a ledger read off every request; revocations this
/// daemon makes (`Hub::revocations`) empty the cache at once.
pub struct Peers {
    ledger: Arc<Ledger>,
    hub: Arc<Hub>,
    /// Admitted certificates.
    certificates: std::sync::Mutex<Admitted>,
    /// The revocations seen when the cache was last emptied.
    revocations: AtomicU64,
    /// Set when the control plane re-admits nodes it does not know (`control.readmit_nodes`).
    readmission: Option<Readmission>,
}

/// Admitted certificates: fingerprint → (node, not after, when admitted), and each node's
/// fingerprint there (so admitting one finds the node's other certificate without a walk over
/// every node's).
#[derive(Default)]
struct Admitted {
    by_fingerprint: std::collections::HashMap<String, (String, i64, Instant)>,
    by_node: std::collections::HashMap<String, String>,
}

impl Peers {
    pub fn new(ledger: Arc<Ledger>, hub: Arc<Hub>, readmission: Option<Readmission>) -> Peers {
        Peers {
            ledger,
            hub,
            certificates: std::sync::Mutex::default(),
            revocations: AtomicU64::new(0),
            readmission,
        }
    }

    fn certificate(&self, fingerprint: &str, now_ms: i64) -> Option<String> {
        let revocations = self.hub.revocations.load(Ordering::Relaxed);
        if self.revocations.swap(revocations, Ordering::Relaxed) != revocations
            && let Ok(mut c) = self.certificates.lock()
        {
            *c = Admitted::default();
        }
        let c = self.certificates.lock().ok()?;
        let (node, not_after, at) = c.by_fingerprint.get(fingerprint)?;
        (*not_after > now_ms && at.elapsed() < Duration::from_millis(CERTIFICATE_CACHE_MS)).then(|| node.clone())
    }

    fn admit(&self, fingerprint: &str, node: &str, not_after: i64) {
        if let Ok(mut c) = self.certificates.lock() {
            // A node's new certificate, on its first use, revokes the one it renewed.
            if let Some(old) = c.by_node.insert(node.to_owned(), fingerprint.to_owned())
                && old != fingerprint
            {
                c.by_fingerprint.remove(&old);
            }
            if c.by_fingerprint.len() > 100_000 {
                *c = Admitted::default();
                c.by_node.insert(node.to_owned(), fingerprint.to_owned());
            }
            c.by_fingerprint
                .insert(fingerprint.to_owned(), (node.to_owned(), not_after, Instant::now()));
        }
    }

    /// The calling node, from its client certificate.
    pub async fn caller(&self, peer: Option<PeerCert>) -> Result<String, Response> {
        self.caller_and_certificate(peer).await.map(|(node, _)| node)
    }

    /// The calling node and its certificate's fingerprint.
    pub async fn caller_and_certificate(&self, peer: Option<PeerCert>) -> Result<(String, String), Response> {
        let Some(PeerCert { fingerprint, der }) = peer else {
            return Err(refused(Refusal::CertificateRevoked, "no client certificate"));
        };
        let now = now_ms();
        if let Some(node) = self.certificate(&fingerprint, now) {
            return Ok((node, fingerprint));
        }
        match crate::ops::agents::admit(&self.ledger, &fingerprint, &der, self.readmission.as_ref(), now).await {
            Ok(Ok((node, not_after))) => {
                self.admit(&fingerprint, &node, not_after);
                Ok((node, fingerprint))
            }
            Ok(Err(CertRefusal::Expired)) => Err(refused(Refusal::CertificateExpired, "the certificate has expired")),
            Ok(Err(_)) => Err(refused(
                Refusal::CertificateRevoked,
                "the certificate is not one the control plane holds valid",
            )),
            Err(e) => Err(internal(e)),
        }
    }
}
