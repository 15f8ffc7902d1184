//! The mesh executor: one WireGuard interface per node of a control plane
//! ([`agent_proto::mesh::mesh_interface`]) joining this node's environments to their subnets
//! on other nodes. It applies a [`MeshSpec`] whole: the device's key, port and peers (each
//! changed in place and every other removed, so a node or subnet the spec no longer names is
//! gone while the sessions of the rest go on), the interface up, each
//! environment's routes to its remote subnets (in the environment's own routing table, so no
//! other environment and not the host routes through the mesh), the firewall's side
//! (`mesh/firewall.rs`), then reads the device back and records the spec with its generation
//! as a fence (a stale retry never puts older peers back).
//!
//! The node's private key is made on first use (`<state>/mesh/private.key`, 0600) and never
//! leaves the node: only its public key goes out, in the heartbeat. Which WireGuard serves
//! the interface, and the device itself: `mesh/device.rs`.

pub mod device;
pub mod firewall;
pub mod offers;

use crate::outcome::{Failure, permanent, retryable};
use agent_proto::mesh::{MESH_MTU, MeshSpec, mesh_interface};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The mesh of one node of one control plane.
pub struct Mesh {
    pub control_plane: String,
    pub node: String,
    /// The agent's state folder: the key, the applied spec and its fence live in `mesh/`.
    pub state_dir: PathBuf,
    /// `nft`, as the firewall runs it.
    pub nft: PathBuf,
    /// Held by whoever writes an environment's routing table or firewall table (the routes
    /// and firewall tasks, the routes' drift repair, the mesh): each computes its part from the
    /// applied mesh, so they take turns.
    pub routes: tokio::sync::Mutex<()>,
    /// One apply, removal or repair of the mesh at a time, from its fence check to the state
    /// it writes: a drift repair that read generation 3 while generation 4 was being applied
    /// applied 3 again over it, and the node stayed on its peer's old key (the fence check
    /// came before the routes' turn, so it passed).
    pub applying: tokio::sync::Mutex<()>,
}

/// How long one apply may wait on the WireGuard device.
const DEVICE_TIMEOUT: Duration = Duration::from_secs(30);

/// A peer as the device reports it: its node and its last handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub node: String,
    pub last_handshake: Option<SystemTime>,
}

/// The mesh spec applied last by the agent whose state folder is `state_dir`.
fn applied_in(state_dir: &Path) -> Option<MeshSpec> {
    let text = std::fs::read_to_string(state_dir.join("mesh").join("applied.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// The subnets `environment` has on other nodes, as the mesh applied last says (what the
/// environment's firewall table and routes carry).
pub fn remote_subnets(state_dir: &Path, environment: &str) -> Vec<String> {
    applied_in(state_dir)
        .and_then(|s| s.environments.into_iter().find(|e| e.environment == environment))
        .map(|e| e.remote)
        .unwrap_or_default()
}

/// The other nodes' names a mesh carries, by environment and role (addresses that do not
/// parse, or lie outside the environment's remote subnets, are left out: a node speaks only
/// for its own subnet).
pub fn remote_names(spec: &MeshSpec) -> std::collections::HashMap<String, crate::names::EnvNames> {
    let mut out: std::collections::HashMap<String, crate::names::EnvNames> = std::collections::HashMap::new();
    for e in &spec.environments {
        for n in &e.names {
            let addresses: Vec<std::net::Ipv4Addr> = n
                .addresses
                .iter()
                .filter_map(|a| a.parse().ok())
                .filter(|a| e.remote.iter().any(|s| crate::names::within(s, *a)))
                .take(agent_proto::mesh::MAX_NAME_ADDRESSES)
                .collect();
            if !addresses.is_empty() {
                out.entry(e.environment.clone())
                    .or_default()
                    .insert(n.role.clone(), addresses);
            }
        }
    }
    out
}

/// This node's own names as the heartbeat says them.
pub fn local_names(
    local: &std::collections::HashMap<String, crate::names::EnvNames>,
) -> Vec<agent_proto::mesh::MeshName> {
    let mut out: Vec<agent_proto::mesh::MeshName> = local
        .iter()
        .flat_map(|(env, roles)| {
            roles.iter().map(move |(role, addresses)| agent_proto::mesh::MeshName {
                environment: env.clone(),
                role: role.clone(),
                addresses: addresses
                    .iter()
                    .take(agent_proto::mesh::MAX_NAME_ADDRESSES)
                    .map(|a| a.to_string())
                    .collect(),
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.environment, &a.role).cmp(&(&b.environment, &b.role)));
    out.truncate(agent_proto::mesh::MAX_HEARTBEAT_NAMES);
    out
}

/// Whether two specs differ at most in their generation and names.
fn same_but_names(a: &MeshSpec, b: &MeshSpec) -> bool {
    let bare = |s: &MeshSpec| MeshSpec {
        generation: 0,
        environments: s
            .environments
            .iter()
            .map(|e| agent_proto::mesh::MeshEnvironment {
                names: Vec::new(),
                ..e.clone()
            })
            .collect(),
        ..s.clone()
    };
    bare(a) == bare(b)
}

fn io(code: &'static str, e: impl std::fmt::Display) -> Failure {
    retryable(code, e.to_string())
}

impl Mesh {
    /// The node's WireGuard interface.
    pub fn interface(&self) -> String {
        mesh_interface(&self.control_plane, &self.node)
    }

    fn key_path(&self) -> PathBuf {
        self.dir().join("private.key")
    }

    fn dir(&self) -> PathBuf {
        self.state_dir.join("mesh")
    }

    /// The node's public key (base64, as `wg` writes it), what the heartbeat carries; the
    /// key pair is made on first use.
    pub fn public_key(&self) -> Result<String, Failure> {
        let key = device::private_key(&self.key_path())?;
        Ok(device::encode(&device::public_key(&key)))
    }

    /// The key epoch the node's key pair was made for (0: the first pair).
    pub fn key_epoch(&self) -> u64 {
        std::fs::read_to_string(self.dir().join("key-epoch"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    /// A new key pair for `epoch`: the private key replaced, then the epoch recorded (a crash
    /// between the two makes one more pair, never none). Blocking.
    fn rotate_key(&self, epoch: u64) -> Result<(), Failure> {
        device::new_key(&self.key_path())?;
        let path = self.dir().join("key-epoch");
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, epoch.to_string()).map_err(|e| io("state-write-failed", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io("state-write-failed", e))
    }

    /// The spec applied last, if any (and not removed since).
    pub fn applied(&self) -> Option<MeshSpec> {
        applied_in(&self.state_dir)
    }

    /// The subnets `environment` has on other nodes, as the applied spec says.
    pub fn remote_of(&self, environment: &str) -> Vec<String> {
        remote_subnets(&self.state_dir, environment)
    }

    /// The generation applied or removed last (0: none).
    pub fn fence(&self) -> u64 {
        std::fs::read_to_string(self.dir().join("generation"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    fn write_state(&self, generation: u64, spec: Option<&MeshSpec>) -> Result<(), Failure> {
        std::fs::create_dir_all(self.dir()).map_err(|e| io("state-write-failed", e))?;
        let put = |name: &str, text: String| -> Result<(), Failure> {
            let path = self.dir().join(name);
            let tmp = path.with_extension("new");
            std::fs::write(&tmp, text).map_err(|e| io("state-write-failed", e))?;
            std::fs::rename(&tmp, &path).map_err(|e| io("state-write-failed", e))
        };
        match spec {
            Some(s) => put("applied.json", serde_json::to_string(s).unwrap_or_default())?,
            None => {
                let _ = std::fs::remove_file(self.dir().join("applied.json"));
            }
        }
        put("generation", generation.to_string())
    }

    /// Reads the device back: its port, and each peer's key and allowed IPs, against `spec`.
    fn verify(&self, spec: &MeshSpec) -> Result<(), Failure> {
        let (_, d) = device::get(&self.interface()).ok_or_else(|| {
            permanent(
                "mesh-readback-mismatch",
                format!("{} answers no more", self.interface()),
            )
        })?;
        let mut got: Vec<(String, Vec<String>)> = d
            .peers
            .iter()
            .map(|p| {
                let mut ips: Vec<String> = p
                    .allowed_ips
                    .iter()
                    .map(|a| format!("{}/{}", a.ipaddr, a.cidr_mask))
                    .collect();
                ips.sort();
                (device::encode(&p.public_key), ips)
            })
            .collect();
        let mut want: Vec<(String, Vec<String>)> = spec
            .peers
            .iter()
            .map(|p| {
                let mut ips = p.subnets.clone();
                ips.sort();
                (p.public_key.clone(), ips)
            })
            .collect();
        got.sort();
        want.sort();
        if got != want || d.listen_port != spec.port {
            return Err(permanent(
                "mesh-readback-mismatch",
                format!("{} reads back otherwise: {} peers", self.interface(), got.len()),
            ));
        }
        Ok(())
    }

    /// Applies `spec` (see the module's comment).
    pub async fn apply(&self, spec: &MeshSpec) -> Result<String, Failure> {
        let _one = self.applying.lock().await;
        self.apply_held(spec).await
    }

    /// [`Mesh::apply`], its turn held.
    async fn apply_held(&self, spec: &MeshSpec) -> Result<String, Failure> {
        let fenced = self.fence();
        if fenced > spec.generation {
            return Err(permanent(
                "stale-generation",
                format!(
                    "generation {fenced} of the mesh is applied already; {} is older",
                    spec.generation
                ),
            ));
        }
        if spec.key_epoch > self.key_epoch() {
            // Asked for a new key pair: made here, before the device takes it; peers learn the
            // public key from the next heartbeat (sent as soon as this apply ends).
            self.off_thread(spec, |m, spec| m.rotate_key(spec.key_epoch)).await?;
            tracing::info!(epoch = spec.key_epoch, "mesh key pair rotated");
        }
        if spec.peers.is_empty() {
            // Nothing to reach: no interface and no listener (a lone node, a node whose last
            // shared environment left), and what an earlier spec made is taken down.
            let note = self.remove_held(spec.generation).await?;
            self.write_state(spec.generation, Some(spec))?;
            return Ok(format!("no peers at generation {}: {note}", spec.generation));
        }
        let _turn = self.routes.lock().await;
        let previous = self.applied();
        // Only other nodes' names changed (a replica started or stopped elsewhere): the device,
        // routes and tables stay as they are, and the names are served once the spec is
        // recorded. This is the path a new replica's name takes, so it is kept short.
        if let Some(p) = &previous
            && same_but_names(p, spec)
            && self
                .off_thread(spec, |m, spec| Ok(m.verify(spec).is_ok() && m.firewall().present()))
                .await?
        {
            self.write_state(spec.generation, Some(spec))?;
            return Ok(format!(
                "{} at generation {}: names only",
                self.interface(),
                spec.generation
            ));
        }
        let backend = self.set_device(spec).await?;
        self.route(spec, previous.as_ref()).await?;
        self.off_thread(spec, move |m, spec| {
            m.firewall().apply(spec, previous.as_ref())?;
            m.verify(spec)?;
            m.write_state(spec.generation, Some(spec))
        })
        .await?;
        Ok(format!(
            "{} ({}) at generation {}: {} peers, {} environments, read back",
            self.interface(),
            backend.name(),
            spec.generation,
            spec.peers.len(),
            spec.environments.len()
        ))
    }

    /// The WireGuard device made (or kept) and set to `spec`'s peers, on blocking sockets
    /// (netlink, or wireguard-go's), bounded: a WireGuard that never answers fails the task
    /// instead of holding it.
    async fn set_device(&self, spec: &MeshSpec) -> Result<device::Backend, Failure> {
        let (iface, path, wanted) = (self.interface(), self.key_path(), spec.clone());
        tokio::time::timeout(
            DEVICE_TIMEOUT,
            tokio::task::spawn_blocking(move || {
                let key = device::private_key(&path)?;
                let backend = device::ensure(&iface)?;
                device::set(&iface, backend, &key, &wanted)?;
                Ok::<_, Failure>(backend)
            }),
        )
        .await
        .map_err(|_| {
            retryable(
                "mesh-apply-failed",
                format!("the WireGuard device took over {DEVICE_TIMEOUT:?}"),
            )
        })?
        .map_err(|e| io("agent-task-failed", e))?
    }

    /// The device up, and each shared environment's remote subnets routed through it; an
    /// environment this node no longer shares with any other loses its routes through the
    /// mesh (its network may be gone already).
    async fn route(&self, spec: &MeshSpec, previous: Option<&MeshSpec>) -> Result<(), Failure> {
        let routes = crate::routes::Routes::connect()?;
        let index = routes
            .link_index(&self.interface())
            .await?
            .ok_or_else(|| retryable("mesh-interface-missing", format!("{} did not appear", self.interface())))?;
        routes.set_up(index, MESH_MTU).await?;
        let name = self.interface();
        for e in &spec.environments {
            let network = agent_proto::host_object(&self.control_plane, &e.environment, &self.node);
            match routes.ensure(&network, &e.subnet, Some((&name, &e.remote))).await {
                // Placed here a moment ago: its network comes with its own tasks, whose
                // routes task adds the mesh's routes from this spec once it is recorded.
                Err(f) if f.code == "bridge-missing" => {}
                other => {
                    other?;
                }
            }
        }
        for gone in previous
            .iter()
            .flat_map(|p| &p.environments)
            .filter(|g| !spec.environments.iter().any(|e| e.environment == g.environment))
        {
            let network = agent_proto::host_object(&self.control_plane, &gone.environment, &self.node);
            if let Err(f) = routes.ensure(&network, &gone.subnet, None).await
                && f.code != "bridge-missing"
            {
                return Err(f);
            }
        }
        Ok(())
    }

    /// Runs `f` (`nft`, the device's socket, files: blocking) off the async threads, on a
    /// copy of this mesh's identity and paths.
    async fn off_thread<T: Send + 'static>(
        &self,
        spec: &MeshSpec,
        f: impl FnOnce(&Mesh, &MeshSpec) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        let copy = Mesh {
            control_plane: self.control_plane.clone(),
            node: self.node.clone(),
            state_dir: self.state_dir.clone(),
            nft: self.nft.clone(),
            routes: tokio::sync::Mutex::new(()),
            applying: tokio::sync::Mutex::new(()),
        };
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || f(&copy, &spec))
            .await
            .map_err(|e| io("agent-task-failed", e))?
    }

    fn firewall(&self) -> firewall::MeshFirewall<'_> {
        firewall::MeshFirewall { mesh: self }
    }

    /// Removes the mesh at `generation`: its environments' routes through it, its firewall
    /// side, and the interface (which ends wireguard-go); gone is done.
    pub async fn remove(&self, generation: u64) -> Result<String, Failure> {
        let _one = self.applying.lock().await;
        self.remove_held(generation).await
    }

    /// [`Mesh::remove`], its turn held.
    async fn remove_held(&self, generation: u64) -> Result<String, Failure> {
        let fenced = self.fence();
        if fenced > generation {
            return Err(permanent(
                "stale-generation",
                format!("generation {fenced} of the mesh is applied already; {generation} is older"),
            ));
        }
        let _turn = self.routes.lock().await;
        let routes = crate::routes::Routes::connect()?;
        let applied = self.applied();
        if let Some(spec) = &applied {
            for e in &spec.environments {
                let network = agent_proto::host_object(&self.control_plane, &e.environment, &self.node);
                // An environment whose network is gone has no routes left to change.
                if let Err(f) = routes.ensure(&network, &e.subnet, None).await
                    && f.code != "bridge-missing"
                {
                    return Err(f);
                }
            }
        }
        let gone = applied.clone().unwrap_or_default();
        self.off_thread(&gone, move |m, _| m.firewall().remove(applied.as_ref()))
            .await?;
        if let Some(index) = routes.link_index(&self.interface()).await? {
            routes.delete_link(index).await?;
        }
        device::forget(&self.interface());
        self.write_state(generation, None)?;
        Ok(format!("{} removed at generation {generation}", self.interface()))
    }

    /// Drift: the applied spec is applied again when its device is gone or reads back
    /// otherwise (a restart that took wireguard-go with it, a peer removed by hand) or the
    /// mesh's table is gone. `None` when nothing needed doing.
    pub async fn repair(&self) -> Option<Result<String, Failure>> {
        // What is applied is read, checked and applied again in one turn: never an older
        // generation over one an apply is putting in place.
        let _one = self.applying.lock().await;
        let spec = self.applied()?;
        // A lone node has nothing to read back: no device, no table.
        if spec.peers.is_empty() {
            return None;
        }
        let healthy = self
            .off_thread(&spec, |m, spec| Ok(m.verify(spec).is_ok() && m.firewall().present()))
            .await
            .unwrap_or(false);
        if healthy {
            return None;
        }
        Some(self.apply_held(&spec).await)
    }

    /// Each peer's last handshake as the heartbeat says it (reads the device: blocking).
    pub fn link_reports(&self) -> Vec<agent_proto::mesh::MeshLink> {
        self.links()
            .into_iter()
            .take(agent_proto::mesh::MAX_MESH_PEERS)
            .map(|l| agent_proto::mesh::MeshLink {
                node: l.node,
                last_handshake: l
                    .last_handshake
                    .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                    .map(|d| d.as_secs()),
            })
            .collect()
    }

    /// Each peer of the device and its last handshake (mesh health), by node as the applied
    /// spec names them; empty when there is no mesh.
    pub fn links(&self) -> Vec<Link> {
        let (Some(spec), Some((_, d))) = (self.applied(), device::get(&self.interface())) else {
            return Vec::new();
        };
        spec.peers
            .iter()
            .map(|p| Link {
                node: p.node.clone(),
                last_handshake: d
                    .peers
                    .iter()
                    .find(|x| device::encode(&x.public_key) == p.public_key)
                    .map(|x| x.last_handshake_time)
                    .filter(|t| !t.is_zero())
                    .map(|t| SystemTime::UNIX_EPOCH + t),
            })
            .collect()
    }
}

impl crate::routes::Routes {
    /// Sets a link up with `mtu`.
    pub async fn set_up(&self, index: u32, mtu: u32) -> Result<(), Failure> {
        let msg = rtnetlink::LinkUnspec::new_with_index(index).up().mtu(mtu).build();
        self.handle()
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|e| retryable("link-set-failed", e.to_string()))
    }

    /// Deletes a link (the mesh's interface).
    pub async fn delete_link(&self, index: u32) -> Result<(), Failure> {
        match self.handle().link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -19 => Ok(()),
            Err(e) => Err(retryable("link-delete-failed", e.to_string())),
        }
    }
}
