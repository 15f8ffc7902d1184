//! The execution specs of a volume's backup and of its restore drill: the repository, the
//! sealed password and the plan, from the generation's own spec; a move's two halves.

use super::*;

impl Ledger {
    /// How `volume` of the environment is backed up, and where to: its plan and mount from the
    /// current spec, the repository's Secret sealed to the node.
    pub(super) async fn backup_execution(
        &self,
        node: &str,
        recipient: Option<&str>,
        (generation, spec): (u64, &DeploymentSpec),
        (volume, into, moving): (&str, Option<u64>, Option<MoveStep>),
        control: &[Box<dyn Identity + Send + Sync>],
        now_ms: i64,
    ) -> Result<Result<Execution, Undeliverable>, LedgerError> {
        let environment = spec.environment.to_string();
        let found = spec.roles.iter().find_map(|(role, r)| {
            let v = r.volumes.iter().find(|v| v.name == volume)?;
            Some((role, v, v.backup.as_ref()?))
        });
        let (Some((role, v, plan)), Some(repo)) = (found, &spec.backups) else {
            return Ok(Err(undeliverable(
                "no-backup-plan",
                format!("generation {generation} of {environment} backs up no volume {volume}"),
            )));
        };
        let Some(recipient) = recipient else {
            return Ok(Err(undeliverable("node-not-enrolled", "the node has no age recipient")));
        };
        let mut values = Vec::with_capacity(repo.values.len());
        for (key, ciphertext) in &repo.values {
            match self.sealed_for(node, recipient, ciphertext, control, now_ms).await? {
                Ok(sealed) => values.push(SealedSecret {
                    key: key.clone(),
                    sealed,
                }),
                Err(e) => return Ok(Err(e)),
            }
        }
        // A replica's container when the role runs one (one writer: instance 0).
        let runs = spec.instances.iter().any(|i| i.role == *role);
        let cp = self.control_plane().await?;
        Ok(Ok(Execution::Backup(Box::new(agent_proto::BackupSpec {
            container: runs.then(|| container_name(&cp, &environment, role.as_str(), Some(0), generation)),
            environment,
            mount: agent_proto::VolumeMount {
                volume: v.name.clone(),
                // What the running generation mounts, or the restore's new one.
                generation: into.unwrap_or(v.generation),
                path: v.path.clone(),
                load: None,
            },
            // A move carries the volume's files (its role is stopped: nothing writes them),
            // whatever the backup's command saves on schedule.
            command: if moving.is_some() { None } else { plan.command.clone() },
            // Whether or not this generation still places it (one that started during the
            // move does not): the replica must not write while its files are saved.
            stop_role: (moving == Some(MoveStep::Out)).then(|| role.to_string()),
            keep: plan.keep,
            repository: repo.repository.clone(),
            secret: repo.secret.to_string(),
            values,
        }))))
    }

    /// A restore drill of `volume`: its backup's repository and Secret, and a run of its role
    /// (image, resources, secrets) with the backup's `verify.command`, no network, and the
    /// scratch copy mounted where the volume is.
    pub(super) async fn drill_execution(
        &self,
        node: &str,
        recipient: Option<&str>,
        (generation, spec): (u64, &DeploymentSpec),
        volume: &str,
        control: &[Box<dyn Identity + Send + Sync>],
        now_ms: i64,
    ) -> Result<Result<Execution, Undeliverable>, LedgerError> {
        let found = spec.roles.iter().find_map(|(role, r)| {
            let v = r.volumes.iter().find(|v| v.name == volume)?;
            Some((role, v.backup.as_ref()?.verify.as_ref()?))
        });
        let Some((role, verify)) = found else {
            return Ok(Err(undeliverable(
                "no-verify-plan",
                format!(
                    "generation {generation} of {} verifies no backup of {volume}",
                    spec.environment
                ),
            )));
        };
        let backup = match self
            .backup_execution(
                node,
                recipient,
                (generation, spec),
                (volume, None, None),
                control,
                now_ms,
            )
            .await?
        {
            Ok(Execution::Backup(b)) => *b,
            Ok(_) => return Ok(Err(undeliverable("no-backup-plan", "not a backup"))),
            Err(e) => return Ok(Err(e)),
        };
        let network = NetworkSpec {
            environment: spec.environment.to_string(),
            network: agent_proto::DRILL_NETWORK.to_owned(),
            subnet: String::new(),
        };
        let mut run = match self
            .application(
                node,
                recipient,
                Ok(spec),
                Ok(network),
                (role.as_str(), None, generation, ""),
                control,
                now_ms,
            )
            .await?
        {
            Ok(Execution::Application(a)) => *a,
            Ok(_) => return Ok(Err(undeliverable("no-role-spec", "not an application"))),
            Err(e) => return Ok(Err(e)),
        };
        run.container = agent_proto::drill_container_name(&self.control_plane().await?, &backup.environment, volume);
        run.command = verify.command.clone();
        run.health = None;
        run.port = None;
        run.ports = Vec::new();
        run.volumes = vec![agent_proto::VolumeMount {
            generation: agent_proto::DRILL_GENERATION,
            ..backup.mount.clone()
        }];
        Ok(Ok(Execution::Drill(Box::new(agent_proto::DrillSpec { backup, run }))))
    }
}
