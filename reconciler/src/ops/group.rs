//! Group commit for the agent API. Each agent leases and completes in small calls (at most 8
//! jobs, one completion at a time); made one transaction each, every call would wait for its
//! own durable commit (on SQLite, for the one writer too). Instead, calls queue here, and one
//! task takes everything queued since its last transaction, completions and leases alike, and
//! writes it in one: under load, a hundred agents' calls share one fsync; when idle, a call
//! goes alone at once.

use crate::hub::Hub;
use crate::store::now_ms;
use crate::store::{Completion, Lease, Ledger, Refused};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Most calls one transaction takes. A release over 10,000 nodes queues about 3,000 calls a
/// second, and a group of 256 (about 180 completions and 60 leases, 24 ms of the writer) left
/// the committer busy end to end: each group's fixed work (the expiry, the release of held
/// jobs, the settle it wakes, the writer's turn) came four times as often. 1,024 released
/// 50,000 replicas in 0.84 of the time with the leases' p50 at 0.75 (docs/benchmarks.md,
/// forty-fourth session); 512 gained less, 2,048 no more.
pub const MAX_GROUP: usize = 1024;

struct LeaseCall {
    node: String,
    max: u32,
    removals_only: bool,
    ttl_ms: i64,
    reply: oneshot::Sender<Result<Vec<Lease>, String>>,
}

struct CompleteCall {
    completion: Completion,
    /// The node that asks: a job of another node's is refused in the same transaction.
    caller: String,
    reply: oneshot::Sender<Result<Result<(), Refused>, String>>,
}

/// One call queued for the next group transaction.
enum Call {
    Lease(LeaseCall),
    Complete(CompleteCall),
}

/// The queue the agent API's handlers put their calls on: one committer takes both kinds, so
/// a group of leases and completions costs one durable commit, and writers of the agent API
/// never wait for each other's locks.
pub struct Group {
    calls: mpsc::Sender<Call>,
    receiver: Mutex<Option<mpsc::Receiver<Call>>>,
}

impl Default for Group {
    fn default() -> Self {
        let (calls, rx) = mpsc::channel(8 * MAX_GROUP);
        Group {
            calls,
            receiver: Mutex::new(Some(rx)),
        }
    }
}

fn stopped<T>(_: T) -> String {
    "the group committer has stopped".to_owned()
}

impl Group {
    /// Leases up to `max` of `node`'s jobs (only removals, for a draining node), in the next
    /// group transaction (after the completions queued before it).
    pub async fn lease(&self, node: &str, max: u32, removals_only: bool, ttl_ms: i64) -> Result<Vec<Lease>, String> {
        let (reply, answer) = oneshot::channel();
        self.calls
            .send(Call::Lease(LeaseCall {
                node: node.to_owned(),
                max,
                removals_only,
                ttl_ms,
                reply,
            }))
            .await
            .map_err(stopped)?;
        answer.await.map_err(stopped)?
    }

    /// Completes one job, in the next group transaction.
    pub async fn complete(&self, completion: Completion, caller: &str) -> Result<Result<(), Refused>, String> {
        self.submit_complete(completion, caller).await?.await.map_err(stopped)?
    }

    /// Queues one completion for the next group transaction without waiting for it: a lease
    /// queued after it goes into the same transaction (or a later one) and sees it.
    pub async fn submit_complete(
        &self,
        completion: Completion,
        caller: &str,
    ) -> Result<oneshot::Receiver<Result<Result<(), Refused>, String>>, String> {
        let (reply, answer) = oneshot::channel();
        self.calls
            .send(Call::Complete(CompleteCall {
                completion,
                caller: caller.to_owned(),
                reply,
            }))
            .await
            .map_err(stopped)?;
        Ok(answer)
    }
}

/// Takes what is queued now, up to [`MAX_GROUP`], after the first call.
fn drain<T>(first: T, rx: &mut mpsc::Receiver<T>) -> Vec<T> {
    let mut batch = vec![first];
    while batch.len() < MAX_GROUP {
        match rx.try_recv() {
            Ok(c) => batch.push(c),
            Err(_) => break,
        }
    }
    batch
}

/// How many groups are written at once: SQLite has one writer, so one; PostgreSQL writes
/// several transactions at once (leases meet on the fencing counter's row, completions do
/// not), so two.
fn committers(backend: crate::store::Backend) -> usize {
    match backend {
        crate::store::Backend::Sqlite => 1,
        crate::store::Backend::Postgres => 2,
    }
}

/// Starts what the agent API needs beside it, until shutdown: the committers ([`run`]) and the
/// waiting leases' wake-ups (`ops::lease_wakes`).
pub fn start(ledger: Arc<Ledger>, group: Arc<Group>, hub: Arc<Hub>, shutdown: tokio::sync::watch::Receiver<bool>) {
    tokio::spawn(crate::ops::lease_wakes::run(
        Arc::clone(&ledger),
        Arc::clone(&hub),
        shutdown.clone(),
    ));
    // On SQLite on a thread of its own (`store::writer`): it holds the one writer.
    let committer = Arc::clone(&ledger);
    let _ended = committer.spawn_writer("pl-group-commit", run(ledger, group, hub, shutdown));
}

/// Runs the committers until shutdown: each transaction records the completions queued, then
/// leases for the lease calls queued. A group that recorded completions wakes the loop's
/// settle (the next step may be due), and says when it recorded a drift repair (the settle
/// publishes its routes again).
pub async fn run(
    ledger: Arc<Ledger>,
    group: Arc<Group>,
    hub: Arc<Hub>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let Some(rx) = group.receiver.lock().ok().and_then(|mut r| r.take()) else {
        return;
    };
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let all = (0..committers(ledger.backend()))
        .map(|_| commit_groups(Arc::clone(&ledger), Arc::clone(&rx), Arc::clone(&hub)));
    tokio::select! {
        _ = futures_util::future::join_all(all) => {}
        _ = shutdown.changed() => {}
    }
}

/// One committer: takes a group off the queue (the queue is free again while it writes), and
/// writes it.
async fn commit_groups(ledger: Arc<Ledger>, rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Call>>>, hub: Arc<Hub>) {
    loop {
        let batch = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else {
                return;
            };
            drain(first, &mut rx)
        };
        {
            let (mut leases, mut completes) = (Vec::new(), Vec::new());
            for call in batch {
                match call {
                    Call::Lease(c) => leases.push(c),
                    Call::Complete(c) => completes.push(c),
                }
            }
            // One lease time for the group: the longest asked for.
            let ttl = leases.iter().map(|c| c.ttl_ms).max().unwrap_or(30_000);
            let requests: Vec<(&str, u32, bool)> = leases
                .iter()
                .map(|c| (c.node.as_str(), c.max, c.removals_only))
                .collect();
            let completions: Vec<Completion> = completes.iter().map(|c| c.completion.clone()).collect();
            let callers: Vec<String> = completes.iter().map(|c| c.caller.clone()).collect();
            let began = std::time::Instant::now();
            let written = ledger
                .jobs()
                .complete_and_lease(&completions, &callers, &requests, ttl, now_ms())
                .await;
            // How long a group holds the writer, and how large it was: where a fleet's leases
            // wait (`PL_LOG=reconciler::ops::group=debug`).
            tracing::debug!(
                completions = completions.len(),
                leases = requests.len(),
                ms = began.elapsed().as_secs_f64() * 1000.0,
                "group written"
            );
            match written {
                Ok((done, leased, ends)) => {
                    drop(requests);
                    for (call, r) in completes.into_iter().zip(done) {
                        let _ = call.reply.send(Ok(r));
                    }
                    for (call, l) in leases.into_iter().zip(leased) {
                        let _ = call.reply.send(Ok(l));
                    }
                    if ends.repaired > 0 {
                        hub.repairs_recorded.store(true, Ordering::Relaxed);
                    }
                    if ends.released > 0 {
                        // Replicas a set-up made due: a node whose lease waits in another
                        // call gets them now rather than at the next look (`ops::lease_wakes`).
                        hub.jobs.notify_waiters();
                    }
                    if !completions.is_empty() {
                        // The next step may be due: the loop advances it now (or, on another
                        // replica that leads, once told: `ops::replica_wakes`).
                        hub.settle_hint.notify_one();
                        hub.completed.notify_one();
                    }
                }
                Err(e) => {
                    drop(requests);
                    let message = e.to_string();
                    for call in completes {
                        let _ = call.reply.send(Err(message.clone()));
                    }
                    for call in leases {
                        let _ = call.reply.send(Err(message.clone()));
                    }
                }
            }
        }
    }
}
