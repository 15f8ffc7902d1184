//! Volumes: an environment's data on this node, made with our labels and this control plane's
//! and node's names, mounted by the one container of its role, never removed by a rollout or
//! a teardown (only by `RemoveVolume`, once the control plane's retention is over), measured
//! for heartbeats. A volume with our name and without our labels is foreign and refused.

use super::*;
use agent_proto::VolumeMount;
use bollard::models::{Mount, MountType, VolumeCreateRequest};
use bollard::query_parameters::{ListVolumesOptionsBuilder, RemoveVolumeOptionsBuilder};

/// The volume's name in its environment, on a volume.
pub const VOLUME: &str = "dev.pushleft.volume";
/// The volume's generation (a restore makes the next), on a volume.
pub const VOLUME_GENERATION: &str = "dev.pushleft.volume-generation";

/// Most entries one measurement walks in one volume: beyond it, the figure is a floor.
const MEASURE_MAX_ENTRIES: u64 = 1_000_000;

/// One of our volumes as a heartbeat reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeUse {
    pub environment: String,
    pub volume: String,
    pub generation: u64,
    pub bytes: u64,
}

impl Engine {
    /// Whether volume `v` is `environment`'s `m` of this control plane and node.
    pub(super) fn owns_volume(&self, v: &bollard::models::Volume, environment: &str, m: &VolumeMount) -> bool {
        self.volume_labels(environment, m)
            .iter()
            .all(|(k, want)| v.labels.get(k) == Some(want))
    }

    pub(super) fn volume_labels(&self, environment: &str, m: &VolumeMount) -> HashMap<String, String> {
        HashMap::from([
            (OWNED.to_owned(), "true".to_owned()),
            (CONTROL_PLANE.to_owned(), self.control_plane.clone()),
            (NODE.to_owned(), self.node.clone()),
            (ENVIRONMENT.to_owned(), environment.to_owned()),
            (VOLUME.to_owned(), m.volume.clone()),
            (VOLUME_GENERATION.to_owned(), m.generation.to_string()),
        ])
    }

    /// The Docker name of `environment`'s volume `m` on this node.
    pub fn volume_name(&self, environment: &str, m: &VolumeMount) -> String {
        agent_proto::volume_name(&self.control_plane, &self.node, environment, &m.volume, m.generation)
    }

    /// `app`'s volumes, each made if missing and checked to be ours: the mounts its container
    /// gets. Creating is idempotent (Docker returns a volume that exists), so the labels are
    /// read back and judged either way.
    pub(super) async fn ensure_volumes(&self, app: &ApplicationSpec) -> Result<Vec<Mount>, Failure> {
        let mut mounts = Vec::with_capacity(app.volumes.len());
        for m in &app.volumes {
            let name = self.volume_name(&app.environment, m);
            let want = self.volume_labels(&app.environment, m);
            let found = match self.docker.inspect_volume(&name).await {
                Ok(v) => v,
                Err(e) if not_found(&e) => self
                    .docker
                    .create_volume(VolumeCreateRequest {
                        name: Some(name.clone()),
                        driver: Some("local".into()),
                        labels: Some(want.clone()),
                        ..VolumeCreateRequest::default()
                    })
                    .await
                    .map_err(|e| docker("volume-create-failed", e))?,
                Err(e) => return Err(docker("docker-unavailable", e)),
            };
            if !self.owns_volume(&found, &app.environment, m) {
                return Err(permanent(
                    "foreign-volume",
                    format!(
                        "a volume named {name} exists and is not this environment's (its labels name another owner): left untouched"
                    ),
                ));
            }
            mounts.push(Mount {
                target: Some(m.path.clone()),
                source: Some(name),
                typ: Some(MountType::VOLUME),
                read_only: Some(false),
                ..Mount::default()
            });
        }
        Ok(mounts)
    }

    /// Our volumes on this node (this control plane's, this node's), with their labels and
    /// where their data is.
    async fn our_volumes(&self, filter: &[(&str, &str)]) -> Result<Vec<bollard::models::Volume>, Failure> {
        let filters = self.our_filter(filter);
        let list = self
            .docker
            .list_volumes(Some(ListVolumesOptionsBuilder::default().filters(&filters).build()))
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        Ok(list.volumes.unwrap_or_default())
    }

    /// What each of our volumes holds, in bytes (files' apparent sizes, walked under the
    /// volume's mount point; at most [`MEASURE_MAX_ENTRIES`] entries each).
    pub async fn measure_volumes(&self) -> Result<Vec<VolumeUse>, Failure> {
        let mut out = Vec::new();
        for v in self.our_volumes(&[]).await? {
            let (Some(environment), Some(volume), Some(generation)) = (
                v.labels.get(ENVIRONMENT),
                v.labels.get(VOLUME),
                v.labels.get(VOLUME_GENERATION).and_then(|g| g.parse().ok()),
            ) else {
                continue;
            };
            // A restore drill's scratch copy is not the volume's data.
            if generation == agent_proto::DRILL_GENERATION {
                continue;
            }
            let dir = PathBuf::from(&v.mountpoint);
            let bytes = tokio::task::spawn_blocking(move || tree_bytes(&dir, MEASURE_MAX_ENTRIES))
                .await
                .unwrap_or(0);
            out.push(VolumeUse {
                environment: environment.clone(),
                volume: volume.clone(),
                generation,
                bytes,
            });
        }
        out.sort_by(|a, b| (&a.environment, &a.volume, a.generation).cmp(&(&b.environment, &b.volume, b.generation)));
        Ok(out)
    }

    /// Removes `environment`'s `volume` at `generation`, if it is ours; a volume in use is
    /// refused by Docker and reported (retried later), never forced.
    pub async fn remove_volume(&self, environment: &str, volume: &str, generation: u64) -> Result<String, Failure> {
        let m = VolumeMount {
            volume: volume.to_owned(),
            generation,
            path: String::new(),
            load: None,
        };
        let name = self.volume_name(environment, &m);
        match self.docker.inspect_volume(&name).await {
            Err(e) if not_found(&e) => return Ok(format!("{name} already gone")),
            Err(e) => return Err(docker("docker-unavailable", e)),
            Ok(v) => {
                if !self.owns_volume(&v, environment, &m) {
                    return Err(permanent(
                        "foreign-volume",
                        format!("a volume named {name} is not ours: left untouched"),
                    ));
                }
            }
        }
        self.docker
            .remove_volume(&name, Some(RemoveVolumeOptionsBuilder::default().force(false).build()))
            .await
            .map_err(|e| docker("volume-remove-failed", e))?;
        Ok(format!("{name} removed"))
    }
}

/// Bytes of the regular files under `dir` (not following links), walking at most `max`
/// entries. An unreadable entry counts as nothing.
fn tree_bytes(dir: &Path, max: u64) -> u64 {
    let mut total = 0u64;
    let mut seen = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            seen += 1;
            if seen > max {
                return total;
            }
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_measured_by_its_files_and_the_walk_is_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("a"), vec![0u8; 1000]).expect("write");
        std::fs::write(dir.path().join("sub/b"), vec![0u8; 24]).expect("write");
        assert_eq!(tree_bytes(dir.path(), 100), 1024);
        assert!(tree_bytes(dir.path(), 1) < 1024, "one entry walked at most");
        assert_eq!(tree_bytes(&dir.path().join("missing"), 100), 0);
    }
}
