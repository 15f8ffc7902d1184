//! Replicas their agents no longer report: the ledger's side of drift. A replica stopped by
//! hand is the agent's to start again (it sees the container); one removed by hand (`docker rm
//! -f`), or lost with the engine's data, the agent cannot see, and nothing asked for it again.
//! So each pass compares every finished rollout's placement with what the nodes' agents last
//! reported, and asks again for a replica that is missing, at the same generation, as a job of
//! its own (`EnsureApplication { repair: n }`, key `…:ensure#r<n>`). Its success is recorded as
//! a `drift-repaired` event (in `Ledger::complete`).
//!
//! A report counts only when it is fresh (the node was heard from within [`FRESH_MS`]), came
//! after its rollout last changed and after the replica's last job ended (each by
//! [`SETTLE_MS`]), so a heartbeat sent before a replica started never reads as the replica
//! missing. At most [`MAX_REPAIRS`] repairs per
//! replica and generation: an application that removes itself is not restarted forever.

use crate::store::rows::{self, Placed};
use crate::store::{JobRow, Ledger, LedgerError, NewJob};
use state_schema::rollout;
use state_schema::task::Task;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// A node's report older than this says nothing about what runs there now.
pub const FRESH_MS: i64 = 60_000;
/// How long after a replica's last job ended a report must come to be believed.
pub const SETTLE_MS: i64 = 2_000;
/// Most repairs of one replica at one generation.
pub const MAX_REPAIRS: u32 = 20;
/// Without a heartbeat that lost a replica, how often drift is looked at in full anyway (a
/// replica removed while the control plane was down, say). Reading every finished rollout's
/// placement is a read of every deployment, so it is not every pass's.
pub const FULL_CHECK_MS: i64 = 60_000;
/// Most repairs whose routes one pass publishes again (the rest wait for the next).
const REPUBLISH_BATCH: i64 = 200;

/// A replica as a heartbeat reports it: environment, role, index, generation.
type Reported = (String, String, u32, u64);
/// A placed replica its node's fresh report leaves out: the replica, its node, and when that
/// node was heard from.
type Missing = (String, String, u32, u64, String, i64);

impl Ledger {
    /// Queues a repair for every replica of a finished rollout that its fresh node's agent no
    /// longer reports, when a heartbeat lost one (`suspected`, the hub's) or [`FULL_CHECK_MS`]
    /// passed since `checked_ms` (the loop's). Returns how many were queued.
    pub async fn repair_missing(
        &self,
        now_ms: i64,
        suspected: &AtomicBool,
        checked_ms: &AtomicI64,
    ) -> Result<usize, LedgerError> {
        let suspect = suspected.swap(false, Ordering::Relaxed);
        if !suspect && now_ms - checked_ms.load(Ordering::Relaxed) < FULL_CHECK_MS {
            return Ok(0);
        }
        checked_ms.store(now_ms, Ordering::Relaxed);
        let queued = self.repair_missing_now(now_ms).await;
        if queued.as_ref().map_or(true, |(_, unsettled)| *unsettled) {
            // Some report came too soon to believe, a role is down for its volume's move (or
            // the read failed): look again next pass.
            suspected.store(true, Ordering::Relaxed);
        }
        queued.map(|(n, _)| n)
    }

    /// Publishes again the routes of each environment whose repaired replica succeeded since
    /// (what `rollout::republish_after_repair` asks: its address may have changed), each in a
    /// transaction that also takes the repair off the list, so it is done once. Returns how
    /// many repairs were handled.
    pub async fn republish_repaired(&self, now_ms: i64) -> Result<usize, LedgerError> {
        let keys = self.jobs().repaired(REPUBLISH_BATCH).await?;
        for key in &keys {
            let mut tx = self.write_tx().await?;
            if self.jobs().forget_repaired_in(&mut tx, key).await?
                && let Some((environment, generation, repair, node)) = rows::repair_of(key)
                && let Some(spec) = self.jobs().rollout_spec_in(&mut tx, environment, generation).await?
            {
                let step = rollout::republish_after_repair(&spec, generation, repair, node);
                let jobs: Vec<JobRow<'_>> = step
                    .iter()
                    .map(|(task, node)| JobRow::new(task, node.as_str(), 5, now_ms, None))
                    .collect();
                self.jobs().enqueue_in(&mut tx, &jobs, now_ms).await?;
            }
            tx.commit().await?;
        }
        Ok(keys.len())
    }

    /// The check itself: how many repairs were queued, and whether a missing replica's report
    /// came too soon after its last job to be believed.
    async fn repair_missing_now(&self, now_ms: i64) -> Result<(usize, bool), LedgerError> {
        let reports = self.reported_running(now_ms).await?;
        if reports.is_empty() {
            return Ok((0, false));
        }
        let missing = self.missing_replicas(&reports).await?;
        if missing.is_empty() {
            return Ok((0, false));
        }
        // A role whose volume moves is down on purpose (`store::moves`).
        let moving = self.volumes().moving_roles().await?;
        let mut jobs = Vec::new();
        let mut unsettled = false;
        for (env, role, index, generation, node, seen) in missing {
            if moving.iter().any(|(e, r)| *e == env && *r == role) {
                // Looked at again each pass until the move ends: one that failed leaves its
                // role to start again where it was.
                unsettled = true;
                continue;
            }
            let prefix = format!("app:{env}/{role}/{index}:g{generation}:ensure");
            let asks = self
                .jobs()
                .asks(&env, i64::try_from(generation).unwrap_or(i64::MAX), &node, &prefix)
                .await?;
            let asked = asks.iter().map(|a| (a.pending(), a.updated_at, a.task.as_str()));
            match repair_of(asked, seen) {
                Repair::NotAskedHere => {}
                Repair::Unsettled => unsettled = true,
                Repair::TooMany => {}
                Repair::Ask(task) => jobs.push(NewJob {
                    task,
                    target_node: node,
                    max_attempts: 5,
                    not_before_ms: now_ms,
                }),
            }
        }
        if jobs.is_empty() {
            return Ok((0, unsettled));
        }
        let queued = self.jobs().enqueue(&jobs, now_ms).await?;
        for j in &jobs {
            tracing::info!(key = %j.task.idempotency_key(), node = %j.target_node, "a replica its agent no longer reports: asked again");
        }
        Ok((queued, unsettled))
    }
}

impl Ledger {
    /// Fresh reports: node → (when, what runs there).
    async fn reported_running(&self, now_ms: i64) -> Result<BTreeMap<String, (i64, BTreeSet<Reported>)>, LedgerError> {
        let mut reports = BTreeMap::new();
        for r in self.jobs().fresh_reports(now_ms - FRESH_MS).await? {
            let running: Vec<agent_proto::RunningInstance> = serde_json::from_str(&r.observed).unwrap_or_default();
            let set = running
                .into_iter()
                .map(|i| (i.environment, i.role, i.instance, i.generation))
                .collect();
            reports.insert(r.name, (r.last_seen, set));
        }
        Ok(reports)
    }

    /// Placed replicas of finished rollouts that a fresh report leaves out.
    async fn missing_replicas(
        &self,
        reports: &BTreeMap<String, (i64, BTreeSet<Reported>)>,
    ) -> Result<Vec<Missing>, LedgerError> {
        let mut missing: Vec<Missing> = Vec::new();
        self.jobs()
            .each_finished_rollout(|r| {
                let generation = u64::try_from(r.generation).unwrap_or(0);
                let Ok(placed) = serde_json::from_str::<Placed>(&r.spec) else {
                    return;
                };
                for i in placed.instances {
                    let Some((seen, running)) = reports.get(i.node.as_str()) else {
                        continue;
                    };
                    // A report from before the rollout last changed says nothing of it: every
                    // replica it placed would read as missing (at 10,000 nodes most reports
                    // are minutes old), each a ledger read, every pass. The node's next
                    // report, or the next full check, looks again.
                    if *seen < r.updated_at + SETTLE_MS {
                        continue;
                    }
                    let here = (r.environment.clone(), i.role.to_string(), i.index, generation);
                    if !running.contains(&here) {
                        missing.push((
                            r.environment.clone(),
                            i.role.to_string(),
                            i.index,
                            generation,
                            i.node.to_string(),
                            *seen,
                        ));
                    }
                }
            })
            .await?;
        Ok(missing)
    }
}

/// What to do about a replica missing from a report made at `seen`, from the jobs that asked
/// for it there.
enum Repair {
    /// Never asked for here: not this pass's to repair.
    NotAskedHere,
    /// Its last job ended too shortly before the report (or still goes) to believe it.
    Unsettled,
    /// Repaired [`MAX_REPAIRS`] times already.
    TooMany,
    /// Asked again: the original ask, with the next repair number.
    Ask(Task),
}

/// `asks`: each ask's (still pending, last updated, task).
fn repair_of<'a>(asks: impl Iterator<Item = (bool, i64, &'a str)>, seen: i64) -> Repair {
    let mut original: Option<Task> = None;
    let (mut asked, mut settled) = (0u32, true);
    for (pending, updated_at, task) in asks {
        asked += 1;
        settled &= !pending && updated_at + SETTLE_MS <= seen;
        // The ask that placed it: a rollout's (`…:ensure@node`) or a scale's
        // (`…:ensure@node#r<revision>`), told from a repair by its task, not its key (a
        // scale's key has a `#` too, and its replicas were once never repaired).
        if let Ok(task @ Task::EnsureApplication { repair: 0, .. }) = serde_json::from_str::<Task>(task) {
            original = Some(task);
        }
    }
    let Some(Task::EnsureApplication {
        environment,
        role,
        instance,
        generation,
        spec_hash,
        ..
    }) = original
    else {
        return Repair::NotAskedHere;
    };
    if !settled {
        return Repair::Unsettled;
    }
    if asked > MAX_REPAIRS {
        return Repair::TooMany;
    }
    Repair::Ask(Task::EnsureApplication {
        environment,
        role,
        instance,
        generation,
        spec_hash,
        repair: asked,
    })
}

#[cfg(test)]
mod tests {
    use crate::store::rows::is_repair;
    use crate::store::rows::repair_of;

    #[test]
    fn repairs_are_told_by_their_keys() {
        assert!(is_repair("app:e/web/0:g3:ensure#r1@n1"));
        assert_eq!(repair_of("app:e-1/web/0:g3:ensure#r2@n-1"), Some(("e-1", 3, 2, "n-1")));
        assert_eq!(repair_of("app:e/web/0:g3:ensure@n1"), None);
        assert!(!is_repair("app:e/web/0:g3:ensure@n1"));
        assert!(!is_repair("net:e:g3:ensure@n1"));
    }
}
