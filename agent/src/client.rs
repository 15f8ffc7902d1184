//! The agent's client of the control plane's agent API: blocking, over mutual TLS with the
//! node's own certificate, speaking `agent-proto`. The node agent uses it, and so does the
//! benchmark of simulated agents.

use agent_proto::{
    CompleteRequest, Heartbeat, LeaseProof, LeaseRequest, LeasedJob, Outcome, Refusal, RefusalBody, RenewRequest,
};
use serde::Deserialize;
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

/// A node's connection settings: its certificate and key, and the control CA. The identity
/// can be switched in place (`switch`) when the certificate is renewed: calls in flight finish
/// on the old one, the next ones use the new one.
pub struct AgentClient {
    agent: std::sync::RwLock<ureq::Agent>,
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
            &read(crate::folder::CERT)?,
            &read(crate::folder::KEY)?,
            &read(crate::folder::CA)?,
        )
    }

    /// A client from PEM bytes; `ca_pem` may be a bundle of several CAs.
    pub fn new(base: &str, cert_pem: &[u8], key_pem: &[u8], ca_pem: &[u8]) -> Result<AgentClient, ClientError> {
        Ok(AgentClient {
            agent: std::sync::RwLock::new(tls_agent(cert_pem, key_pem, ca_pem)?),
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Uses a renewed certificate and key (and CA bundle) from the next call on.
    pub fn switch(&self, cert_pem: &[u8], key_pem: &[u8], ca_pem: &[u8]) -> Result<(), ClientError> {
        let fresh = tls_agent(cert_pem, key_pem, ca_pem)?;
        let mut slot = self
            .agent
            .write()
            .map_err(|_| transport("the client's identity lock is poisoned"))?;
        *slot = fresh;
        Ok(())
    }

    fn agent(&self) -> Result<ureq::Agent, ClientError> {
        self.agent
            .read()
            .map(|a| a.clone())
            .map_err(|_| transport("the client's identity lock is poisoned"))
    }
}

/// An HTTPS agent presenting `cert_pem`/`key_pem` and trusting the CAs of `ca_pem`.
fn tls_agent(cert_pem: &[u8], key_pem: &[u8], ca_pem: &[u8]) -> Result<ureq::Agent, ClientError> {
    {
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
            // ureq's 128 KiB each way is for browsing; an agent's answers are small or streamed
            // (image blobs), and a node simulator holds ten thousand of these.
            .input_buffer_size(CONNECTION_BUFFER)
            .output_buffer_size(CONNECTION_BUFFER)
            .build()
            .into();
        Ok(agent)
    }
}

impl AgentClient {
    fn post<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let mut resp = self
            .agent()?
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
    /// Sends a heartbeat; the reply may carry the mesh the node should apply.
    pub fn heartbeat(&self, heartbeat: &Heartbeat) -> Result<agent_proto::mesh::HeartbeatReply, ClientError> {
        self.post("/v1/agent/heartbeat", heartbeat)
    }

    /// Up to `max` of this node's jobs, waiting up to `wait` for one.
    pub fn lease(&self, max: u32, wait: Duration) -> Result<Leased, ClientError> {
        self.lease_holding(max, wait, None)
    }

    /// [`AgentClient::lease`] for a node in the mesh holding generation `mesh` of it: a newer
    /// mesh comes with the answer (and ends its wait).
    pub fn lease_holding(&self, max: u32, wait: Duration, mesh: Option<u64>) -> Result<Leased, ClientError> {
        let raw: RawLease = self.post(
            "/v1/agent/lease",
            &LeaseRequest {
                max,
                wait_ms: millis(wait),
                mesh_applied: mesh,
            },
        )?;
        raw.decode()
    }

    pub fn renew(&self, proof: &LeaseProof) -> Result<(), ClientError> {
        let _: agent_proto::RenewResponse = self.post("/v1/agent/renew", &RenewRequest { proof: proof.clone() })?;
        Ok(())
    }

    pub fn complete(&self, proof: &LeaseProof, outcome: Outcome, detail: &str) -> Result<(), ClientError> {
        let _: agent_proto::CompleteResponse = self.post(
            "/v1/agent/complete",
            &CompleteRequest {
                proof: proof.clone(),
                outcome,
                detail: detail.to_owned(),
                backup: None,
                measured: None,
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
        Ok(self.complete_batch(requests(completions), None)?.results)
    }

    /// `/v1/agent/complete-batch`, with the next lease when `lease` asks for one.
    fn complete_batch(
        &self,
        completions: Vec<CompleteRequest>,
        lease: Option<LeaseRequest>,
    ) -> Result<RawCompleteBatch, ClientError> {
        let batch = agent_proto::CompleteBatch { completions, lease };
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
        self.report_and_lease(requests(completions), max, wait, None)
    }

    /// [`AgentClient::complete_and_lease`] with whole completions (a backup's report, say),
    /// holding generation `mesh` of the node's mesh (see [`AgentClient::lease_holding`]).
    pub fn report_and_lease(
        &self,
        completions: Vec<CompleteRequest>,
        max: u32,
        wait: Duration,
        mesh: Option<u64>,
    ) -> Result<CompletedAndLeased, ClientError> {
        let lease = LeaseRequest {
            max,
            wait_ms: millis(wait),
            mesh_applied: mesh,
        };
        let answer = self.complete_batch(completions, Some(lease))?;
        let lease = match (answer.leased, answer.lease_refused) {
            (_, Some(r)) => Err(ClientError::Refused {
                code: r.code,
                message: r.message,
            }),
            (Some(l), None) => l.decode(),
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
            .agent()?
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

    /// A manifest or blob of the control plane's image store, by digest, as the answer
    /// streams (the caller reads its body; any status comes back). One fetch may take up to
    /// [`FETCH_TIMEOUT`].
    pub fn fetch(
        &self,
        kind: agent_proto::images::Fetch,
        digest: &str,
        head: bool,
    ) -> Result<ureq::http::Response<ureq::Body>, ClientError> {
        let url = format!("{}{}", self.base, agent_proto::images::fetch_path(kind, digest));
        let agent = self.agent()?;
        let request = if head { agent.head(&url) } else { agent.get(&url) };
        request
            .config()
            .timeout_global(Some(FETCH_TIMEOUT))
            .build()
            .call()
            .map_err(transport)
    }
}

/// Each connection's read and write buffer: the largest header an answer may have, and the
/// chunk a streamed body moves in.
const CONNECTION_BUFFER: usize = 32 * 1024;

/// How long one image fetch through the agent API may take (a large layer on a slow link).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(3_600);

/// What `complete_and_lease` answers: per completion, `None` when recorded or its refusal;
/// then the lease, or its refusal.
pub type CompletedAndLeased = (Vec<Option<agent_proto::RefusalBody>>, Result<Leased, ClientError>);

/// What a lease brought: the jobs that decode, in order, and those that do not.
#[derive(Debug, Default)]
pub struct Leased {
    pub jobs: Vec<LeasedJob>,
    /// Jobs whose task or execution this agent does not know (a newer control plane's, or a
    /// malformed one): never run, reported as permanent failures with `task-undecodable`.
    pub undecodable: Vec<Undecodable>,
    /// The node's mesh, when newer than the one the lease said it holds.
    pub mesh: Option<agent_proto::mesh::MeshSpec>,
}

/// A leased job that does not decode: what is needed to report it, and why.
#[derive(Debug)]
pub struct Undecodable {
    pub key: String,
    pub proof: LeaseProof,
    pub reason: String,
}

/// A lease's answer, each job decoded alone (one job this agent cannot read must not cost it
/// the others, nor leave their leases to expire).
///
/// Each job is kept as its JSON text and decoded once, straight into its type: building a
/// `serde_json::Value` tree per job first cost the agent more than the rest of a request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLease {
    jobs: Vec<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    mesh: Option<agent_proto::mesh::MeshSpec>,
}

/// What a job must carry at least, to be reported.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reportable {
    key: String,
    proof: LeaseProof,
}

impl RawLease {
    fn decode(self) -> Result<Leased, ClientError> {
        let mut out = Leased {
            mesh: self.mesh,
            ..Leased::default()
        };
        for raw in self.jobs {
            let job = serde_json::from_str::<LeasedJob>(raw.get())
                .map_err(|e| e.to_string())
                .and_then(|job| job.task.check().map(|()| job));
            match job {
                Ok(job) => out.jobs.push(job),
                Err(e) => {
                    let r = serde_json::from_str::<Reportable>(raw.get())
                        .map_err(|_| transport(format!("a leased job without a key and proof: {e}")))?;
                    out.undecodable.push(Undecodable {
                        key: r.key,
                        proof: r.proof,
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(out)
    }
}

/// `/v1/agent/complete-batch`'s answer, its lease decoded job by job.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawCompleteBatch {
    results: Vec<Option<RefusalBody>>,
    #[serde(default)]
    leased: Option<RawLease>,
    #[serde(default)]
    lease_refused: Option<RefusalBody>,
}

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

/// Completions without a backup's report, as the tests and simple callers give them.
fn requests(completions: &[(&LeaseProof, Outcome, &str)]) -> Vec<CompleteRequest> {
    completions
        .iter()
        .map(|(proof, outcome, detail)| CompleteRequest {
            proof: (*proof).clone(),
            outcome: *outcome,
            detail: (*detail).to_owned(),
            backup: None,
            measured: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(task: &str) -> String {
        format!(
            r#"{{"key":"k","task":{task},"execution":{{"kind":"removal"}},"attempt":1,"proof":{{"jobId":7,"leaseToken":"t","fencingToken":1}},"expiresAtMs":0}}"#
        )
    }

    #[test]
    fn a_job_this_agent_cannot_read_is_set_apart_with_its_proof_and_the_others_run() {
        let good = job(r#"{"task":"stop-application","environment":"e","role":"web","instance":0,"generation":1}"#);
        let unknown = job(r#"{"task":"format-disk","environment":"e","generation":1}"#);
        let bad_name = job(r#"{"task":"ensure-network","environment":"../../etc","generation":1}"#);
        let answer = format!(r#"{{"results":[null],"leased":{{"jobs":[{unknown},{good},{bad_name}]}}}}"#);
        let raw: RawCompleteBatch = serde_json::from_str(&answer).expect("decodes");
        assert_eq!(raw.results, vec![None]);
        let leased = raw.leased.expect("a lease").decode().expect("decodes");
        assert_eq!(leased.jobs.len(), 1);
        assert_eq!(leased.jobs[0].task.kind(), "stop-application");
        let reasons: Vec<&str> = leased.undecodable.iter().map(|u| u.reason.as_str()).collect();
        assert_eq!(leased.undecodable.len(), 2, "{reasons:?}");
        assert!(reasons[0].contains("format-disk"), "{reasons:?}");
        assert!(reasons[1].contains("not a label"), "{reasons:?}");
        assert!(leased.undecodable.iter().all(|u| u.proof.job_id == 7 && u.key == "k"));
        // Without a proof it cannot be reported: the whole answer is refused.
        let hopeless = r#"{"jobs":[{"key":"k","task":{"task":"x"}}]}"#;
        let raw: RawLease = serde_json::from_str(hopeless).expect("json");
        assert!(raw.decode().is_err());
    }
}
