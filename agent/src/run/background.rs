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

/// Heartbeats: alive, able to run containers while Docker answers, and what runs; every
/// `every`, and sooner (at most one per `EARLY_HEARTBEAT_GAP`) when something changed.
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
        loop {
            let docker_up = engine.engine.docker.ping().await.is_ok();
            let mut volumes = Vec::new();
            if docker_up && measured_at.is_none_or(|t| t.elapsed() >= VOLUME_MEASURE_EVERY) {
                if let Ok(measured) = engine.engine.measure_volumes().await {
                    volumes = measured
                        .into_iter()
                        .take(agent_proto::MAX_HEARTBEAT_VOLUMES)
                        .map(|v| agent_proto::VolumeUsage {
                            environment: v.environment,
                            volume: v.volume,
                            generation: v.generation,
                            bytes: v.bytes,
                        })
                        .collect();
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
            match blocking(&client, move |c| c.heartbeat(&hb)).await {
                Ok(reply) => {
                    resend = false;
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
                    tracing::warn!(error = %e, "heartbeat failed");
                }
            }
            tokio::time::sleep(EARLY_HEARTBEAT_GAP).await;
            tokio::select! {
                _ = tokio::time::sleep(every.saturating_sub(EARLY_HEARTBEAT_GAP)) => {}
                _ = engine.changed.notified() => {}
            }
        }
    });
}
