//! The node's executors and the dispatch from a leased task and its execution spec to the one
//! that runs it: Docker, the firewall, routes, the ingress, the mesh, service names, volumes
//! and backups. A task for an executor the configuration turns off fails for good with
//! `executor-missing`, never pretends; drift repair asks each executor that is on.

use super::*;

/// What the node runs now: its containers of replicas, as the heartbeat reports them (none
/// while Docker does not answer). Healthy: running, and for a web replica answering its health
/// path now (probed each heartbeat), so what `pl status` counts and what a release's watch
/// judges is what serves.
pub async fn observed(engine: &Engine) -> Vec<RunningInstance> {
    let Ok(list) = engine.ours(&[]).await else {
        return Vec::new();
    };
    let failing = engine.failing_health().await.unwrap_or_default();
    list.into_iter()
        .filter_map(|(name, l, running)| {
            Some(RunningInstance {
                environment: l.get(ENVIRONMENT)?.clone(),
                role: l.get(ROLE)?.clone(),
                instance: l.get(INSTANCE)?.parse().ok()?,
                generation: l.get(GENERATION)?.parse().ok()?,
                healthy: running && !failing.contains(&name),
                spec_hash: l.get(SPEC_HASH).cloned(),
                image: l.get(IMAGE).cloned(),
                image_signed: match (l.get(IMAGE_SIGNER), l.get(IMAGE_FINGERPRINT)) {
                    (Some(principal), Some(fingerprint)) => Some(agent_proto::ImageSigned {
                        principal: principal.clone(),
                        fingerprint: fingerprint.clone(),
                        verified_at_ms: l.get(IMAGE_VERIFIED_AT).and_then(|t| t.parse().ok()).unwrap_or(0),
                    }),
                    _ => None,
                },
            })
        })
        .take(agent_proto::MAX_HEARTBEAT_INSTANCES)
        .collect()
}

/// The executors of this node.
pub struct Executors {
    pub engine: Engine,
    pub firewall: Arc<Firewall>,
    /// Which executors are on (`Config::executors`).
    pub enabled: Vec<Capability>,
    /// Where the routes each environment should have are remembered (for drift repair).
    pub routes_dir: PathBuf,
    pub ingress: Arc<crate::ingress::Ingress>,
    /// Each environment's service names, served on its network's gateway (`names/mod.rs`).
    pub names: crate::names::server::NameService,
    /// Woken when a task changed what runs: the heartbeat reports it now, not at its next
    /// interval (what `pl up`, `pl wait` and drift repair read comes from heartbeats).
    pub changed: tokio::sync::Notify,
    /// Backups: the restic program, its cache, and where repositories on the node may be.
    pub backups: crate::docker::backup::Backups,
    /// The mesh between nodes (its routes are part of each environment's table).
    pub mesh: Arc<crate::mesh::Mesh>,
    /// Whether this node is in the mesh (its configuration says so, and it has the routes
    /// and nftables executors the mesh needs).
    pub mesh_on: bool,
    /// Newer meshes from leases and heartbeats, for the task that applies them.
    pub mesh_offers: crate::mesh::offers::Offers,
}

/// Runs an executor's blocking work (`nft`, Caddy's admin API) off the async threads, with
/// the executor it needs.
pub(super) async fn off_thread<X: Send + Sync + 'static, T: Send + 'static>(
    executor: &Arc<X>,
    f: impl FnOnce(&X) -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    let executor = Arc::clone(executor);
    tokio::task::spawn_blocking(move || f(&executor))
        .await
        .unwrap_or_else(|e| Err(crate::outcome::retryable("agent-task-failed", e.to_string())))
}

/// Runs one task with what its lease carries. After a Docker task, whatever its outcome (a
/// failed ensure removes its container), the service names and the firewall's sets follow
/// what runs.
pub async fn execute(x: &Executors, job: &LeasedJob) -> Result<Ended, Failure> {
    let outcome = match (&job.task, &job.execution) {
        (Task::BackupVolume { .. }, Execution::Backup(spec)) if x.on(Capability::Docker) => {
            x.engine.backup(&x.backups, spec).await
        }
        (Task::VerifyBackup { .. }, Execution::Drill(spec)) if x.on(Capability::Docker) => {
            x.engine.drill(&x.backups, spec).await
        }
        (Task::RestoreVolume { snapshot, .. }, Execution::Backup(spec)) if x.on(Capability::Docker) => {
            x.engine.restore(&x.backups, spec, snapshot).await.map(Ended::from)
        }
        (
            Task::MeasureCanary {
                hostname, generation, ..
            },
            _,
        ) if x.on(Capability::Ingress) => {
            let (host, generation) = (hostname.clone(), *generation);
            off_thread(&x.ingress, move |ingress| ingress.measure_canary(&host, generation))
                .await
                .map(|(note, measured)| Ended {
                    note,
                    measured: Some(measured),
                    ..Ended::default()
                })
        }
        _ => run_task(x, job).await.map(Ended::from),
    };
    // A set-up changes no container (its firewall apply refreshed the names already).
    if job.task.needs() == [Capability::Docker] && x.on(Capability::Docker) {
        x.names.refresh(&x.engine).await;
    }
    outcome
}

pub(super) async fn run_task(x: &Executors, job: &LeasedJob) -> Result<String, Failure> {
    let engine = &x.engine;
    // Every executor it needs before any runs: half an environment's set-up is not one.
    if let Some(needs) = job.task.needs().iter().find(|c| !x.on(**c)) {
        return Err(permanent(
            "executor-missing",
            format!("this agent has no {needs} executor on for {}", job.task.kind()),
        ));
    }
    match (&job.task, &job.execution) {
        (Task::EnsureEnvironment { generation, .. }, Execution::Network(net)) => {
            // In the order each needs the one before: the routes name the network's bridge.
            let network = engine.ensure_network(net).await?;
            let firewall = apply_firewall(x, net, *generation).await?;
            let routes = ensure_routes(x, net).await?;
            Ok(format!("{network}; {firewall}; {routes}"))
        }
        (Task::EnsureNetwork { .. }, Execution::Network(net)) => engine.ensure_network(net).await,
        (Task::ApplyFirewall { generation, .. }, Execution::Network(net)) => apply_firewall(x, net, *generation).await,
        (Task::EnsureRoutes { .. }, Execution::Network(net)) => ensure_routes(x, net).await,
        (
            Task::RemoveNetwork {
                environment,
                generation,
            },
            execution,
        ) => {
            // Teardown's last step: the firewall table and the routes first, then the network.
            let (env, generation) = (environment.clone(), *generation);
            let mut notes = Vec::new();
            if x.on(Capability::Nftables) {
                notes.push(off_thread(&x.firewall, move |fw| fw.remove(&env, generation)).await?);
            }
            if let (true, Execution::Network(net)) = (x.on(Capability::Routes), execution) {
                // Held until the remembered routes are forgotten: a drift round between the two
                // would find them missing and write them again, a rule left behind.
                let _turn = x.mesh.routes.lock().await;
                notes.push(crate::routes::Routes::connect()?.remove(&net.subnet).await?);
                let _ = std::fs::remove_file(x.routes_dir.join(&net.environment));
            }
            let network = agent_proto::host_object(&engine.control_plane, environment, &engine.node);
            notes.push(engine.remove_network(&network).await?);
            Ok(notes.join("; "))
        }
        (Task::EnsureApplication { .. }, Execution::Application(app)) => {
            let note = engine.ensure_application(app).await?;
            // Healthy: its role's name may stand for it now (the refresh after the task); a
            // rollback's resumed container stands for it under its own name.
            x.names.judge(&engine.serving(&app.container));
            Ok(note)
        }
        (Task::RunOnce { .. } | Task::RunCron { .. }, Execution::Application(app)) => {
            engine.run_once(app, RUN_TIMEOUT).await
        }
        (
            Task::StopApplication {
                environment,
                role,
                instance,
                generation,
            },
            _,
        ) => {
            withdraw_names(x, environment, role, *instance, *generation, true).await?;
            engine.stop_older(environment, role, *instance, *generation, true).await
        }
        (
            Task::TeardownApplication {
                environment,
                role,
                instance,
                generation,
            },
            _,
        ) => {
            withdraw_names(x, environment, role, *instance, *generation, false).await?;
            engine.teardown(environment, role, *instance, *generation).await
        }
        (
            Task::RemoveVolume {
                environment,
                volume,
                generation,
            },
            _,
        ) => engine.remove_volume(environment, volume, *generation).await,
        (Task::PublishIngress { .. }, Execution::Ingress(spec)) if spec.held => {
            // A custom domain not proven yet: nothing of it is routed on this node.
            let (env, host, generation) = (spec.environment.clone(), spec.hostname.clone(), spec.generation);
            let note = off_thread(&x.ingress, move |ingress| ingress.remove(&env, &host, generation)).await?;
            Ok(format!("held until its domain is verified ({note})"))
        }
        (Task::PublishIngress { weight, repair, .. }, Execution::Ingress(spec)) => {
            // This generation's replicas on this node, by their address on the environment's
            // network.
            let mut dials = Vec::new();
            for u in &spec.upstreams {
                // A rollback's replica may be a resumed container of the previous release; a
                // rolling rollout's replica not replaced yet is the older one that runs.
                let container = match &u.older {
                    Some(o) => match engine
                        .older_serving(&spec.environment, &o.role, o.instance, spec.generation)
                        .await?
                    {
                        Some(c) => c,
                        None => continue,
                    },
                    None => engine.serving(&u.container),
                };
                if let Some(ip) = engine.address(&container, &spec.network.network).await {
                    dials.push(format!("{ip}:{}", u.port));
                }
            }
            let (env, host, generation) = (spec.environment.clone(), spec.hostname.clone(), spec.generation);
            let sealed = spec.tls.clone();
            let share = match (weight, repair) {
                (Some(w), _) => Share::Canary(*w),
                (None, 0) => Share::Whole,
                (None, _) => Share::Repair,
            };
            off_thread(&x.ingress, move |ingress| {
                ingress.publish_share(&env, &host, generation, &dials, sealed.as_ref(), share)
            })
            .await
        }
        (
            Task::RemoveIngress {
                environment,
                hostname,
                generation,
            },
            _,
        ) => {
            let (env, host, generation) = (environment.clone(), hostname.clone(), *generation);
            off_thread(&x.ingress, move |ingress| ingress.remove(&env, &host, generation)).await
        }
        (
            Task::PlaceAcmeChallenge {
                hostname,
                token,
                key_authorization,
                ..
            },
            _,
        ) => {
            let (host, token, key) = (hostname.clone(), token.clone(), key_authorization.clone());
            off_thread(&x.ingress, move |ingress| ingress.place_challenge(&host, &token, &key)).await
        }
        (task, _) => Err(permanent(
            "task-malformed",
            format!("a {} task came without the execution it needs", task.kind()),
        )),
    }
}

/// How long a replica's name is withdrawn before the replica ends, when other nodes serve the
/// name too (its environment is in the mesh): the withdrawal reaches them with the next
/// heartbeat and their leases (tens of milliseconds), and an answer a caller got just before
/// lives one TTL ([`crate::names::TTL`], 1 s).
pub const NAME_DRAIN: Duration = Duration::from_secs(1);

/// Before a stop or a teardown: the replicas about to end leave their role's name first, and
/// the heartbeat says so at once; when other nodes serve the name, the replica keeps running
/// for [`NAME_DRAIN`] while they learn it, so a caller anywhere is never sent to a replica that
/// is gone.
pub(super) async fn withdraw_names(
    x: &Executors,
    environment: &str,
    role: &str,
    instance: u32,
    generation: u64,
    older_only: bool,
) -> Result<(), Failure> {
    let ending = x
        .engine
        .ending(environment, role, instance, generation, older_only)
        .await?;
    let mut withdrawn = false;
    for container in &ending {
        withdrawn |= x.names.withdraw(container);
    }
    if !withdrawn {
        return Ok(());
    }
    x.names.refresh(&x.engine).await;
    x.changed.notify_one();
    if x.mesh_on && !x.mesh.remote_of(environment).is_empty() {
        tokio::time::sleep(NAME_DRAIN).await;
    }
    Ok(())
}

/// The environment's nftables table, with its sets as the replicas are now.
async fn apply_firewall(x: &Executors, net: &agent_proto::NetworkSpec, generation: u64) -> Result<String, Failure> {
    let (env, subnet) = (net.environment.clone(), net.subnet.clone());
    // The mesh's set comes from the applied mesh: a mesh apply running now finishes first (or
    // finds this table made), so neither misses the other.
    let _turn = x.mesh.routes.lock().await;
    // The sets as the replicas are now, so replacing the table never empties them.
    x.names.refresh(&x.engine).await;
    let reach = x.names.reach_of(&env);
    let pushed = reach.clone();
    let note = off_thread(&x.firewall, move |fw| fw.apply(&env, &subnet, generation, &reach)).await?;
    x.names.pushed(&net.environment, pushed);
    Ok(note)
}

/// The environment's routing table and rules, the mesh's remote subnets included.
async fn ensure_routes(x: &Executors, net: &agent_proto::NetworkSpec) -> Result<String, Failure> {
    let _turn = x.mesh.routes.lock().await;
    let (iface, remote) = (x.mesh.interface(), x.mesh.remote_of(&net.environment));
    let note = crate::routes::Routes::connect()?
        .ensure(&net.network, &net.subnet, Some((iface.as_str(), remote.as_slice())))
        .await?;
    // Remembered for drift repair (the environment's name is a plain label).
    let _ = std::fs::create_dir_all(&x.routes_dir);
    std::fs::write(x.routes_dir.join(&net.environment), &net.subnet)
        .map_err(|e| crate::outcome::retryable("state-write-failed", e.to_string()))?;
    Ok(note)
}

impl Executors {
    pub(super) fn on(&self, executor: Capability) -> bool {
        self.enabled.contains(&executor)
    }

    /// One round of drift repair: containers, firewall tables, routes. Returns (environment,
    /// what was repaired).
    pub async fn repair(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.on(Capability::Docker) {
            match self.engine.repair_containers().await {
                Ok(r) => out.extend(r),
                Err(f) => tracing::warn!(code = f.code, "cannot check containers for drift"),
            }
            // Every environment's firewall sets are written again (a set emptied by hand, or
            // an apply that raced a write, heals within a round).
            self.names.forget_pushed();
            self.names.refresh(&self.engine).await;
            // Memory: the previous generations' replicas paused past the rollback window.
            match self.engine.expire_paused().await {
                Ok(stopped) if !stopped.is_empty() => {
                    tracing::info!(
                        containers = stopped.len(),
                        "stopped replicas kept past the rollback window"
                    )
                }
                Ok(_) => {}
                Err(f) => tracing::warn!(code = f.code, "cannot stop replicas kept for a rollback"),
            }
            // Runs whose jobs never came back for them (cancelled while their agent was down).
            match self.engine.sweep_runs().await {
                Ok(removed) if !removed.is_empty() => {
                    tracing::info!(containers = ?removed, "removed finished runs no job claimed")
                }
                Ok(_) => {}
                Err(f) => tracing::warn!(code = f.code, "cannot sweep finished runs"),
            }
            // Disk: images this agent pulled that nothing uses any more.
            match self.engine.collect_images().await {
                Ok(removed) if !removed.is_empty() => tracing::info!(images = removed.len(), "removed unused images"),
                Ok(_) => {}
                Err(f) => tracing::warn!(code = f.code, "cannot collect unused images"),
            }
        }
        if self.on(Capability::Nftables) {
            let fw = Arc::clone(&self.firewall);
            let reach = self.names.reach_all();
            out.extend(
                tokio::task::spawn_blocking(move || fw.repair(&reach))
                    .await
                    .unwrap_or_default(),
            );
        }
        if self.on(Capability::Ingress) {
            let ingress = Arc::clone(&self.ingress);
            out.extend(
                tokio::task::spawn_blocking(move || ingress.repair())
                    .await
                    .unwrap_or_default(),
            );
        }
        if self.on(Capability::Routes) && self.on(Capability::Nftables) {
            match self.mesh.repair().await {
                Some(Ok(note)) => out.push(("mesh".to_owned(), format!("mesh applied again: {note}"))),
                Some(Err(f)) => tracing::warn!(code = f.code, "cannot repair the mesh"),
                None => {}
            }
        }
        if self.on(Capability::Routes)
            && let Ok(dir) = std::fs::read_dir(&self.routes_dir)
            && let Ok(routes) = crate::routes::Routes::connect()
        {
            for entry in dir.flatten() {
                let env = entry.file_name().to_string_lossy().into_owned();
                let network = agent_proto::host_object(&self.engine.control_plane, &env, &self.engine.node);
                let _turn = self.mesh.routes.lock().await;
                // Read under the lock: a removal that took it first has forgotten the routes.
                let Ok(subnet) = std::fs::read_to_string(entry.path()) else {
                    continue;
                };
                let subnet = subnet.trim();
                let (iface, remote) = (self.mesh.interface(), self.mesh.remote_of(&env));
                let mesh = Some((iface.as_str(), remote.as_slice()));
                if routes.verify(&network, subnet, mesh).await.is_ok() {
                    continue;
                }
                match routes.ensure(&network, subnet, mesh).await {
                    Ok(_) => out.push((env.clone(), "routes re-applied".to_owned())),
                    Err(f) => tracing::warn!(environment = %env, code = f.code, "cannot repair routes"),
                }
            }
        }
        out
    }
}

impl Tasks for Executors {
    fn execute(&self, job: &LeasedJob) -> impl std::future::Future<Output = Result<Ended, Failure>> + Send {
        execute(self, job)
    }

    fn changed(&self) {
        self.changed.notify_one();
    }

    fn mesh_held(&self) -> Option<u64> {
        self.mesh_on.then(|| self.mesh_offers.held(self.mesh.fence()))
    }

    fn mesh(&self, spec: agent_proto::mesh::MeshSpec) {
        if self.mesh_on {
            self.mesh_offers.offer(spec, self.mesh.fence());
        }
    }
}
