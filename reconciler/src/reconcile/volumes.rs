//! The end of a volume's retention: a released volume whose `retainDays` are over (or whose
//! removal an admin asked for) gets a `remove-volume` job on its node, and its row goes once
//! that job succeeded. Reads, then writes; the decision is the row's own (released, expired).

use crate::store::rows::JobState;
use crate::store::{Ledger, LedgerError};
use state_schema::task::Task;

/// How often the sweep runs (a pass runs it when this much time went by).
pub const SWEEP_EVERY_MS: i64 = 60_000;

/// What one sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Rows forgotten: their nodes removed the volumes.
    pub forgotten: usize,
    /// Removals queued or under way: the next pass sweeps again, not a minute later.
    pub pending: usize,
}

/// Queues the removal of every expired volume (a job is its key: queued once) and forgets
/// those whose removal succeeded.
pub async fn sweep(ledger: &Ledger, now_ms: i64) -> Result<Swept, LedgerError> {
    let due = ledger.volumes().expired_volumes(now_ms).await?;
    let mut swept = Swept::default();
    for chunk in due.chunks(64) {
        let tasks: Vec<(Task, String)> = chunk
            .iter()
            .filter_map(|r| Some((r.removal()?, r.node.clone())))
            .collect();
        let keys = ledger.certificates().enqueue_tasks(&tasks, now_ms).await?;
        let outcomes = ledger.certificates().job_outcomes(&keys).await?;
        for row in chunk {
            let Some(task) = row.removal() else { continue };
            let key = crate::store::job_key(&task, &row.node);
            match outcomes.iter().find(|o| o.key == key).map(|o| o.state) {
                Some(JobState::Succeeded) => {
                    if ledger.volumes().forget_volume(row, now_ms).await? {
                        swept.forgotten += 1;
                    }
                }
                // Failed for good (a volume Docker keeps in use, say): its job says why, and
                // the row stays for `pl volumes` to show.
                Some(JobState::Dead | JobState::Failed | JobState::Cancelled) => {}
                _ => swept.pending += 1,
            }
        }
    }
    Ok(swept)
}
