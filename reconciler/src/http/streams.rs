//! Event streams without a poll per stream. One watcher per daemon learns the newest event id
//! (woken by this daemon's own writes, and every 250 ms for another leader's) and publishes it
//! on a `watch` channel; each open stream waits on that channel and reads the ledger only when
//! there is something after its cursor. Streams are counted per token and in total, so one
//! viewer token cannot hold the API's connections or the ledger's.

use crate::hub::Hub;
use crate::store::Ledger;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the watcher asks the ledger when nothing woke it (another daemon may lead).
pub const TIP_POLL: Duration = Duration::from_millis(250);

/// Open streams, by token name and in total.
pub struct StreamSlots {
    max_total: usize,
    max_per_token: usize,
    open: Mutex<(usize, HashMap<String, usize>)>,
}

/// One open stream's place; dropping it frees the place.
pub struct StreamSlot {
    slots: Arc<StreamSlots>,
    token: String,
}

impl StreamSlots {
    pub fn new(max_total: usize, max_per_token: usize) -> Arc<StreamSlots> {
        Arc::new(StreamSlots {
            max_total,
            max_per_token,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// A place for one more stream of `token`, or `None` when a limit is reached.
    pub fn acquire(self: &Arc<Self>, token: &str) -> Option<StreamSlot> {
        let mut open = self.open.lock().ok()?;
        let (total, per) = &mut *open;
        let mine = per.get(token).copied().unwrap_or(0);
        if *total >= self.max_total || mine >= self.max_per_token {
            return None;
        }
        *total += 1;
        per.insert(token.to_owned(), mine + 1);
        Some(StreamSlot {
            slots: Arc::clone(self),
            token: token.to_owned(),
        })
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.open.lock().map_or(0, |o| o.0)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.slots.open.lock() {
            let (total, per) = &mut *open;
            *total = total.saturating_sub(1);
            if let Some(n) = per.get_mut(&self.token) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    per.remove(&self.token);
                }
            }
        }
    }
}

/// Publishes the newest event id on `hub.events_tip` until shutdown.
pub async fn watch_events(ledger: Arc<Ledger>, hub: Arc<Hub>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow() {
            break;
        }
        if let Ok(tip) = ledger.views().last_event_id().await {
            hub.events_tip.send_if_modified(|t| {
                let newer = tip > *t;
                if newer {
                    *t = tip;
                }
                newer
            });
        }
        tokio::select! {
            _ = hub.wrote.notified() => {}
            _ = tokio::time::sleep(TIP_POLL) => {}
            _ = shutdown.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_token_and_in_total() {
        let slots = StreamSlots::new(3, 2);
        let a1 = slots.acquire("a").expect("first");
        let a2 = slots.acquire("a").expect("second");
        assert!(slots.acquire("a").is_none(), "per-token limit");
        let b1 = slots.acquire("b").expect("another token");
        assert!(slots.acquire("c").is_none(), "total limit");
        drop(a1);
        assert_eq!(slots.open(), 2);
        let a3 = slots.acquire("a").expect("a place was freed");
        drop((a2, a3, b1));
        assert_eq!(slots.open(), 0);
    }
}
