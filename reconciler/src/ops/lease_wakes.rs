//! Which waiting leases to wake: while any agent's lease waits, one statement for the whole
//! fleet finds the nodes with work due (`Jobs::nodes_with_work`), and only those nodes' leases
//! are woken (`hub::wakes`). It looks at once when this daemon queued jobs (`Hub::jobs`), and
//! otherwise every [`LOOK_EVERY`]: what nobody here announced (another replica's writes, a
//! retry coming due, a lease running out) is seen within that; when another replica
//! announced new jobs (`ops::replica_wakes`) it looks at once too. Before, every waiting lease
//! read its own queue about once a second: ten thousand reads a second for an idle fleet of
//! ten thousand nodes, where this is one.

use crate::hub::Hub;
use crate::store::{Ledger, now_ms};
use std::sync::Arc;
use std::time::Duration;

/// The longest a due job waits for its node's lease to be woken when nothing announced it.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The least time between two looks, so a burst of announcements costs one look.
const LOOK_AT_MOST_EVERY: Duration = Duration::from_millis(20);

/// Runs until `shutdown` turns true.
pub async fn run(ledger: Arc<Ledger>, hub: Arc<Hub>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        // Enabled before the look: an announcement made while it runs is not lost.
        let announced = hub.jobs.notified();
        tokio::pin!(announced);
        announced.as_mut().enable();
        let elsewhere = hub.jobs_elsewhere.notified();
        tokio::pin!(elsewhere);
        elsewhere.as_mut().enable();
        if hub.nodes.waiting() > 0 {
            match ledger.jobs().nodes_with_work(now_ms()).await {
                Ok(nodes) => hub.nodes.wake(nodes),
                Err(e) => tracing::warn!(error = %e, "looking for nodes with work due failed"),
            }
        }
        tokio::select! {
            () = &mut announced => {}
            () = &mut elsewhere => {}
            () = tokio::time::sleep(LOOK_EVERY) => {}
            _ = shutdown.changed() => return,
        }
        tokio::time::sleep(LOOK_AT_MOST_EVERY).await;
    }
}
