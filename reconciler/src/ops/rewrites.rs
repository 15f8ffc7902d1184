//! The applied branch's history: heads refused as rewrites (a head that does not descend from
//! the commit in force), an admin's approval of one (an event names the token), and a pass now.

use super::{Answer, OpError, Ops, wire};
use crate::store::now_ms;
use crate::store::rewrites::Approval;
use operator_proto::revisions::{ApproveRewrite, Approved, Rewrites};
use operator_proto::status::ReconcileAsked;
use std::sync::atomic::Ordering;

impl Ops {
    /// `GET /v1/rewrites`, newest first.
    pub async fn rewrites(&self, limit: u32) -> Answer<Rewrites> {
        Ok(Rewrites {
            rewrites: self
                .ledger
                .revisions()
                .rewrites(limit)
                .await?
                .into_iter()
                .map(wire::rewrite)
                .collect(),
        })
    }

    /// `POST /v1/rewrites/approve`: one refused head approved, judged at the next pass.
    pub async fn approve_rewrite(&self, who: &str, ask: ApproveRewrite) -> Answer<Approved> {
        match self
            .ledger
            .revisions()
            .approve_rewrite(&ask.branch, &ask.sha, who, now_ms())
            .await?
        {
            Approval::Approved => {
                tracing::warn!(branch = %ask.branch, sha = %ask.sha, token = %who, "history rewrite approved");
                self.hub.hint.notify_one();
                Ok(Approved {
                    approved: true,
                    already: false,
                })
            }
            Approval::AlreadyApproved => Ok(Approved {
                approved: true,
                already: true,
            }),
            Approval::NotPending => Err(OpError::not_found(
                "rewrite-not-pending",
                "that head of that branch was not refused as a rewrite",
            )),
        }
    }

    /// `POST /v1/reconcile`: a fetch and a pass now (a standby's leader keeps its schedule).
    pub fn reconcile_now(&self) -> ReconcileAsked {
        let passes_before = self.hub.passes.load(Ordering::Relaxed);
        self.hub.fetch_hint.notify_one();
        self.hub.hint.notify_one();
        ReconcileAsked {
            leader: self.hub.leader.load(Ordering::Relaxed),
            passes_before,
        }
    }
}
