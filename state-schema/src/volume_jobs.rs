//! What is asked of a backed-up volume: a backup or a restore drill, on its schedule or now,
//! and a restore of a snapshot into the volume's next generation. Pure: which volumes a spec
//! plans each job for, the task each one is, and whether an operator's ask is queued or
//! refused (why, typed) from what the caller read. The reconcile loop's schedules and the
//! operator's `pl backup`/`pl restore` (`reconciler::ops::backups`) both use it; the store
//! writes what it decides.

use crate::deployment::DeploymentSpec;
use crate::task::{Task, backup_key_prefix, drill_key_prefix, is_snapshot_id};
use crate::values::{CronSchedule, Name};

/// Attempts of a backup: a retryable failure (the repository unreachable, the container not
/// running yet) retries within its time; then it waits for the next time.
pub const BACKUP_ATTEMPTS: u32 = 3;

/// A backup, or a restore drill of one: what a volume's schedules and an operator queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeJob {
    Backup,
    Drill,
}

impl VolumeJob {
    /// The volumes `spec` plans this job for, with its schedule.
    pub fn planned(self, spec: &DeploymentSpec) -> Vec<(Name, CronSchedule)> {
        if spec.backups.is_none() {
            return Vec::new();
        }
        spec.roles
            .values()
            .flat_map(|r| r.volumes.iter())
            .filter_map(|v| {
                let backup = v.backup.as_ref()?;
                let schedule = match self {
                    VolumeJob::Backup => &backup.schedule,
                    VolumeJob::Drill => &backup.verify.as_ref()?.schedule,
                };
                Some((Name::new(&v.name).ok()?, CronSchedule::parse(schedule).ok()?))
            })
            .collect()
    }

    /// The task for one time (Unix seconds), or for an operator's request at that second.
    pub fn task(self, environment: &Name, volume: &Name, generation: u64, scheduled: i64, on_demand: bool) -> Task {
        let (environment, volume) = (environment.clone(), volume.clone());
        match self {
            VolumeJob::Backup => Task::BackupVolume {
                environment,
                volume,
                generation,
                scheduled,
                on_demand,
                moving: false,
            },
            VolumeJob::Drill => Task::VerifyBackup {
                environment,
                volume,
                generation,
                scheduled,
                on_demand,
            },
        }
    }

    /// What every key of this job for the volume starts with: one at a time per volume.
    pub fn key_prefix(self, environment: &Name, volume: &Name) -> String {
        match self {
            VolumeJob::Backup => backup_key_prefix(environment, volume),
            VolumeJob::Drill => drill_key_prefix(environment, volume),
        }
    }

    /// Its schedule's key in the ledger's schedules (a role's name has no `:`).
    pub fn schedule_key(self, volume: &Name) -> String {
        match self {
            VolumeJob::Backup => format!("volume:{volume}"),
            VolumeJob::Drill => format!("verify:{volume}"),
        }
    }

    /// Its events: queued, skipped.
    pub fn events(self) -> (&'static str, &'static str) {
        match self {
            VolumeJob::Backup => ("backup-queued", "backup-skipped"),
            VolumeJob::Drill => ("backup-verify-queued", "backup-verify-skipped"),
        }
    }
}

/// Whether `spec` backs up `volume`: `Some(dump)`, where `dump` says its backups are a
/// command's output with no `restore` command to load one.
pub fn backup_plan(spec: &DeploymentSpec, volume: &str) -> Option<bool> {
    spec.backups.as_ref()?;
    let plan = spec
        .roles
        .values()
        .flat_map(|r| r.volumes.iter())
        .find(|v| v.name == volume)?
        .backup
        .as_ref()?;
    Some(plan.command.is_some() && plan.restore.is_none())
}

/// The snapshot `asked` names among `known` (a volume's succeeded backups): the same id, or
/// the one id it is a prefix of (restic's short ids). `None` when none, or more than one, is.
pub fn known_snapshot(known: &[String], asked: &str) -> Option<String> {
    let mut matching = known
        .iter()
        .filter(|k| k.as_str() == asked || k.starts_with(asked) || asked.starts_with(k.as_str()));
    let first = matching.next()?;
    matching.all(|k| k == first).then(|| first.clone())
}

/// Why a backup, a drill or a restore cannot be asked for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackupRefusal {
    /// No live deployment of the environment backs up (or verifies) such a volume.
    NoPlan,
    /// The volume was never made (its role was not placed yet).
    NotPlaced,
    /// One is queued or running already: its key.
    Going(String),
    /// The volume's backups are a command's output (a dump to load), not its files, and its
    /// backup names no `restore` command to load one.
    Dump,
    /// The volume is moving to this node (`pl volume move`): one thing at a time.
    Moving(String),
    /// No succeeded backup to restore, or the snapshot id is not one.
    NoSnapshot,
}

/// Where a volume is, as the ledger has it: its node, its generation, and the node it is
/// moving to, if it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub node: String,
    pub generation: u64,
    pub moving_to: Option<String>,
}

/// A job to queue on a node, unless one with `prefix` still goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Asked {
    pub task: Task,
    pub node: String,
    /// One at a time per volume: a queued or leased job whose key starts with this refuses it.
    pub prefix: String,
}

/// An operator's backup (or drill) of `volume` now: `live` is the environment's live
/// deployment that backs up volumes (generation, spec), `placed` where the volume is,
/// `snapshots` the snapshots its succeeded backups saved (a drill needs one).
pub fn ask(
    job: VolumeJob,
    live: Option<(u64, &DeploymentSpec)>,
    volume: &str,
    placed: Option<&Placed>,
    snapshots: &[String],
    now_ms: i64,
) -> Result<Asked, BackupRefusal> {
    let (generation, spec) = live.ok_or(BackupRefusal::NoPlan)?;
    let (volume, _) = job
        .planned(spec)
        .into_iter()
        .find(|(v, _)| v.as_str() == volume)
        .ok_or(BackupRefusal::NoPlan)?;
    let placed = placed.ok_or(BackupRefusal::NotPlaced)?;
    if let Some(to) = &placed.moving_to {
        return Err(BackupRefusal::Moving(to.clone()));
    }
    if job == VolumeJob::Drill && snapshots.is_empty() {
        return Err(BackupRefusal::NoSnapshot);
    }
    Ok(Asked {
        task: job.task(&spec.environment, &volume, generation, now_ms.div_euclid(1000), true),
        node: placed.node.clone(),
        prefix: job.key_prefix(&spec.environment, &volume),
    })
}

/// A restore asked for: the job to queue, the volume generation it fills and the snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct Restore {
    pub asked: Asked,
    pub to: u64,
    pub snapshot: String,
}

/// An admin's restore of `volume`: `snapshot`, or the newest of `snapshots` (the volume's
/// succeeded backups', newest first), into the volume's next generation on its node. Only a
/// snapshot a backup of this volume saved (its id, or a prefix restic would take for it and
/// for no other): a job for anything else would fail in restic after making the volume's next
/// generation.
pub fn restore(
    live: Option<(u64, &DeploymentSpec)>,
    volume: &str,
    placed: Option<&Placed>,
    snapshot: Option<&str>,
    snapshots: &[String],
    now_ms: i64,
) -> Result<Restore, BackupRefusal> {
    let (generation, spec) = live.ok_or(BackupRefusal::NoPlan)?;
    if backup_plan(spec, volume).ok_or(BackupRefusal::NoPlan)? {
        return Err(BackupRefusal::Dump);
    }
    let placed = placed.ok_or(BackupRefusal::NotPlaced)?;
    if let Some(to) = &placed.moving_to {
        return Err(BackupRefusal::Moving(to.clone()));
    }
    let snapshot = match snapshot {
        Some(s) if is_snapshot_id(s) => known_snapshot(snapshots, s),
        Some(_) => None,
        None => snapshots.first().cloned(),
    }
    .ok_or(BackupRefusal::NoSnapshot)?;
    let volume = Name::new(volume).map_err(|_| BackupRefusal::NoPlan)?;
    let to = placed.generation + 1;
    let prefix = format!("vol:{}/{volume}:v{to}:", spec.environment);
    let task = Task::RestoreVolume {
        environment: spec.environment.clone(),
        volume,
        generation,
        to,
        snapshot: snapshot.clone(),
        asked_at: now_ms,
        moved: false,
    };
    Ok(Restore {
        asked: Asked {
            task,
            node: placed.node.clone(),
            prefix,
        },
        to,
        snapshot,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_names_a_snapshot_the_volumes_backups_saved() {
        let known = ["a1b2c3d4e5f60718".to_owned(), "a1b2ffff00000000".to_owned()];
        assert_eq!(
            known_snapshot(&known, "a1b2c3d4e5f60718").as_deref(),
            Some("a1b2c3d4e5f60718")
        );
        assert_eq!(known_snapshot(&known, "a1b2c3d4").as_deref(), Some("a1b2c3d4e5f60718"));
        assert_eq!(known_snapshot(&known, "a1b2"), None, "ambiguous");
        assert_eq!(known_snapshot(&known, "deadbeef"), None, "well-formed, unknown");
    }
}
