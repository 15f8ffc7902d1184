//! One simulated node: a thread with the agent's own client (`pushleft_agent::client`), over
//! its own mutual-TLS identity. It beats at the interval the control plane tells (or its own,
//! when longer), reporting the replicas it "runs"; between beats it long-polls for work, runs
//! each leased batch for `task_ms` a job of its busiest environment (the agent runs
//! environments side by side), failing `fail_percent` of them (retryable), and reports the
//! ends with its next lease, as the agent's lease loop does. Its first
//! beat comes at a random moment within its own interval, as a fleet's would, and is timed
//! apart (`firstBeat`) from the beats at the intervals the control plane told.

use crate::stats::{Call, Stats};
use agent_proto::{CompleteRequest, FULL_CAPABILITIES, Heartbeat, Outcome, RunningInstance, Task};
use pushleft_agent::client::{AgentClient, ClientError};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How the nodes behave.
#[derive(Clone, Copy, Debug)]
pub struct Behaviour {
    /// The node's own heartbeat interval (an agent's `heartbeat_seconds`).
    pub every: Duration,
    pub task: Duration,
    pub fail_percent: u32,
    /// The longest one lease waits for work.
    pub lease_wait: Duration,
    /// How often the node renews its certificate (`None`: never in a run).
    pub renew_every: Option<Duration>,
    /// Whether the node joins the mesh: its heartbeats carry a key, and it "applies" each mesh
    /// the control plane hands it (nothing is configured; the peer set is counted).
    pub mesh: bool,
}

/// A node's mesh as the simulator keeps it: its key, and the generation applied.
struct Mesh {
    key: String,
    applied: u64,
}

impl Mesh {
    fn new() -> Mesh {
        use base64::Engine as _;
        let mut k = [0u8; 32];
        let _ = getrandom::fill(&mut k);
        Mesh {
            key: base64::engine::general_purpose::STANDARD.encode(k),
            applied: 0,
        }
    }

    fn advert(&self) -> agent_proto::mesh::MeshAdvert {
        agent_proto::mesh::MeshAdvert {
            public_key: self.key.clone(),
            port: 51820,
            address: Some("127.0.0.1".to_owned()),
            applied: self.applied,
            links: Vec::new(),
            names: Vec::new(),
        }
    }

    /// Takes a newer mesh; its peer count goes to the report.
    fn apply(&mut self, spec: Option<agent_proto::mesh::MeshSpec>, stats: &Stats) {
        if let Some(spec) = spec
            && spec.generation > self.applied
        {
            self.applied = spec.generation;
            stats.mesh_applied(spec.peers.len());
        }
    }
}

/// Who the node is: its name and its identity's folder.
pub struct Identity<'a> {
    pub name: &'a str,
    pub dir: &'a std::path::Path,
}

/// What the observer reads of a node: when it last beat, and the interval it was told then;
/// and whether it was told to fall silent (`--silence-file`).
#[derive(Default)]
pub struct Beating {
    pub last_ms: AtomicI64,
    pub interval_ms: AtomicI64,
    pub silent: std::sync::atomic::AtomicBool,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A number in `[0, 1)`.
pub fn fraction() -> f64 {
    let mut b = [0u8; 4];
    match getrandom::fill(&mut b) {
        Ok(()) => f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.5,
    }
}

fn note(stats: &Stats, e: &ClientError) {
    match e {
        ClientError::Refused { code, .. } => stats.refused(code.code()),
        ClientError::Transport(what) => stats.transport_error(what),
    }
}

/// The agent's wait after a failed lease (`agent/src/lease_loop.rs`), and its most.
const LEASE_BACKOFF_FIRST: Duration = Duration::from_millis(500);
const LEASE_BACKOFF_MOST: Duration = Duration::from_secs(30);

/// Failed beats in a row after which a node reaches for the next agent API address (a pair's
/// other replica, as a load balancer in front of a pair would send it).
const SWITCH_AFTER: u32 = 2;

/// One node's state between its calls.
struct Node<'a> {
    urls: &'a [String],
    at: usize,
    client: AgentClient,
    who: &'a Identity<'a>,
    how: Behaviour,
    stats: &'a Stats,
    beating: &'a Beating,
    until: Instant,
    running: Vec<RunningInstance>,
    next_beat: Instant,
    next_renewal: Option<Instant>,
    interval: Duration,
    beat_failures: u32,
    told_once: bool,
    mesh: Option<Mesh>,
    /// Ends of the jobs of the last batch, reported with the next lease.
    ends: Vec<CompleteRequest>,
    backoff: Duration,
}

/// Runs the node until `until`, against the agent API at `urls[first]` (and the others when
/// that one stops answering).
pub fn run(
    urls: &[String],
    first: usize,
    who: &Identity<'_>,
    how: Behaviour,
    stats: &Stats,
    beating: &Beating,
    until: Instant,
) {
    let at = first % urls.len().max(1);
    let Some(url) = urls.get(at) else { return };
    let client = match AgentClient::from_dir(url, who.dir) {
        Ok(c) => c,
        Err(e) => {
            note(stats, &e);
            return;
        }
    };
    let mut node = Node {
        urls,
        at,
        client,
        who,
        how,
        stats,
        beating,
        until,
        running: Vec::new(),
        next_beat: Instant::now() + how.every.mul_f64(fraction()),
        next_renewal: how.renew_every.map(|e| Instant::now() + e.mul_f64(fraction())),
        interval: how.every,
        beat_failures: 0,
        told_once: false,
        mesh: how.mesh.then(Mesh::new),
        ends: Vec::new(),
        backoff: LEASE_BACKOFF_FIRST,
    };
    // A silenced node stops between calls and drops its connection (the thread ends), as a
    // host that lost its power: it neither beats nor leases again.
    while Instant::now() < until && !beating.silent.load(Ordering::Relaxed) {
        node.renew_when_due();
        node.beat_when_due();
        if let Some(jobs) = node.lease() {
            node.work(jobs);
        }
    }
}

impl Node<'_> {
    fn renew_when_due(&mut self) {
        if let (Some(at), Some(every)) = (self.next_renewal, self.how.renew_every)
            && Instant::now() >= at
        {
            let started = Instant::now();
            // The agent's own renewal, errors as its words (`anyhow`): counted as refused.
            match pushleft_agent::renewal::renew(&self.client, self.who.name, self.who.dir) {
                Ok(_) => self.stats.record(Call::Renew, started.elapsed()),
                Err(_) => self.stats.refused("renewal-failed"),
            }
            self.next_renewal = Some(Instant::now() + every);
        }
    }

    fn beat_when_due(&mut self) {
        if Instant::now() < self.next_beat {
            return;
        }
        let mut hb = Heartbeat::new("pl-nodesim", &FULL_CAPABILITIES);
        hb.running.clone_from(&self.running);
        hb.mesh = self.mesh.as_ref().map(Mesh::advert);
        let started = Instant::now();
        match self.client.heartbeat(&hb) {
            Ok(reply) => {
                let call = if self.told_once {
                    Call::Heartbeat
                } else {
                    Call::FirstBeat
                };
                self.stats.record(call, started.elapsed());
                self.told_once = true;
                if let Some(m) = self.mesh.as_mut() {
                    m.apply(reply.mesh.clone(), self.stats);
                }
                self.interval = pushleft_agent::run::told_interval(reply.next_heartbeat_ms, self.how.every);
                self.beat_failures = 0;
                self.beating.last_ms.store(now_ms(), Ordering::Relaxed);
                self.beating.interval_ms.store(
                    i64::try_from(self.interval.as_millis()).unwrap_or(i64::MAX),
                    Ordering::Relaxed,
                );
            }
            Err(e) => {
                note(self.stats, &e);
                self.beat_failures = self.beat_failures.saturating_add(1);
                if self.beat_failures >= SWITCH_AFTER {
                    self.switch();
                }
            }
        }
        // A failed beat is sent again as the agent sends it: soon, at a random moment.
        self.next_beat = Instant::now()
            + if self.beat_failures == 0 {
                self.interval
            } else {
                pushleft_agent::run::retry_after(self.interval, self.beat_failures)
            };
    }

    /// A client for the next agent API address (kept as it is when there is one, or when the
    /// identity does not load: the node keeps trying where it was).
    fn switch(&mut self) {
        if self.urls.len() < 2 {
            return;
        }
        let next = (self.at + 1) % self.urls.len();
        if let Ok(c) = AgentClient::from_dir(&self.urls[next], self.who.dir) {
            self.at = next;
            self.client = c;
        }
    }

    /// As the agent's lease loop does: with ends to report, they go with the next lease,
    /// which asks without waiting (timed: the lease round trip); otherwise a long poll until
    /// the next beat, whose time is the wait (counted, not timed). The jobs it brought.
    fn lease(&mut self) -> Option<Vec<agent_proto::LeasedJob>> {
        let wait = if self.ends.is_empty() {
            self.next_beat
                .min(self.next_renewal.unwrap_or(self.until))
                .min(self.until)
                .saturating_duration_since(Instant::now())
                .min(self.how.lease_wait)
        } else {
            Duration::ZERO
        };
        let started = Instant::now();
        let held = self.mesh.as_ref().map(|m| m.applied);
        let answer = if self.ends.is_empty() {
            self.client.lease_holding(8, wait, held)
        } else {
            match self
                .client
                .report_and_lease(std::mem::take(&mut self.ends), 8, wait, held)
            {
                Ok((results, lease)) => {
                    self.stats.record(Call::Lease, started.elapsed());
                    for refusal in results.into_iter().flatten() {
                        self.stats.refused(refusal.code.code());
                    }
                    lease
                }
                Err(e) => Err(e),
            }
        };
        let leased = match answer {
            Ok(l) => {
                self.backoff = LEASE_BACKOFF_FIRST;
                l
            }
            Err(e) => {
                // A refused or failed lease is asked again after 0.5 s doubling to 30 s (a
                // draining node is refused new work); ends whose report failed are lost, and
                // their leases run out, as a crashed agent's would. (The agent beats on a task
                // of its own: here the wait ends at the next beat.)
                note(self.stats, &e);
                let left = self.next_beat.min(self.until).saturating_duration_since(Instant::now());
                std::thread::sleep(self.backoff.min(left));
                self.backoff = (self.backoff * 2).min(LEASE_BACKOFF_MOST);
                return None;
            }
        };
        if let Some(m) = self.mesh.as_mut() {
            m.apply(leased.mesh, self.stats);
        }
        if leased.jobs.is_empty() {
            self.stats.empty_lease();
            return None;
        }
        Some(leased.jobs)
    }

    /// Runs a leased batch: the agent runs each environment's jobs in order and environments
    /// side by side, so the batch takes `task` times the most steps one environment has in it
    /// (an environment's set-up is three: its network, firewall and routes, as the three tasks
    /// it replaced took, so a bench measures the control plane's saving, not the simulator's).
    fn work(&mut self, jobs: Vec<agent_proto::LeasedJob>) {
        let mut per_env: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        for job in &jobs {
            let steps = match job.task {
                Task::EnsureEnvironment { .. } => 3,
                _ => 1,
            };
            *per_env.entry(job.task.environment()).or_default() += steps;
        }
        std::thread::sleep(self.how.task * per_env.values().copied().max().unwrap_or(1));
        for job in jobs {
            let fails = fraction() * 100.0 < f64::from(self.how.fail_percent);
            if !fails {
                ran(&mut self.running, &job.task);
            }
            self.ends.push(CompleteRequest {
                proof: job.proof,
                outcome: if fails { Outcome::Retryable } else { Outcome::Succeeded },
                detail: "simulated".to_owned(),
                backup: None,
                measured: None,
            });
        }
    }
}

/// What the node reports running after `task` succeeded.
fn ran(running: &mut Vec<RunningInstance>, task: &Task) {
    match task {
        Task::EnsureApplication {
            environment,
            role,
            instance,
            generation,
            spec_hash,
            ..
        } => {
            running.retain(|r| !(&r.environment == environment && &r.role == role && r.instance == *instance));
            running.push(RunningInstance {
                environment: environment.clone(),
                role: role.clone(),
                instance: *instance,
                generation: *generation,
                healthy: true,
                spec_hash: Some(spec_hash.clone()),
                image: None,
                image_signed: None,
            });
        }
        Task::StopApplication {
            environment,
            role,
            instance,
            generation,
        }
        | Task::TeardownApplication {
            environment,
            role,
            instance,
            generation,
        } => running.retain(|r| {
            !(&r.environment == environment
                && &r.role == role
                && r.instance == *instance
                && r.generation <= *generation)
        }),
        _ => {}
    }
}
