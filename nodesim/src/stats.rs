//! What the simulated nodes saw: each call's latency by kind, refusals by code, transport
//! errors, and the nodes the control plane marked unhealthy or lost while they were beating.
//! Shared by every node's thread; summarised once at the end.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The calls a node makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call {
    Enrol,
    /// A node's first heartbeat of the run, sent before the control plane told it an
    /// interval: the join wave of a fleet starting at once, kept apart from the beats at the
    /// told intervals.
    FirstBeat,
    Heartbeat,
    /// A lease that asked without waiting, with the ends of the jobs before it (the agent's
    /// report and next lease, one request; a long poll waits by design and is only counted):
    /// its round trip.
    Lease,
    /// A certificate renewal (a new key, the control plane's certificate, the client switched).
    Renew,
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::Enrol => "enrol",
            Call::FirstBeat => "firstBeat",
            Call::Heartbeat => "heartbeat",
            Call::Lease => "lease",
            Call::Renew => "renew",
        }
    }
}

/// The most nodes a report names (the count is exact).
const NAMED_AT_MOST: usize = 100;

#[derive(Default)]
pub struct Stats {
    latencies: Mutex<BTreeMap<Call, Vec<u32>>>,
    refusals: Mutex<BTreeMap<String, u64>>,
    transport_errors: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    empty_leases: AtomicU64,
    meshes_applied: AtomicU64,
    largest_peer_set: AtomicU64,
    marked: Mutex<BTreeMap<String, String>>,
}

impl Stats {
    pub fn record(&self, call: Call, took: Duration) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        if let Ok(mut l) = self.latencies.lock() {
            l.entry(call).or_default().push(micros);
        }
    }

    pub fn refused(&self, code: &str) {
        if let Ok(mut r) = self.refusals.lock() {
            *r.entry(code.to_owned()).or_default() += 1;
        }
    }

    /// A call that got no answer: counted, and by its first words (a few kinds).
    pub fn transport_error(&self, what: &str) {
        self.transport_errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut e) = self.errors.lock()
            && (e.len() < 20 || e.contains_key(what))
        {
            *e.entry(what.chars().take(120).collect()).or_default() += 1;
        }
    }

    /// A node took a mesh of `peers` peers.
    pub fn mesh_applied(&self, peers: usize) {
        self.meshes_applied.fetch_add(1, Ordering::Relaxed);
        self.largest_peer_set.fetch_max(peers as u64, Ordering::Relaxed);
    }

    pub fn empty_lease(&self) {
        self.empty_leases.fetch_add(1, Ordering::Relaxed);
    }

    /// The control plane said `node` was `state` while it was beating as told.
    pub fn marked(&self, node: &str, state: &str) {
        if let Ok(mut m) = self.marked.lock() {
            m.entry(node.to_owned()).or_insert_with(|| state.to_owned());
        }
    }

    pub fn report(&self, nodes: usize, (enrol_seconds, seconds): (f64, f64), cost: Cost) -> Report {
        let latencies = self.latencies.lock().map(|l| l.clone()).unwrap_or_default();
        let marked = self.marked.lock().map(|m| m.clone()).unwrap_or_default();
        Report {
            nodes,
            enrol_seconds,
            seconds,
            calls: latencies
                .into_iter()
                .map(|(call, v)| (call.name().to_owned(), Summary::of(v, seconds)))
                .collect(),
            empty_leases: self.empty_leases.load(Ordering::Relaxed),
            meshes_applied: self.meshes_applied.load(Ordering::Relaxed),
            largest_peer_set: self.largest_peer_set.load(Ordering::Relaxed),
            refusals: self.refusals.lock().map(|r| r.clone()).unwrap_or_default(),
            transport_errors: self.transport_errors.load(Ordering::Relaxed),
            errors: self.errors.lock().map(|e| e.clone()).unwrap_or_default(),
            marked_while_beating: marked.len(),
            marked_nodes: marked.into_iter().take(NAMED_AT_MOST).collect(),
            cost,
        }
    }
}

/// One call kind: how many, how many a second, and latency quantiles in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub count: usize,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    pub fn of(mut micros: Vec<u32>, seconds: f64) -> Summary {
        micros.sort_unstable();
        let at = |q: f64| -> f64 {
            if micros.is_empty() {
                return 0.0;
            }
            let i = ((micros.len() as f64 * q).ceil() as usize).clamp(1, micros.len()) - 1;
            f64::from(micros[i]) / 1000.0
        };
        Summary {
            count: micros.len(),
            per_second: if seconds > 0.0 {
                micros.len() as f64 / seconds
            } else {
                0.0
            },
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: micros.last().map_or(0.0, |m| f64::from(*m) / 1000.0),
        }
    }
}

/// What the simulator itself cost: resident memory at the end and CPU over the run, whole and
/// per node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    pub rss_bytes: u64,
    pub cpu_seconds: f64,
    pub rss_bytes_per_node: u64,
    /// CPU per node per second of the run, in milliseconds.
    pub cpu_ms_per_node_second: f64,
}

/// The run's report (`--report FILE`, and a summary on standard error).
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub nodes: usize,
    /// How long enrolment took (those not enrolled by an earlier run).
    pub enrol_seconds: f64,
    pub seconds: f64,
    pub calls: BTreeMap<String, Summary>,
    pub empty_leases: u64,
    /// Meshes the nodes took (with `--mesh`), and the most peers one of them held.
    pub meshes_applied: u64,
    pub largest_peer_set: u64,
    pub refusals: BTreeMap<String, u64>,
    pub transport_errors: u64,
    /// The transport errors by their words (at most 20 kinds).
    pub errors: BTreeMap<String, u64>,
    /// Nodes the control plane showed unhealthy or lost while they beat as told.
    pub marked_while_beating: usize,
    /// The first of them, with the state shown.
    pub marked_nodes: BTreeMap<String, String>,
    pub cost: Cost,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_read_off_the_sorted_latencies() {
        let s = Summary::of((1..=100).map(|ms| ms * 1000).collect(), 10.0);
        assert_eq!((s.count, s.p50_ms, s.p99_ms, s.max_ms), (100, 50.0, 99.0, 100.0));
        assert_eq!(s.per_second, 10.0);
        let none = Summary::of(Vec::new(), 1.0);
        assert_eq!((none.count, none.p99_ms), (0, 0.0));
    }
}
