//! The agent API, over mutual TLS: a connection must present a client certificate signed by
//! the control CA, and every request is admitted only if the control plane issued that
//! certificate, has not revoked it and it has not expired. A node then heartbeats, leases only
//! the jobs targeted at itself (long polling), renews and completes them with their fencing
//! proof. Every refusal is a code from `agent_proto::Refusal` and records nothing.

use crate::config::Config;
use crate::delivery::ImageRules;
use crate::http::peer::Peers;
use crate::http::server::{PeerCert, internal, json, refused};
use crate::hub::Hub;
use crate::ops::group::Group;
use crate::store::{Completion, LeaseToken, Ledger, now_ms};
use agent_proto::{
    CompleteRequest, Heartbeat, LeaseProof, LeaseRequest, LeaseResponse, LeasedJob, MAX_DETAIL_BYTES, MAX_LEASE_BATCH,
    MAX_LEASE_WAIT_MS, Outcome, Refusal, RenewRequest,
};
use axum::Router;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use state_schema::declared::Declared;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a lease lasts before it must be renewed.
pub const LEASE_TTL_MS: i64 = 30_000;

/// How long what Git declares of the nodes is reused by leases.
pub const DECLARED_CACHE_MS: u64 = 1_000;

/// The agent API's own state.
pub struct Agents {
    pub config: Arc<Config>,
    pub ledger: Arc<Ledger>,
    pub hub: Arc<Hub>,
    /// The group commit its leases and completions go through.
    pub group: Arc<Group>,
    pub peers: Arc<Peers>,
    /// The control host's age identities (`control.age_identity`, `certificates.identity`), which
    /// reseal secrets and issued keys to nodes at lease time; empty when none is configured.
    pub control_identities: Vec<Box<dyn age::Identity + Send + Sync>>,
    /// The policy's image rules and the allowed signers: what each container's image must carry.
    pub images: ImageRules,
    /// What Git declares of each node, reused for [`DECLARED_CACHE_MS`].
    declared: std::sync::Mutex<Option<DeclaredNodes>>,
}

impl Agents {
    /// Reads the control host's age identity, if one is configured; `images` from the trust files.
    pub fn new(
        config: Arc<Config>,
        ledger: Arc<Ledger>,
        hub: Arc<Hub>,
        group: Arc<Group>,
        peers: Arc<Peers>,
        images: ImageRules,
    ) -> Result<Agents, String> {
        let mut control_identities = match &config.control.age_identity {
            Some(p) => pushleft_secrets::load_identities(p)
                .map_err(|e| format!("control.age_identity {}: {}", p.display(), e.code()))?,
            None => Vec::new(),
        };
        // Issued certificates' keys may be sealed to an identity of their own.
        if let Some(p) = config.certificates.as_ref().and_then(|c| c.identity.as_ref())
            && config.control.age_identity.as_ref() != Some(p)
        {
            control_identities.extend(
                pushleft_secrets::load_identities(p)
                    .map_err(|e| format!("certificates.identity {}: {}", p.display(), e.code()))?,
            );
        }
        Ok(Agents {
            config,
            ledger,
            hub,
            group,
            peers,
            control_identities,
            images,
            declared: std::sync::Mutex::new(None),
        })
    }
}

type App = State<Arc<Agents>>;
type Peer = Extension<Option<PeerCert>>;

/// The agent API's own routes; the composition root merges `pl logs`' agent side.
pub fn router(state: Arc<Agents>) -> Router {
    Router::new()
        .route("/v1/agent/heartbeat", post(heartbeat))
        .route("/v1/agent/lease", post(lease))
        .route("/v1/agent/renew", post(renew))
        .route("/v1/agent/complete", post(complete))
        .route("/v1/agent/complete-batch", post(complete_batch))
        .route("/v1/agent/certificate", post(certificate))
        .with_state(state)
}

/// What the applied branch declares of `node`, from a map looked at again at most once a
/// second and rebuilt only when the pools' hashes changed (10,000 declared nodes are a map
/// of 10,000 entries: rebuilt every second, it was a few percent of a daemon's time).
async fn declared(s: &Agents, node: &str) -> Result<Declared, crate::store::LedgerError> {
    if let Ok(c) = s.declared.lock()
        && let Some(d) = c.as_ref()
        && d.at.elapsed() < Duration::from_millis(DECLARED_CACHE_MS)
    {
        return Ok(d.nodes.get(node).cloned().unwrap_or(Declared::No));
    }
    let branch = &s.config.source.branch;
    let pools = crate::ops::nodes::pools_signature(&s.ledger, branch).await?;
    if let Ok(mut c) = s.declared.lock()
        && let Some(d) = c.as_mut()
        && d.pools == pools
    {
        d.at = Instant::now();
        return Ok(d.nodes.get(node).cloned().unwrap_or(Declared::No));
    }
    let nodes = state_schema::declared::declared_nodes(&crate::ops::nodes::applied_pools(&s.ledger, branch).await?);
    let answer = nodes.get(node).cloned().unwrap_or(Declared::No);
    if let Ok(mut c) = s.declared.lock() {
        *c = Some(DeclaredNodes {
            at: Instant::now(),
            pools,
            nodes,
        });
    }
    Ok(answer)
}

/// What Git declares of each node, as of the pools whose hashes are `pools`.
pub(crate) struct DeclaredNodes {
    at: Instant,
    pools: Vec<String>,
    nodes: std::collections::HashMap<String, Declared>,
}

fn token_of(p: &LeaseProof) -> LeaseToken {
    LeaseToken {
        job_id: p.job_id,
        lease_token: p.lease_token.clone(),
        fencing_token: p.fencing_token,
    }
}

/// Refuses a proof for another node's job before anything is written.
async fn own_job(s: &Agents, node: &str, job_id: i64) -> Result<(), Response> {
    match s.ledger.nodes().job_nodes(&[job_id]).await {
        Ok(found) if found.iter().any(|(_, n)| n == node) => Ok(()),
        Ok(found) if found.is_empty() => Err(refused(Refusal::StaleFencingToken, "no such lease")),
        Ok(_) => Err(refused(Refusal::NotYourJob, "that job is another node's")),
        Err(e) => Err(internal(e)),
    }
}

async fn heartbeat(State(s): App, Extension(peer): Peer, body: axum::body::Body) -> Response {
    let node = match s.peers.caller(peer).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let hb: Heartbeat = match json(body).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    // Every refusal before the first write.
    if let Some(why) = crate::ops::agents::malformed(&hb) {
        return refused(Refusal::MalformedRequest, why);
    }
    let version: String = hb.agent_version.chars().take(64).collect();
    let capabilities = crate::ops::agents::offered(&hb);
    let observed = serde_json::to_string(&hb.running).unwrap_or_else(|_| "[]".into());
    let bounded = |t: &str, n: usize| -> String { t.chars().filter(|c| !c.is_control()).take(n).collect() };
    let repaired: Vec<(String, String)> = hb
        .repaired
        .iter()
        .map(|r| (bounded(&r.environment, 63), bounded(&r.what, 256)))
        .collect();
    let taken = taken_subnets(&hb.taken_subnets);
    // Its environment networks as pool indices (anything outside the pool says nothing).
    let networks: Vec<(String, i64)> = hb
        .networks
        .iter()
        .filter(|n| state_schema::values::Name::new(&n.environment).is_ok())
        .filter_map(|n| Some((n.environment.clone(), crate::store::rows::subnet_index(&n.subnet)?)))
        .collect();
    // Only rows naming this node are updated, so a node reports only what it holds.
    let measured: Vec<crate::store::volumes::Measured> = hb
        .volumes
        .iter()
        .map(|v| crate::store::volumes::Measured {
            environment: v.environment.clone(),
            volume: v.volume.clone(),
            generation: v.generation,
            bytes: v.bytes,
        })
        .collect();
    let names = hb
        .mesh
        .as_ref()
        .and_then(|m| serde_json::to_string(&m.names).ok())
        .unwrap_or_else(|| "[]".into());
    let links = hb
        .mesh
        .as_ref()
        .map(|m| serde_json::to_string(&m.links).unwrap_or_else(|_| "[]".into()));
    let beat = crate::ops::agents::Heartbeat {
        beat: crate::store::fleet::Beat {
            agent_version: &version,
            protocol: hb.protocol,
            capabilities: &capabilities,
            host: hb.host.as_deref(),
            observed: &observed,
            repaired: &repaired,
            taken_subnets: &taken,
            mesh: hb
                .mesh
                .as_ref()
                .map(|m| (m.public_key.as_str(), m.port, m.address.as_deref(), names.as_str())),
            // The heartbeat's use case sets it with the interval it tells the node.
            grace_ms: 0,
        },
        volumes: &measured,
        mesh: hb.mesh.as_ref().zip(links.as_deref()).map(|(m, l)| (m.applied, l)),
        age_recipient: hb.age_recipient.as_deref(),
        networks: &networks,
    };
    let control = &s.config.control;
    let silence = (control.lost_after_ms(), control.cadence());
    let beaten = match crate::ops::agents::heartbeat(&s.ledger, &s.hub, silence, &node, &beat, now_ms()).await {
        Ok(b) => b,
        Err(e) => return internal(e),
    };
    axum::Json(agent_proto::mesh::HeartbeatReply {
        node,
        // The node's mesh, when it has not applied the newest yet.
        mesh: beaten.mesh.and_then(served_mesh),
        next_heartbeat_ms: u64::try_from(beaten.next_ms).ok(),
    })
    .into_response()
}

/// The subnets a node reports taken, as indices in the pool (sorted, once each, joined by
/// commas); anything else (outside it, malformed) says nothing to placement.
fn taken_subnets(reported: &[String]) -> String {
    let mut taken: Vec<i64> = reported
        .iter()
        .filter_map(|s| crate::store::rows::subnet_index(s))
        .collect();
    taken.sort_unstable();
    taken.dedup();
    taken.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// A node's mesh row as its agent receives it: the spec with the ledger's generation.
fn served_mesh((generation, spec): (i64, String)) -> Option<agent_proto::mesh::MeshSpec> {
    serde_json::from_str::<agent_proto::mesh::MeshSpec>(&spec)
        .ok()
        .map(|spec| agent_proto::mesh::MeshSpec {
            generation: u64::try_from(generation).unwrap_or(0),
            ..spec
        })
}

/// Leases up to `max` (at most 8) of the caller's own jobs, waiting up to `waitMs` for one:
/// woken at once by this daemon's writes, and every 50 ms for another leader's.
async fn lease(State(s): App, Extension(peer): Peer, body: axum::body::Body) -> Response {
    let node = match s.peers.caller(peer).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let req: LeaseRequest = match json(body).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    match lease_jobs(&s, &node, &req).await {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(LeaseError::Refused(code, message)) => refused(code, message),
        Err(LeaseError::Internal(e)) => internal(e),
    }
}

/// Why a lease gave nothing.
enum LeaseError {
    Refused(Refusal, &'static str),
    Internal(String),
}

/// The lease itself, for `lease` and for the lease that comes with a `complete-batch`, in a
/// span of its own (`lease`: the node, what it asked for, and what it got).
async fn lease_jobs(s: &Agents, node: &str, req: &LeaseRequest) -> Result<LeaseResponse, LeaseError> {
    use tracing::Instrument;
    let span = tracing::debug_span!("lease", node = %node, max = req.max, wait_ms = req.wait_ms, leased = tracing::field::Empty);
    let answer = lease_jobs_now(s, node, req).instrument(span.clone()).await;
    if let Ok(a) = &answer {
        span.record("leased", a.jobs.len());
    }
    answer
}

async fn lease_jobs_now(s: &Agents, node: &str, req: &LeaseRequest) -> Result<LeaseResponse, LeaseError> {
    let internal = |e: &dyn std::fmt::Display| LeaseError::Internal(e.to_string());
    // A draining node gets no new work: only what takes its old work away (each removal
    // queued after its replacement elsewhere is healthy).
    let removals_only = match declared(s, node).await {
        Ok(Declared::Yes { .. }) => false,
        Ok(Declared::Draining { .. }) => true,
        Ok(Declared::Retired) => return Err(LeaseError::Refused(Refusal::NodeRetired, "the node is retired in Git")),
        Ok(Declared::No) => {
            return Err(LeaseError::Refused(
                Refusal::NodeNotDeclared,
                "the node is not declared",
            ));
        }
        Err(e) => return Err(internal(&e)),
    };
    let max = req.max.clamp(1, MAX_LEASE_BATCH);
    let wait = Duration::from_millis(req.wait_ms.min(MAX_LEASE_WAIT_MS));
    let started = Instant::now();
    // Registered before the first look: the node's lease is woken when work for it is due
    // (`ops::lease_wakes`: one look for the fleet, within a second of any write, at once
    // after this daemon's) or its mesh changed; nothing else reads its queue while it waits.
    let mut woken = s.hub.nodes.wait_for(node);
    // The node's mesh, when its agent holds an older one: looked at first, then after each
    // wake-up (one read each), and it ends the wait like a job would.
    let held = req.mesh_applied.map(|g| i64::try_from(g).unwrap_or(i64::MAX));
    let mut mesh = None;
    loop {
        if let Some(held) = held {
            mesh = s
                .ledger
                .nodes()
                .mesh_newer(node, held)
                .await
                .map_err(|e| internal(&e))?
                .and_then(served_mesh);
        }
        let wait = if mesh.is_some() { Duration::ZERO } else { wait };
        let asked = Instant::now();
        let leases = s
            .group
            .lease(node, max, removals_only, LEASE_TTL_MS)
            .await
            .map_err(|e| internal(&e))?;
        if !leases.is_empty() || started.elapsed() >= wait {
            let grouped = asked.elapsed();
            let jobs = delivered(s, node, leases).await.map_err(|e| internal(&e))?;
            // Where a lease's time goes: its group's transaction, and its jobs' reads.
            tracing::debug!(
                node,
                jobs = jobs.len(),
                group_ms = grouped.as_secs_f64() * 1000.0,
                delivered_ms = (asked.elapsed() - grouped).as_secs_f64() * 1000.0,
                "lease answered"
            );
            if jobs.is_empty() && started.elapsed() < wait {
                continue;
            }
            if jobs.is_empty() && removals_only && mesh.is_none() {
                // Nothing to take away, and new work is not for a draining node.
                return Err(LeaseError::Refused(
                    Refusal::NodeDraining,
                    "the node is draining: no new work",
                ));
            }
            return Ok(LeaseResponse { jobs, mesh });
        }
        let left = wait.saturating_sub(started.elapsed());
        tokio::select! {
            () = woken.woken() => {}
            () = tokio::time::sleep(left) => {}
        }
    }
}

/// The leased jobs as the agent gets them, each with its execution spec. A job that cannot be
/// delivered would fail the same way on every node and every try: recorded as a permanent
/// failure, with its code, and never handed out.
async fn delivered(s: &Agents, node: &str, leases: Vec<crate::store::Lease>) -> Result<Vec<LeasedJob>, String> {
    let executions = s
        .ledger
        .executions(
            node,
            &leases,
            (&s.control_identities, s.config.issues_certificates(), &s.images),
            now_ms(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut jobs = Vec::with_capacity(leases.len());
    for (l, execution) in leases.into_iter().zip(executions) {
        let execution = match execution {
            Ok(x) => x,
            Err(why) => {
                tracing::warn!(node = %node, job_key = %l.key, job_id = l.token.job_id, code = why.code, "job cannot be delivered");
                let done = Completion {
                    token: l.token,
                    outcome: crate::store::Outcome::Permanent(format!("{}: {}", why.code, why.message)),
                };
                // This daemon's own fresh lease: a refusal cannot come, and would change
                // nothing.
                let _ = s.group.complete(done, node).await?;
                continue;
            }
        };
        jobs.push(LeasedJob {
            key: l.key,
            task: crate::delivery::wire_task(&l.task),
            execution,
            attempt: l.attempt,
            proof: LeaseProof {
                job_id: l.token.job_id,
                lease_token: l.token.lease_token,
                fencing_token: l.token.fencing_token,
            },
            expires_at_ms: l.expires_at_ms,
        });
    }
    Ok(jobs)
}

async fn renew(State(s): App, Extension(peer): Peer, body: axum::body::Body) -> Response {
    let node = match s.peers.caller(peer).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let req: RenewRequest = match json(body).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    if let Err(r) = own_job(&s, &node, req.proof.job_id).await {
        return r;
    }
    match crate::ops::agents::renew_leases(&s.ledger, &[token_of(&req.proof)], LEASE_TTL_MS, now_ms()).await {
        Ok(r) => match r.first() {
            Some(Ok(expires)) => axum::Json(agent_proto::RenewResponse {
                expires_at_ms: *expires,
            })
            .into_response(),
            _ => refused(Refusal::StaleFencingToken, "the lease is no longer yours"),
        },
        Err(e) => internal(e),
    }
}

/// True when a detail carries what looks like a secret: age ciphertext or an age identity.
fn secret_shaped(detail: &str) -> bool {
    detail.contains("-----BEGIN AGE ENCRYPTED FILE-----") || detail.contains("AGE-SECRET-KEY-")
}

/// A completion as the ledger records it, or its refusal (which records nothing).
fn checked(req: CompleteRequest) -> Result<Completion, (Refusal, &'static str)> {
    if req.detail.len() > MAX_DETAIL_BYTES {
        return Err((Refusal::MalformedRequest, "the detail is larger than 16 KiB"));
    }
    if secret_shaped(&req.detail) {
        return Err((Refusal::SecretInResult, "a result may not carry secret-shaped values"));
    }
    let outcome = match req.outcome {
        Outcome::Succeeded => match (req.backup, req.measured) {
            (Some(b), _) => crate::store::Outcome::Saved(crate::store::backups::Saved {
                snapshot: b.snapshot,
                bytes: b.bytes,
                data_added: b.data_added,
            }),
            (None, Some(m)) => crate::store::Outcome::Measured(crate::store::Measure {
                requests: i64::from(m.requests),
                errors: i64::from(m.errors),
                p95_micros: m.p95_micros.map(|p| i64::try_from(p).unwrap_or(i64::MAX)),
                logged: m.logged,
            }),
            (None, None) => crate::store::Outcome::Succeeded,
        },
        Outcome::Retryable => crate::store::Outcome::Retryable(req.detail),
        Outcome::Permanent => crate::store::Outcome::Permanent(req.detail),
    };
    Ok(Completion {
        token: token_of(&req.proof),
        outcome,
    })
}

/// The ledger's answer to a completion, as the protocol's refusal.
fn judged(r: Result<(), crate::store::Refused>) -> Result<(), (Refusal, &'static str)> {
    match r {
        Ok(()) => Ok(()),
        Err(crate::store::Refused::NotYourJob) => Err((Refusal::NotYourJob, "that job is another node's")),
        Err(_) => Err((Refusal::StaleFencingToken, "the lease is no longer yours")),
    }
}

/// One completion, judged alone: its refusal (recording nothing), or recorded.
async fn complete_one(
    s: &Agents,
    node: &str,
    req: CompleteRequest,
) -> Result<Result<(), (Refusal, &'static str)>, String> {
    let done = match checked(req) {
        Ok(d) => d,
        Err(r) => return Ok(Err(r)),
    };
    // Ownership is checked in the completion's own transaction (one query for a whole group).
    Ok(judged(s.group.complete(done, node).await?))
}

async fn complete(State(s): App, Extension(peer): Peer, body: axum::body::Body) -> Response {
    let node = match s.peers.caller(peer).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let req: CompleteRequest = match json(body).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    match complete_one(&s, &node, req).await {
        Ok(Ok(())) => axum::Json(agent_proto::CompleteResponse { completed: true }).into_response(),
        Ok(Err((code, message))) => refused(code, message),
        Err(e) => internal(e),
    }
}

/// Several completions in one request, each judged alone; they share the group's
/// transaction.
async fn complete_batch(State(s): App, Extension(peer): Peer, body: axum::body::Body) -> Response {
    let node = match s.peers.caller(peer).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let req: agent_proto::CompleteBatch = match json(body).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    if req.completions.len() > MAX_LEASE_BATCH as usize {
        return refused(Refusal::MalformedRequest, "at most 8 completions a request");
    }
    // Every completion queued first, then the lease: they share a group transaction (or the
    // lease comes in a later one), so the lease sees the completions.
    let mut pending = Vec::with_capacity(req.completions.len());
    for c in req.completions {
        pending.push(match checked(c) {
            Ok(done) => match s.group.submit_complete(done, &node).await {
                Ok(answer) => Ok(answer),
                Err(e) => return internal(e),
            },
            Err(r) => Err(r),
        });
    }
    let (mut leased, mut lease_refused) = (None, None);
    if let Some(lease) = &req.lease {
        match lease_jobs(&s, &node, lease).await {
            Ok(answer) => leased = Some(answer),
            Err(LeaseError::Refused(code, message)) => {
                lease_refused = Some(agent_proto::RefusalBody {
                    code,
                    message: message.to_owned(),
                });
            }
            Err(LeaseError::Internal(e)) => return internal(e),
        }
    }
    let mut results = Vec::with_capacity(pending.len());
    for p in pending {
        let r = match p {
            Ok(answer) => match answer.await {
                Ok(Ok(r)) => judged(r),
                Ok(Err(e)) => return internal(e),
                Err(_) => return internal("the group committer has stopped"),
            },
            Err(r) => Err(r),
        };
        results.push(r.err().map(|(code, message)| agent_proto::RefusalBody {
            code,
            message: message.to_owned(),
        }));
    }
    axum::Json(agent_proto::CompleteBatchResponse {
        results,
        leased,
        lease_refused,
    })
    .into_response()
}

/// Renews the caller's certificate from a new key's signing request.
async fn certificate(State(s): App, Extension(peer): Peer, body: axum::body::Body) -> Response {
    let (node, old) = match s.peers.caller_and_certificate(peer).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let req: agent_proto::RenewCertificateRequest = match json(body).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let renewed = crate::ops::agents::renew_certificate(&s.ledger, &s.config.control, &node, &old, &req.csr, now_ms());
    crate::http::server::certified(renewed.await)
}
