//! The agent's loops besides leasing, each spawned once by `run`: drift repair (its repairs
//! go with the next heartbeat), the meshes leases and heartbeats bring (applied one at a time,
//! newest first), the mesh's links read off the async threads, and the heartbeats.

use super::{EARLY_HEARTBEAT_GAP, Executors, MESH_LINKS_EVERY, MESH_READ, VOLUME_MEASURE_EVERY, observed};
use crate::client::AgentClient;
use crate::lease_loop::blocking;
use agent_proto::{Capability, Heartbeat};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What drift repair found since the last heartbeat, at most `MAX_HEARTBEAT_REPAIRS`.
pub(super) type Repairs = Arc<Mutex<Vec<agent_proto::Repair>>>;
/// The mesh's links as last read from its device.
pub(super) type Links = Arc<Mutex<Vec<agent_proto::mesh::MeshLink>>>;

/// Checks for drift every `every` and repairs it; what was repaired is kept for the next
/// heartbeat.
pub(super) fn drift(engine: Arc<Executors>, every: Duration) -> Repairs {
    let repairs: Repairs = Arc::default();
    let kept = Arc::clone(&repairs);
    tokio::spawn(async move {
        let repairs = kept;
        loop {
            tokio::time::sleep(every).await;
            let found = engine.repair().await;
            for (environment, what) in found {
                tracing::info!(environment = %environment, what = %what, "drift repaired");
                if let Ok(mut r) = repairs.lock()
                    && r.len() < agent_proto::MAX_HEARTBEAT_REPAIRS
                {
                    r.push(agent_proto::Repair { environment, what });
                }
            }
        }
    });
    repairs
}

/// Applies the meshes offered (`taken`), one at a time, newest first; each apply wakes a
/// heartbeat, which says which generation holds.
pub(super) fn mesh_applies(engine: Arc<Executors>, mut mesh_taken: crate::mesh::offers::Taken) {
    tokio::spawn(async move {
        while let Some(spec) = crate::mesh::offers::next(&mut mesh_taken, || engine.mesh.fence()).await {
            match engine.mesh.apply(&spec).await {
                Ok(note) => {
                    // Other nodes' names, served with this node's own.
                    engine.names.set_remote(crate::mesh::remote_names(&spec));
                    tracing::info!(generation = spec.generation, note = %note, "mesh applied")
                }
                Err(f) => {
                    engine.mesh_offers.failed(spec.generation);
                    tracing::warn!(generation = spec.generation, code = f.code, detail = %f.detail, "cannot apply the mesh")
                }
            }
            // The next heartbeat says which generation holds, now.
            engine.changed.notify_one();
        }
    });
}

/// Reads the mesh's links every `MESH_LINKS_EVERY`, each read bounded by `MESH_READ`.
pub(super) fn mesh_links(engine: Arc<Executors>) -> Links {
    let links: Links = Arc::default();
    let kept = Arc::clone(&links);
    tokio::spawn(async move {
        loop {
            let e = Arc::clone(&engine);
            let read =
                tokio::time::timeout(MESH_READ, tokio::task::spawn_blocking(move || e.mesh.link_reports())).await;
            if let Ok(Ok(read)) = read
                && let Ok(mut l) = kept.lock()
            {
                *l = read;
            }
            tokio::time::sleep(MESH_LINKS_EVERY).await;
        }
    });
    links
}

/// What the heartbeats need: the client, the executors, what drift repaired, the mesh's
/// links, the interval, the machine, the mesh's advert (when the node is in the mesh), and
/// whether nftables answers.
pub(super) struct Beats {
    pub client: Arc<AgentClient>,
    pub engine: Arc<Executors>,
    pub repairs: Repairs,
    pub links: Links,
    pub every: Duration,
    pub host: Option<String>,
    pub mesh: Option<agent_proto::mesh::MeshAdvert>,
    pub nft_works: bool,
    /// The node's age recipient, from its enrolment folder's identity (public).
    pub age_recipient: Option<String>,
}

/// Heartbeats: alive, able to run containers while Docker answers, and what runs; at the
/// interval the control plane answered (`every` until it says, or when it does not), and
/// sooner (at most one per `EARLY_HEARTBEAT_GAP`) when something changed. A heartbeat that
/// failed is sent again after a random wait of at most `RETRY_SPREAD`, doubling with each
/// failure in a row, never past the interval: a node whose beat fell in a control plane's
/// restart is not late for long, the nodes retrying do not arrive together, and a long outage
/// is not met by a fleet retrying faster than it beats.
pub(super) fn heartbeats(beats: Beats) {
    let Beats {
        client,
        engine,
        repairs,
        links,
        every,
        host,
        mesh,
        nft_works,
        age_recipient,
    } = beats;
    tokio::spawn(async move {
        // Volumes are walked at most once a minute, whatever the heartbeat interval, and
        // reported in the heartbeat that follows a walk only (the control plane keeps the
        // last figures; an empty list changes nothing there) and, unwalked, again after a
        // heartbeat that failed: a control plane rebuilt without its ledger learns which
        // generation of each volume the node holds from its first heartbeat.
        let mut measured_at: Option<std::time::Instant> = None;
        let mut last_volumes: Vec<agent_proto::VolumeUsage> = Vec::new();
        let mut resend = false;
        // The interval the control plane told last, and how many beats failed in a row.
        let (mut told, mut failures) = (every, 0u32);
        loop {
            let docker_up = engine.engine.docker.ping().await.is_ok();
            let mut volumes = Vec::new();
            if docker_up && measured_at.is_none_or(|t| t.elapsed() >= VOLUME_MEASURE_EVERY) {
                if let Some(measured) = volume_usage(&engine).await {
                    volumes = measured;
                    last_volumes.clone_from(&volumes);
                }
                measured_at = Some(std::time::Instant::now());
            } else if resend {
                volumes.clone_from(&last_volumes);
            }
            let mut capabilities = Vec::new();
            for c in &engine.enabled {
                let works = match c {
                    Capability::Docker => docker_up,
                    Capability::Nftables => nft_works,
                    Capability::Routes => true,
                    Capability::Ingress => engine.ingress.answers().await,
                };
                if works {
                    capabilities.push(c.name().to_owned());
                }
            }
            let repaired = repairs.lock().map(|mut r| std::mem::take(&mut *r)).unwrap_or_default();
            let (taken_subnets, networks) = engine.engine.networks_seen().await.unwrap_or_default();
            let hb = Heartbeat {
                agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                protocol: agent_proto::PROTOCOL,
                capabilities,
                running: observed(&engine.engine).await,
                repaired,
                host: host.clone(),
                taken_subnets,
                volumes,
                mesh: mesh.as_ref().map(|m| agent_proto::mesh::MeshAdvert {
                    // Read each time: a rotation replaces it.
                    public_key: engine.mesh.public_key().unwrap_or_else(|_| m.public_key.clone()),
                    applied: engine.mesh.fence(),
                    links: links.lock().map(|l| l.clone()).unwrap_or_default(),
                    names: crate::mesh::local_names(&engine.names.local()),
                    ..m.clone()
                }),
                age_recipient: age_recipient.clone(),
                networks,
            };
            // The wait before the next beat.
            let next;
            match blocking(&client, move |c| c.heartbeat(&hb)).await {
                Ok(reply) => {
                    resend = false;
                    failures = 0;
                    told = told_interval(reply.next_heartbeat_ms, every);
                    next = told;
                    // A newer mesh than the one applied: applied off the heartbeat's path.
                    if let Some(spec) = reply.mesh
                        && mesh.is_some()
                        && engine.mesh_on
                    {
                        engine.mesh_offers.offer(spec, engine.mesh.fence());
                    }
                }
                Err(e) => {
                    resend = true;
                    failures = failures.saturating_add(1);
                    next = retry_after(told, failures);
                    tracing::warn!(error = %e, retry_ms = next.as_millis() as u64, "heartbeat failed");
                }
            }
            tokio::time::sleep(EARLY_HEARTBEAT_GAP.min(next)).await;
            tokio::select! {
                _ = tokio::time::sleep(next.saturating_sub(EARLY_HEARTBEAT_GAP)) => {}
                _ = engine.changed.notified() => {}
            }
        }
    });
}

/// What the node's volumes hold, for a heartbeat (at most `MAX_HEARTBEAT_VOLUMES`); `None`
/// when the walk failed.
async fn volume_usage(engine: &Executors) -> Option<Vec<agent_proto::VolumeUsage>> {
    let measured = engine.engine.measure_volumes().await.ok()?;
    Some(
        measured
            .into_iter()
            .take(agent_proto::MAX_HEARTBEAT_VOLUMES)
            .map(|v| agent_proto::VolumeUsage {
                environment: v.environment,
                volume: v.volume,
                generation: v.generation,
                bytes: v.bytes,
            })
            .collect(),
    )
}

/// The longest a failed heartbeat waits before it is sent again.
pub(super) const RETRY_SPREAD: Duration = Duration::from_secs(15);
/// The longest interval a control plane may tell.
const TOLD_AT_MOST: Duration = Duration::from_secs(900);

/// The interval to beat at: the node's own `every`, or the control plane's when it tells a
/// longer one (a large fleet's; `None`: an older control plane), at most [`TOLD_AT_MOST`].
pub fn told_interval(told_ms: Option<u64>, every: Duration) -> Duration {
    told_ms.map_or(every, |ms| every.max(Duration::from_millis(ms).min(TOLD_AT_MOST)))
}

/// When to send a heartbeat again after `failures` in a row: a random wait up to
/// [`RETRY_SPREAD`] doubled for each failure after the first, or the interval, whichever is
/// shorter, and at least a second.
pub fn retry_after(interval: Duration, failures: u32) -> Duration {
    let cap = RETRY_SPREAD.saturating_mul(1 << failures.saturating_sub(1).min(10));
    let mut b = [0u8; 4];
    let fraction = match getrandom::fill(&mut b) {
        Ok(()) => f64::from(u32::from_le_bytes(b)) / f64::from(u32::MAX),
        Err(_) => 0.5,
    };
    cap.min(interval).mul_f64(fraction).max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_told_interval_is_kept_within_bounds() {
        let own = Duration::from_secs(10);
        assert_eq!(told_interval(None, own), own);
        assert_eq!(told_interval(Some(250_000), own), Duration::from_secs(250));
        assert_eq!(told_interval(Some(5), own), own, "its own when longer");
        assert_eq!(told_interval(Some(u64::MAX), own), Duration::from_secs(900));
    }

    #[test]
    fn a_failed_beat_is_retried_soon_and_spread() {
        let interval = Duration::from_secs(250);
        let waits: Vec<Duration> = (0..200).map(|_| retry_after(interval, 1)).collect();
        assert!(waits.iter().all(|w| *w >= Duration::from_secs(1) && *w <= RETRY_SPREAD));
        let distinct: std::collections::BTreeSet<u128> = waits.iter().map(Duration::as_millis).collect();
        assert!(distinct.len() > 100, "spread, not one instant: {}", distinct.len());
        assert!(retry_after(Duration::from_secs(2), 1) <= Duration::from_secs(2));
        // Failing on, the waits grow to the interval and no further.
        let late: Vec<Duration> = (0..200).map(|_| retry_after(interval, 9)).collect();
        assert!(late.iter().all(|w| *w <= interval));
        assert!(late.iter().any(|w| *w > RETRY_SPREAD * 4), "backed off");
    }
}
