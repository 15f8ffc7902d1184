//! The agent's client of the control plane's agent API: blocking, over mutual TLS with the
//! node's own certificate, speaking `agent-proto`. The node agent uses it, and so does the
//! benchmark of simulated agents.

use agent_proto::{
    CompleteRequest, Heartbeat, LeaseProof, LeaseRequest, LeaseResponse, Outcome, Refusal, RefusalBody, RenewRequest,
};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// What a call can end in.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The control plane refused, with its code.
    #[error("{message} [{}]", code.code())]
    Refused { code: Refusal, message: String },
    /// The call did not get an answer (network, TLS, or an answer that is not the protocol's).
    #[error("{0}")]
    Transport(String),
}

/// A node's connection settings: its certificate and key, and the control CA.
pub struct AgentClient {
    agent: ureq::Agent,
    base: String,
}

/// A wait as the protocol's milliseconds.
fn millis(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
}

fn transport(e: impl std::fmt::Display) -> ClientError {
    ClientError::Transport(e.to_string())
}

impl AgentClient {
    /// A client for `base` (`https://…`) with the node's files from enrolment in `dir`
    /// (`node.crt`, `node.key`, `ca.crt`).
    pub fn from_dir(base: &str, dir: &Path) -> Result<AgentClient, ClientError> {
        let read =
            |f: &str| std::fs::read(dir.join(f)).map_err(|e| transport(format!("{}: {e}", dir.join(f).display())));
        AgentClient::new(
            base,
            &read(crate::enroll::CERT)?,
            &read(crate::enroll::KEY)?,
            &read(crate::enroll::CA)?,
        )
    }

    /// A client from PEM bytes; `ca_pem` may be a bundle of several CAs.
    pub fn new(base: &str, cert_pem: &[u8], key_pem: &[u8], ca_pem: &[u8]) -> Result<AgentClient, ClientError> {
        let cert = ureq::tls::Certificate::from_pem(cert_pem)
            .map_err(transport)?
            .to_owned();
        let key = ureq::tls::PrivateKey::from_pem(key_pem).map_err(transport)?.to_owned();
        let cas = ca_bundle(ca_pem)?;
        let tls = ureq::tls::TlsConfig::builder()
            .client_cert(Some(ureq::tls::ClientCert::new_with_certs(&[cert], key)))
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(cas)))
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            // A long-polling lease waits up to 30 s; the bound leaves room for it.
            .timeout_global(Some(Duration::from_secs(45)))
            .build()
            .into();
        Ok(AgentClient {
            agent,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    fn post<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let mut resp = self
            .agent
            .post(&format!("{}{path}", self.base))
            .send_json(body)
            .map_err(transport)?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(4 * 1024 * 1024)
            .read_to_string()
            .map_err(transport)?;
        if status != 200 {
            let r: RefusalBody =
                serde_json::from_str(&text).map_err(|_| transport(format!("{path}: HTTP {status}")))?;
            return Err(ClientError::Refused {
                code: r.code,
                message: r.message,
            });
        }
        serde_json::from_str(&text).map_err(transport)
    }

    /// A new certificate for a new key's signing request (see `enroll::signing_request`); the
    /// current one stays valid until the new one is first used.
    pub fn renew_certificate(&self, csr: &str) -> Result<agent_proto::EnrollResponse, ClientError> {
        self.post(
            "/v1/agent/certificate",
            &agent_proto::RenewCertificateRequest { csr: csr.to_owned() },
        )
    }

    /// Says the node is alive, what it can run and what it runs.
    pub fn heartbeat(&self, heartbeat: &Heartbeat) -> Result<(), ClientError> {
        let _: serde_json::Value = self.post("/v1/agent/heartbeat", heartbeat)?;
        Ok(())
    }

    /// Up to `max` of this node's jobs, waiting up to `wait` for one.
    pub fn lease(&self, max: u32, wait: Duration) -> Result<LeaseResponse, ClientError> {
        self.post(
            "/v1/agent/lease",
            &LeaseRequest {
                max,
                wait_ms: millis(wait),
            },
        )
    }

    pub fn renew(&self, proof: &LeaseProof) -> Result<(), ClientError> {
        let _: serde_json::Value = self.post("/v1/agent/renew", &RenewRequest { proof: proof.clone() })?;
        Ok(())
    }

    pub fn complete(&self, proof: &LeaseProof, outcome: Outcome, detail: &str) -> Result<(), ClientError> {
        let _: serde_json::Value = self.post(
            "/v1/agent/complete",
            &CompleteRequest {
                proof: proof.clone(),
                outcome,
                detail: detail.to_owned(),
            },
        )?;
        Ok(())
    }

    /// Several jobs' ends in one request (at most 8), each judged alone: per completion, in
    /// order, `None` when recorded or its refusal.
    pub fn complete_many(
        &self,
        completions: &[(&LeaseProof, Outcome, &str)],
    ) -> Result<Vec<Option<agent_proto::RefusalBody>>, ClientError> {
        Ok(self.complete_batch(completions, None)?.results)
    }

    /// `/v1/agent/complete-batch`, with the next lease when `lease` asks for one.
    fn complete_batch(
        &self,
        completions: &[(&LeaseProof, Outcome, &str)],
        lease: Option<LeaseRequest>,
    ) -> Result<agent_proto::CompleteBatchResponse, ClientError> {
        let batch = agent_proto::CompleteBatch {
            completions: completions
                .iter()
                .map(|(proof, outcome, detail)| CompleteRequest {
                    proof: (*proof).clone(),
                    outcome: *outcome,
                    detail: (*detail).to_owned(),
                })
                .collect(),
            lease,
        };
        self.post("/v1/agent/complete-batch", &batch)
    }

    /// Several jobs' ends and the next lease of up to `max` jobs (waiting up to `wait`), in one
    /// request: per completion, `None` when recorded or its refusal; then the lease, or its
    /// refusal (`node-draining`, …) as an error.
    pub fn complete_and_lease(
        &self,
        completions: &[(&LeaseProof, Outcome, &str)],
        max: u32,
        wait: Duration,
    ) -> Result<CompletedAndLeased, ClientError> {
        let lease = LeaseRequest {
            max,
            wait_ms: millis(wait),
        };
        let answer = self.complete_batch(completions, Some(lease))?;
        let lease = match (answer.leased, answer.lease_refused) {
            (_, Some(r)) => Err(ClientError::Refused {
                code: r.code,
                message: r.message,
            }),
            (Some(l), None) => Ok(l),
            (None, None) => Err(transport("complete-batch answered no lease")),
        };
        Ok((answer.results, lease))
    }

    /// This node's `pl logs` requests, waiting up to `wait` for one.
    pub fn log_wait(&self, wait: Duration) -> Result<Vec<agent_proto::LogRequest>, ClientError> {
        let answer: agent_proto::LogRequests =
            self.post("/v1/agent/logs/wait", &agent_proto::LogWait { wait_ms: millis(wait) })?;
        Ok(answer.requests)
    }

    /// A piece of the log stream `id` (at most `MAX_LOG_CHUNK_BYTES`; empty to learn whether
    /// its reader is still there); `done` ends it. `log-stream-gone`: stop.
    pub fn log_chunk(&self, id: &str, lines: &[u8], done: bool) -> Result<(), ClientError> {
        if !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(transport("a log stream id is hex"));
        }
        let mut resp = self
            .agent
            .post(&format!(
                "{}/v1/agent/logs/{id}{}",
                self.base,
                if done { "?done=true" } else { "" }
            ))
            .header("content-type", "application/octet-stream")
            .send(lines)
            .map_err(transport)?;
        let status = resp.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024)
            .read_to_string()
            .map_err(transport)?;
        let r: RefusalBody = serde_json::from_str(&text).map_err(|_| transport(format!("logs: HTTP {status}")))?;
        Err(ClientError::Refused {
            code: r.code,
            message: r.message,
        })
    }
}

/// What `complete_and_lease` answers: per completion, `None` when recorded or its refusal;
/// then the lease, or its refusal.
pub type CompletedAndLeased = (
    Vec<Option<agent_proto::RefusalBody>>,
    Result<LeaseResponse, ClientError>,
);

/// Every CA certificate of a PEM bundle: during a CA rotation it holds the new CA and the old.
pub fn ca_bundle(pem: &[u8]) -> Result<Vec<ureq::tls::Certificate<'static>>, ClientError> {
    let mut cas = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        if let ureq::tls::PemItem::Certificate(c) = item.map_err(transport)? {
            cas.push(c.to_owned());
        }
    }
    if cas.is_empty() {
        return Err(ClientError::Transport("the CA bundle holds no certificate".into()));
    }
    Ok(cas)
}
