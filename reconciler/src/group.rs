//! Group commit for the agent API. Each agent leases and completes in small calls (at most 8
//! jobs, one completion at a time); made one transaction each, every call would wait for its
//! own durable commit (on SQLite, for the one writer too). Instead, calls queue here, and one
//! task per kind takes everything queued since its last transaction and writes it in one:
//! under load, a hundred agents' calls share one fsync; when idle, a call goes alone at once.

use crate::daemon::{Shared, now_ms};
use crate::ledger::{Completion, Lease, Refused};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Most calls one transaction takes.
pub const MAX_GROUP: usize = 256;

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

type Receivers = (mpsc::Receiver<LeaseCall>, mpsc::Receiver<CompleteCall>);

/// The queues the agent API's handlers put their calls on.
pub struct Group {
    leases: mpsc::Sender<LeaseCall>,
    completes: mpsc::Sender<CompleteCall>,
    receivers: Mutex<Option<Receivers>>,
}

impl Default for Group {
    fn default() -> Self {
        let (leases, lease_rx) = mpsc::channel(4 * MAX_GROUP);
        let (completes, complete_rx) = mpsc::channel(4 * MAX_GROUP);
        Group {
            leases,
            completes,
            receivers: Mutex::new(Some((lease_rx, complete_rx))),
        }
    }
}

impl Group {
    /// Leases up to `max` of `node`'s jobs (only removals, for a draining node), in the next
    /// group transaction.
    pub async fn lease(&self, node: &str, max: u32, removals_only: bool, ttl_ms: i64) -> Result<Vec<Lease>, String> {
        let (reply, answer) = oneshot::channel();
        self.leases
            .send(LeaseCall {
                node: node.to_owned(),
                max,
                removals_only,
                ttl_ms,
                reply,
            })
            .await
            .map_err(|_| "the group committer has stopped".to_owned())?;
        answer.await.map_err(|_| "the group committer has stopped".to_owned())?
    }

    /// Completes one job, in the next group transaction.
    pub async fn complete(&self, completion: Completion, caller: &str) -> Result<Result<(), Refused>, String> {
        let (reply, answer) = oneshot::channel();
        self.completes
            .send(CompleteCall {
                completion,
                caller: caller.to_owned(),
                reply,
            })
            .await
            .map_err(|_| "the group committer has stopped".to_owned())?;
        answer.await.map_err(|_| "the group committer has stopped".to_owned())?
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

/// Runs the two committers (leases, completions) until shutdown.
pub async fn run(shared: Arc<Shared>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let Some((mut lease_rx, mut complete_rx)) = shared.group.receivers.lock().ok().and_then(|mut r| r.take()) else {
        return;
    };
    let leaser = {
        let shared = Arc::clone(&shared);
        async move {
            while let Some(first) = lease_rx.recv().await {
                let batch = drain(first, &mut lease_rx);
                // One lease time for the group: the longest asked for.
                let ttl = batch.iter().map(|c| c.ttl_ms).max().unwrap_or(30_000);
                let requests: Vec<(&str, u32, bool)> = batch
                    .iter()
                    .map(|c| (c.node.as_str(), c.max, c.removals_only))
                    .collect();
                match shared.ledger.lease_many(&requests, ttl, now_ms()).await {
                    Ok(all) => {
                        for (call, leases) in batch.into_iter().zip(all) {
                            let _ = call.reply.send(Ok(leases));
                        }
                    }
                    Err(e) => {
                        let message = e.to_string();
                        for call in batch {
                            let _ = call.reply.send(Err(message.clone()));
                        }
                    }
                }
            }
        }
    };
    let completer = {
        let shared = Arc::clone(&shared);
        async move {
            while let Some(first) = complete_rx.recv().await {
                let batch = drain(first, &mut complete_rx);
                let completions: Vec<Completion> = batch.iter().map(|c| c.completion.clone()).collect();
                let callers: Vec<String> = batch.iter().map(|c| c.caller.clone()).collect();
                match shared.ledger.complete_as(&completions, &callers, now_ms()).await {
                    Ok(results) => {
                        for (call, r) in batch.into_iter().zip(results) {
                            let _ = call.reply.send(Ok(r));
                        }
                        // The next step may be due: the loop advances it now.
                        shared.settle_hint.notify_one();
                    }
                    Err(e) => {
                        let message = e.to_string();
                        for call in batch {
                            let _ = call.reply.send(Err(message.clone()));
                        }
                    }
                }
            }
        }
    };
    tokio::select! {
        _ = leaser => {}
        _ = completer => {}
        _ = shutdown.changed() => {}
    }
}
