//! A volume saved to and restored from a restic repository (`crate::restic`). Consistent either
//! way: with a command (`pg_dump`, say), what the command prints inside the running container
//! is saved, and a command that fails leaves no snapshot; without one, the volume's files are
//! saved with its container paused (frozen by the cgroup freezer: no write lands mid-copy,
//! connections wait rather than fail) and always unpaused after. A restore goes into a new,
//! empty volume generation; the volume it came from is never written.

use super::*;
use crate::lease_loop::Ended;
use crate::restic::{Repository, Restic, Summary};
use agent_proto::{BackupReport, BackupSpec, VolumeMount};
use bollard::exec::{CreateExecOptions, StartExecResults};
use tokio::io::AsyncWriteExt;

/// What a backup's command may write to its standard error, kept for the failure's detail.
const COMMAND_STDERR_BYTES: usize = 8 * 1024;

/// The longest one restic run may take (a backup of a large volume, a prune).
pub const BACKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// How this node backs up: the restic program, its cache, and the folders a repository on the
/// node itself may be in.
#[derive(Clone, Debug)]
pub struct Backups {
    pub restic: Restic,
    pub roots: Vec<PathBuf>,
    pub cache_dir: PathBuf,
}

/// Whether a repository on the node (`/path`) is inside one of `roots` (component-wise: the
/// control plane checked it is clean, and it is checked again here).
fn under_a_root(location: &Path, roots: &[PathBuf]) -> bool {
    use std::path::Component;
    let clean = location
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    clean && roots.iter().any(|r| location.starts_with(r) && location != r.as_path())
}

/// Whether a backups Secret's key may be restic's environment: a plain variable name that
/// cannot point restic elsewhere (`RESTIC_REPOSITORY`, …) or change what runs (`PATH`, `LD_…`).
fn backend_variable(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && !key.starts_with("RESTIC_")
        && !key.starts_with("LD_")
        && !["PATH", "HOME", "TMPDIR"].contains(&key)
}

/// The tags every snapshot of a volume carries: listing and retention go by them, and two
/// control planes sharing a repository never forget each other's.
pub fn volume_tags(control_plane: &str, environment: &str, volume: &str) -> Vec<String> {
    vec![
        format!("pl-plane={control_plane}"),
        format!("pl-environment={environment}"),
        format!("pl-volume={volume}"),
    ]
}

/// The repository's password, opened with the node's identity, in a file of its own on the
/// tmpfs for as long as restic runs; removed when dropped.
pub(super) struct PasswordFile(PathBuf);

impl Drop for PasswordFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
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
    /// Runs a `backup-volume` task: the repository opened with its sealed Secret, the volume
    /// saved (consistently, see the module), the snapshots beyond `keep` forgotten and pruned.
    pub async fn backup(&self, b: &Backups, spec: &BackupSpec) -> Result<Ended, Failure> {
        let (password, repo) = self.backup_repository(b, spec)?;
        let held = self.hold_repository(&repo.location).await;
        if let Some(role) = &spec.stop_role {
            return self.save_for_move(b, spec, &repo, role).await;
        }
        // The role's container, when one of ours runs: paused for a file backup, the host of
        // the command.
        let container = match &spec.container {
            Some(name) => match self.docker.inspect_container(name, None).await {
                Ok(c)
                    if c.state.as_ref().and_then(|s| s.running) == Some(true)
                        && mine(
                            c.config.as_ref().and_then(|c| c.labels.as_ref()),
                            &self.control_plane,
                            &self.node,
                        ) =>
                {
                    Some(name.as_str())
                }
                Ok(_) => None,
                Err(e) if not_found(&e) => None,
                Err(e) => return Err(docker("docker-unavailable", e)),
            },
            None => None,
        };
        let tags = volume_tags(&self.control_plane, &spec.environment, &spec.mount.volume);
        let of = BackupOf {
            environment: &spec.environment,
            mount: &spec.mount,
            container,
            command: spec.command.as_deref(),
            tags: &tags,
        };
        let saved = self.backup_volume(&b.restic, &repo, &of).await?;
        // Retention is housekeeping: the backup is done (and reported) once its snapshot is
        // saved. The snapshots beyond `keep` are forgotten and pruned right after, holding the
        // repository (the next backup, restore or drill of it here waits); one that fails is
        // done by the next backup's, which forgets the same and more.
        let (restic, keep) = (b.restic.clone(), spec.keep);
        tokio::spawn(async move {
            if let Err(f) = restic.retain(&repo, &tags, keep).await {
                tracing::warn!(code = f.code, detail = %f.detail, repository = %repo.location, "retention after a backup failed; the next backup's retries it");
            }
            drop((held, password));
        });
        Ok(Ended {
            note: format!(
                "snapshot {} of {} ({} bytes read, {} added)",
                saved.snapshot_id, spec.mount.volume, saved.bytes, saved.data_added
            ),
            backup: Some(BackupReport {
                snapshot: saved.snapshot_id,
                bytes: saved.bytes,
                data_added: saved.data_added,
            }),
            measured: None,
        })
    }

    /// A move's first half: every container of the role (ours: its replica of any generation,
    /// and a job's or cron's run) removed, so nothing writes the volume any more and the role
    /// stays down, then the volume's files saved. Safe twice: containers already gone are
    /// fine, and a second save is a snapshot of the same files.
    async fn save_for_move(
        &self,
        b: &Backups,
        spec: &BackupSpec,
        repo: &Repository,
        role: &str,
    ) -> Result<Ended, Failure> {
        let mut gone = 0;
        for (name, _, _) in self.ours(&[(ENVIRONMENT, &spec.environment), (ROLE, role)]).await? {
            self.remove(&name).await?;
            gone += 1;
        }
        let removed = format!("{gone} containers removed");
        let tags = volume_tags(&self.control_plane, &spec.environment, &spec.mount.volume);
        let of = BackupOf {
            environment: &spec.environment,
            mount: &spec.mount,
            container: None,
            command: None,
            tags: &tags,
        };
        let saved = self.backup_volume(&b.restic, repo, &of).await?;
        Ok(Ended {
            note: format!(
                "{role} stopped ({removed}); snapshot {} of {} for its move ({} bytes read, {} added)",
                saved.snapshot_id, spec.mount.volume, saved.bytes, saved.data_added
            ),
            backup: Some(BackupReport {
                snapshot: saved.snapshot_id,
                bytes: saved.bytes,
                data_added: saved.data_added,
            }),
            measured: None,
        })
    }

    /// Runs a `restore-volume` task: `snapshot` restored into the volume's new generation
    /// (`spec.mount`), made here, empty. What a failed earlier try left of that generation
    /// (ours, mounted by no container: the control plane never asks for a generation that is
    /// in use) is removed first, so a restore can be asked for again.
    pub async fn restore(&self, b: &Backups, spec: &BackupSpec, snapshot: &str) -> Result<String, Failure> {
        let repo = self.backup_repository(b, spec)?;
        let _held = self.hold_repository(&repo.1.location).await;
        let name = self.volume_name(&spec.environment, &spec.mount);
        if let Ok(v) = self.docker.inspect_volume(&name).await
            && self.owns_volume(&v, &spec.environment, &spec.mount)
        {
            self.docker
                .remove_volume(&name, None::<bollard::query_parameters::RemoveVolumeOptions>)
                .await
                .map_err(|e| docker("volume-in-use", e))?;
        }
        if spec.command.is_some() {
            // A command's dump: the new generation starts empty, and the dump waits beside it
            // for the role's `restore` command (`load.rs`).
            return self
                .restore_dump(&b.restic, &repo.1, &spec.environment, &spec.mount, snapshot)
                .await;
        }
        self.restore_volume(&b.restic, &repo.1, &spec.environment, &spec.mount, snapshot)
            .await
    }

    /// Holds `location` for one backup, restore or drill on this node (see
    /// `Engine::repository_locks`).
    pub async fn hold_repository(&self, location: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = std::sync::Arc::clone(
            self.repository_locks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(location.to_owned())
                .or_default(),
        );
        lock.lock_owned().await
    }

    /// A failed restore leaves no volume behind: the ledger never moves the volume to the
    /// generation it was made for, so nothing would ever list or remove it. Removes `name`
    /// if it is ours, and returns `failure` as it was.
    pub(super) async fn discard_failed_restore(
        &self,
        environment: &str,
        to: &VolumeMount,
        name: &str,
        failure: Failure,
    ) -> Failure {
        if let Ok(v) = self.docker.inspect_volume(name).await
            && self.owns_volume(&v, environment, to)
            && let Err(e) = self
                .docker
                .remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>)
                .await
        {
            tracing::warn!(volume = %name, error = %e, "cannot remove a failed restore's volume");
        }
        failure
    }

    /// The repository of a backup's spec, opened: refused when it is a path on the node
    /// outside `backup_roots`; the password file lives as long as the returned guard.
    pub(super) fn backup_repository(
        &self,
        b: &Backups,
        spec: &BackupSpec,
    ) -> Result<(PasswordFile, Repository), Failure> {
        if spec.repository.starts_with('/') && !under_a_root(Path::new(&spec.repository), &b.roots) {
            return Err(permanent(
                "backup-repository-refused",
                format!(
                    "{} is not under this node's backup_roots ({})",
                    spec.repository,
                    b.roots
                        .iter()
                        .map(|r| r.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let (password, env) = self.open_backup_secret(spec)?;
        let repo = Repository {
            location: spec.repository.clone(),
            password_file: password.0.clone(),
            env,
            cache_dir: b.cache_dir.clone(),
        };
        Ok((password, repo))
    }

    /// The password file and the backend's variables of a backup's sealed Secret.
    fn open_backup_secret(
        &self,
        spec: &BackupSpec,
    ) -> Result<(PasswordFile, std::collections::BTreeMap<String, String>), Failure> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let identities = pushleft_secrets::load_identities(&self.identity)
            .map_err(|e| permanent("node-identity-unreadable", e.code().to_owned()))?;
        let mut env = std::collections::BTreeMap::new();
        let mut password = None;
        for s in &spec.values {
            let plaintext = pushleft_secrets::decrypt(&s.sealed, &identities)
                .map_err(|e| permanent("secret-unopenable", format!("{}: {}", spec.secret, e.code())))?;
            if s.key == "RESTIC_PASSWORD" {
                password = Some(plaintext);
            } else if backend_variable(&s.key) {
                let value = String::from_utf8(plaintext.to_vec())
                    .map_err(|_| permanent("secret-unopenable", format!("{}'s {} is not UTF-8", spec.secret, s.key)))?;
                env.insert(s.key.clone(), value);
            } else {
                return Err(permanent(
                    "backup-secret-refused",
                    format!("{}'s key {} cannot be restic's environment", spec.secret, s.key),
                ));
            }
        }
        let Some(password) = password else {
            return Err(permanent(
                "backup-secret-incomplete",
                format!("{} has no RESTIC_PASSWORD", spec.secret),
            ));
        };
        // A folder per run: two runs at once never share (or remove) one another's file.
        static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.secrets_dir.join(format!(
            ".backup-{}-{}-{}-{run}",
            spec.environment,
            spec.mount.volume,
            std::process::id()
        ));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| retryable("secrets-dir-failed", e.to_string()))?;
        let file = PasswordFile(dir.join("password"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(&file.0)
            .map_err(|e| retryable("secrets-write-failed", e.to_string()))?;
        use std::io::Write;
        f.write_all(&password)
            .map_err(|e| retryable("secrets-write-failed", e.to_string()))?;
        Ok((file, env))
    }

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
        let known = |engine: &Engine| {
            engine
                .known_repositories
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&repo.location)
        };
        if !known(self) {
            restic.ensure_repository(repo).await?;
            self.known_repositories
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(repo.location.clone());
        }
        let saved = self.backup_volume_in(restic, repo, of, &dir).await;
        if saved.is_err() {
            // Gone or changed since it was found: checked (and made) again next time.
            self.known_repositories
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&repo.location);
        }
        saved
    }

    async fn backup_volume_in(
        &self,
        restic: &Restic,
        repo: &Repository,
        of: &BackupOf<'_>,
        dir: &Path,
    ) -> Result<Summary, Failure> {
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
                let saved = restic.backup_dir(repo, dir, &self.node, of.tags).await;
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

    /// Makes `to`, a new generation of the volume, with our labels and empty: its name, or
    /// `volume-exists` (a restore never writes into data that exists).
    pub(super) async fn new_generation(&self, environment: &str, to: &VolumeMount) -> Result<String, Failure> {
        let name = self.volume_name(environment, to);
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
                labels: Some(self.volume_labels(environment, to)),
                ..Default::default()
            })
            .await
            .map_err(|e| docker("volume-create-failed", e))?;
        Ok(name)
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
        let name = self.new_generation(environment, to).await?;
        let restored = match self.volume_dir(environment, to).await {
            Ok(dir) => match restic.restore(repo, snapshot, &dir).await {
                // The root as it was saved: owner, mode, extended attributes.
                Ok(()) => restic.tags_of(repo, snapshot).await.and_then(|tags| {
                    crate::volume_root::apply(&dir, &tags)
                        .map_err(|e| permanent("restore-failed", format!("the volume's root {}: {e}", dir.display())))
                }),
                Err(f) => Err(f),
            },
            Err(f) => Err(f),
        };
        match restored {
            Ok(_) => Ok(format!("snapshot {snapshot} restored into {name}")),
            Err(f) => Err(self.discard_failed_restore(environment, to, &name, f).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repository_on_the_node_must_be_inside_a_backup_root() {
        let roots = [PathBuf::from("/var/backups/pushleft")];
        assert!(under_a_root(Path::new("/var/backups/pushleft/shop"), &roots));
        for outside in [
            "/var/backups/pushleft",
            "/var/backups/pushleft-other/x",
            "/etc",
            "/var/backups/pushleft/../../../etc",
        ] {
            assert!(!under_a_root(Path::new(outside), &roots), "{outside}");
        }
    }

    #[test]
    fn a_secret_key_cannot_point_restic_elsewhere_or_change_what_runs() {
        for ok in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "B2_ACCOUNT_KEY"] {
            assert!(backend_variable(ok), "{ok}");
        }
        for bad in [
            "RESTIC_REPOSITORY",
            "RESTIC_PASSWORD_COMMAND",
            "PATH",
            "LD_PRELOAD",
            "HOME",
            "aws_key",
            "",
        ] {
            assert!(!backend_variable(bad), "{bad}");
        }
    }
}
