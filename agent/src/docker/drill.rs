//! Restore drills: a volume's newest snapshot restored into a scratch copy (the volume at
//! generation [`DRILL_GENERATION`], never a real one), and the backup's `verify.command` run on
//! it in a scratch container of the role's image (hardened as every container, with no
//! network). Exit 0 proves the snapshot restores into something the application reads; any
//! other end, or a restore restic refuses (a corrupted pack, a wrong password), fails the drill
//! with its reason. The scratch container and copy are removed either way, and what a drill cut
//! short left behind is removed before the next.

use super::*;
use crate::lease_loop::Ended;
use agent_proto::{BackupReport, DRILL_GENERATION, DrillSpec, VolumeMount};
use backup::{Backups, volume_tags};

/// The longest a drill's command may run.
pub const DRILL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

impl Engine {
    /// Runs a `verify-backup` task.
    pub async fn drill(&self, b: &Backups, d: &DrillSpec) -> Result<Ended, Failure> {
        let spec = &d.backup;
        let scratch = VolumeMount {
            generation: DRILL_GENERATION,
            ..spec.mount.clone()
        };
        if d.run.volumes != [scratch.clone()] || d.run.network.network != agent_proto::DRILL_NETWORK {
            return Err(permanent(
                "drill-refused",
                "a drill's container mounts the scratch copy alone, without a network",
            ));
        }
        let (_password, repo) = self.backup_repository(b, spec)?;
        let _held = self.hold_repository(&repo.location).await;
        let tags = volume_tags(&self.control_plane, &spec.environment, &spec.mount.volume);
        let Some(newest) = b.restic.snapshots(&repo, &tags).await?.pop() else {
            return Err(permanent(
                "no-snapshot",
                format!(
                    "{} holds no snapshot of {} to verify",
                    spec.repository, spec.mount.volume
                ),
            ));
        };
        self.clear_drill(&spec.environment, &scratch, &d.run.container).await?;
        let outcome = async {
            self.restore_volume(&b.restic, &repo, &spec.environment, &scratch, &newest.short_id)
                .await
                .map_err(|f| Failure {
                    detail: format!("restoring snapshot {}: {}", newest.short_id, f.detail),
                    code: "verify-restore-failed",
                    ..f
                })?;
            self.run_once(&d.run, DRILL_TIMEOUT).await.map_err(|f| Failure {
                detail: format!("the verify command on snapshot {}: {}", newest.short_id, f.detail),
                code: "verify-command-failed",
                ..f
            })
        }
        .await;
        // Removed whatever happened; a failure to remove is the next drill's to clear.
        let _ = self.clear_drill(&spec.environment, &scratch, &d.run.container).await;
        let out = outcome?;
        let first = out.lines().nth(1).unwrap_or_default();
        Ok(Ended {
            note: format!("snapshot {} restored and verified: {first}", newest.short_id),
            backup: Some(BackupReport {
                snapshot: newest.short_id,
                bytes: 0,
                data_added: 0,
            }),
            measured: None,
        })
    }

    /// Removes a drill's scratch container and copy if they are ours; a foreign one with
    /// their names is refused and left alone.
    async fn clear_drill(&self, environment: &str, scratch: &VolumeMount, container: &str) -> Result<(), Failure> {
        match self.docker.inspect_container(container, None).await {
            Ok(c)
                if mine(
                    c.config.as_ref().and_then(|c| c.labels.as_ref()),
                    &self.control_plane,
                    &self.node,
                ) =>
            {
                self.remove(container).await?;
            }
            Ok(_) => {
                return Err(permanent(
                    "foreign-container",
                    format!("a container named {container} exists and is not ours: left untouched"),
                ));
            }
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(docker("docker-unavailable", e)),
        }
        let name = self.volume_name(environment, scratch);
        match self.docker.inspect_volume(&name).await {
            Ok(v) if self.owns_volume(&v, environment, scratch) => self
                .docker
                .remove_volume(&name, None::<bollard::query_parameters::RemoveVolumeOptions>)
                .await
                .map_err(|e| docker("volume-in-use", e)),
            Ok(_) => Err(permanent(
                "foreign-volume",
                format!("a volume named {name} exists and is not ours: left untouched"),
            )),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(docker("docker-unavailable", e)),
        }
    }
}
