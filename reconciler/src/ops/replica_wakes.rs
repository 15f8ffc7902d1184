//! What the replicas of a pair on PostgreSQL tell each other (`store::wakes`): the jobs one
//! queued reach the other's waiting leases at once (its `ops::lease_wakes` looks when told),
//! and completions recorded by a replica that does not lead wake the leader's settle, which
//! advances the next step. Only hints: each side still looks on its own
//! (leases once a second, the leader at every pass), so a lost word costs that delay and no
//! more. Nothing runs on SQLite (one daemon).

use crate::hub::Hub;
use crate::store::Ledger;
use crate::store::wakes::Wake;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long completions gather before one word goes to the leader (a group commit runs many
/// times a second under load).
const GATHER: Duration = Duration::from_millis(10);
/// How long a listener that cannot reach the ledger waits before it tries again.
const RETRY: Duration = Duration::from_secs(1);

/// Starts the listener and the announcers of new jobs and of completions, until shutdown
/// (PostgreSQL only).
pub fn start(ledger: Arc<Ledger>, hub: Arc<Hub>, shutdown: tokio::sync::watch::Receiver<bool>) {
    if ledger.backend() != crate::store::Backend::Postgres {
        return;
    }
    tokio::spawn(listen(Arc::clone(&ledger), Arc::clone(&hub), shutdown.clone()));
    tokio::spawn(announce_jobs(Arc::clone(&ledger), Arc::clone(&hub), shutdown.clone()));
    tokio::spawn(announce_completions(ledger, hub, shutdown));
}

/// Hands what the other replicas say to this daemon's loops.
async fn listen(ledger: Arc<Ledger>, hub: Arc<Hub>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        let mut wakes = match ledger.wakes().await {
            Ok(Some(w)) => w,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for the other replicas' wakes; trying again");
                tokio::select! {
                    () = tokio::time::sleep(RETRY) => continue,
                    _ = shutdown.changed() => return,
                }
            }
        };
        loop {
            let wake = tokio::select! {
                w = wakes.next() => w,
                _ = shutdown.changed() => return,
            };
            match wake {
                Ok(Wake::Jobs) => hub.jobs_elsewhere.notify_one(),
                // Only the leader settles (`reconcile::run_loop` takes the hint only then).
                Ok(Wake::Completions) => hub.settle_hint.notify_one(),
                Err(e) => {
                    tracing::warn!(error = %e, "listening for the other replicas' wakes failed; listening again");
                    break;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RETRY) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Tells the other replicas that this one queued jobs (`Hub::jobs`), beside this replica's own
/// lease look rather than in its way: one statement after each burst.
async fn announce_jobs(ledger: Arc<Ledger>, hub: Arc<Hub>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut queued = Box::pin(hub.jobs.notified());
    queued.as_mut().enable();
    loop {
        tokio::select! {
            () = &mut queued => {}
            _ = shutdown.changed() => return,
        }
        // Listening again before the word goes: jobs queued meanwhile are told next.
        queued = Box::pin(hub.jobs.notified());
        queued.as_mut().enable();
        tokio::time::sleep(GATHER).await;
        if let Err(e) = ledger.announce(Wake::Jobs).await {
            tracing::warn!(error = %e, "telling the other replicas of new jobs failed; they look within a second");
        }
    }
}

/// Tells the leader that this replica's agents completed jobs, when this replica does not lead.
async fn announce_completions(ledger: Arc<Ledger>, hub: Arc<Hub>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = hub.completed.notified() => {}
            _ = shutdown.changed() => return,
        }
        tokio::time::sleep(GATHER).await;
        if hub.leader.load(Ordering::Relaxed) {
            continue;
        }
        if let Err(e) = ledger.announce(Wake::Completions).await {
            tracing::warn!(error = %e, "telling the leader of completions failed; it settles at its next pass");
        }
    }
}
