//! Catching a branch up: which of its commits to judge and against which base (the applied
//! branch only moves forward; a rebased preview is judged against its merge base with the
//! applied branch's accepted commit), then judging and applying them oldest first.

use crate::reconcile::{DaemonError, PassReport, Reconciler};
use crate::store::now_ms;
use crate::store::rewrites::RewriteStatus;
use gix::ObjectId;
use state_repo::revision::{Judgement, Preview, Trust, judge};
use state_repo::source::Commit;
use std::sync::Arc;

/// What the ledger says of a branch, for [`Reconciler::decide`].
struct BranchState {
    head: ObjectId,
    preview: bool,
    last_judged: Option<ObjectId>,
    accepted: Option<ObjectId>,
    /// For a preview: the applied branch's accepted commit.
    applied_accepted: Option<ObjectId>,
    rewrite_approved: bool,
}

/// What to do on a branch this pass.
enum Catchup {
    /// Judge these commits, oldest first, against `base`.
    Judge {
        commits: Vec<ObjectId>,
        base: Option<ObjectId>,
    },
    /// The applied branch's head does not descend from its last accepted commit.
    Rewritten { accepted: ObjectId },
}

impl Reconciler {
    /// Which commits of a branch to judge, and against what (blocking: it walks Git).
    ///
    /// The applied branch only moves forward: a head that does not descend from the last
    /// accepted commit is a rewrite, refused unless an admin approved that head. A preview
    /// branch is rebased as a matter of course: when its head no longer descends from its own
    /// last accepted commit, it is judged afresh against its merge base with the applied
    /// branch's accepted commit.
    fn decide(&self, b: &BranchState) -> Result<Catchup, DaemonError> {
        let repo = self.repo()?;
        let head = b.head;
        let descends = |a: ObjectId| repo.is_ancestor(a, head);
        // Judging resumes after the last judged commit while the head still descends from it.
        let resume = match b.last_judged {
            Some(l) if descends(l)? => Some(l),
            _ => None,
        };
        if !b.preview {
            if let Some(a) = b.accepted
                && !descends(a)?
            {
                if !b.rewrite_approved {
                    return Ok(Catchup::Rewritten { accepted: a });
                }
                return Ok(Catchup::Judge {
                    commits: vec![head],
                    base: repo.merge_base(a, head)?,
                });
            }
            let commits = match resume.or(b.accepted) {
                Some(from) => repo.first_parent_range(Some(from), head)?,
                None => vec![head],
            };
            return Ok(Catchup::Judge {
                commits,
                base: b.accepted,
            });
        }
        let base = match b.accepted {
            Some(a) if descends(a)? => Some(a),
            _ => match b.applied_accepted {
                Some(m) => repo.merge_base(m, head)?,
                None => None,
            },
        };
        let commits = match resume {
            Some(from) => repo.first_parent_range(Some(from), head)?,
            None => vec![head],
        };
        Ok(Catchup::Judge { commits, base })
    }

    /// Judges and applies, oldest first, the commits of `branch` after the last one judged, at
    /// most `limit` of them (`report.more` says when some wait).
    /// A branch seen for the first time starts at its head.
    pub(crate) async fn catch_up(
        self: &Arc<Self>,
        branch: &str,
        head: ObjectId,
        limit: usize,
        report: &mut PassReport,
    ) -> Result<(), DaemonError> {
        let Some((state, accepted)) = self.branch_state(branch, head).await? else {
            return Ok(());
        };
        let rewrite_approved = state.rewrite_approved;
        let preview = state.preview;
        let me = Arc::clone(self);
        let (plan, repository) = tokio::task::spawn_blocking(move || {
            let plan = me.decide(&state)?;
            // A preview is derived under the applied branch's accepted Repository document.
            let repository = match state.applied_accepted {
                Some(id) => state_repo::load::repository_at(
                    &*me.repo()?,
                    &Commit {
                        spec: id.to_string(),
                        id,
                    },
                )?,
                None => None,
            };
            Ok::<_, DaemonError>((plan, repository))
        })
        .await
        .map_err(|e| DaemonError::Join(e.to_string()))??;
        let (commits, mut base) = match plan {
            Catchup::Rewritten { accepted } => {
                let head_hex = head.to_string();
                if self
                    .ledger
                    .revisions()
                    .record_rewrite(branch, &head_hex, &accepted.to_string(), now_ms())
                    .await?
                {
                    report.judged += 1;
                    report.rejected += 1;
                    tracing::warn!(branch, sha = %head, accepted = %accepted, code = crate::store::rewrites::HISTORY_REWRITTEN, "the head does not descend from the last accepted commit; it stays in force until an admin approves the rewrite");
                }
                return Ok(());
            }
            Catchup::Judge { commits, base } => (commits, base),
        };
        let repository = Arc::new(repository);
        for (i, id) in commits.into_iter().enumerate() {
            if i == limit {
                // The rest on the next pass: it resumes after the last revision judged here.
                report.more = true;
                break;
            }
            if i > 0 {
                // A commit accepted earlier in this range is the next one's base.
                base = oid(self.ledger.revisions().last_accepted(branch).await?).or(base);
            }
            let judgement = self.judge_commit(branch, id, base, preview, &repository).await?;
            // An approved rewrite back to a commit judged before: applied again, in force again.
            let over = accepted.as_deref().filter(|_| rewrite_approved);
            self.apply_judged(branch, preview, judgement, over, report).await?;
        }
        Ok(())
    }

    /// What the ledger says of `branch` at `head`, and its last accepted commit; `None` when
    /// there is nothing to do (its head was judged, or it is a refused rewrite that waits).
    async fn branch_state(
        &self,
        branch: &str,
        head: ObjectId,
    ) -> Result<Option<(BranchState, Option<String>)>, DaemonError> {
        let head_hex = head.to_string();
        let last_judged = self.ledger.revisions().last_judged(branch).await?;
        if last_judged.as_deref() == Some(head_hex.as_str()) {
            return Ok(None);
        }
        let preview = self.is_preview(branch);
        let accepted = self.ledger.revisions().last_accepted(branch).await?;
        let rewrite = match (preview, &accepted) {
            (false, Some(a)) => self.ledger.revisions().rewrite_status(branch, &head_hex, a).await?,
            _ => None,
        };
        if rewrite == Some(RewriteStatus::Pending) {
            return Ok(None); // refused already; waits for an admin or a new push
        }
        let applied_accepted = match preview {
            true => oid(self
                .ledger
                .revisions()
                .last_accepted(&self.config.source.branch)
                .await?),
            false => None,
        };
        let state = BranchState {
            head,
            preview,
            last_judged: oid(last_judged),
            accepted: oid(accepted.clone()),
            applied_accepted,
            rewrite_approved: rewrite == Some(RewriteStatus::Approved),
        };
        Ok(Some((state, accepted)))
    }

    /// Judges commit `id` of `branch` against `base` (blocking: it reads Git and checks
    /// signatures).
    async fn judge_commit(
        self: &Arc<Self>,
        branch: &str,
        id: ObjectId,
        base: Option<ObjectId>,
        preview: bool,
        repository: &Arc<Option<state_schema::parse::Located>>,
    ) -> Result<Judgement, DaemonError> {
        let me = Arc::clone(self);
        let repository = Arc::clone(repository);
        let owned_branch = branch.to_owned();
        tokio::task::spawn_blocking(move || {
            let repo = me.repo()?;
            let commit = Commit {
                spec: id.to_string(),
                id,
            };
            let trust = Trust {
                signers: &me.signers,
                policy: me.policy.as_ref(),
                seen_at: Some(now_ms() / 1000),
                preview: preview.then(|| Preview {
                    branch: &owned_branch,
                    repository: repository.as_ref().as_ref(),
                }),
            };
            judge(&repo, &commit, base, &trust).map_err(DaemonError::from)
        })
        .await
        .map_err(|e| DaemonError::Join(e.to_string()))?
    }

    /// Applies a judged commit (again over `over`, an approved rewrite back to a commit judged
    /// before) and counts it in `report`.
    async fn apply_judged(
        &self,
        branch: &str,
        preview: bool,
        mut judgement: Judgement,
        over: Option<&str>,
        report: &mut PassReport,
    ) -> Result<(), DaemonError> {
        let lost_after_ms = self.config.control.lost_after_ms();
        let mut applied = match self.rebuild_waiting() {
            // A rebuild waits for its nodes' reports: recorded, planned when it ends.
            true => {
                self.ledger
                    .apply_revision_held(branch, preview, &mut judgement, now_ms(), lost_after_ms)
                    .await?
            }
            false => {
                self.ledger
                    .apply_revision(branch, preview, &mut judgement, now_ms(), lost_after_ms)
                    .await?
            }
        };
        if let (false, Some(over)) = (applied.recorded, over) {
            applied = self
                .ledger
                .apply_revision_again(branch, &mut judgement, over, now_ms(), lost_after_ms)
                .await?;
        }
        if !applied.recorded {
            return Ok(());
        }
        report.judged += 1;
        if judgement.accepted() {
            report.accepted += 1;
            tracing::info!(branch, sha = %judgement.sha, rollouts = applied.rollouts.len(), teardowns = applied.teardowns.len(), jobs = applied.jobs_queued, "revision accepted");
        } else {
            report.rejected += 1;
            let codes: Vec<&str> = judgement.reasons.iter().map(|r| r.code.as_str()).collect();
            tracing::warn!(branch, sha = %judgement.sha, reasons = ?codes, "revision rejected; the last accepted one stays in force");
        }
        report.jobs_queued += applied.jobs_queued;
        report.teardowns += applied.teardowns.len();
        Ok(())
    }
}

/// A commit id the ledger wrote as hex.
fn oid(s: Option<String>) -> Option<ObjectId> {
    s.and_then(|s| ObjectId::from_hex(s.as_bytes()).ok())
}
