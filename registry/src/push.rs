//! The push side of the distribution protocol, as `pl image push` speaks it to a control
//! plane's store: whether a blob is there (`HEAD /v2/<name>/blobs/<digest>`, asked before each
//! blob, so only what the store lacks travels), a blob sent whole (`POST` then one `PUT
//! ?digest=`, the body streamed from a reader), and a manifest put by digest or tag. The
//! caller's agent carries the TLS it trusts; the token goes in every request.

use crate::oci::{Digest, Errors};
use std::io::Read;
use std::time::Duration;
use zeroize::Zeroizing;

/// A blob's whole upload may take this long (200 MB at 1 MB/s and some).
pub const UPLOAD_TIMEOUT: Duration = Duration::from_secs(3_600);
/// Every other request's whole time.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a push stopped: the store's own code when it said one.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("{url}: HTTP {status}: {message}")]
    Refused {
        url: String,
        status: u16,
        /// The store's stable code (`image-quota-exceeded`, `image-digest-mismatch`, …), or the
        /// distribution spec's when it gave no other.
        code: String,
        message: String,
    },
}

impl PushError {
    pub fn code(&self) -> &str {
        match self {
            PushError::Unreachable { .. } => "image-store-unreachable",
            PushError::Refused { code, .. } => code,
        }
    }
}

/// A control plane's image store (`https://host:port`), as one token may push to it.
pub struct Pusher {
    agent: ureq::Agent,
    base: String,
    authorization: Zeroizing<String>,
}

impl Pusher {
    /// `agent` trusts the control plane's TLS; `token` is an operator token.
    pub fn new(agent: ureq::Agent, base: &str, token: &str) -> Pusher {
        Pusher {
            agent,
            base: base.trim_end_matches('/').to_owned(),
            authorization: Zeroizing::new(format!("Bearer {token}")),
        }
    }

    /// Whether the store holds `digest` already.
    pub fn has_blob(&self, name: &str, digest: &Digest) -> Result<bool, PushError> {
        self.holds(&format!("{}/v2/{name}/blobs/{digest}", self.base))
    }

    /// Whether the store holds `digest` as a manifest (what a push by another path, the
    /// engine's, left there).
    pub fn has_manifest(&self, name: &str, digest: &Digest) -> Result<bool, PushError> {
        self.holds(&format!("{}/v2/{name}/manifests/{digest}", self.base))
    }

    fn holds(&self, url: &str) -> Result<bool, PushError> {
        let resp = self
            .agent
            .head(url)
            .config()
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .header("authorization", self.authorization.as_str())
            .call()
            .map_err(|e| unreachable(url, e))?;
        match resp.status().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            status => Err(refused(url, status, resp)),
        }
    }

    /// Sends one blob of `size` bytes, which the store checks against `digest` before keeping.
    pub fn upload(&self, name: &str, digest: &Digest, size: u64, mut body: impl Read) -> Result<(), PushError> {
        let start = format!("{}/v2/{name}/blobs/uploads/", self.base);
        let resp = self
            .agent
            .post(&start)
            .config()
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .header("authorization", self.authorization.as_str())
            .send_empty()
            .map_err(|e| unreachable(&start, e))?;
        if resp.status().as_u16() != 202 {
            return Err(refused(&start, resp.status().as_u16(), resp));
        }
        let location = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .filter(|l| l.starts_with("/v2/"))
            .ok_or_else(|| PushError::Unreachable {
                url: start.clone(),
                detail: "the store gave no upload location on itself".into(),
            })?
            .to_owned();
        let sep = if location.contains('?') { '&' } else { '?' };
        let url = format!("{}{location}{sep}digest={digest}", self.base);
        let resp = self
            .agent
            .put(&url)
            .config()
            .timeout_global(Some(UPLOAD_TIMEOUT))
            .build()
            .header("authorization", self.authorization.as_str())
            .header("content-type", "application/octet-stream")
            .header("content-length", &size.to_string())
            .send(ureq::SendBody::from_reader(&mut body))
            .map_err(|e| unreachable(&url, e))?;
        match resp.status().as_u16() {
            201 => Ok(()),
            status => Err(refused(&url, status, resp)),
        }
    }

    /// Puts a manifest under `reference` (its digest, or a tag); the store checks that every
    /// blob it names is there.
    pub fn put_manifest(&self, name: &str, reference: &str, media_type: &str, bytes: &[u8]) -> Result<(), PushError> {
        let url = format!("{}/v2/{name}/manifests/{reference}", self.base);
        let resp = self
            .agent
            .put(&url)
            .config()
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .header("authorization", self.authorization.as_str())
            .header("content-type", media_type)
            .send(bytes)
            .map_err(|e| unreachable(&url, e))?;
        match resp.status().as_u16() {
            201 => Ok(()),
            status => Err(refused(&url, status, resp)),
        }
    }
}

fn unreachable(url: &str, e: ureq::Error) -> PushError {
    PushError::Unreachable {
        url: url.to_owned(),
        detail: e.to_string(),
    }
}

fn refused(url: &str, status: u16, mut resp: ureq::http::Response<ureq::Body>) -> PushError {
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024)
        .read_to_vec()
        .unwrap_or_default();
    let (code, message) = match serde_json::from_slice::<Errors>(&body) {
        Ok(e) => match e.errors.into_iter().next() {
            Some(i) => (i.detail.unwrap_or(i.code), i.message),
            None => ("image-store-refused".into(), String::new()),
        },
        Err(_) if status == 401 || status == 403 => (
            "image-store-unauthorized".into(),
            "the token was refused (pushing needs an operator token)".into(),
        ),
        Err(_) => (
            "image-store-refused".into(),
            String::from_utf8_lossy(&body).chars().take(200).collect(),
        ),
    };
    PushError::Refused {
        url: url.to_owned(),
        status,
        code,
        message,
    }
}
