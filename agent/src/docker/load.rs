//! Restored dumps. A volume backed up by a `command` (`pg_dump`) is restored as the command's
//! output, not as files: its new generation is made empty (the role's first start on it is a
//! first start, a database making a new cluster), the dump goes to the agent's `restores_dir`
//! (0600, outside every volume), and once the role's container runs on that generation the
//! backup's `restore` command runs in it with the dump on its standard input. The dump is
//! removed when the command exited 0; a failure leaves it for the next try (the command
//! should be safe to run twice: `pg_restore --clean --if-exists`).

use super::*;
use crate::restic::{Repository, Restic};
use agent_proto::VolumeMount;
use bollard::exec::{CreateExecOptions, StartExecResults};
use std::os::unix::fs::PermissionsExt;
use tokio::io::AsyncWriteExt;

/// The longest a restore command may run.
pub const LOAD_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// What a restore command's output keeps for a failure's detail.
const LOAD_OUTPUT_BYTES: usize = 8 * 1024;

impl Engine {
    fn dump_path(&self, environment: &str, m: &VolumeMount) -> PathBuf {
        self.restores_dir
            .join(format!("{}.dump", self.volume_name(environment, m)))
    }

    /// Restores a command's snapshot: `to` made empty (a restore never writes into data that
    /// exists), the dump kept in `restores_dir` for the role to load.
    pub(super) async fn restore_dump(
        &self,
        restic: &Restic,
        repo: &Repository,
        environment: &str,
        to: &VolumeMount,
        snapshot: &str,
    ) -> Result<String, Failure> {
        // Made first: what a failed try leaves, ours and unused, the next try removes.
        let name = self.new_generation(environment, to).await?;
        match self
            .restore_dump_into(restic, repo, environment, to, snapshot, &name)
            .await
        {
            Ok(done) => Ok(done),
            Err(f) => Err(self.discard_failed_restore(environment, to, &name, f).await),
        }
    }

    /// [`Engine::restore_dump`] once the new generation `name` is made.
    async fn restore_dump_into(
        &self,
        restic: &Restic,
        repo: &Repository,
        environment: &str,
        to: &VolumeMount,
        snapshot: &str,
        name: &str,
    ) -> Result<String, Failure> {
        let staging = self.restores_dir.join(format!("{name}.restoring"));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)
            .and_then(|()| std::fs::set_permissions(&self.restores_dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| permanent("restore-failed", format!("{}: {e}", staging.display())))?;
        restic.restore(repo, snapshot, &staging).await?;
        let file = staging.join(format!("{}.dump", to.volume));
        let dump = self.dump_path(environment, to);
        let moved = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&file, &dump));
        let _ = std::fs::remove_dir_all(&staging);
        moved.map_err(|e| {
            permanent(
                "restore-failed",
                format!("snapshot {snapshot} holds no {}.dump: {e}", to.volume),
            )
        })?;
        Ok(format!(
            "snapshot {snapshot}'s dump kept for the role to load into {name}, made empty"
        ))
    }

    /// After `app`'s container started: each of its volumes with a restored dump waiting has
    /// it loaded by the backup's `restore` command, in the container, from standard input.
    /// Returns what was loaded.
    pub(super) async fn load_dumps(&self, app: &ApplicationSpec) -> Result<Vec<String>, Failure> {
        let mut loaded = Vec::new();
        for m in &app.volumes {
            let Some(cmd) = &m.load else { continue };
            let dump = self.dump_path(&app.environment, m);
            let Ok(file) = tokio::fs::File::open(&dump).await else {
                continue;
            };
            self.load_dump(&app.container, cmd, file).await.map_err(|f| Failure {
                detail: format!("loading the restored dump of {}: {}", m.volume, f.detail),
                ..f
            })?;
            let _ = std::fs::remove_file(&dump);
            loaded.push(m.volume.clone());
        }
        Ok(loaded)
    }

    async fn load_dump(&self, container: &str, cmd: &[String], mut file: tokio::fs::File) -> Result<(), Failure> {
        let exec = self
            .docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(cmd.to_vec()),
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..CreateExecOptions::default()
                },
            )
            .await
            .map_err(|e| docker("restore-command-failed", e))?;
        let StartExecResults::Attached { mut output, mut input } = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| docker("restore-command-failed", e))?
        else {
            return Err(permanent(
                "restore-command-failed",
                "the command's input was not attached",
            ));
        };
        let feed = async move {
            let copied = tokio::io::copy(&mut file, &mut input).await;
            // End of input: the command sees its standard input close.
            let _ = input.shutdown().await;
            copied
        };
        let drain = async move {
            let mut kept = Vec::new();
            while let Some(frame) = output.next().await {
                let Ok(frame) = frame else { break };
                let bytes = frame.into_bytes();
                let room = LOAD_OUTPUT_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            kept
        };
        let (fed, said) = tokio::time::timeout(LOAD_TIMEOUT, async { tokio::join!(feed, drain) })
            .await
            .map_err(|_| {
                permanent(
                    "restore-command-failed",
                    format!("still running after {} s", LOAD_TIMEOUT.as_secs()),
                )
            })?;
        let code = self
            .docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| docker("docker-unavailable", e))?
            .exit_code
            .unwrap_or(-1);
        let said = String::from_utf8_lossy(&said).trim().to_owned();
        match (fed, code) {
            (Ok(_), 0) => Ok(()),
            (Err(e), 0) => Err(permanent(
                "restore-command-failed",
                format!("the dump did not reach it: {e}"),
            )),
            (_, code) => Err(permanent(
                "restore-command-failed",
                format!("the restore command exited with {code}: {said}"),
            )),
        }
    }
}
