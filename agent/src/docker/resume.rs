//! Rollbacks without starting anything: after a switch the previous generation's web replicas
//! are paused (frozen, not stopped) for the rollback window, and a rollback's replica resumes
//! one (`ApplicationSpec::resume`) instead of making a container: thawed, probed healthy, and
//! serving as the rollback's generation. A container's labels cannot change, so which
//! generation a resumed container serves is kept beside the `pulled` file (`resumed`, JSON:
//! its name → the generation and the name it serves as) and read through [`Engine::ours`]:
//! heartbeats, stops, teardowns and drift repair all see the generation it serves. Ownership
//! stays the labels' alone. Past the window a paused one is stopped, as before the window
//! existed (a rollback then starts it again: seconds, not milliseconds).

use super::*;
use serde::{Deserialize, Serialize};

/// A container serving as another generation's replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resumed {
    pub generation: u64,
    /// The container name of that generation's replica, which the control plane names.
    pub serves_as: String,
}

/// How long the previous generation's web replicas stay paused after a switch, by default.
pub const ROLLBACK_WINDOW: Duration = Duration::from_secs(900);

impl Engine {
    fn resumed_file(&self) -> PathBuf {
        self.pulled.with_file_name("resumed")
    }

    /// What is resumed as what (read once from its file, then kept in memory).
    pub(super) fn resumed(&self) -> HashMap<String, Resumed> {
        let mut held = self.resumed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.is_none() {
            let map = std::fs::read_to_string(self.resumed_file())
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            *held = Some(map);
        }
        held.clone().unwrap_or_default()
    }

    /// Changes the map and writes it (a temporary file renamed over the old one).
    fn edit_resumed(&self, change: impl FnOnce(&mut HashMap<String, Resumed>)) -> Result<(), Failure> {
        let mut map = self.resumed();
        let before = map.clone();
        change(&mut map);
        if map == before {
            return Ok(());
        }
        let file = self.resumed_file();
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| retryable("state-write-failed", e.to_string()))?;
        }
        let tmp = file.with_extension("new");
        let text = serde_json::to_string(&map).map_err(|e| retryable("state-write-failed", e.to_string()))?;
        std::fs::write(&tmp, text).map_err(|e| retryable("state-write-failed", e.to_string()))?;
        std::fs::rename(&tmp, &file).map_err(|e| retryable("state-write-failed", e.to_string()))?;
        if let Ok(mut held) = self.resumed.lock() {
            *held = Some(map);
        }
        Ok(())
    }

    /// Forgets a removed container.
    pub(super) fn forget_resumed(&self, container: &str) {
        let _ = self.edit_resumed(|m| {
            m.remove(container);
        });
    }

    /// The container that serves as `name`: a resumed one, or `name` itself.
    pub fn serving(&self, name: &str) -> String {
        self.resumed()
            .into_iter()
            .find(|(_, r)| r.serves_as == name)
            .map_or_else(|| name.to_owned(), |(actual, _)| actual)
    }

    /// Resumes `from` as `app`'s replica when it is this replica's container with the same
    /// spec (paused: thawed; stopped: made again under its own name; running: as is) and
    /// healthy. `Ok(None)` when it cannot stand in (gone, another replica's or spec's, or the
    /// replica's own container exists already): the caller makes the replica as usual.
    pub(super) async fn resume(&self, app: &ApplicationSpec, from: &str) -> Result<Option<String>, Failure> {
        use bollard::models::ContainerStateStatusEnum as Status;
        let from = self.serving(from);
        if from == app.container {
            return Ok(None);
        }
        match self.docker.inspect_container(&app.container, None).await {
            Ok(_) => return Ok(None),
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(docker("docker-unavailable", e)),
        }
        let c = match self.docker.inspect_container(&from, None).await {
            Ok(c) => c,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(docker("docker-unavailable", e)),
        };
        let labels = c.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
        let is = |k: &str, v: &str| labels.get(k).is_some_and(|x| x == v);
        let instance = app.instance.map(|i| i.to_string()).unwrap_or_default();
        if !(mine(Some(&labels), &self.control_plane, &self.node)
            && is(ENVIRONMENT, &app.environment)
            && is(ROLE, &app.role)
            && is(INSTANCE, &instance)
            && is(SPEC_HASH, &app.spec_hash))
        {
            return Ok(None);
        }
        let how = match c.state.and_then(|s| s.status) {
            Some(Status::PAUSED) => {
                self.docker
                    .unpause_container(&from)
                    .await
                    .map_err(|e| docker("container-start-failed", e))?;
                "thawed"
            }
            Some(Status::RUNNING) => "running",
            Some(Status::CREATED) => {
                self.docker
                    .start_container(&from, None)
                    .await
                    .map_err(|e| docker("container-start-failed", e))?;
                "started"
            }
            _ => {
                self.recreate(&from).await?;
                "started again"
            }
        };
        if let Ok(mut p) = self.paused_at.lock() {
            p.remove(&from);
        }
        let serves = Resumed {
            generation: app.generation,
            serves_as: app.container.clone(),
        };
        self.edit_resumed(|m| {
            m.insert(from.clone(), serves);
        })?;
        let mut probe = app.clone();
        probe.container = from.clone();
        if let Err(f) = self.healthy(&probe).await {
            // It does not serve: it goes back to what it was (stopped), and the rollout fails
            // with the reason while the current generation keeps serving.
            self.forget_resumed(&from);
            let _ = self
                .docker
                .stop_container(&from, Some(StopContainerOptionsBuilder::default().t(10).build()))
                .await;
            return Err(f);
        }
        Ok(Some(format!("{from} {how} as {}, healthy", app.container)))
    }

    /// Keeps a previous generation's running web replica for a rollback: paused for the
    /// window. Whether it was paused (otherwise the caller stops it).
    pub(super) async fn keep_paused(&self, name: &str, labels: &HashMap<String, String>) -> Result<bool, Failure> {
        if self.rollback_window.is_zero() || !labels.contains_key(HEALTH) {
            return Ok(false);
        }
        match self.docker.pause_container(name).await {
            Ok(()) => {
                if let Ok(mut p) = self.paused_at.lock() {
                    p.insert(name.to_owned(), Instant::now());
                }
                Ok(true)
            }
            Err(e) if not_found(&e) => Ok(false),
            // Already paused, or the engine cannot freeze it: stopped instead.
            Err(_) => Ok(false),
        }
    }

    /// Stops the previous generations' replicas paused longer than the window (one whose
    /// pause this agent did not see, after a restart, gets a window from now). The newest
    /// generation of a replica is never touched (a backup pauses it). Returns what it stopped.
    pub async fn expire_paused(&self) -> Result<Vec<String>, Failure> {
        let mut newest: HashMap<(String, String, String), u64> = HashMap::new();
        let all = self.ours(&[]).await?;
        for (_, labels, _) in &all {
            let (Some(env), Some(role), Some(instance)) =
                (labels.get(ENVIRONMENT), labels.get(ROLE), labels.get(INSTANCE))
            else {
                continue;
            };
            let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            let n = newest.entry((env.clone(), role.clone(), instance.clone())).or_default();
            *n = (*n).max(g);
        }
        let mut filters = self.our_filter(&[]);
        filters.insert("status".to_owned(), vec!["paused".to_owned()]);
        let paused = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        let mut stopped = Vec::new();
        for c in paused {
            let name = c.names.and_then(|n| n.into_iter().next()).unwrap_or_default();
            let name = name.trim_start_matches('/').to_owned();
            let labels = c.labels.unwrap_or_default();
            let (Some(env), Some(role), Some(instance)) =
                (labels.get(ENVIRONMENT), labels.get(ROLE), labels.get(INSTANCE))
            else {
                continue;
            };
            let g = self.resumed().get(&name).map_or_else(
                || labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0),
                |r| r.generation,
            );
            if newest
                .get(&(env.clone(), role.clone(), instance.clone()))
                .is_none_or(|n| g >= *n)
            {
                continue;
            }
            let since = match self.paused_at.lock() {
                Ok(mut p) => *p.entry(name.clone()).or_insert_with(Instant::now),
                Err(_) => continue,
            };
            if since.elapsed() < self.rollback_window {
                continue;
            }
            let _ = self.docker.unpause_container(&name).await;
            match self
                .docker
                .stop_container(&name, Some(StopContainerOptionsBuilder::default().t(10).build()))
                .await
            {
                Ok(()) => stopped.push(name.clone()),
                Err(e) if not_found(&e) => {}
                Err(DockerError::DockerResponseServerError { status_code: 304, .. }) => {}
                Err(e) => return Err(docker("container-stop-failed", e)),
            }
            if let Ok(mut p) = self.paused_at.lock() {
                p.remove(&name);
            }
        }
        Ok(stopped)
    }
}
