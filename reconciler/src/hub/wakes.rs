//! Wake-ups for agents' long-polling leases, one node at a time. A waiting lease registers its
//! node here and sleeps until that node is woken (or its wait ends); `ops::lease_wakes` wakes
//! the nodes that have work due (one query for the whole fleet, instead of every waiting lease
//! reading its own queue), and the mesh wakes the nodes whose mesh changed. So an idle fleet's
//! long polls cost the ledger nothing, and a write for one node wakes that node only.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::watch;

/// The nodes with a waiting lease, each with a counter its waiters watch (its receivers are
/// its waiters).
#[derive(Default)]
pub struct NodeWakes {
    nodes: Mutex<HashMap<String, watch::Sender<u64>>>,
}

/// One waiting lease's registration; dropped, it leaves (the node's slot with its last waiter).
pub struct Waiting<'a> {
    wakes: &'a NodeWakes,
    node: String,
    woken: watch::Receiver<u64>,
}

impl NodeWakes {
    /// Registers a waiter for `node`: a wake from now on is seen by [`Waiting::woken`], even
    /// one that comes before it is awaited.
    pub fn wait_for(&self, node: &str) -> Waiting<'_> {
        let woken = match self.nodes.lock() {
            Ok(mut nodes) => nodes
                .entry(node.to_owned())
                .or_insert_with(|| watch::Sender::new(0))
                .subscribe(),
            // A poisoned lock: a receiver of nothing, so the wait ends at its time.
            Err(_) => watch::Sender::new(0).subscribe(),
        };
        Waiting {
            wakes: self,
            node: node.to_owned(),
            woken,
        }
    }

    /// Wakes the waiting leases of each of `nodes` (a node with none is skipped).
    pub fn wake<S: AsRef<str>>(&self, nodes: impl IntoIterator<Item = S>) {
        if let Ok(map) = self.nodes.lock() {
            for n in nodes {
                if let Some(bump) = map.get(n.as_ref()) {
                    bump.send_modify(|v| *v = v.wrapping_add(1));
                }
            }
        }
    }

    /// How many nodes have a waiting lease.
    pub fn waiting(&self) -> usize {
        self.nodes.lock().map_or(0, |n| n.len())
    }
}

impl Waiting<'_> {
    /// Returns once the node was woken since registering or since the last return.
    pub async fn woken(&mut self) {
        if self.woken.changed().await.is_err() {
            // The slot is gone (it cannot be while this waiter holds it): never wake.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // This waiter's receiver is still alive here: the last one sees a count of one.
        if let Ok(mut nodes) = self.wakes.nodes.lock()
            && nodes.get(&self.node).is_some_and(|bump| bump.receiver_count() <= 1)
        {
            nodes.remove(&self.node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_reaches_only_its_node_and_is_kept_until_awaited() {
        let wakes = NodeWakes::default();
        let mut a = wakes.wait_for("a");
        let mut b = wakes.wait_for("b");
        assert_eq!(wakes.waiting(), 2);
        // Woken before it waits: not lost.
        wakes.wake(["a", "nobody"]);
        tokio::time::timeout(Duration::from_secs(1), a.woken())
            .await
            .expect("a woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), b.woken())
                .await
                .is_err(),
            "b was not woken"
        );
        // Two waiters of one node: both woken; the slot goes with the last.
        let mut a2 = wakes.wait_for("a");
        wakes.wake(["a"]);
        tokio::time::timeout(Duration::from_secs(1), a.woken())
            .await
            .expect("a");
        tokio::time::timeout(Duration::from_secs(1), a2.woken())
            .await
            .expect("a2");
        drop(a);
        assert_eq!(wakes.waiting(), 2);
        drop(a2);
        drop(b);
        assert_eq!(wakes.waiting(), 0);
    }
}
