//! What the layers tell each other, and what the reconcile loop observed for the surfaces to
//! report. Wake-ups go through `Notify`s; the leader flag, pass counters, the newest event id,
//! the ledger's counts as of the last pass and the pass-duration histogram are read by the
//! operator API. Each layer's state holds an `Arc<Hub>`, so no layer imports another's state:
//! the composition root (`main.rs`) makes one and hands it to all.

pub mod wakes;

use crate::store::views::Counts;
use crate::store::{Ledger, now_ms};
use state_schema::model::NodePool;
use state_schema::values::Name;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The bounds of the reconcile-duration histogram, in seconds.
pub const DURATION_BUCKETS: [f64; 8] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// Counters the `/metrics` endpoint shows next to what it reads from the ledger.
#[derive(Default)]
pub struct Metrics {
    pub ticks: AtomicU64,
    pub tick_errors: AtomicU64,
    /// Cumulative counts per bucket of `DURATION_BUCKETS`, then the sum in microseconds.
    pub buckets: [AtomicU64; 8],
    pub duration_sum_us: AtomicU64,
}

impl Metrics {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, b) in DURATION_BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.duration_sum_us
            .fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.ticks.fetch_add(1, Ordering::Relaxed);
    }
}

/// The signals between layers and what the loop observed.
pub struct Hub {
    /// Wakes the reconcile loop early (a watch event, `reconcile --now`, a webhook).
    pub hint: Notify,
    /// Wakes the remote fetcher early (webhooks).
    pub fetch_hint: Notify,
    /// Wakes the event watcher after this daemon wrote.
    pub wrote: Notify,
    /// Says this daemon queued jobs: `ops::lease_wakes` looks which nodes have work due, and
    /// tells the other replicas (`ops::replica_wakes`).
    pub jobs: Notify,
    /// Says another replica queued jobs (`ops::replica_wakes`): `ops::lease_wakes` looks too.
    pub jobs_elsewhere: Notify,
    /// Says this daemon's agents completed jobs: `ops::replica_wakes` tells the leader, when
    /// that is another replica.
    pub completed: Notify,
    /// Wakes agents' long-polling leases one node at a time: the nodes with work due
    /// (`ops::lease_wakes`), and those whose mesh this daemon changed.
    pub nodes: wakes::NodeWakes,
    /// Wakes the loop for the ledger-only part of a pass (`settle`): agents completed jobs.
    pub settle_hint: Notify,
    /// The newest event id, published by the event watcher to every stream.
    pub events_tip: tokio::sync::watch::Sender<i64>,
    /// The ledger's counts as of the last pass (or standby check): `/metrics` serves these
    /// instead of querying per scrape.
    pub counts: Mutex<Option<Counts>>,
    pub metrics: Metrics,
    /// Whether this daemon holds the lead, as the lock said when last asked.
    pub leader: AtomicBool,
    /// When the loop (leader) or the standby check (follower) last completed.
    pub last_tick_ms: AtomicI64,
    /// Completed passes, for `reconcile --now` to wait on.
    pub passes: AtomicU64,
    /// Bumped when certificates were revoked (a node retired in Git): the agent API's
    /// certificate cache starts afresh.
    pub revocations: AtomicU64,
    /// Set while a control plane rebuilt without its ledger waits for its nodes' reports
    /// (`reconcile::rebuild`): heartbeats' environment networks are kept as the ledger's
    /// subnets meanwhile.
    pub rebuilding: AtomicBool,
    /// The hostnames' issued certificates as of the last look (`[certificates]`): hostname,
    /// when it expires (Unix ms, 0 before the first issuance) and failures in a row. `/metrics`
    /// serves these, so a scrape costs no query.
    pub certificates: Mutex<Vec<(String, i64, i64)>>,
    /// Each backed-up volume's newest success and failures since, as of the last refresh of
    /// the counts: `/metrics` serves these.
    pub backups: Mutex<Vec<crate::store::backups::BackupHealth>>,
    /// The mesh's links as last judged, bounded whatever the fleet's size: `/metrics` serves
    /// these.
    pub mesh_links: Mutex<MeshLinks>,
    /// A heartbeat left out a replica its node reported before: the loop's next drift check
    /// looks at once instead of at its next full check (`reconcile::drift`).
    pub drift_suspected: AtomicBool,
    /// A completion recorded a drift repair since the last settle looked: the next one
    /// publishes its routes again (a full pass always looks, for another daemon's).
    pub repairs_recorded: AtomicBool,
    /// Until when some generation is under watch, as this daemon last read or wrote it:
    /// heartbeats after it judge nothing (`ops::agents`).
    pub watching: WatchHint,
    /// How many nodes are enrolled, as last counted: what each node's heartbeat interval is
    /// derived from (`ops::agents::heartbeat`).
    pub fleet_size: FleetSize,
}

/// The most mesh links named one by one (`/metrics`' `pushleft_mesh_link_up`): a fleet of
/// 10,000 nodes has about two million links, and a series each would be a scrape of hundreds
/// of MB; links that are up are counted, not named.
pub const MAX_NAMED_LINKS: usize = 1_000;

/// The mesh's links as last judged: how many are in each state, and the links not up (down
/// first), at most [`MAX_NAMED_LINKS`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MeshLinks {
    pub up: u64,
    pub connecting: u64,
    pub down: u64,
    /// (node, peer, whether down rather than still connecting).
    pub not_up: Vec<(String, String, bool)>,
}

/// How long a daemon trusts its count of the fleet before counting again.
pub const FLEET_SIZE_MS: i64 = 10_000;

/// The fleet's size, counted at most every [`FLEET_SIZE_MS`]: a heartbeat reads nothing more
/// for it.
#[derive(Debug, Default)]
pub struct FleetSize {
    nodes: AtomicU64,
    /// When `nodes` was counted (0: never).
    read_ms: AtomicI64,
}

impl FleetSize {
    /// The count, if made within [`FLEET_SIZE_MS`] of `now_ms`.
    pub fn get(&self, now_ms: i64) -> Option<u64> {
        let read = self.read_ms.load(Ordering::Acquire);
        (read > 0 && now_ms - read < FLEET_SIZE_MS).then(|| self.nodes.load(Ordering::Relaxed))
    }

    pub fn set(&self, nodes: u64, now_ms: i64) {
        self.nodes.store(nodes, Ordering::Relaxed);
        self.read_ms.store(now_ms.max(1), Ordering::Release);
    }
}

/// How long a daemon believes what it read of the watches before reading again: another
/// daemon of the same ledger (PostgreSQL) may have set one since.
pub const WATCH_HINT_MS: i64 = 1_000;

/// What heartbeats need to look at, kept in memory so that a heartbeat with nothing under
/// watch reads nothing: until when some generation is watched (`i64::MAX` for a canary's,
/// which is watched to its switch), and when that was read from the ledger. This daemon's own
/// writes extend it at once; another daemon's are seen within [`WATCH_HINT_MS`].
#[derive(Debug, Default)]
pub struct WatchHint {
    until: AtomicI64,
    /// When `until` was read from the ledger (0: never).
    read_ms: AtomicI64,
}

impl WatchHint {
    /// Until when some generation is watched, if read from the ledger within
    /// [`WATCH_HINT_MS`] of `now_ms`.
    pub fn get(&self, now_ms: i64) -> Option<i64> {
        let read = self.read_ms.load(Ordering::Acquire);
        (read > 0 && now_ms - read < WATCH_HINT_MS).then(|| self.until.load(Ordering::Relaxed))
    }

    /// What the ledger says, read at `now_ms`.
    pub fn set(&self, until: i64, now_ms: i64) {
        self.until.store(until, Ordering::Relaxed);
        self.read_ms.store(now_ms.max(1), Ordering::Release);
    }

    /// This daemon set a watch running until `until`.
    pub fn extend(&self, until: i64) {
        self.until.fetch_max(until, Ordering::Relaxed);
    }
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            certificates: Mutex::new(Vec::new()),
            backups: Mutex::new(Vec::new()),
            mesh_links: Mutex::new(MeshLinks::default()),
            hint: Notify::new(),
            fetch_hint: Notify::new(),
            wrote: Notify::new(),
            jobs: Notify::new(),
            nodes: wakes::NodeWakes::default(),
            settle_hint: Notify::new(),
            jobs_elsewhere: Notify::new(),
            completed: Notify::new(),
            events_tip: tokio::sync::watch::Sender::new(0),
            counts: Mutex::new(None),
            metrics: Metrics::default(),
            leader: AtomicBool::new(false),
            last_tick_ms: AtomicI64::new(0),
            passes: AtomicU64::new(0),
            revocations: AtomicU64::new(0),
            rebuilding: AtomicBool::new(false),
            // A daemon that just started has not looked: its first check does.
            drift_suspected: AtomicBool::new(true),
            repairs_recorded: AtomicBool::new(true),
            watching: WatchHint::default(),
            fleet_size: FleetSize::default(),
        }
    }
}

impl Hub {
    /// Reads the ledger's counts for `/metrics`: after a pass that wrote, and otherwise at
    /// most once a second.
    pub async fn refresh_counts(&self, ledger: &Ledger, wrote: bool) {
        let fresh = !wrote
            && self
                .counts
                .lock()
                .ok()
                .and_then(|c| c.as_ref().map(|c| now_ms() - c.at_ms < 1000))
                .unwrap_or(false);
        if fresh {
            return;
        }
        match ledger.views().counts(now_ms()).await {
            Ok(c) => {
                if let Ok(mut slot) = self.counts.lock() {
                    *slot = Some(c);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the ledger's counts"),
        }
        match ledger.backups().backup_health().await {
            Ok(b) => {
                if let Ok(mut slot) = self.backups.lock() {
                    *slot = b;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the backups' health"),
        }
    }
}

/// The last decode of the applied pools, by the hash of their documents.
type DecodedPools = (u64, Arc<Vec<(Name, NodePool)>>);
static DECODED_POOLS: Mutex<Option<DecodedPools>> = Mutex::new(None);

/// `state_schema::declared::node_pools`, kept: the same documents decode to the same pools, so
/// the last decode is reused while the documents' hash is the same. Enrolment, the agent API
/// and placement each ask for the pools; decoding 10,000 declared nodes' YAML takes tens of
/// milliseconds, and enrolling a large fleet asked for it once a node (found by `pl-nodesim`).
pub fn node_pools(documents: &[String]) -> Vec<(Name, NodePool)> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    documents.hash(&mut h);
    let key = h.finish();
    if let Ok(d) = DECODED_POOLS.lock()
        && let Some((k, pools)) = d.as_ref()
        && *k == key
    {
        return pools.as_ref().clone();
    }
    let pools = Arc::new(state_schema::declared::node_pools(documents));
    if let Ok(mut d) = DECODED_POOLS.lock() {
        *d = Some((key, Arc::clone(&pools)));
    }
    Arc::unwrap_or_clone(pools)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n    - {name: n1, capacity: {cpu: \"4\", memory: 8Gi}}\n";

    #[test]
    fn a_decode_is_kept_for_the_same_documents_only() {
        let one = vec![POOL.to_owned()];
        let first = node_pools(&one);
        assert_eq!(first.len(), 1);
        assert_eq!(node_pools(&one), first, "the kept decode is the same");
        let two = vec![POOL.replace("n1", "n2")];
        let other = node_pools(&two);
        assert_eq!(other[0].1.nodes[0].name.as_str(), "n2", "other documents decode anew");
        assert_eq!(node_pools(&one)[0].1.nodes[0].name.as_str(), "n1");
    }
}
