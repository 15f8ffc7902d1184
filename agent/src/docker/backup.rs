//! A volume saved to and restored from a restic repository (`crate::restic`). Consistent either
//! way: with a command (`pg_dump`, say), what the command prints inside the running container
//! is saved, and a command that fails leaves no snapshot; without one, the volume's files are
//! saved with its container paused (frozen by the cgroup freezer: no write lands mid-copy,
//! connections wait rather than fail) and always unpaused after. A restore goes into a new,
//! empty volume generation; the volume it came from is never written.

use super::*;
use crate::restic::{Repository, Restic, Summary};
use agent_proto::VolumeMount;
use bollard::exec::{CreateExecOptions, StartExecResults};
use tokio::io::AsyncWriteExt;

/// What a backup's command may write to its standard error, kept for the failure's detail.
const COMMAND_STDERR_BYTES: usize = 8 * 1024;

/// What to save, and how to keep it consistent.
pub struct BackupOf<'a> {
    pub environment: &'a str,
    pub mount: &'a VolumeMount,
    /// The container that mounts it, if one runs: paused for a file backup, the command's host.
    pub container: Option<&'a str>,
    /// Run in `container`; its standard output is the backup.
    pub command: Option<&'a [String]>,
    /// Tags on the snapshot (the environment's and volume's, for listing and retention).
    pub tags: &'a [String],
}

impl Engine {
    /// Where an owned volume's files are on this host; `foreign-volume` if it is not ours.
    async fn volume_dir(&self, environment: &str, m: &VolumeMount) -> Result<PathBuf, Failure> {
        let name = self.volume_name(environment, m);
        let v = match self.docker.inspect_volume(&name).await {
            Ok(v) => v,
            Err(e) if not_found(&e) => {
                return Err(permanent(
                    "volume-missing",
                    format!("{name} does not exist on this node"),
                ));
            }
            Err(e) => return Err(docker("docker-unavailable", e)),
        };
        if !self.owns_volume(&v, environment, m) {
            return Err(permanent(
                "foreign-volume",
                format!("{name} is not ours: left untouched"),
            ));
        }
        Ok(PathBuf::from(v.mountpoint))
    }

    /// Saves a volume into `repo` as one snapshot.
    pub async fn backup_volume(
        &self,
        restic: &Restic,
        repo: &Repository,
        of: &BackupOf<'_>,
    ) -> Result<Summary, Failure> {
        let dir = self.volume_dir(of.environment, of.mount).await?;
        restic.ensure_repository(repo).await?;
        match (of.command, of.container) {
            (Some(cmd), Some(container)) => self.backup_command(restic, repo, of, container, cmd).await,
            (Some(_), None) => Err(retryable(
                "backup-container-not-running",
                "the backup's command runs in the role's container, and none runs",
            )),
            (None, container) => {
                let paused = match container {
                    Some(c) => match self.docker.pause_container(c).await {
                        Ok(()) => Some(c),
                        Err(e) => return Err(docker("container-pause-failed", e)),
                    },
                    None => None,
                };
                let saved = restic.backup_dir(repo, &dir, &self.node, of.tags).await;
                if let Some(c) = paused
                    && let Err(e) = self.docker.unpause_container(c).await
                {
                    // Left paused, the role stops answering: say so loudly, and retry.
                    return Err(docker("container-unpause-failed", e));
                }
                saved
            }
        }
    }

    async fn backup_command(
        &self,
        restic: &Restic,
        repo: &Repository,
        of: &BackupOf<'_>,
        container: &str,
        cmd: &[String],
    ) -> Result<Summary, Failure> {
        let exec = self
            .docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(cmd.to_vec()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..CreateExecOptions::default()
                },
            )
            .await
            .map_err(|e| docker("backup-command-failed", e))?;
        let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| docker("backup-command-failed", e))?
        else {
            return Err(permanent(
                "backup-command-failed",
                "the command's output was not attached",
            ));
        };
        // The command's standard output flows into restic through a pipe; its standard error
        // is kept (bounded) for a failure's detail.
        let (mut writer, mut reader) = tokio::io::duplex(256 * 1024);
        let pump = async move {
            let mut stderr = Vec::new();
            while let Some(frame) = output.next().await {
                match frame {
                    Ok(bollard::container::LogOutput::StdOut { message }) => {
                        if writer.write_all(&message).await.is_err() {
                            break;
                        }
                    }
                    Ok(bollard::container::LogOutput::StdErr { message }) => {
                        let room = COMMAND_STDERR_BYTES.saturating_sub(stderr.len());
                        stderr.extend_from_slice(&message[..message.len().min(room)]);
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            let _ = writer.shutdown().await;
            stderr
        };
        let filename = format!("{}.dump", of.mount.volume);
        let (saved, stderr) = tokio::join!(
            restic.backup_stream(repo, &mut reader, &filename, &self.node, of.tags),
            pump
        );
        let code = self
            .docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| docker("docker-unavailable", e))?
            .exit_code
            .unwrap_or(-1);
        match (saved, code) {
            (Ok(summary), 0) => Ok(summary),
            (saved, code) => {
                // A half dump is not a backup: the snapshot it made goes.
                if let Ok(s) = &saved {
                    restic.forget_one(repo, &s.snapshot_id).await?;
                }
                let err = String::from_utf8_lossy(&stderr).trim().to_owned();
                match saved {
                    Err(f) if code == 0 => Err(f),
                    _ => Err(permanent(
                        "backup-command-failed",
                        format!("the backup command exited with {code}: {err}"),
                    )),
                }
            }
        }
    }

    /// Restores snapshot `snapshot` into `to` (a new generation of the volume, made here
    /// with our labels and empty: a restore never writes into data that exists).
    pub async fn restore_volume(
        &self,
        restic: &Restic,
        repo: &Repository,
        environment: &str,
        to: &VolumeMount,
        snapshot: &str,
    ) -> Result<String, Failure> {
        let name = self.volume_name(environment, to);
        let want = self.volume_labels(environment, to);
        match self.docker.inspect_volume(&name).await {
            Ok(_) => {
                return Err(permanent(
                    "volume-exists",
                    format!("{name} exists: a restore goes into a new volume generation only"),
                ));
            }
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(docker("docker-unavailable", e)),
        }
        self.docker
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(name.clone()),
                driver: Some("local".into()),
                labels: Some(want),
                ..Default::default()
            })
            .await
            .map_err(|e| docker("volume-create-failed", e))?;
        let dir = self.volume_dir(environment, to).await?;
        restic.restore(repo, snapshot, &dir).await?;
        Ok(format!("snapshot {snapshot} restored into {name}"))
    }
}
