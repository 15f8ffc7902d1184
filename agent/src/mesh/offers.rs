//! Newer meshes as they come (with a lease, or a heartbeat's reply), handed to the one task
//! that applies them: the newest offered wins, an older one or one already applied is
//! dropped, and an offer made while an apply runs waits for it (a `watch` channel keeps only
//! the newest). What the node holds — applied, or taken to be applied — is what its leases
//! say, so a lease never brings the same mesh twice; what it applied is what its heartbeats
//! say, so a failed apply comes again with the next one.

use agent_proto::mesh::MeshSpec;
use tokio::sync::watch;

/// The offers' end that leases and heartbeats write to.
pub struct Offers {
    newest: watch::Sender<Option<MeshSpec>>,
}

/// The applying task's end.
pub type Taken = watch::Receiver<Option<MeshSpec>>;

impl Offers {
    pub fn new() -> (Offers, Taken) {
        let (newest, taken) = watch::channel(None);
        (Offers { newest }, taken)
    }

    /// Offers `spec`; `applied` is the generation applied now. True when it is taken (newer
    /// than both what is applied and what waits).
    pub fn offer(&self, spec: MeshSpec, applied: u64) -> bool {
        if spec.generation <= applied {
            return false;
        }
        self.newest.send_if_modified(|slot| {
            if slot.as_ref().is_some_and(|s| s.generation >= spec.generation) {
                return false;
            }
            *slot = Some(spec);
            true
        })
    }

    /// The apply of `generation` failed: it is no longer held, so the next heartbeat's reply
    /// (or lease) offers it again.
    pub fn failed(&self, generation: u64) {
        self.newest.send_if_modified(|slot| {
            if slot.as_ref().is_some_and(|s| s.generation == generation) {
                *slot = None;
            }
            // Nothing new to apply: the applier is not woken.
            false
        });
    }

    /// The newest generation the node holds: applied, or offered and taken.
    pub fn held(&self, applied: u64) -> u64 {
        let offered = self.newest.borrow().as_ref().map_or(0, |s| s.generation);
        offered.max(applied)
    }
}

/// Waits for the next offer newer than `applied` (`None` once the offers' end is gone).
pub async fn next(taken: &mut Taken, applied: impl Fn() -> u64) -> Option<MeshSpec> {
    loop {
        taken.changed().await.ok()?;
        let spec = taken.borrow_and_update().clone();
        if let Some(spec) = spec
            && spec.generation > applied()
        {
            return Some(spec);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(generation: u64) -> MeshSpec {
        MeshSpec {
            generation,
            ..MeshSpec::default()
        }
    }

    #[tokio::test]
    async fn the_newest_offer_wins_and_older_ones_are_dropped() {
        let (offers, mut taken) = Offers::new();
        assert!(!offers.offer(at(3), 3), "applied already");
        assert_eq!(offers.held(3), 3);
        assert!(offers.offer(at(5), 3));
        assert!(offers.offer(at(7), 3));
        assert!(!offers.offer(at(6), 3), "older than the one waiting");
        assert_eq!(offers.held(3), 7);
        let got = next(&mut taken, || 3).await.expect("offer");
        assert_eq!(got.generation, 7, "two offers before the applier looked: the newest");
        // The same generation again (a lease racing a heartbeat): held, not taken twice.
        assert!(!offers.offer(at(7), 3), "the same generation is held already");
        // Its apply failed: the next offer of it is taken again.
        offers.failed(7);
        assert_eq!(offers.held(3), 3);
        assert!(offers.offer(at(7), 3));
        assert_eq!(next(&mut taken, || 3).await.expect("offer").generation, 7);
        // One the node applied meanwhile (by another path) is skipped.
        assert!(offers.offer(at(9), 3));
        assert!(offers.offer(at(10), 3));
        drop(offers);
        assert!(next(&mut taken, || 10).await.is_none(), "applied already, then the end");
    }
}
