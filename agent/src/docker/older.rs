//! The older generation's replicas of a switch: which are ending, which still serve, stopped
//! once the new ones are up (after the drain), and a whole environment's teardown.

use super::*;

impl Engine {
    /// Stops the replica's containers of generations older than `generation` (the new one is
    /// healthy by now); those two or more generations back are removed.
    /// The containers of `environment`'s replica `role`/`instance` that a stop
    /// (`older_only`: of generations before `generation`) or a teardown (up to `generation`)
    /// would end.
    pub async fn ending(
        &self,
        environment: &str,
        role: &str,
        instance: u32,
        generation: u64,
        older_only: bool,
    ) -> Result<Vec<String>, Failure> {
        let instance = instance.to_string();
        Ok(self
            .ours(&[(ENVIRONMENT, environment), (ROLE, role), (INSTANCE, &instance)])
            .await?
            .into_iter()
            .filter(|(_, labels, _)| {
                let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
                if older_only { g < generation } else { g <= generation }
            })
            .map(|(name, _, _)| name)
            .collect())
    }

    /// The running container of the newest generation before `generation` of a replica: what
    /// serves it until a rolling rollout replaces it. `None` when none runs (stopped, paused
    /// or gone: nothing to route to).
    pub async fn older_serving(
        &self,
        environment: &str,
        role: &str,
        instance: u32,
        generation: u64,
    ) -> Result<Option<String>, Failure> {
        let instance = instance.to_string();
        Ok(self
            .ours(&[(ENVIRONMENT, environment), (ROLE, role), (INSTANCE, &instance)])
            .await?
            .into_iter()
            .filter(|(_, _, running)| *running)
            .filter_map(|(name, labels, _)| {
                let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok())?;
                (g < generation).then_some((g, name))
            })
            .max()
            .map(|(_, name)| name))
    }

    /// With `keep` (a rollout's cleanup), the generation just before `generation` is kept for
    /// a rollback: its running web replicas are paused for the rollback window, not stopped.
    pub async fn stop_older(
        &self,
        environment: &str,
        role: &str,
        instance: u32,
        generation: u64,
        keep: bool,
    ) -> Result<String, Failure> {
        let instance = instance.to_string();
        let mut done = Vec::new();
        for (name, labels, running) in self
            .ours(&[(ENVIRONMENT, environment), (ROLE, role), (INSTANCE, &instance)])
            .await?
        {
            let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            if g >= generation {
                continue;
            }
            if g + 1 < generation {
                self.remove(&name).await?;
                done.push(format!("{name} removed"));
            } else if running && keep && self.keep_paused(&name, &labels).await? {
                done.push(format!("{name} paused for a rollback"));
            } else if running {
                match self
                    .docker
                    .stop_container(&name, Some(StopContainerOptionsBuilder::default().t(10).build()))
                    .await
                {
                    Ok(()) => done.push(format!("{name} stopped")),
                    Err(e) if not_found(&e) => {}
                    Err(DockerError::DockerResponseServerError { status_code: 304, .. }) => {}
                    Err(e) => return Err(docker("container-stop-failed", e)),
                }
            }
        }
        Ok(if done.is_empty() {
            "nothing older runs".into()
        } else {
            done.join(", ")
        })
    }

    /// Removes every container of the replica, of any generation up to `generation`.
    pub async fn teardown(
        &self,
        environment: &str,
        role: &str,
        instance: u32,
        generation: u64,
    ) -> Result<String, Failure> {
        let instance = instance.to_string();
        let mut n = 0;
        for (name, labels, _) in self
            .ours(&[(ENVIRONMENT, environment), (ROLE, role), (INSTANCE, &instance)])
            .await?
        {
            let g: u64 = labels.get(GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
            if g <= generation {
                self.remove(&name).await?;
                n += 1;
            }
        }
        Ok(format!("{n} containers removed"))
    }
}
