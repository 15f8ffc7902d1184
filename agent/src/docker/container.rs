//! Containers: a replica created hardened with our labels, started and probed until healthy,
//! repaired, stopped when an older generation, torn down, or run once for a job.

use super::*;

/// The labels that say who signed the image, as verified before the pull: the heartbeat
/// reports them with the replica (provenance is what the node checked, not what was asked).
fn with_signer(
    mut labels: HashMap<String, String>,
    verified: Option<&image_trust::Verified>,
) -> HashMap<String, String> {
    if let Some(v) = verified {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        labels.insert(IMAGE_SIGNER.to_owned(), v.principal.clone());
        labels.insert(IMAGE_FINGERPRINT.to_owned(), v.fingerprint.clone());
        labels.insert(IMAGE_VERIFIED_AT.to_owned(), now_ms.to_string());
    }
    labels
}

impl Engine {
    pub(super) fn labels(&self, app: &ApplicationSpec) -> HashMap<String, String> {
        let mut l = HashMap::from([
            (OWNED.to_owned(), "true".to_owned()),
            (CONTROL_PLANE.to_owned(), self.control_plane.clone()),
            (NODE.to_owned(), self.node.clone()),
            (ENVIRONMENT.to_owned(), app.environment.clone()),
            (DEPLOYMENT.to_owned(), app.deployment.clone()),
            (ROLE.to_owned(), app.role.clone()),
            (GENERATION.to_owned(), app.generation.to_string()),
            (SPEC_HASH.to_owned(), app.spec_hash.clone()),
            (IMAGE.to_owned(), app.image.clone()),
        ]);
        if let Some(i) = app.instance {
            l.insert(INSTANCE.to_owned(), i.to_string());
        }
        if let (Some(h), Some(port)) = (&app.health, app.port) {
            l.insert(HEALTH.to_owned(), format!("{port} {}", h.path));
        }
        // What other containers of the environment may reach (the firewall's set): the web
        // port and the declared ones; present, even empty, on every container of this version.
        let mut ports: Vec<u16> = app.port.into_iter().chain(app.ports.iter().copied()).collect();
        ports.sort_unstable();
        ports.dedup();
        l.insert(
            PORTS.to_owned(),
            ports.iter().map(u16::to_string).collect::<Vec<_>>().join(","),
        );
        l
    }

    /// Creates the hardened container: read-only root, a small `/tmp` tmpfs, every capability
    /// dropped, no new privileges, the role's CPU, memory (and swap) and pids limits, no
    /// published port, only the environment's network, an init as PID 1.
    pub(super) async fn create(
        &self,
        app: &ApplicationSpec,
        image: &str,
        secrets: Option<&Path>,
        verified: Option<&image_trust::Verified>,
    ) -> Result<(), Failure> {
        // The environment's volumes, ours or refused, before anything is made.
        let mounts = self.ensure_volumes(app).await?;
        let host = HostConfig {
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                "rw,noexec,nosuid,nodev,size=64m".to_owned(),
            )])),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            nano_cpus: Some(i64::try_from(app.cpu_millis.saturating_mul(1_000_000)).unwrap_or(i64::MAX)),
            memory: Some(i64::try_from(app.memory_bytes).unwrap_or(i64::MAX)),
            memory_swap: Some(i64::try_from(app.memory_bytes).unwrap_or(i64::MAX)),
            pids_limit: Some(i64::from(app.pids)),
            network_mode: Some(app.network.network.clone()),
            // Service names: Docker's resolver in the container forwards what it does not know
            // to the agent's name server on the network's gateway (`names/mod.rs`); a short name
            // is also tried as `<name>.<environment>.internal`.
            dns: crate::names::gateway(&app.network.subnet).map(|g| vec![g.to_string()]),
            dns_search: Some(vec![format!("{}.{}", app.environment, crate::names::DOMAIN)]),
            init: Some(true),
            binds: secrets.map(|d| vec![format!("{}:/run/secrets:ro", d.display())]),
            mounts: (!mounts.is_empty()).then_some(mounts),
            // Output is bounded on disk whatever the engine's default driver: a container that
            // writes without end could otherwise fill the disk under every environment and the
            // ledger (24 MiB of stdout grew the host's log by 25.6 MiB in the review).
            log_config: Some(HostConfigLogConfig {
                typ: Some("json-file".to_owned()),
                config: Some(HashMap::from([
                    ("max-size".to_owned(), app.log_max_bytes.max(1 << 20).to_string()),
                    ("max-file".to_owned(), app.log_max_files.clamp(1, 10).to_string()),
                ])),
            }),
            ..HostConfig::default()
        };
        let body = ContainerCreateBody {
            // The engine's own reference (for an image of the control plane's store, the one
            // pulled through the agent); the label keeps the one Git names.
            image: Some(image.to_owned()),
            cmd: (!app.command.is_empty()).then(|| app.command.clone()),
            env: Some(app.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(with_signer(self.labels(app), verified)),
            host_config: Some(host),
            stop_timeout: Some(10),
            ..ContainerCreateBody::default()
        };
        self.docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&app.container).build()),
                body,
            )
            .await
            .map_err(|e| docker("container-create-failed", e))?;
        Ok(())
    }

    /// One replica at its generation, healthy. See the module's rules for adopting, repairing
    /// and refusing.
    pub async fn ensure_application(&self, app: &ApplicationSpec) -> Result<String, Failure> {
        let verified = super::image::check_image(app)?;
        let instance = app.instance.map(|i| i.to_string()).unwrap_or_default();
        // A newer generation of this replica already runs: this task is stale.
        for (name, labels, _) in self
            .ours(&[
                (ENVIRONMENT, &app.environment),
                (ROLE, &app.role),
                (INSTANCE, &instance),
            ])
            .await?
        {
            let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            if g > app.generation {
                return Err(permanent(
                    "stale-generation",
                    format!("{name} runs generation {g}, newer than {}", app.generation),
                ));
            }
        }
        // A rollback's replica: the previous release's container, kept paused, stands in.
        if let Some(from) = &app.resume
            && let Some(note) = self.resume(app, from).await?
        {
            return Ok(note);
        }
        let existing = match self.docker.inspect_container(&app.container, None).await {
            Ok(c) => Some(c),
            Err(e) if not_found(&e) => None,
            Err(e) => return Err(docker("docker-unavailable", e)),
        };
        let mut note = "created";
        if let Some(c) = existing {
            let labels = c.config.as_ref().and_then(|c| c.labels.clone());
            if !same_identity(labels.as_ref(), &self.control_plane, &self.node, app) {
                return Err(foreign_container(app));
            }
            let hash = labels
                .as_ref()
                .and_then(|l| l.get(SPEC_HASH))
                .cloned()
                .unwrap_or_default();
            let running = c.state.and_then(|s| s.running).unwrap_or(false);
            if hash == app.spec_hash && running {
                note = "adopted";
            } else {
                // A stopped one is made again rather than started: see `recreate`.
                self.remove(&app.container).await?;
                if hash == app.spec_hash {
                    note = "restarted";
                }
            }
        }
        if note != "adopted" {
            let image = self.ensure_image(&app.image).await?;
            let secrets = self.write_secrets(app)?;
            self.create(app, &image, secrets.as_deref(), verified.as_ref()).await?;
        }
        if note != "adopted" {
            // One writer: a role with volumes is restarted in place, so its older generation
            // stops before this one starts (a stateless replica overlaps instead).
            if !app.volumes.is_empty()
                && let Some(instance) = app.instance
            {
                self.stop_older(&app.environment, &app.role, instance, app.generation, false)
                    .await?;
            }
            self.docker
                .start_container(&app.container, None)
                .await
                .map_err(|e| docker("container-start-failed", e))?;
        }
        if let Err(f) = self.healthy(app).await {
            // A replica that never became healthy goes (its log tail is in the result), so it
            // is neither left half-started nor restarted as drift; the generation before it
            // keeps serving.
            if f.outcome == agent_proto::Outcome::Permanent {
                self.remove(&app.container).await?;
            }
            return Err(f);
        }
        // A restored dump waiting for this generation is loaded now (the container is up).
        let loaded = self.load_dumps(app).await?;
        if !loaded.is_empty() {
            return Ok(format!(
                "{} {note}, healthy, the restored dump of {} loaded",
                app.container,
                loaded.join(", ")
            ));
        }
        Ok(format!("{} {note}, healthy", app.container))
    }

    /// Drift: the newest generation of each replica of ours should run. One found stopped
    /// (by hand, or its process died) is started again; returns (environment, what) for each.
    pub async fn repair_containers(&self) -> Result<Vec<(String, String)>, Failure> {
        let mut newest: HashMap<(String, String, String), (u64, String, bool)> = HashMap::new();
        for (name, labels, running) in self.ours(&[]).await? {
            let (Some(env), Some(role), Some(instance)) =
                (labels.get(ENVIRONMENT), labels.get(ROLE), labels.get(INSTANCE))
            else {
                continue; // runs have no instance: they are not kept running
            };
            let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            let key = (env.clone(), role.clone(), instance.clone());
            if newest.get(&key).is_none_or(|(n, _, _)| g > *n) {
                newest.insert(key, (g, name, running));
            }
        }
        let mut out = Vec::new();
        for ((env, _, _), (_, name, running)) in newest {
            if running {
                continue;
            }
            match self.recreate(&name).await {
                Ok(true) => out.push((env, format!("container {name} was stopped: started again"))),
                Ok(false) => {}
                Err(e) => tracing::warn!(container = %name, error = %e.detail, "cannot start a drifted container"),
            }
        }
        Ok(out)
    }

    /// Drift: removes the containers of this control plane and node that are no replica (runs
    /// of release and cron roles, drills) once they have ended (or were made and never
    /// started) and stayed so for the run sweep's grace, as this process saw them. A run is
    /// removed by its job on every way out; this is for a job that never came back (its agent
    /// died mid-run and a newer release cancelled it). Running ones, replicas and anything
    /// without our labels are never touched. Returns the names removed.
    pub async fn sweep_runs(&self) -> Result<Vec<String>, Failure> {
        use bollard::models::ContainerStateStatusEnum as Status;
        let mut finished = Vec::new();
        for (name, labels, running) in self.ours(&[]).await? {
            if running || labels.contains_key(INSTANCE) {
                continue;
            }
            let status = match self.docker.inspect_container(&name, None).await {
                Ok(c) => c.state.and_then(|s| s.status),
                Err(e) if not_found(&e) => continue,
                Err(e) => return Err(docker("docker-unavailable", e)),
            };
            if matches!(status, Some(Status::EXITED | Status::DEAD | Status::CREATED)) {
                finished.push(name);
            }
        }
        let due: Vec<String> = {
            let mut seen = self
                .runs_unclaimed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            seen.retain(|name, _| finished.contains(name));
            let now = Instant::now();
            finished
                .iter()
                .filter(|name| now.duration_since(*seen.entry((*name).clone()).or_insert(now)) >= self.run_sweep_grace)
                .cloned()
                .collect()
        };
        let mut removed = Vec::new();
        for name in due {
            self.remove(&name).await?;
            self.runs_unclaimed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&name);
            removed.push(name);
        }
        Ok(removed)
    }

    /// Starts a stopped container of ours again as a new container with the same
    /// configuration, name, mounts and volumes. Not `docker start`: Docker (20.10) mounts a
    /// restarted container's `/tmp` tmpfs with the mode of the mount point it made in the
    /// container's layer at the first start (0755, root's), so a non-root process (PostgreSQL,
    /// say) could no longer write its socket or lock files after a crash. Only a container
    /// that ran and ended (exited, dead) is made again: one just created (an ensure is about
    /// to start it) or paused (a backup reads its volume) is left alone. Whether it was.
    pub(super) async fn recreate(&self, name: &str) -> Result<bool, Failure> {
        use bollard::models::ContainerStateStatusEnum as Status;
        let c = self
            .docker
            .inspect_container(name, None)
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        let status = c.state.as_ref().and_then(|s| s.status);
        if !matches!(status, Some(Status::EXITED | Status::DEAD)) {
            return Ok(false);
        }
        let config = c.config.unwrap_or_default();
        let body = ContainerCreateBody {
            image: config.image,
            cmd: config.cmd,
            entrypoint: config.entrypoint,
            env: config.env,
            labels: config.labels,
            user: config.user,
            working_dir: config.working_dir,
            host_config: c.host_config,
            stop_timeout: config.stop_timeout,
            ..ContainerCreateBody::default()
        };
        self.remove_keeping_secrets(name).await?;
        self.docker
            .create_container(Some(CreateContainerOptionsBuilder::default().name(name).build()), body)
            .await
            .map_err(|e| docker("container-create-failed", e))?;
        self.docker
            .start_container(name, None)
            .await
            .map_err(|e| docker("container-start-failed", e))?;
        Ok(true)
    }

    /// Waits [`WORKER_SETTLE`], or, for a worker, less once each of its declared ports accepts
    /// a TCP connection at the container's address (every 100 ms, each try bounded).
    async fn settled(&self, app: &ApplicationSpec) {
        let until = Instant::now() + WORKER_SETTLE;
        // Workers only: a service (a database) may accept connections before it can answer
        // (PostgreSQL recovering its WAL does), so it keeps the whole settle.
        if app.ports.is_empty() || app.role_kind != "worker" {
            tokio::time::sleep(WORKER_SETTLE).await;
            return;
        }
        while Instant::now() < until {
            if let Some(ip) = self.address(&app.container, &app.network.network).await {
                let mut all = true;
                for port in &app.ports {
                    let open = tokio::time::timeout(
                        Duration::from_millis(200),
                        tokio::net::TcpStream::connect((ip.as_str(), *port)),
                    )
                    .await
                    .is_ok_and(|c| c.is_ok());
                    if !open {
                        all = false;
                        break;
                    }
                }
                if all {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100).min(until.saturating_duration_since(Instant::now()))).await;
        }
    }

    /// Web roles: an HTTP probe of the health path until it answers 2xx, within the role's
    /// deadline. Others: still running after [`WORKER_SETTLE`]. A missed deadline is permanent,
    /// with the last probe outcomes and the log tail.
    pub(super) async fn healthy(&self, app: &ApplicationSpec) -> Result<(), Failure> {
        let exited = |detail: String| permanent("exited", detail);
        let Some(health) = &app.health else {
            // Running for WORKER_SETTLE, or, for a worker, sooner once every port it declares
            // accepts a connection: it is named as soon as it listens.
            self.settled(app).await;
            return match self.running(&app.container).await? {
                (true, _) => Ok(()),
                (false, code) => Err(exited(format!(
                    "exit code {code}\n{}",
                    self.log_tail(&app.container).await
                ))),
            };
        };
        let deadline = Instant::now() + Duration::from_secs(u64::from(health.timeout_seconds.max(1)));
        let mut probes: Vec<String> = Vec::new();
        loop {
            match self.running(&app.container).await? {
                (true, _) => {}
                (false, code) => {
                    return Err(exited(format!(
                        "exit code {code} before it was healthy\n{}",
                        self.log_tail(&app.container).await
                    )));
                }
            }
            let outcome = match self.address(&app.container, &app.network.network).await {
                None => "no address yet".to_owned(),
                Some(ip) => probe(&ip, app.port.unwrap_or(80), &health.path).await,
            };
            if outcome.starts_with('2') {
                return Ok(());
            }
            probes.push(outcome);
            if probes.len() > 5 {
                probes.remove(0);
            }
            if Instant::now() >= deadline {
                return Err(permanent(
                    "health-deadline",
                    format!(
                        "not healthy within {} s; last probes: {}\n{}",
                        health.timeout_seconds,
                        probes.join("; "),
                        self.log_tail(&app.container).await
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the container runs, and its exit code when it does not.
    pub(super) async fn running(&self, container: &str) -> Result<(bool, i64), Failure> {
        let c = self
            .docker
            .inspect_container(container, None)
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        let s = c.state.unwrap_or_default();
        Ok((s.running.unwrap_or(false), s.exit_code.unwrap_or(0)))
    }

    /// Removes a container of ours (and its secret files); gone already is fine.
    pub(super) async fn remove(&self, container: &str) -> Result<(), Failure> {
        self.remove_keeping_secrets(container).await?;
        self.forget_resumed(container);
        let dir = self.secrets_dir.join(container);
        if dir.starts_with(&self.secrets_dir) && dir != self.secrets_dir {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    }

    /// Removes a container of ours, its secret files kept (for its successor of the same name).
    async fn remove_keeping_secrets(&self, container: &str) -> Result<(), Failure> {
        match self
            .docker
            .remove_container(
                container,
                Some(RemoveContainerOptionsBuilder::default().force(true).build()),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(docker("container-remove-failed", e)),
        }
        Ok(())
    }

    /// A run of a job or release role: the same hardened container, bounded in time, removed
    /// on every way out. Exit 0 succeeds; another exit code is permanent, with the log tail. A
    /// run found finished (a replay after a crash) is judged by its exit code.
    pub async fn run_once(&self, app: &ApplicationSpec, timeout: Duration) -> Result<String, Failure> {
        let verified = super::image::check_image(app)?;
        let existing = match self.docker.inspect_container(&app.container, None).await {
            Ok(c) => Some(c),
            Err(e) if not_found(&e) => None,
            Err(e) => return Err(docker("docker-unavailable", e)),
        };
        match existing {
            Some(c)
                if !same_identity(
                    c.config.as_ref().and_then(|c| c.labels.as_ref()),
                    &self.control_plane,
                    &self.node,
                    app,
                ) =>
            {
                return Err(foreign_container(app));
            }
            Some(_) => {}
            None => {
                let image = self.ensure_image(&app.image).await?;
                let secrets = self.write_secrets(app)?;
                self.create(app, &image, secrets.as_deref(), verified.as_ref()).await?;
                if let Err(e) = self.docker.start_container(&app.container, None).await {
                    self.remove(&app.container).await?;
                    return Err(docker("container-start-failed", e));
                }
            }
        }
        let started = Instant::now();
        let code = loop {
            match self.running(&app.container).await {
                Ok((false, code)) => break code,
                Ok((true, _)) if started.elapsed() < timeout => tokio::time::sleep(Duration::from_millis(200)).await,
                Ok((true, _)) => {
                    let tail = self.log_tail(&app.container).await;
                    self.remove(&app.container).await?;
                    return Err(permanent(
                        "run-timeout",
                        format!("still running after {} s\n{tail}", timeout.as_secs()),
                    ));
                }
                Err(f) => return Err(f),
            }
        };
        let tail = self.log_tail(&app.container).await;
        self.remove(&app.container).await?;
        if code == 0 {
            Ok(format!("exit code 0\n{tail}"))
        } else {
            Err(permanent("exit-code", format!("exit code {code}\n{tail}")))
        }
    }
}
