//! The daemon's loops around a pass: leadership (one leader per ledger, a standby checks every
//! 200 ms), passes at the interval or on a hint, the settle after agents' completions, the
//! watch of a local repository and the fetcher of a remote one.

use super::*;
use crate::store::now_ms;
use state_repo::source::StateRepo;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Runs the loop while this daemon leads: a pass at least every `interval`, sooner on a hint.
/// Transient errors back off (1 s doubling to 1 min) and the loop goes on.
pub async fn run_loop(shared: Arc<Reconciler>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let interval = Duration::from_secs(shared.config.reconcile.interval_seconds);
    let mut backoff = Duration::from_secs(1);
    let mut lock: Option<crate::store::LeaderLock> = None;
    loop {
        if *shutdown.borrow() {
            break;
        }
        // Leadership first: only the holder of the lock reconciles.
        let leading = match &mut lock {
            Some(l) => l.still_held().await,
            None => false,
        };
        if !leading {
            lock = None;
            match shared.ledger.try_lead().await {
                Ok(Some(l)) => {
                    tracing::info!("leading: this daemon reconciles");
                    lock = Some(l);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "cannot reach the ledger to take the lead"),
            }
        }
        let is_leader = lock.is_some();
        if shared.hub.leader.swap(is_leader, Ordering::Relaxed) && !is_leader {
            tracing::warn!("lost the lead: another daemon reconciles");
        }
        let wait = if is_leader {
            match shared.pass_bounded().await {
                Ok(r) => {
                    backoff = Duration::from_secs(1);
                    if r.judged + r.teardowns + r.advanced > 0 {
                        tracing::debug!(judged = r.judged, advanced = r.advanced, more = r.more, "pass");
                    }
                    if r.more { Duration::ZERO } else { interval }
                }
                Err(e) => {
                    shared.hub.metrics.tick_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "pass failed; retrying");
                    let w = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                    w
                }
            }
        } else {
            // A follower serves reads and leases; it checks the ledger and retries the lock.
            if shared.ledger.ping().await.is_ok() {
                shared.hub.last_tick_ms.store(now_ms(), Ordering::Relaxed);
                shared.hub.refresh_counts(&shared.ledger, false).await;
            }
            Duration::from_millis(1000)
        };
        // Completions wake only `settle` (no Git), a few milliseconds later so that one settle
        // takes many agents' completions; anything else wakes a whole pass. Leadership is what
        // the lock says at that moment: it is checked before each settle and every
        // `LEADERSHIP_CHECK` meanwhile, so a lock lost with PostgreSQL's restart stops this
        // daemon's writes and its `leader` at once, not at the next pass.
        let mut sd = shutdown.clone();
        let mut deadline = tokio::time::Instant::now() + wait;
        if is_leader {
            deadline = wake_for_pauses(&shared, deadline).await;
        }
        let mut check = tokio::time::interval_at(tokio::time::Instant::now() + LEADERSHIP_CHECK, LEADERSHIP_CHECK);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = shared.hub.hint.notified() => break,
                _ = sd.changed() => break,
                _ = check.tick(), if is_leader => {
                    if !still_leading(&mut lock, &shared).await {
                        break;
                    }
                }
                _ = shared.hub.settle_hint.notified(), if is_leader => {
                    tokio::time::sleep(SETTLE_DELAY).await;
                    if !still_leading(&mut lock, &shared).await {
                        break;
                    }
                    match shared.settle().await {
                        Ok(n) if n > 0 => {
                            shared.hub.wrote.notify_waiters();
                            shared.hub.jobs.notify_waiters();
                            deadline = wake_for_pauses(&shared, deadline).await;
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "settling after completions failed; the next pass retries"),
                    }
                }
            }
        }
    }
}

/// `deadline`, or sooner when a step's pause (a canary's) ends before it: level-triggered like
/// the rest, a pause is looked at again when it is due, not at the next pass.
async fn wake_for_pauses(shared: &Reconciler, deadline: tokio::time::Instant) -> tokio::time::Instant {
    match shared.ledger.deployments().next_step_due().await {
        Ok(Some(due)) => {
            let left = Duration::from_millis(u64::try_from(due - now_ms()).unwrap_or(0));
            deadline.min(tokio::time::Instant::now() + left)
        }
        Ok(None) => deadline,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read when the next pause ends; the next pass looks");
            deadline
        }
    }
}

/// How many revisions of one branch a pass of the daemon's loop judges at most (a few
/// seconds' work on this machine); the rest waits for the next pass, which starts at once.
pub const MAX_JUDGED_PER_PASS: usize = 32;

/// How long completions gather before a settle runs for them.
pub const SETTLE_DELAY: Duration = Duration::from_millis(10);

/// How often a leader checks its lock between passes (one `SELECT 1` on the lock's own
/// connection; a restarted PostgreSQL ended that session and with it the lock).
pub const LEADERSHIP_CHECK: Duration = Duration::from_millis(200);

/// Whether this daemon still holds the lock; when it does not, it says so (`leader` false, at
/// once) and lets the lock go, so the loop takes it again or follows.
async fn still_leading(lock: &mut Option<crate::store::LeaderLock>, shared: &Reconciler) -> bool {
    let held = match lock.as_mut() {
        Some(l) => l.still_held().await,
        None => false,
    };
    if !held {
        *lock = None;
        if shared.hub.leader.swap(false, Ordering::Relaxed) {
            tracing::warn!("lost the lead: the lock is gone (PostgreSQL restarted, or its session ended)");
        }
    }
    held
}

/// Watches a local repository's refs: any change is a hint. The watcher lives as long as the
/// returned value.
pub fn watch_local(shared: &Arc<Reconciler>) -> Result<Option<notify::RecommendedWatcher>, notify::Error> {
    use notify::Watcher;
    let Source::Local(path) = &shared.source else {
        return Ok(None);
    };
    let Ok(repo) = StateRepo::open(path) else {
        return Ok(None);
    };
    let Some(git_dir) = repo.git_dir() else {
        return Ok(None);
    };
    let me = Arc::clone(shared);
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        // Only what changes a ref: a pass's own reads of the repository (opens, closes) must
        // not wake another pass, or passes would feed each other.
        if let Ok(ev) = ev
            && matches!(
                ev.kind,
                notify::EventKind::Create(_)
                    | notify::EventKind::Modify(_)
                    | notify::EventKind::Remove(_)
                    | notify::EventKind::Any
            )
            && !matches!(
                ev.kind,
                notify::EventKind::Modify(notify::event::ModifyKind::Metadata(_))
            )
            && ev.paths.iter().any(|p| p.extension().is_none_or(|e| e != "lock"))
        {
            me.hub.hint.notify_one();
        }
    })?;
    // Loose refs live under refs/ (recursive); packed-refs and HEAD at the top.
    watcher.watch(&git_dir.join("refs"), notify::RecursiveMode::Recursive)?;
    watcher.watch(&git_dir, notify::RecursiveMode::NonRecursive)?;
    Ok(Some(watcher))
}

/// Fetches a remote source on its interval and at once on a webhook.
pub async fn run_fetcher(shared: Arc<Reconciler>, shutdown: tokio::sync::watch::Receiver<bool>) {
    if !matches!(shared.source, Source::Remote { .. }) {
        return;
    }
    let interval = Duration::from_secs(shared.config.source.fetch_interval_seconds);
    loop {
        if *shutdown.borrow() {
            break;
        }
        let wait = match shared.fetch().await {
            Ok(changed) => {
                if changed {
                    shared.hub.hint.notify_one();
                }
                interval
            }
            Err(e) => {
                tracing::warn!(error = %e, "fetch failed; retrying");
                interval.min(Duration::from_secs(10))
            }
        };
        let mut sd = shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.hub.fetch_hint.notified() => {}
            _ = sd.changed() => {}
        }
    }
}
