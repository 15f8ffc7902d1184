//! The plan between two accepted revisions, as `pl plan` prints it (the text renderer of
//! `pushleft_plan_render`, without colour): what the web view's revisions screen shows. Only
//! commits the control plane accepted are read (trust before work: a refused or unknown commit's
//! tree is never opened), one plan at a time, its text bounded.

use super::{Answer, Kind, OpError, Ops};
use pushleft_plan_render::{Paint, PlanHeader, Side, plan_text};
use state_repo::source::{Rev, StateRepo};
use std::path::Path;
use std::time::Duration;

/// The most text a plan answers with; past it, a line says where it was cut.
pub const MAX_PLAN_BYTES: usize = 512 * 1024;
/// How long a plan waits for the one before it.
const PLAN_WAIT: Duration = Duration::from_secs(20);

/// The plan's text, and whether it was cut.
pub struct PlanText {
    pub text: String,
    pub cut: bool,
}

fn sha_like(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Ops {
    /// `pl plan --base BASE --head HEAD` of the daemon's repository, for two accepted commits
    /// of the applied branch.
    pub async fn plan_between(&self, base: &str, head: &str) -> Answer<PlanText> {
        if !sha_like(base) || !sha_like(head) {
            return Err(OpError::malformed("base and head are full commit ids (40 hex digits)"));
        }
        for sha in [base, head] {
            match self.ledger.revisions().revision(&self.branch, sha).await? {
                Some((verdict, _)) if verdict == "accepted" => {}
                _ => {
                    return Err(OpError::not_found(
                        "revision-not-accepted",
                        format!("{sha} is not a commit of {} the control plane accepted", self.branch),
                    ));
                }
            }
        }
        let Some(dir) = self.repo_dir.clone() else {
            return Err(OpError::new(
                Kind::Unavailable,
                "repository-unavailable",
                "this daemon has no repository to read",
            ));
        };
        let _turn = tokio::time::timeout(PLAN_WAIT, self.plans.acquire())
            .await
            .map_err(|_| OpError::new(Kind::Pending, "plan-busy", "another plan is being made; try again"))?
            .map_err(OpError::unavailable)?;
        let (base, head) = (base.to_owned(), head.to_owned());
        tokio::task::spawn_blocking(move || render(&dir, &base, &head))
            .await
            .map_err(OpError::unavailable)?
    }
}

/// Reads both trees and renders their plan (blocking: gix and parsing).
fn render(dir: &Path, base: &str, head: &str) -> Answer<PlanText> {
    let repo = StateRepo::open(dir).map_err(OpError::unavailable)?;
    let base = repo.resolve(base).map_err(OpError::unavailable)?;
    let head = repo.resolve(head).map_err(OpError::unavailable)?;
    let header = PlanHeader {
        base: Side {
            rev: Some(base.spec.clone()),
            commit: Some(base.id.to_string()),
        },
        head: Side {
            rev: Some(head.spec.clone()),
            commit: Some(head.id.to_string()),
        },
        merge_base: None,
        signature: None,
    };
    let input = state_repo::load::load_for_plan(&repo, &base, &Rev::Commit(head)).map_err(OpError::unavailable)?;
    let plan = state_schema::plan::plan_scoped(&input.base.state, &input.head.state, input.scope);
    let mut text = plan_text::render(&plan, &header, Paint::new(false));
    let cut = text.len() > MAX_PLAN_BYTES;
    if cut {
        let mut at = MAX_PLAN_BYTES;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
        text.push_str("\n… (cut here: run `pl plan` for the whole plan)\n");
    }
    Ok(PlanText { text, cut })
}
