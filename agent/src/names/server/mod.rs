//! The service-name servers (`names/mod.rs` says what they answer): one server (UDP and TCP) per
//! environment network of ours on this node, on the network's gateway, port 53. The table is rebuilt from
//! the engine after every task that changes containers and at every drift round; the servers
//! follow the networks (one starts with a network, stops when it goes).
//!
//! Names outside `.internal` reach the server too (Docker's resolver forwards everything it
//! does not know); they are passed to the host's resolver (the first `nameserver` of
//! `/etc/resolv.conf`, read at start) and its reply relayed back, at most [`MAX_FORWARDS`] at
//! once per environment and each for [`FORWARD_TIMEOUT`] at most. Over UDP, and over TCP
//! (`server/tcp.rs`) for the clients that ask so after a truncated answer.

use crate::docker::{CONTROL_PLANE, ENVIRONMENT, Engine, GENERATION, INSTANCE, NODE, OWNED, PORTS, ROLE};
use crate::firewall::Reachable;
use crate::names::{self, EnvNames, MAX_QUERY, Replica, Reply};
use bollard::query_parameters::{ListContainersOptionsBuilder, ListNetworksOptionsBuilder};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

mod tcp;

/// Forwarded queries in flight per environment; more are dropped (the client asks again).
pub const MAX_FORWARDS: usize = 64;
/// How long a forwarded query waits for the host's resolver.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
pub use crate::names::PORT;

type Table = Arc<RwLock<HashMap<String, EnvNames>>>;
/// Writes an environment's reachable addresses and ports to its firewall (blocking: `nft`).
pub type PushReach = Arc<dyn Fn(&str, &Reachable) -> Result<(), String> + Send + Sync>;

/// The servers and what they answer.
pub struct NameService {
    /// What the servers answer: this node's names with the other nodes' added.
    table: Table,
    /// This node's own names (its judged replicas).
    local: RwLock<HashMap<String, EnvNames>>,
    /// Other nodes' names, as the mesh applied last carries them.
    remote: RwLock<HashMap<String, EnvNames>>,
    /// Containers this agent judged healthy (their `ensure` succeeded, or they ran when it
    /// started).
    judged: Mutex<HashSet<String>>,
    /// Whether the first refresh happened (it judges what already runs).
    adopted: std::sync::atomic::AtomicBool,
    /// Each environment's server: its subnet and task.
    servers: Mutex<HashMap<String, (String, tokio::task::JoinHandle<()>)>>,
    /// Where names outside `.internal` go.
    upstream: Option<SocketAddr>,
    /// What each environment's containers may reach of each other, as the engine says now.
    reach: RwLock<HashMap<String, Reachable>>,
    /// What was last written to each environment's firewall sets.
    pushed: Mutex<HashMap<String, Reachable>>,
    /// How sets are written (`None`: no firewall executor on this node).
    push: Option<PushReach>,
}

/// The first `nameserver` of a `resolv.conf` text.
pub fn upstream_of(resolv_conf: &str) -> Option<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, PORT))
        .next()
}

impl NameService {
    /// A service forwarding to `upstream` (`None`: names outside `.internal` are refused).
    pub fn new(upstream: Option<SocketAddr>) -> Self {
        NameService {
            table: Arc::default(),
            local: RwLock::default(),
            remote: RwLock::default(),
            judged: Mutex::default(),
            adopted: std::sync::atomic::AtomicBool::new(false),
            servers: Mutex::default(),
            upstream,
            reach: RwLock::default(),
            pushed: Mutex::default(),
            push: None,
        }
    }

    /// Keeps the firewall's sets with the replicas: `push` writes one environment's.
    pub fn with_reach(mut self, push: PushReach) -> Self {
        self.push = Some(push);
        self
    }

    /// What `environment`'s containers may reach of each other now (for a table's apply).
    pub fn reach_of(&self, environment: &str) -> Reachable {
        self.reach
            .read()
            .ok()
            .and_then(|r| r.get(environment).cloned())
            .unwrap_or_default()
    }

    /// [`NameService::reach_of`] for every environment (for the firewall's drift repair).
    pub fn reach_all(&self) -> HashMap<String, Reachable> {
        self.reach.read().map(|r| r.clone()).unwrap_or_default()
    }

    /// The sets of `environment` hold `r` (its table was just applied with them).
    pub fn pushed(&self, environment: &str, r: Reachable) {
        if let Ok(mut p) = self.pushed.lock() {
            p.insert(environment.to_owned(), r);
        }
    }

    /// Forgets what was written, so the next refresh writes every environment's sets again
    /// (the drift round: a set emptied by hand, or an apply that raced a write, heals).
    pub fn forget_pushed(&self) {
        if let Ok(mut p) = self.pushed.lock() {
            p.clear();
        }
    }

    /// The host's resolver from `/etc/resolv.conf`.
    pub fn from_host() -> Self {
        Self::new(upstream_of(
            &std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
        ))
    }

    /// `container` passed its checks: its role's name may stand for it.
    pub fn judge(&self, container: &str) {
        if let Ok(mut j) = self.judged.lock() {
            j.insert(container.to_owned());
        }
    }

    /// `container` is about to end: its role's name no longer stands for it. True when it did.
    pub fn withdraw(&self, container: &str) -> bool {
        self.judged.lock().map(|mut j| j.remove(container)).unwrap_or(false)
    }

    /// What `environment`'s server answers now (tests read it).
    pub fn names_of(&self, environment: &str) -> Option<EnvNames> {
        self.table.read().ok()?.get(environment).cloned()
    }

    /// Rebuilds the table from the engine and starts or stops servers with the networks.
    pub async fn refresh(&self, engine: &Engine) {
        let (networks, running, reach) = match sources(engine).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the engine for service names");
                return;
            }
        };
        let judged = {
            let Ok(mut j) = self.judged.lock() else { return };
            if !self.adopted.swap(true, std::sync::atomic::Ordering::SeqCst) {
                j.extend(running.iter().map(|r| r.container.clone()));
            }
            // Forget containers that are gone (the set stays as small as what runs).
            let alive: HashSet<&str> = running.iter().map(|r| r.container.as_str()).collect();
            j.retain(|c| alive.contains(c.as_str()));
            j.clone()
        };
        // The firewall first: a name never points at an address the firewall still drops.
        self.push_reach(&reach).await;
        if let Ok(mut r) = self.reach.write() {
            *r = reach;
        }
        let table = names::table(&running, &judged);
        if let Ok(mut l) = self.local.write() {
            *l = table;
        }
        self.merge();
        self.follow(&networks);
    }

    /// Other nodes' names (from the mesh): served with this node's own from now on.
    pub fn set_remote(&self, remote: HashMap<String, EnvNames>) {
        if let Ok(mut r) = self.remote.write() {
            *r = remote;
        }
        self.merge();
    }

    /// This node's own names, for the heartbeat (other nodes' names add them).
    pub fn local(&self) -> HashMap<String, EnvNames> {
        self.local.read().map(|l| l.clone()).unwrap_or_default()
    }

    /// The served table: each role's addresses here and on other nodes, sorted, once each.
    fn merge(&self) {
        let mut table = self.local();
        if let Ok(remote) = self.remote.read() {
            for (env, roles) in remote.iter() {
                let names = table.entry(env.clone()).or_default();
                for (role, addresses) in roles {
                    let a = names.entry(role.clone()).or_default();
                    a.extend(addresses);
                    a.sort();
                    a.dedup();
                }
            }
        }
        if let Ok(mut t) = self.table.write() {
            *t = table;
        }
    }

    /// Writes the sets of each environment whose reach changed since last written.
    async fn push_reach(&self, reach: &HashMap<String, Reachable>) {
        let Some(push) = &self.push else { return };
        let changed: Vec<(String, Reachable)> = {
            let Ok(p) = self.pushed.lock() else { return };
            reach
                .iter()
                .filter(|(env, r)| p.get(*env) != Some(*r))
                .map(|(env, r)| (env.clone(), r.clone()))
                .collect()
        };
        for (env, r) in changed {
            let push = Arc::clone(push);
            let (e, rr) = (env.clone(), r.clone());
            match tokio::task::spawn_blocking(move || push(&e, &rr)).await {
                Ok(Ok(())) => self.pushed(&env, r),
                Ok(Err(error)) => {
                    tracing::warn!(environment = %env, %error, "cannot write the firewall's reachable ports")
                }
                Err(e) => tracing::warn!(environment = %env, error = %e, "cannot write the firewall's reachable ports"),
            }
        }
    }

    /// Starts a server for each network without one, stops those whose network went.
    fn follow(&self, networks: &HashMap<String, String>) {
        let Ok(mut servers) = self.servers.lock() else { return };
        servers.retain(|env, (subnet, task)| {
            let keep = networks.get(env) == Some(subnet) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for (env, subnet) in networks {
            if servers.contains_key(env) {
                continue;
            }
            let Some(gateway) = names::gateway(subnet) else {
                continue;
            };
            let std_socket = match std::net::UdpSocket::bind((gateway, PORT)) {
                Ok(s) => s,
                Err(e) => {
                    // The bridge may not have its address yet (a network made a moment ago):
                    // the next refresh tries again.
                    tracing::debug!(environment = %env, %gateway, error = %e, "name server not bound yet");
                    continue;
                }
            };
            let socket = match std_socket
                .set_nonblocking(true)
                .map(|()| UdpSocket::from_std(std_socket))
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) | Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "cannot serve names");
                    continue;
                }
            };
            let tcp = match std::net::TcpListener::bind((gateway, PORT))
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::TcpListener::from_std)
            {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!(environment = %env, %gateway, error = %e, "name server not bound yet");
                    continue;
                }
            };
            tracing::info!(environment = %env, %gateway, "serving service names");
            let (udp, tcp) = (
                serve(
                    Arc::new(socket),
                    env.clone(),
                    subnet.clone(),
                    Arc::clone(&self.table),
                    self.upstream,
                ),
                tcp::serve(
                    tcp,
                    env.as_str().into(),
                    subnet.as_str().into(),
                    Arc::clone(&self.table),
                    self.upstream,
                ),
            );
            // One task for both, so stopping the server stops both.
            let task = tokio::spawn(async move {
                tokio::join!(udp, tcp);
            });
            servers.insert(env.clone(), (subnet.clone(), task));
        }
    }
}

impl Drop for NameService {
    fn drop(&mut self) {
        if let Ok(servers) = self.servers.lock() {
            for (_, task) in servers.values() {
                task.abort();
            }
        }
    }
}

/// `environment`'s reply to `packet`, read under the table's lock (a query copies no names).
fn answer(table: &Table, environment: &str, packet: &[u8]) -> Reply {
    match table.read() {
        Ok(t) => names::reply(packet, environment, t.get(environment)),
        Err(_) => Reply::Drop,
    }
}

/// One environment's server loop.
async fn serve(
    socket: Arc<UdpSocket>,
    environment: String,
    subnet: String,
    table: Table,
    upstream: Option<SocketAddr>,
) {
    let forwards = Arc::new(Semaphore::new(MAX_FORWARDS));
    let mut buf = vec![0u8; MAX_QUERY + 1];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        // Only the environment's own containers are answered (another environment reaching
        // this address, through a host without our firewall, learns nothing).
        let SocketAddr::V4(v4) = from else { continue };
        if !names::within(&subnet, *v4.ip()) {
            continue;
        }
        let packet = &buf[..n];
        match answer(&table, &environment, packet) {
            Reply::Answer(bytes) => {
                let _ = socket.send_to(&bytes, from).await;
            }
            Reply::Forward => {
                let (Some(to), Ok(permit)) = (upstream, Arc::clone(&forwards).try_acquire_owned()) else {
                    continue;
                };
                let (socket, query) = (Arc::clone(&socket), packet.to_vec());
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Some(answer) = forward(&query, to).await {
                        let _ = socket.send_to(&answer, from).await;
                    }
                });
            }
            Reply::Drop => {}
        }
    }
}

/// The host resolver's reply to `query` (`None`: none in time).
async fn forward(query: &[u8], to: SocketAddr) -> Option<Vec<u8>> {
    let local: SocketAddr = if to.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await.ok()?;
    socket.connect(to).await.ok()?;
    socket.send(query).await.ok()?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(FORWARD_TIMEOUT, socket.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    buf.truncate(n);
    // The reply must answer this query (same id), or it is not relayed.
    (buf.len() >= 2 && query.len() >= 2 && buf[..2] == query[..2]).then_some(buf)
}

/// The networks of ours (environment → subnet), our running replicas with their addresses, and
/// what each environment's containers may reach (every running container of ours: its ports
/// label, or every port when it has none).
async fn sources(
    engine: &Engine,
) -> Result<(HashMap<String, String>, Vec<Replica>, HashMap<String, Reachable>), bollard::errors::Error> {
    let labels = vec![
        format!("{OWNED}=true"),
        format!("{CONTROL_PLANE}={}", engine.control_plane),
        format!("{NODE}={}", engine.node),
    ];
    let filters = HashMap::from([("label".to_owned(), labels)]);
    let mut networks = HashMap::new();
    let mut network_of = HashMap::new();
    for n in engine
        .docker
        .list_networks(Some(ListNetworksOptionsBuilder::default().filters(&filters).build()))
        .await?
    {
        let (Some(name), Some(env)) = (n.name, n.labels.as_ref().and_then(|l| l.get(ENVIRONMENT)).cloned()) else {
            continue;
        };
        let subnet = n
            .ipam
            .and_then(|i| i.config)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.subnet);
        if let Some(subnet) = subnet {
            networks.insert(env.clone(), subnet);
            network_of.insert(env, name);
        }
    }
    let mut running = Vec::new();
    let mut reach: HashMap<String, Reachable> = HashMap::new();
    let mut filters = filters;
    // Paused counts as running: a backup pauses a replica for a moment, and a refresh in that
    // moment must neither forget that it was judged healthy (it would never be named again
    // until its next ensure) nor close the firewall to it.
    filters.insert("status".to_owned(), vec!["running".to_owned(), "paused".to_owned()]);
    for c in engine
        .docker
        .list_containers(Some(ListContainersOptionsBuilder::default().filters(&filters).build()))
        .await?
    {
        let labels = c.labels.unwrap_or_default();
        let Some(env) = labels.get(ENVIRONMENT) else { continue };
        let container = c
            .names
            .and_then(|n| n.into_iter().next())
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_owned();
        let address = network_of.get(env).and_then(|net| {
            c.network_settings
                .as_ref()?
                .networks
                .as_ref()?
                .get(net)?
                .ip_address
                .as_deref()?
                .parse::<Ipv4Addr>()
                .ok()
        });
        let Some(address) = address else { continue };
        let r = reach.entry(env.clone()).or_default();
        match labels.get(PORTS) {
            Some(ports) => r.ports.extend(
                ports
                    .split(',')
                    .filter_map(|p| p.parse::<u16>().ok())
                    .map(|p| (address, p)),
            ),
            None => {
                r.open.insert(address);
            }
        }
        let (Some(role), Some(g), Some(_instance)) = (
            labels.get(ROLE),
            labels.get(GENERATION).and_then(|g| g.parse::<u64>().ok()),
            labels.get(INSTANCE),
        ) else {
            continue; // runs (jobs, releases, cron) have no instance and no name
        };
        running.push(Replica {
            environment: env.clone(),
            role: role.clone(),
            generation: g,
            container,
            address,
        });
    }
    // An environment whose network is here and runs nothing yet still has (empty) sets.
    for env in networks.keys() {
        reach.entry(env.clone()).or_default();
    }
    Ok((networks, running, reach))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_is_the_first_nameserver() {
        let text = "# comment\nsearch example.test\nnameserver 127.0.0.53\nnameserver 10.0.0.2\n";
        assert_eq!(upstream_of(text), Some("127.0.0.53:53".parse().expect("addr")));
        assert_eq!(upstream_of("nameserver ::1\n"), Some("[::1]:53".parse().expect("addr")));
        assert_eq!(upstream_of("nameserver nonsense\n"), None);
    }
}
