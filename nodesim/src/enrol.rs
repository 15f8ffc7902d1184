//! Enrolment of the simulated nodes, each as a real node enrols: a one-time token asked for
//! with the operator's token (`POST /v1/nodes/{node}/token`), then `pushleft_agent::enroll`
//! (its own key, a CSR, the CA pinned by fingerprint). A node whose folder already holds an
//! identity is not enrolled again, so a large fleet is enrolled once for many runs.

use crate::stats::{Call, Stats};
use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Where the control plane is and who asks for tokens.
pub struct Control {
    pub url: String,
    pub ca_pem: Vec<u8>,
    pub operator_token: String,
}

impl Control {
    /// The CA's fingerprint as `pl-agent enroll` takes it.
    pub fn fingerprint(&self) -> Result<String> {
        use sha2::Digest as _;
        let cert = ureq::tls::Certificate::from_pem(&self.ca_pem).map_err(|e| anyhow!("the CA: {e}"))?;
        let hex: String = sha2::Sha256::digest(cert.der())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(format!("SHA256:{hex}"))
    }

    /// A client of the operator API for the observer.
    pub fn observer(&self) -> Result<ureq::Agent> {
        self.agent()
    }

    fn agent(&self) -> Result<ureq::Agent> {
        let cert = ureq::tls::Certificate::from_pem(&self.ca_pem)
            .map_err(|e| anyhow!("the CA: {e}"))?
            .to_owned();
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(vec![cert])))
            .build();
        Ok(ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into())
    }

    /// A one-time enrolment token for `node`.
    fn token(&self, agent: &ureq::Agent, node: &str) -> Result<String> {
        let mut r = agent
            .post(&format!("{}/v1/nodes/{node}/token", self.url))
            .header("authorization", &format!("Bearer {}", self.operator_token))
            .send_empty()
            .map_err(|e| anyhow!("asking for {node}'s token: {e}"))?;
        let status = r.status().as_u16();
        let body = r.body_mut().with_config().limit(64 * 1024).read_to_string()?;
        if status != 200 {
            bail!("no enrolment token for {node} (HTTP {status}): {body}");
        }
        let t: operator_proto::nodes::NodeToken = serde_json::from_str(&body).context("the token answer")?;
        Ok(t.token)
    }
}

/// Enrols `names` (those not enrolled already) with `parallel` threads; each node's folder
/// under `dir`.
pub fn all(control: &Control, names: &[String], dir: &Path, parallel: usize, stats: &Stats) -> Result<Vec<PathBuf>> {
    let fingerprint = control.fingerprint()?;
    let agent = control.agent()?;
    let next = AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(None::<anyhow::Error>);
    std::thread::scope(|scope| {
        for _ in 0..parallel.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(name) = names.get(i) else { break };
                    let node_dir = dir.join(name);
                    if node_dir.join(pushleft_agent::folder::CERT).exists() {
                        continue;
                    }
                    let started = Instant::now();
                    let done = control
                        .token(&agent, name)
                        .and_then(|t| pushleft_agent::enroll::enroll(&control.url, &fingerprint, name, &node_dir, &t));
                    match done {
                        Ok(_) => stats.record(Call::Enrol, started.elapsed()),
                        Err(e) => {
                            if let Ok(mut f) = failed.lock() {
                                f.get_or_insert(e.context(format!("enrolling {name}")));
                            }
                            break;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().ok().flatten() {
        return Err(e);
    }
    Ok(names.iter().map(|n| dir.join(n)).collect())
}
