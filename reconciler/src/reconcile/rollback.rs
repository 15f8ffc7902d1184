//! Rollbacks in the pass: an asked rollback (`store::rollbacks`) becomes its generation, the
//! previous release's spec rolled out again without its release step
//! (`state_schema::rollout::rollback_steps`), and a released hold has its branch's commit in
//! force planned again, so the environment goes back to what Git says without a new commit.

use crate::reconcile::deploy::Applied;
use crate::reconcile::{DaemonError, Reconciler};
use crate::store::rollbacks::Held;
use crate::store::{Ledger, LedgerError, now_ms};
use state_repo::revision::{Preview, Trust, judge};
use state_repo::source::Commit;
use state_schema::generations::{Action, Start};
use std::sync::Arc;

impl Ledger {
    /// Starts every asked rollback whose deployment still stands at the generation it rolls
    /// back; one that moved on meanwhile (a commit, a re-placement) is void, with an event.
    /// Returns the rollbacks started and the branches with released holds.
    pub async fn start_rollbacks(&self, now_ms: i64) -> Result<(Applied, Vec<String>), LedgerError> {
        let mut tx = self.write_tx().await?;
        let held = self.deployments().held(&mut tx).await?;
        let mut applied = Applied::default();
        let mut released = Vec::new();
        for h in held {
            let Held {
                environment: env,
                branch,
                hold,
                generation,
                spec,
                mut retired,
                previous,
                revision,
            } = h;
            if hold.released {
                if !released.contains(&branch) {
                    released.push(branch);
                }
                continue;
            }
            if generation == hold.generation {
                continue; // started already
            }
            let previous = previous.filter(|(g, _, _)| *g == hold.to);
            let (true, Some((_, to_spec, to_hash))) = (generation == hold.from, previous) else {
                self.deployments().set_hold(&mut tx, &env, "").await?;
                let why = format!("generation {} moved on to {generation} before it started", hold.from);
                self.events()
                    .event(&mut tx, now_ms, "rollback-void", &env, &why)
                    .await?;
                continue;
            };
            // The previous release at today's replica counts and placement: a rollback takes
            // the release back, not a scale made since.
            let back = state_schema::generations::rollback_spec(&to_spec, &spec);
            let (to_spec, to_hash) = if back == to_spec {
                (to_spec, to_hash)
            } else {
                let hash = state_schema::canonical::hash(&back);
                (back, hash)
            };
            if !retired.contains(&spec) {
                retired.push(spec);
            }
            self.ensure_subnets(&mut tx, &branch, &Ledger::subnet_wants(&to_spec), now_ms)
                .await?;
            self.volumes().record_volumes(&mut tx, &to_spec, now_ms).await?;
            let start = Start {
                action: Action::Rollout,
                spec: to_spec,
                spec_hash: to_hash,
                retired,
                generation: hold.generation,
                existed: true,
                rollback: true,
            };
            self.write_starts(
                &mut tx,
                &branch,
                std::slice::from_ref(&start),
                revision,
                now_ms,
                &mut applied,
            )
            .await?;
            let detail = format!(
                "generation {}: generation {}'s release again, rolled back from {} by {}",
                hold.generation, hold.to, hold.from, hold.by
            );
            self.events()
                .event(&mut tx, now_ms, "deployment-rollback", &env, &detail)
                .await?;
            applied.rollouts.push((env, hold.generation));
        }
        tx.commit().await?;
        Ok((applied, released))
    }
}

impl Reconciler {
    /// The pass's part: asked rollbacks started, released holds' branches planned again from
    /// their commit in force (judged again: trust is checked before the state is read).
    pub(crate) async fn rollbacks(self: &Arc<Self>) -> Result<usize, DaemonError> {
        let (applied, released) = self.ledger.start_rollbacks(now_ms()).await?;
        let mut moved = applied.rollouts.len();
        for branch in released {
            let Some((mut judgement, preview)) = self.judged_in_force(&branch).await? else {
                continue;
            };
            if !judgement.accepted() {
                let why: Vec<&str> = judgement.reasons.iter().map(|r| r.code.as_str()).collect();
                self.ledger
                    .deployments()
                    .end_released(&branch, &why.join(", "), now_ms())
                    .await?;
                continue;
            }
            let applied = self
                .ledger
                .replan(
                    &branch,
                    preview,
                    &mut judgement,
                    now_ms(),
                    self.config.control.lost_after_ms(),
                )
                .await?;
            moved += applied.rollouts.len() + applied.scales.len();
        }
        Ok(moved)
    }

    /// `branch`'s commit in force, judged again now (trust is checked before the state is
    /// read), and whether the branch is a preview; `None` when it has no accepted commit.
    pub(crate) async fn judged_in_force(
        self: &Arc<Self>,
        branch: &str,
    ) -> Result<Option<(state_repo::revision::Judgement, bool)>, DaemonError> {
        let Some(sha) = self.ledger.revisions().last_accepted(branch).await? else {
            return Ok(None);
        };
        let preview = self.is_preview(branch);
        let applied_accepted = match preview {
            true => {
                self.ledger
                    .revisions()
                    .last_accepted(&self.config.source.branch)
                    .await?
            }
            false => None,
        };
        let me = Arc::clone(self);
        let owned = branch.to_owned();
        let judgement = tokio::task::spawn_blocking(move || {
            let repo = me.repo()?;
            let id =
                gix::ObjectId::from_hex(sha.as_bytes()).map_err(|e| DaemonError::Join(format!("a stored sha: {e}")))?;
            let repository = match applied_accepted.and_then(|a| gix::ObjectId::from_hex(a.as_bytes()).ok()) {
                Some(a) => state_repo::load::repository_at(
                    &repo,
                    &Commit {
                        spec: a.to_string(),
                        id: a,
                    },
                )?,
                None => None,
            };
            let commit = Commit { spec: sha, id };
            let trust = Trust {
                signers: &me.signers,
                policy: me.policy.as_ref(),
                seen_at: Some(now_ms() / 1000),
                preview: preview.then(|| Preview {
                    branch: &owned,
                    repository: repository.as_ref(),
                }),
            };
            // Against itself: nothing changed since it was accepted, so the path rules
            // hold as they did; the signature is checked again.
            judge(&repo, &commit, Some(id), &trust).map_err(DaemonError::from)
        })
        .await
        .map_err(|e| DaemonError::Join(e.to_string()))??;
        Ok(Some((judgement, preview)))
    }
}
