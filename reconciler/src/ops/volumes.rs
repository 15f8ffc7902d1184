//! Volumes: every volume with its node, generation, retention, what its agent last measured
//! and its last move; a released volume (or a kept generation) removed, answered only once its
//! node removed it; a move to another node (`store::moves`), answered once it is queued or with
//! why not before anything changed (the caller follows `movingTo`, then `movedUpAtMs`).

use super::backups::live_of;
use super::{Answer, Kind, OpError, Ops, wire};
use crate::store::kept::KeptRefusal;
use crate::store::moves::{MoveRefusal, Moving};
use crate::store::now_ms;
use crate::store::rows::JobState;
use crate::store::volumes::{VolumeRefusal, VolumeRow};
use operator_proto::volumes::{MoveVolume, RemoveVolume, VolumeMoving, VolumeRemoved, Volumes};
use state_schema::placement::Fleet;
use state_schema::task::Task;
use state_schema::values::Name;
use std::time::Duration;

/// How long a removal waits for the node.
pub const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

impl Ops {
    /// `GET /v1/volumes`.
    pub async fn volumes(&self) -> Answer<Volumes> {
        let rows = self.ledger.volumes().volumes().await?;
        let kept = self.ledger.deployments().kept_generations().await?;
        Ok(Volumes {
            volumes: rows.iter().map(|r| wire::volume(r, &kept)).collect(),
        })
    }

    /// One environment's volumes (the web view's).
    pub async fn volumes_of(&self, environment: &str) -> Answer<Vec<operator_proto::volumes::Volume>> {
        let rows = self.ledger.volumes().volumes_of(environment).await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let kept = self.ledger.deployments().kept_generations().await?;
        Ok(rows.iter().map(|r| wire::volume(r, &kept)).collect())
    }

    /// `POST /v1/volumes/remove`: a released volume, or one kept generation of one.
    pub async fn remove_volume(&self, who: &str, ask: RemoveVolume) -> Answer<VolumeRemoved> {
        if let Some(generation) = ask.generation {
            return self.remove_kept(who, &ask.environment, &ask.volume, generation).await;
        }
        let (env, volume) = (&ask.environment, &ask.volume);
        let row = self
            .ledger
            .volumes()
            .expire_volume(env, volume, now_ms())
            .await?
            .map_err(|why| match why {
                VolumeRefusal::Unknown => OpError::not_found("volume-unknown", format!("no volume {volume} in {env}")),
                VolumeRefusal::InUse => OpError::conflict(
                    "volume-in-use",
                    format!(
                        "{env} runs and mounts {volume}: a volume is removed only after its environment is torn down"
                    ),
                ),
            })?;
        tracing::warn!(environment = %row.environment, volume = %row.volume, token = %who, "volume removal asked");
        let task = row
            .removal()
            .ok_or_else(|| OpError::unavailable("a volume row whose names do not parse"))?;
        let detail = self.removed_on_node(task, &row.node).await?;
        self.ledger.volumes().forget_volume(&row, now_ms()).await?;
        Ok(VolumeRemoved {
            removed: true,
            node: row.node,
            generation: None,
            detail,
        })
    }

    /// Removes a kept generation of a volume (one a restore or a move left behind) from its
    /// node, answering once the node did.
    async fn remove_kept(&self, who: &str, env: &str, volume: &str, generation: i64) -> Answer<VolumeRemoved> {
        let row = self
            .ledger
            .deployments().kept_generation(env, volume, generation)
            .await?
            .map_err(|why| match why {
                KeptRefusal::Unknown => OpError::not_found(
                    "volume-generation-unknown",
                    format!("{env}/{volume} keeps no generation {generation} (`pl volumes` lists the kept ones)"),
                ),
                KeptRefusal::Current => OpError::conflict(
                    "volume-generation-current",
                    format!(
                        "generation {generation} is {env}/{volume}'s current one, which its role mounts: remove the volume once its environment is torn down"
                    ),
                ),
            })?;
        tracing::warn!(environment = %env, volume = %volume, generation, node = %row.node, token = %who, "kept generation removal asked");
        let task = row
            .removal()
            .ok_or_else(|| OpError::unavailable("a kept generation whose names do not parse"))?;
        let detail = self.removed_on_node(task, &row.node).await?;
        self.ledger.deployments().forget_generation(&row, now_ms()).await?;
        Ok(VolumeRemoved {
            removed: true,
            node: row.node,
            generation: Some(generation),
            detail,
        })
    }

    /// Queues a removal on `node` and waits (at most [`REMOVE_TIMEOUT`]) until the node did
    /// it: the job's detail, or why not. Success only once the node removed it: the answer is
    /// what the host did.
    async fn removed_on_node(&self, task: state_schema::task::Task, node: &str) -> Answer<Option<String>> {
        let keys = self
            .ledger
            .certificates()
            .enqueue_tasks(&[(task, node.to_owned())], now_ms())
            .await?;
        self.hub.jobs.notify_waiters();
        let deadline = tokio::time::Instant::now() + REMOVE_TIMEOUT;
        loop {
            match self.ledger.certificates().job_outcomes(&keys).await?.into_iter().next() {
                Some(o) if o.state == JobState::Succeeded => return Ok(o.detail),
                Some(o) if o.state.broken() || o.state == JobState::Cancelled => {
                    return Err(OpError::new(
                        Kind::FailedOnNode,
                        "volume-remove-failed",
                        format!(
                            "node {node}: {}",
                            o.detail.unwrap_or_else(|| o.state.as_str().to_owned())
                        ),
                    ));
                }
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(OpError::new(
                    Kind::Pending,
                    "volume-remove-pending",
                    format!(
                        "node {node} has not removed it within {} s; the removal stays queued",
                        REMOVE_TIMEOUT.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `POST /v1/volumes/move`: judged against the fleet as placement sees it now.
    pub async fn move_volume(&self, who: &str, ask: MoveVolume) -> Answer<VolumeMoving> {
        let (env, volume, to) = (&ask.environment, &ask.volume, &ask.to);
        let m = self
            .ask_move(&ask, now_ms())
            .await?
            .map_err(|why| move_refused(env, volume, to, &why))?;
        tracing::warn!(by = %who, environment = %env, volume = %volume, from = %m.from, to = %m.to, job = %m.job, "volume move asked");
        self.hub.jobs.notify_waiters();
        Ok(VolumeMoving {
            job: m.job,
            role: m.role,
            from: m.from,
            to: m.to,
            asked_at_ms: m.asked_at,
        })
    }

    /// A move asked at `now_ms`, judged ([`judge_move`], against the fleet made from the
    /// ledger's rows now) and started, or why not (nothing written).
    pub async fn ask_move(&self, ask: &MoveVolume, now_ms: i64) -> Result<Result<Moving, MoveRefusal>, OpError> {
        let (env, volume, to) = (&ask.environment, &ask.volume, &ask.to);
        let pools = super::nodes::applied_pools(&self.ledger, &self.branch).await?;
        let fleet = state_schema::replacement::fleet_of(
            &pools,
            &self.ledger.nodes().fleet_rows(self.lost_after_ms).await?,
            now_ms,
        );
        let (rows, backing) = self.ledger.volumes().move_rows().await?;
        let (task, role, from) = match judge_move(&rows, backing, &fleet, env, volume, to, now_ms) {
            Ok(judged) => judged,
            Err(why) => return Ok(Err(why)),
        };
        Ok(self
            .ledger
            .volumes()
            .start_move(env, volume, &role, &from, to, &task, now_ms)
            .await?)
    }
}

/// Whether `environment`'s `volume` may move to node `to` now, judged on every volume's row
/// (`rows`), the finished rollouts that back volumes up (`backing`) and the live `fleet`: the
/// move's first job (its backup, `moving`), the volume's role and its node; or why not.
fn judge_move(
    rows: &[VolumeRow],
    backing: Vec<(i64, String)>,
    fleet: &Fleet,
    environment: &str,
    volume: &str,
    to: &str,
    now_ms: i64,
) -> Result<(Task, String, String), MoveRefusal> {
    let row = rows
        .iter()
        .find(|r| r.environment == environment && r.volume == volume)
        .ok_or(MoveRefusal::Unknown)?;
    if row.released_at.is_some() {
        return Err(MoveRefusal::Released);
    }
    if let Some(going) = &row.moving_to {
        return Err(MoveRefusal::Moving(going.clone()));
    }
    if row.node == to {
        return Err(MoveRefusal::AlreadyThere);
    }
    if let Some(other) = rows
        .iter()
        .find(|r| r.environment == environment && r.role == row.role && r.volume != volume)
    {
        return Err(MoveRefusal::SharedRole(other.volume.clone()));
    }
    let (generation, spec) = live_of(backing, environment)
        .filter(|(_, spec)| state_schema::volume_jobs::backup_plan(spec, volume).is_some())
        .ok_or(MoveRefusal::NoBackup)?;
    let (Ok(role), Ok(target), Ok(source), Ok(volume_name)) = (
        Name::new(&row.role),
        Name::new(to),
        Name::new(&row.node),
        Name::new(volume),
    ) else {
        return Err(MoveRefusal::Unplaceable(state_schema::placement::NOT_ELIGIBLE.into()));
    };
    if !fleet.answers(&source) {
        return Err(MoveRefusal::SourceSilent(row.node.clone()));
    }
    fleet
        .move_lands(&spec, &role, &target)
        .map_err(MoveRefusal::Unplaceable)?;
    let task = Task::BackupVolume {
        environment: spec.environment.clone(),
        volume: volume_name,
        generation,
        scheduled: now_ms / 1000,
        on_demand: true,
        moving: true,
    };
    Ok((task, row.role.clone(), row.node.clone()))
}

fn move_refused(env: &str, volume: &str, to: &str, why: &MoveRefusal) -> OpError {
    let code = why.code();
    match why {
        MoveRefusal::Unknown => OpError::not_found(code, format!("no volume {volume} in {env}")),
        MoveRefusal::Released => OpError::conflict(
            code,
            format!("{env} was torn down: its volume {volume} is kept where it is until its retention ends"),
        ),
        MoveRefusal::Moving(what) => OpError::conflict(
            code,
            format!("{env}/{volume} has a move or a backup under way ({what}): follow it with `pl volumes`"),
        ),
        MoveRefusal::AlreadyThere => OpError::conflict(code, format!("{env}/{volume} is on {to} already")),
        MoveRefusal::NoBackup => OpError::conflict(
            code,
            format!(
                "no finished rollout of {env} backs up {volume}: a move carries the data through the volume's backup repository, so give the volume a `backup` and the environment `backups` (a repository both nodes reach)"
            ),
        ),
        MoveRefusal::SharedRole(other) => OpError::conflict(
            code,
            format!(
                "{volume}'s role also mounts {other}: a role's volumes live on one node, and a move takes one volume"
            ),
        ),
        MoveRefusal::SourceSilent(node) => OpError::conflict(
            code,
            format!(
                "{node}, which holds {env}/{volume}, has not been heard from lately: nothing could stop and save it (restore a backup with `pl restore` once it is back)"
            ),
        ),
        MoveRefusal::Unplaceable(reason) => OpError::conflict(
            code,
            format!(
                "{env}'s role would not run on {to} ({reason}): it must be active in Git, in the environment's pool, heard from lately and have room for the role"
            ),
        ),
    }
}
