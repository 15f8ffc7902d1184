//! `pl-agent run`: heartbeats with what the node can run and what runs, leases its own jobs
//! with the lease loop (`lease_loop.rs`: one environment's tasks in order, different
//! environments in parallel up to a bound, each end reported with its fencing proof). The executors live in `docker/`, `firewall/mod.rs`, `routes.rs` and
//! `ingress/mod.rs`; a task for an executor the configuration turns off fails for good with
//! `executor-missing`, never pretends.

mod config;
mod executors;

pub use config::Config;
use executors::observed;
pub use executors::{Executors, NAME_DRAIN, execute};

use crate::client::AgentClient;
use crate::docker::{ENVIRONMENT, Engine, GENERATION, INSTANCE, ROLE, RUN_TIMEOUT};
use crate::firewall::Firewall;
use crate::ingress::Share;
use crate::lease_loop::{Ended, LeaseLoop, Tasks, blocking};
use crate::outcome::{Failure, permanent};
use agent_proto::{Capability, Execution, Heartbeat, LeasedJob, RunningInstance, Task};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Sooner than its interval, a heartbeat waits at least this long after the one before: a
/// burst of completions makes one early heartbeat, not one each.
pub const EARLY_HEARTBEAT_GAP: Duration = Duration::from_millis(100);

/// The agent's main loop, until the process is stopped.
pub async fn run(config: Config) -> Result<()> {
    let client = Arc::new(AgentClient::from_dir(&config.control, &config.dir).context("the enrolment folder")?);
    std::fs::create_dir_all(&config.secrets_dir)
        .with_context(|| format!("creating {}", config.secrets_dir.display()))?;
    let node = crate::enroll::node_of(&config.dir)?;
    let control_plane = crate::enroll::control_plane_of(&config.dir)?;
    if config.executors.contains(&Capability::Ingress) && config.ingress_migrate_requests {
        crate::ingress::kernel::ensure_migrate_requests();
    }
    let firewall = Arc::new(Firewall {
        nft: config.nft.clone(),
        control_plane: control_plane.clone(),
        node: node.clone(),
        state_dir: config.state_dir.clone(),
    });
    let (mesh_offers, mut mesh_taken) = crate::mesh::offers::Offers::new();
    let engine = Arc::new(Executors {
        mesh_on: config.mesh
            && config.executors.contains(&Capability::Routes)
            && config.executors.contains(&Capability::Nftables),
        mesh_offers,
        engine: Engine::connect(
            &config.docker_socket,
            &control_plane,
            &node,
            config.secrets_dir.clone(),
            config.dir.join(crate::enroll::AGE),
            config.state_dir.join("images-pulled"),
        )
        .await
        .with_context(|| format!("Docker at {}", config.docker_socket.display()))?
        .with_registry_auth(config.registry_auth.clone())
        .with_rollback_window(Duration::from_secs(config.rollback_window_seconds)),
        firewall: Arc::clone(&firewall),
        mesh: Arc::new(crate::mesh::Mesh {
            control_plane: control_plane.clone(),
            node: node.clone(),
            state_dir: config.state_dir.clone(),
            nft: config.nft.clone(),
            routes: tokio::sync::Mutex::new(()),
            applying: tokio::sync::Mutex::new(()),
        }),
        enabled: config.executors.clone(),
        routes_dir: config.state_dir.join("routes"),
        ingress: Arc::new({
            let ingress = crate::ingress::Ingress::new(
                &config.caddy_admin,
                config.ingress_listen.clone(),
                config.ingress_upstreams.clone(),
                &format!("{control_plane}_{node}"),
            )
            .map_err(anyhow::Error::msg)?;
            let ingress = match &config.ingress_host_suffix {
                Some(suffix) => ingress.with_host_suffix(suffix).map_err(anyhow::Error::msg)?,
                None => ingress,
            };
            if config.ingress_tls_listen.is_empty() {
                ingress
            } else {
                ingress
                    .with_tls(crate::ingress::tls::TlsConfig {
                        listen: config.ingress_tls_listen.clone(),
                        dir: config.ingress_tls_dir.clone(),
                        identity: config.dir.join(crate::enroll::AGE),
                        certs_listen: config.ingress_certs_listen.clone(),
                    })
                    .map_err(anyhow::Error::msg)?
            }
        }),
        names: {
            let names = crate::names::server::NameService::from_host();
            if config.executors.contains(&Capability::Nftables) {
                let fw = Arc::clone(&firewall);
                names.with_reach(Arc::new(move |env: &str, r: &crate::firewall::Reachable| {
                    fw.set_reachable(env, r)
                        .map_err(|f| format!("{}: {}", f.code, f.detail))
                }))
            } else {
                names
            }
        },
        changed: tokio::sync::Notify::new(),
        backups: crate::docker::Backups {
            restic: crate::restic::Restic {
                program: config.restic.clone(),
                timeout: crate::docker::backup::BACKUP_TIMEOUT,
            },
            roots: config.backup_roots.clone(),
            cache_dir: config.state_dir.join("restic-cache"),
        },
    });
    if engine.on(Capability::Docker) {
        // What already runs keeps its names from the start (it was judged before a restart).
        engine.names.refresh(&engine.engine).await;
    }
    // `pl logs`: this node's requests, served as they come.
    tokio::spawn(crate::logs::serve(
        Arc::clone(&client),
        engine.engine.docker.clone(),
        crate::logs::Scope {
            control_plane: control_plane.clone(),
            node: node.clone(),
        },
    ));
    // Drift: checked every `drift_seconds`; what was repaired goes with the next heartbeat.
    let repairs: Arc<std::sync::Mutex<Vec<agent_proto::Repair>>> = Arc::default();
    {
        let (engine, repairs) = (Arc::clone(&engine), Arc::clone(&repairs));
        let every = Duration::from_secs(config.drift_seconds);
        tokio::spawn(async move {
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
    }
    let nft_works = std::process::Command::new(&config.nft)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    // Other nodes' names as the mesh applied last carried them (an agent restart keeps them).
    if let Some(spec) = engine.mesh.applied() {
        engine.names.set_remote(crate::mesh::remote_names(&spec));
    }
    // Meshes as leases and heartbeats bring them, applied one at a time, newest first.
    if engine.mesh_on {
        let engine = Arc::clone(&engine);
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
    // The mesh: the node's key pair made now (only its public half is ever sent).
    let mesh = if config.mesh {
        match engine.mesh.public_key() {
            Ok(public_key) => Some(agent_proto::mesh::MeshAdvert {
                public_key,
                port: config.mesh_port,
                address: config.mesh_address.map(|a| a.to_string()),
                applied: 0,
                links: Vec::new(),
                names: Vec::new(),
            }),
            Err(f) => {
                tracing::warn!(code = f.code, detail = %f.detail, "no mesh key: this node stays out of the mesh");
                None
            }
        }
    } else {
        None
    };
    // Heartbeats: alive, able to run containers while Docker answers, and what runs.
    // The machine: its id, else the Docker engine's (agents sharing an engine share a machine).
    let host = match crate::enroll::machine_id() {
        Some(id) => Some(id),
        None => engine
            .engine
            .docker
            .info()
            .await
            .ok()
            .and_then(|i| i.id)
            .map(|id| id.replace(':', "-"))
            .filter(|id| agent_proto::valid_host(id)),
    };
    // The mesh's links (each peer's last handshake), read from the device every
    // MESH_LINKS_EVERY off the async threads and bounded: a device that is slow to answer (a
    // wireguard-go starting) never holds a heartbeat, which says the links as last read.
    let links: Arc<std::sync::Mutex<Vec<agent_proto::mesh::MeshLink>>> = Arc::default();
    if mesh.is_some() {
        let (engine, links) = (Arc::clone(&engine), Arc::clone(&links));
        tokio::spawn(async move {
            loop {
                let e = Arc::clone(&engine);
                let read =
                    tokio::time::timeout(MESH_READ, tokio::task::spawn_blocking(move || e.mesh.link_reports())).await;
                if let Ok(Ok(read)) = read
                    && let Ok(mut l) = links.lock()
                {
                    *l = read;
                }
                tokio::time::sleep(MESH_LINKS_EVERY).await;
            }
        });
    }
    {
        let (client, engine, repairs) = (Arc::clone(&client), Arc::clone(&engine), Arc::clone(&repairs));
        let links = Arc::clone(&links);
        let every = Duration::from_secs(config.heartbeat_seconds.max(1));
        tokio::spawn(async move {
            // Volumes are walked at most once a minute, whatever the heartbeat interval, and
            // reported in the heartbeat that follows a walk only (the control plane keeps the
            // last figures; an empty list changes nothing there).
            let mut measured_at: Option<std::time::Instant> = None;
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
                    }
                    measured_at = Some(std::time::Instant::now());
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
                let hb = Heartbeat {
                    agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                    capabilities,
                    running: observed(&engine.engine).await,
                    repaired,
                    host: host.clone(),
                    taken_subnets: engine.engine.taken_subnets().await.unwrap_or_default(),
                    volumes,
                    mesh: mesh.as_ref().map(|m| agent_proto::mesh::MeshAdvert {
                        // Read each time: a rotation replaces it.
                        public_key: engine.mesh.public_key().unwrap_or_else(|_| m.public_key.clone()),
                        applied: engine.mesh.fence(),
                        links: links.lock().map(|l| l.clone()).unwrap_or_default(),
                        names: crate::mesh::local_names(&engine.names.local()),
                        ..m.clone()
                    }),
                };
                match blocking(&client, move |c| c.heartbeat(&hb)).await {
                    Ok(reply) => {
                        // A newer mesh than the one applied: applied off the heartbeat's path.
                        if let Some(spec) = reply.mesh
                            && mesh.is_some()
                            && engine.mesh_on
                        {
                            engine.mesh_offers.offer(spec, engine.mesh.fence());
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                }
                tokio::time::sleep(EARLY_HEARTBEAT_GAP).await;
                tokio::select! {
                    _ = tokio::time::sleep(every.saturating_sub(EARLY_HEARTBEAT_GAP)) => {}
                    _ = engine.changed.notified() => {}
                }
            }
        });
    }
    // One queue per environment (its tasks in order), at most `parallel_environments` at work;
    // a step's ends go back with the next lease.
    let leasing = LeaseLoop::new(client, engine, config.parallel_environments, LONG_POLL);
    leasing.run(&AtomicBool::new(false)).await;
    Ok(())
}

/// How long one read of the mesh's device for its links may take.
pub const MESH_READ: Duration = Duration::from_secs(2);

/// How often the mesh's links are read for the heartbeats.
pub const MESH_LINKS_EVERY: Duration = Duration::from_secs(5);

/// How often the heartbeat measures what the node's volumes hold.
pub const VOLUME_MEASURE_EVERY: Duration = Duration::from_secs(60);

/// How long a lease waits for a job when the node holds none.
pub const LONG_POLL: Duration = Duration::from_secs(20);
