//! The agent's lease loop: leases its node's jobs, runs each environment's in order (different
//! environments in parallel up to a bound; an ACME challenge's placement beside its
//! environment's steps, [`Queue`]), renews every held lease until its end is reported,
//! and reports a step's ends together with the next lease in one request
//! (`/v1/agent/complete-batch`). `pl-agent run` drives it with the real executors; the fleet
//! bench drives the same loop with tasks that do nothing, so it measures what a fleet gets.
//!
//! Why one request: a node spends one round trip per step instead of two, and the control plane
//! one group transaction. A long poll is used only when nothing is held (no end can come while
//! it waits); while tasks run, the loop waits for their ends and looks for other environments'
//! jobs every [`BUSY_POLL`].

use crate::client::{AgentClient, ClientError, Undecodable};
use crate::outcome::{Failure, report};
use agent_proto::{LeaseProof, LeasedJob, MAX_LEASE_BATCH, Outcome};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What runs a leased task. `pl-agent run` runs the node's executors; the fleet bench, nothing.
pub trait Tasks: Send + Sync + 'static {
    /// Runs one task: a short note on success, or its failure.
    fn execute(&self, job: &LeasedJob) -> impl Future<Output = Result<Ended, Failure>> + Send;
    /// A step's tasks ended: what runs may have changed.
    fn changed(&self) {}
    /// The newest mesh generation this node holds (applied or being applied), when it is in
    /// the mesh: the lease asks for a newer one.
    fn mesh_held(&self) -> Option<u64> {
        None
    }
    /// A newer mesh came with a lease: applied off the lease's path.
    fn mesh(&self, _spec: agent_proto::mesh::MeshSpec) {}
}

/// How many tasks of one step of one environment run at once.
pub const STEP_PARALLELISM: usize = 8;

/// Jobs leased and not yet reported, at most: beyond it the loop leases nothing more until
/// ends are reported (a node does not hoard work another could do after a re-placement).
pub const MAX_HELD: usize = 64;

/// While tasks run, how often the loop asks for other environments' jobs.
pub const BUSY_POLL: Duration = Duration::from_secs(1);

/// How often a held lease is renewed (the control plane's leases last 30 s).
pub const RENEW_EVERY: Duration = Duration::from_secs(10);

/// What the ends of one request may take of the agent API's body limit; the rest is for the
/// envelope and the lease asked with them.
const REPORT_BUDGET: usize = agent_proto::MAX_AGENT_BODY_BYTES - 2048;

/// An end's size in a request, at most: its detail as JSON writes it (quotes, backslashes,
/// newlines and tabs take two bytes; the other control characters, which take six, are left
/// out of reports, and are counted as six should one come), its proof with the field names,
/// and a backup's or a measure's typed report (their numbers at their widest).
fn wire_bytes(end: &Done) -> usize {
    let detail: usize = end
        .detail
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\t' | b'\r' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum();
    let backup = end.backup.as_ref().map_or(0, |b| b.snapshot.len() + 96);
    let measured = end.measured.map_or(0, |_| 112);
    detail + end.proof.lease_token.len() + 160 + backup + measured
}

/// A job's end, waiting to be reported. Its lease is renewed until then.
struct Done {
    key: String,
    proof: LeaseProof,
    outcome: Outcome,
    detail: String,
    /// What a backup saved (its success's typed report).
    backup: Option<agent_proto::BackupReport>,
    /// What a canary's measure saw.
    measured: Option<agent_proto::CanaryMeasure>,
    _renewing: Option<Renewal>,
}

/// A task's success: its note, and what a backup saved or a canary's measure saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ended {
    pub note: String,
    pub backup: Option<agent_proto::BackupReport>,
    pub measured: Option<agent_proto::CanaryMeasure>,
}

impl From<String> for Ended {
    fn from(note: String) -> Ended {
        Ended {
            note,
            ..Ended::default()
        }
    }
}

/// Renews a lease every [`RENEW_EVERY`] until dropped.
struct Renewal(tokio::task::JoinHandle<()>);

impl Drop for Renewal {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn renewal(client: &Arc<AgentClient>, proof: &LeaseProof) -> Renewal {
    let (client, proof) = (Arc::clone(client), proof.clone());
    Renewal(tokio::spawn(async move {
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            let p = proof.clone();
            if let Err(e) = blocking(&client, move |c| c.renew(&p)).await {
                tracing::warn!(job_id = proof.job_id, error = %e, "lease renewal failed");
                return;
            }
        }
    }))
}

/// Runs a blocking client call off the async threads.
pub async fn blocking<T: Send + 'static>(
    client: &Arc<AgentClient>,
    f: impl FnOnce(&AgentClient) -> Result<T, ClientError> + Send + 'static,
) -> Result<T, ClientError> {
    let c = Arc::clone(client);
    tokio::task::spawn_blocking(move || f(&c))
        .await
        .unwrap_or_else(|e| Err(ClientError::Transport(e.to_string())))
}

/// Ends waiting to be reported, in the order they came.
#[derive(Default)]
struct Outbox {
    done: Mutex<VecDeque<Done>>,
    ready: tokio::sync::Notify,
}

impl Outbox {
    fn push(&self, ends: Vec<Done>) {
        if let Ok(mut d) = self.done.lock() {
            d.extend(ends);
        }
        self.ready.notify_one();
    }

    /// Up to one request's worth: at most [`MAX_LEASE_BATCH`] ends, and no more than fit in
    /// the agent API's body limit (eight failures with full log tails do not), at least one.
    fn take(&self) -> Vec<Done> {
        let Ok(mut d) = self.done.lock() else {
            return Vec::new();
        };
        let (mut n, mut bytes) = (0, 0);
        for end in d.iter().take(MAX_LEASE_BATCH as usize) {
            bytes += wire_bytes(end);
            if n > 0 && bytes > REPORT_BUDGET {
                break;
            }
            n += 1;
        }
        d.drain(..n).collect()
    }

    /// Puts back ends whose report was lost, before any newer.
    fn put_back(&self, ends: Vec<Done>) {
        if let Ok(mut d) = self.done.lock() {
            for e in ends.into_iter().rev() {
                d.push_front(e);
            }
        }
    }
}

/// One node's lease loop.
pub struct LeaseLoop<T: Tasks> {
    client: Arc<AgentClient>,
    tasks: Arc<T>,
    slots: Arc<tokio::sync::Semaphore>,
    long_wait: Duration,
    outbox: Arc<Outbox>,
    recorded: AtomicU64,
    reports: AtomicU64,
    requests: AtomicU64,
}

impl<T: Tasks> LeaseLoop<T> {
    /// `parallel_environments` environments at work at once; `long_wait` is the long poll's
    /// length when nothing is held (the agent waits 20 s).
    pub fn new(client: Arc<AgentClient>, tasks: Arc<T>, parallel_environments: usize, long_wait: Duration) -> Self {
        LeaseLoop {
            client,
            tasks,
            slots: Arc::new(tokio::sync::Semaphore::new(parallel_environments.max(1))),
            long_wait,
            outbox: Arc::default(),
            recorded: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    /// How many ends the control plane has recorded.
    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    /// How many requests carried ends (each with the next lease).
    pub fn reports(&self) -> u64 {
        self.reports.load(Ordering::Relaxed)
    }

    /// How many requests the loop made (leases alone and reports).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Leases and runs until `stop` is set (checked before each request; a request waits at
    /// most `long_wait`, or [`BUSY_POLL`] while tasks run).
    pub async fn run(&self, stop: &AtomicBool) {
        let mut queues: HashMap<Queue, tokio::sync::mpsc::UnboundedSender<(LeasedJob, Renewal)>> = HashMap::new();
        let mut held = 0usize;
        let mut backoff = Duration::from_millis(500);
        while !stop.load(Ordering::Relaxed) {
            let ends = self.outbox.take();
            let still_running = held - ends.len();
            if ends.is_empty() && still_running > 0 {
                // Busy: report ends as they come; look for other environments' jobs now and
                // then, unless this node holds enough.
                let poll = if held >= MAX_HELD { RENEW_EVERY } else { BUSY_POLL };
                tokio::select! {
                    _ = self.outbox.ready.notified() => continue,
                    _ = tokio::time::sleep(poll) => if held >= MAX_HELD { continue },
                }
            }
            // A long poll only when nothing is held: no end can come while it waits.
            let wait = if still_running == 0 {
                self.long_wait
            } else {
                Duration::ZERO
            };
            let max = (MAX_HELD - still_running).min(MAX_LEASE_BATCH as usize) as u32;
            self.requests.fetch_add(1, Ordering::Relaxed);
            let mesh = self.tasks.mesh_held();
            let answer = if ends.is_empty() {
                blocking(&self.client, move |c| c.lease_holding(max, wait, mesh)).await
            } else {
                let sent: Vec<agent_proto::CompleteRequest> = ends
                    .iter()
                    .map(|d| agent_proto::CompleteRequest {
                        proof: d.proof.clone(),
                        outcome: d.outcome,
                        detail: d.detail.clone(),
                        backup: d.backup.clone(),
                        measured: d.measured,
                    })
                    .collect();
                match blocking(&self.client, move |c| c.report_and_lease(sent, max, wait, mesh)).await {
                    Ok((results, lease)) => {
                        held -= ends.len();
                        self.reports.fetch_add(1, Ordering::Relaxed);
                        self.judged(&ends, &results);
                        lease
                    }
                    Err(e) => {
                        // Whether they were recorded is unknown: sent again (a second report of
                        // a recorded end is refused and changes nothing).
                        self.outbox.put_back(ends);
                        Err(e)
                    }
                }
            };
            let leased = match answer {
                Ok(l) => {
                    backoff = Duration::from_millis(500);
                    if let Some(spec) = l.mesh {
                        self.tasks.mesh(spec);
                    }
                    if !l.undecodable.is_empty() {
                        held += l.undecodable.len();
                        self.outbox.push(l.undecodable.into_iter().map(undecodable).collect());
                    }
                    l.jobs
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "lease failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            held += leased.len();
            for job in leased {
                let renewing = renewal(&self.client, &job.proof);
                let queue = queues
                    .entry(queue_of(&job.task))
                    .or_insert_with(|| self.environment_queue());
                let _ = queue.send((job, renewing));
            }
        }
    }

    /// Counts and logs what the control plane said of each end.
    fn judged(&self, ends: &[Done], results: &[Option<agent_proto::RefusalBody>]) {
        for (d, r) in ends.iter().zip(results) {
            match r {
                None => {
                    self.recorded.fetch_add(1, Ordering::Relaxed);
                }
                Some(r) => {
                    tracing::warn!(job_key = %d.key, job_id = d.proof.job_id, code = r.code.code(), "completion refused; the lease will expire")
                }
            }
        }
    }

    /// One environment's queue: its jobs in order, a step's at once; a step's ends go to the
    /// outbox together, so they are reported in one request.
    fn environment_queue(&self) -> tokio::sync::mpsc::UnboundedSender<(LeasedJob, Renewal)> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(LeasedJob, Renewal)>();
        let (tasks, slots, outbox) = (
            Arc::clone(&self.tasks),
            Arc::clone(&self.slots),
            Arc::clone(&self.outbox),
        );
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                // What is queued behind it too, in order; a run of jobs of one kind and
                // generation (one step's replicas, say) goes at once.
                let mut jobs = vec![first];
                while let Ok(more) = rx.try_recv() {
                    jobs.push(more);
                }
                let Ok(_slot) = slots.acquire().await else { return };
                for group in same_step(jobs) {
                    let ends = run_step(group.into_iter(), |(job, renewing)| {
                        let tasks = Arc::clone(&tasks);
                        async move {
                            let result = execute_logged(&*tasks, &job).await;
                            ended(job, renewing, result)
                        }
                    })
                    .await;
                    outbox.push(ends);
                    tasks.changed();
                }
            }
        });
        tx
    }
}

/// Runs a task in a span of its own (`job`: its key, id, kind, environment and attempt, which
/// every line the executors log inside it carries) and logs its end.
async fn execute_logged<T: Tasks>(tasks: &T, job: &LeasedJob) -> Result<Ended, Failure> {
    use tracing::Instrument;
    let span = tracing::info_span!(
        "job",
        job_key = %job.key,
        job_id = job.proof.job_id,
        task = job.task.kind(),
        environment = job.task.environment(),
        attempt = job.attempt,
    );
    async {
        let started = std::time::Instant::now();
        let result = tasks.execute(job).await;
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match &result {
            Ok(_) => tracing::info!(elapsed_ms = ms, "task succeeded"),
            Err(f) => tracing::warn!(elapsed_ms = ms, code = f.code, "task failed"),
        }
        result
    }
    .instrument(span)
    .await
}

fn ended(job: LeasedJob, renewing: Renewal, result: Result<Ended, Failure>) -> Done {
    let (outcome, detail, backup, measured) = match result {
        Ok(e) => (Outcome::Succeeded, report("ok", &e.note), e.backup, e.measured),
        Err(f) => (f.outcome, report(f.code, &f.detail), None, None),
    };
    Done {
        key: job.key,
        proof: job.proof,
        outcome,
        detail,
        backup,
        measured,
        _renewing: Some(renewing),
    }
}

/// A job this agent cannot read ends at once, for good: it would read it no better next time.
fn undecodable(u: Undecodable) -> Done {
    tracing::warn!(job_key = %u.key, job_id = u.proof.job_id, code = "task-undecodable", "a leased job does not decode");
    Done {
        key: u.key,
        proof: u.proof,
        outcome: Outcome::Permanent,
        detail: report(
            "task-undecodable",
            &format!(
                "this agent ({}) cannot read the task: {}",
                env!("CARGO_PKG_VERSION"),
                u.reason
            ),
        ),
        backup: None,
        measured: None,
        _renewing: None,
    }
}

/// Runs `tasks` of one step (independent of each other by construction: the reconciler queues
/// a step only when the one before has ended, and a step's tasks touch different replicas,
/// hostnames or nodes' parts), at most [`STEP_PARALLELISM`] at once; results in order.
pub async fn run_step<T, R, F: Future<Output = R>>(tasks: impl Iterator<Item = T>, run: impl FnMut(T) -> F) -> Vec<R> {
    use futures_util::StreamExt;
    futures_util::stream::iter(tasks)
        .map(run)
        .buffered(STEP_PARALLELISM)
        .collect()
        .await
}

/// The queue a job runs in: its environment's, whose jobs run in the order leased (a step
/// after the one before), except an ACME challenge's placement: no step of the environment
/// orders against it, and its order waits for it with a deadline, so it has a queue of its own
/// beside and never waits behind a replica's start (the replicas that follow a node's set-up
/// are leased before an order that began after the commit places its challenge).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Queue {
    environment: String,
    challenges: bool,
}

fn queue_of(task: &agent_proto::Task) -> Queue {
    Queue {
        environment: task.environment().to_string(),
        challenges: matches!(task, agent_proto::Task::PlaceAcmeChallenge { .. }),
    }
}

/// Splits an environment's queued jobs into runs of one task kind and generation, in order:
/// each run is one step's, and may go at once; the runs go one after another.
fn same_step<X>(jobs: Vec<(LeasedJob, X)>) -> Vec<Vec<(LeasedJob, X)>> {
    let step_of = |j: &LeasedJob| (j.task.kind(), j.task.generation());
    let mut groups: Vec<Vec<(LeasedJob, X)>> = Vec::new();
    for job in jobs {
        match groups.last_mut() {
            Some(g) if g.first().map(|(j, _)| step_of(j)) == Some(step_of(&job.0)) => g.push(job),
            _ => groups.push(vec![job]),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_proto::MAX_DETAIL_BYTES;

    fn job(task: &str, generation: u64, id: i64) -> (LeasedJob, ()) {
        let environment = "e".to_owned();
        let task = match task {
            "ensure-network" => agent_proto::Task::EnsureNetwork {
                environment,
                generation,
            },
            "apply-firewall" => agent_proto::Task::ApplyFirewall {
                environment,
                generation,
            },
            "ensure-application" => agent_proto::Task::EnsureApplication {
                environment,
                role: "web".into(),
                instance: id as u32,
                generation,
                spec_hash: String::new(),
                repair: 0,
            },
            _ => agent_proto::Task::StopApplication {
                environment,
                role: "web".into(),
                instance: id as u32,
                generation,
            },
        };
        let j = LeasedJob {
            key: format!("{}-{id}", task.kind()),
            task,
            execution: agent_proto::Execution::Removal,
            attempt: 1,
            proof: agent_proto::LeaseProof {
                job_id: id,
                lease_token: String::new(),
                fencing_token: id,
            },
            expires_at_ms: 0,
        };
        (j, ())
    }

    #[test]
    fn an_end_s_size_bound_holds_its_typed_reports_at_their_widest() {
        let proof = job("ensure-application", 1, i64::MAX).0.proof;
        let end = Done {
            key: "k".into(),
            proof: proof.clone(),
            outcome: Outcome::Succeeded,
            detail: "ok".into(),
            backup: Some(agent_proto::BackupReport {
                snapshot: "f".repeat(64),
                bytes: u64::MAX,
                data_added: u64::MAX,
            }),
            measured: Some(agent_proto::CanaryMeasure {
                requests: u32::MAX,
                errors: u32::MAX,
                p95_micros: Some(u64::MAX),
                logged: false,
            }),
            _renewing: None,
        };
        let sent = serde_json::to_vec(&agent_proto::CompleteRequest {
            proof,
            outcome: end.outcome,
            detail: end.detail.clone(),
            backup: end.backup.clone(),
            measured: end.measured,
        })
        .expect("json");
        assert!(wire_bytes(&end) >= sent.len(), "{} < {}", wire_bytes(&end), sent.len());
    }

    #[test]
    fn a_request_takes_no_more_ends_than_the_body_limit_holds() {
        let outbox = Outbox::default();
        let end = |id: i64, detail: &str| Done {
            key: format!("k{id}"),
            proof: job("ensure-application", 1, id).0.proof,
            outcome: Outcome::Permanent,
            detail: detail.to_owned(),
            backup: None,
            measured: None,
            _renewing: None,
        };
        // Eight failures with full log tails, quotes and all.
        let long = report("exit-code", &"\"a\"\\ \u{1b}".repeat(4000));
        assert!(long.len() > MAX_DETAIL_BYTES - 8, "{}", long.len());
        outbox.push((0..8).map(|i| end(i, &long)).collect());
        let mut requests = Vec::new();
        loop {
            let ends = outbox.take();
            if ends.is_empty() {
                break;
            }
            let body = serde_json::to_vec(&agent_proto::CompleteBatch {
                completions: ends
                    .iter()
                    .map(|d| agent_proto::CompleteRequest {
                        proof: d.proof.clone(),
                        outcome: d.outcome,
                        detail: d.detail.clone(),
                        backup: None,
                        measured: None,
                    })
                    .collect(),
                lease: Some(agent_proto::LeaseRequest {
                    max: 8,
                    wait_ms: 0,
                    mesh_applied: None,
                }),
            })
            .expect("json");
            assert!(body.len() <= agent_proto::MAX_AGENT_BODY_BYTES, "{} bytes", body.len());
            requests.push(ends.len());
        }
        assert_eq!(requests.iter().sum::<usize>(), 8, "{requests:?}");
        assert!(requests.len() >= 3, "{requests:?}");
        // Short ends go eight at a time.
        outbox.push((0..20).map(|i| end(i, "ok: ")).collect());
        assert_eq!(outbox.take().len(), MAX_LEASE_BATCH as usize);
    }

    #[test]
    fn a_challenge_s_placement_never_waits_behind_its_environment_s_replicas() {
        let (replica, _) = job("ensure-application", 1, 1);
        let (network, _) = job("ensure-network", 1, 2);
        let placement = agent_proto::Task::PlaceAcmeChallenge {
            environment: "e".into(),
            hostname: "e.example.com".into(),
            generation: 1,
            token: "t".repeat(43),
            key_authorization: format!("{}.{}", "t".repeat(43), "k".repeat(43)),
        };
        assert_eq!(
            queue_of(&replica.task),
            queue_of(&network.task),
            "one environment's steps, in order"
        );
        assert_ne!(queue_of(&placement), queue_of(&replica.task));
        assert_eq!(queue_of(&placement).environment, "e");
    }

    #[test]
    fn runs_of_one_kind_and_generation_go_together_in_order() {
        let jobs = vec![
            job("ensure-network", 2, 1),
            job("apply-firewall", 2, 2),
            job("ensure-application", 2, 3),
            job("ensure-application", 2, 4),
            job("ensure-application", 3, 5),
            job("stop-application", 2, 6),
            job("stop-application", 2, 7),
        ];
        let groups: Vec<Vec<i64>> = same_step(jobs)
            .into_iter()
            .map(|g| g.into_iter().map(|(j, _)| j.proof.job_id).collect())
            .collect();
        assert_eq!(groups, vec![vec![1], vec![2], vec![3, 4], vec![5], vec![6, 7]]);
    }

    #[test]
    fn a_step_runs_at_once_up_to_the_bound_with_results_in_order() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let out = rt.block_on(run_step(0..20u64, |i| {
            let (running, most) = (Arc::clone(&running), Arc::clone(&most));
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20 - i)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                i * 10
            }
        }));
        assert_eq!(out, (0..20).map(|i| i * 10).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), STEP_PARALLELISM);
    }
}
