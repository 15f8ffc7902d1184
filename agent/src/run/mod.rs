//! `pl-agent run`: heartbeats with what the node can run and what runs, leases its own jobs
//! with the lease loop (`lease_loop.rs`: one environment's tasks in order, different
//! environments in parallel up to a bound, each end reported with its fencing proof). The executors live in `docker/`, `firewall/mod.rs`, `routes.rs` and
//! `ingress/mod.rs`; a task for an executor the configuration turns off fails for good with
//! `executor-missing`, never pretends.

mod background;
/// The heartbeat's timing, shared with `pl-nodesim` so simulated nodes beat as agents do.
pub use background::{retry_after, told_interval};
mod config;
mod executors;
pub use executors::observed;

pub use config::Config;
pub use executors::{Executors, NAME_DRAIN, execute};

use crate::client::AgentClient;
use crate::docker::{
    ENVIRONMENT, Engine, GENERATION, IMAGE, IMAGE_FINGERPRINT, IMAGE_SIGNER, IMAGE_VERIFIED_AT, INSTANCE, ROLE,
    RUN_TIMEOUT, SPEC_HASH,
};
use crate::firewall::Firewall;
use crate::ingress::Share;
use crate::lease_loop::{Ended, LeaseLoop, Tasks};
use crate::outcome::{Failure, permanent};
use agent_proto::{Capability, Execution, LeasedJob, RunningInstance, Task};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Sooner than its interval, a heartbeat waits at least this long after the one before: a
/// burst of completions makes one early heartbeat, not one each.
pub const EARLY_HEARTBEAT_GAP: Duration = Duration::from_millis(100);

/// The enrolment folder read (a renewal a crash cut short finished first): the client, the
/// node's name and the control plane's id; the certificate's renewal started, for as long as
/// the agent runs.
fn connect(config: &Config) -> Result<(Arc<AgentClient>, String, String)> {
    crate::renewal::finish_interrupted(&config.dir).context("the enrolment folder")?;
    let client = Arc::new(AgentClient::from_dir(&config.control, &config.dir).context("the enrolment folder")?);
    std::fs::create_dir_all(&config.secrets_dir)
        .with_context(|| format!("creating {}", config.secrets_dir.display()))?;
    let node = crate::enroll::node_of(&config.dir)?;
    let control_plane = crate::enroll::control_plane_of(&config.dir)?;
    tokio::spawn(crate::renewal::run(
        Arc::clone(&client),
        node.clone(),
        config.dir.clone(),
    ));
    Ok((client, node, control_plane))
}

/// The control plane's image store, served to the engine on loopback (`image_proxy`), when
/// this node runs containers.
async fn image_store_proxy(
    config: &Config,
    client: &Arc<AgentClient>,
) -> Result<Option<crate::image_proxy::StoreProxy>> {
    if !config.executors.contains(&Capability::Docker) {
        return Ok(None);
    }
    let proxy = crate::image_proxy::start(Arc::clone(client)).await;
    Ok(Some(proxy.context("the image store's loopback endpoint")?))
}

/// The agent's main loop, until the process is stopped.
pub async fn run(config: Config) -> Result<()> {
    let (client, node, control_plane) = connect(&config)?;
    if config.executors.contains(&Capability::Ingress) && config.ingress_migrate_requests {
        crate::ingress::kernel::ensure_migrate_requests();
    }
    let (mesh_offers, mesh_taken) = crate::mesh::offers::Offers::new();
    let proxy = image_store_proxy(&config, &client).await?;
    let engine = Arc::new(executors_of(&config, &control_plane, &node, mesh_offers, proxy).await?);
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
    let repairs = background::drift(Arc::clone(&engine), Duration::from_secs(config.drift_seconds));
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
        background::mesh_applies(Arc::clone(&engine), mesh_taken);
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
    let links = match mesh.is_some() {
        true => background::mesh_links(Arc::clone(&engine)),
        false => Arc::default(),
    };
    background::heartbeats(background::Beats {
        client: Arc::clone(&client),
        engine: Arc::clone(&engine),
        repairs,
        links,
        every: Duration::from_secs(config.heartbeat_seconds.max(1)),
        host,
        mesh,
        nft_works,
        age_recipient: age_recipient(&config.dir.join(crate::enroll::AGE)),
    });
    // One queue per environment (its tasks in order), at most `parallel_environments` at work;
    // a step's ends go back with the next lease.
    let leasing = LeaseLoop::new(client, engine, config.parallel_environments, LONG_POLL);
    leasing.run(&AtomicBool::new(false)).await;
    Ok(())
}

/// The executors this node runs, as the configuration turns them on: Docker (its engine
/// connected now), the firewall, the mesh, the ingress (with TLS when it listens for it), the
/// names it serves and backups.
async fn executors_of(
    config: &Config,
    control_plane: &str,
    node: &str,
    mesh_offers: crate::mesh::offers::Offers,
    proxy: Option<crate::image_proxy::StoreProxy>,
) -> Result<Executors> {
    let firewall = Arc::new(Firewall {
        nft: config.nft.clone(),
        control_plane: control_plane.to_owned(),
        node: node.to_owned(),
        state_dir: config.state_dir.clone(),
    });
    Ok(Executors {
        mesh_on: config.mesh
            && config.executors.contains(&Capability::Routes)
            && config.executors.contains(&Capability::Nftables),
        mesh_offers,
        engine: Engine::connect(
            &config.docker_socket,
            control_plane,
            node,
            config.secrets_dir.clone(),
            config.dir.join(crate::enroll::AGE),
            config.state_dir.join("images-pulled"),
        )
        .await
        .with_context(|| format!("Docker at {}", config.docker_socket.display()))?
        .with_registry_auth(config.registry_auth.clone())
        .with_rollback_window(Duration::from_secs(config.rollback_window_seconds))
        .with_image_store_if(proxy),
        firewall: Arc::clone(&firewall),
        mesh: Arc::new(crate::mesh::Mesh {
            control_plane: control_plane.to_owned(),
            node: node.to_owned(),
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
    })
}

/// How long one read of the mesh's device for its links may take.
pub const MESH_READ: Duration = Duration::from_secs(2);

/// How often the mesh's links are read for the heartbeats.
pub const MESH_LINKS_EVERY: Duration = Duration::from_secs(5);

/// How often the heartbeat measures what the node's volumes hold.
pub const VOLUME_MEASURE_EVERY: Duration = Duration::from_secs(60);

/// How long a lease waits for a job when the node holds none.
pub const LONG_POLL: Duration = Duration::from_secs(20);

/// The public half of the node's age identity (the file `pl-agent enroll` wrote): what a
/// control plane rebuilt without its ledger seals this node's secrets to. `None` when the
/// file does not read as one X25519 identity (the heartbeat then leaves it out).
fn age_recipient(path: &std::path::Path) -> Option<String> {
    let text = zeroize::Zeroizing::new(std::fs::read_to_string(path).ok()?);
    let line = text.lines().find(|l| l.starts_with("AGE-SECRET-KEY-"))?;
    let identity: age::x25519::Identity = line.trim().parse().ok()?;
    Some(identity.to_public().to_string())
}
