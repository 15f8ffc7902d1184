//! A scale at the same generation (replicas added or removed, a replica moved off a node):
//! the new replicas' jobs now, the removals held until they are up, the specs they replace
//! kept as retired until the scale's jobs end.

use crate::store::{JobRow, Ledger, LedgerError};
use state_schema::generations::Scale;
use state_schema::release::Change;
use state_schema::rollout::{self};

type Tx = crate::store::WriteTx;

use super::deploy::Applied;

impl Ledger {
    /// Scales deployments at their current generation: the stored spec becomes the new one,
    /// and the instance delta is queued at once, in the order it must run: infrastructure on
    /// new nodes, new replicas, their ingress; then ingress leaves nodes, replicas go, and
    /// networks of nodes left behind. Nothing else of the generation runs again.
    pub(super) async fn write_scales(
        &self,
        tx: &mut Tx,
        scales: &[Scale],
        revision: i64,
        now_ms: i64,
        applied: &mut Applied,
    ) -> Result<(), LedgerError> {
        let mut events: Vec<(String, String, String)> = Vec::new();
        let mut older = super::advance::Older::default();
        for s in scales {
            let env = s.spec.environment.as_str();
            let removes = matches!(&s.change, Change::Scale { removed, .. } if !removed.is_empty());
            self.deployments()
                .rescale(tx, &s.spec, &s.spec_hash, revision, removes, now_ms)
                .await?;
            // An earlier scale's held removals of what this one puts back go.
            let generation = i64::try_from(s.generation).unwrap_or(i64::MAX);
            let patterns: Vec<String> = rollout::held_conflicts(&s.spec, s.generation, &s.change)
                .iter()
                .map(|(task, node)| format!("{}#r%", crate::store::job_key(task, node.as_str())))
                .collect();
            self.jobs()
                .cancel_held_in(tx, env, generation, &patterns, now_ms)
                .await?;
            let (first, then) = rollout::scale_tasks(&s.spec, s.generation, &s.change);
            let first = older.shape(self, tx, first).await?;
            if first.is_empty() && then.is_empty() {
                continue;
            }
            // What waits for the replicas that replace the ones it removes is queued held, and
            // released when the rest of the scale succeeded (`Ledger::release_scale_in`).
            let rows: Vec<JobRow<'_>> = first
                .iter()
                .map(|(task, node)| JobRow::scaled(task, node.as_str(), revision, now_ms, false))
                .chain(
                    then.iter()
                        .map(|(task, node)| JobRow::scaled(task, node.as_str(), revision, now_ms, true)),
                )
                .collect();
            let added = self.jobs().enqueue_in(tx, &rows, now_ms).await?;
            applied.jobs_queued += added.len();
            applied.scales.push((env.to_owned(), s.generation));
            if let Change::Scale {
                added,
                removed,
                certificates_changed,
                ..
            } = &s.change
            {
                if !added.is_empty() || !removed.is_empty() {
                    events.push((
                        "deployment-scaled".into(),
                        env.to_owned(),
                        format!(
                            "generation {}: {} replicas added, {} removed",
                            s.generation,
                            added.len(),
                            removed.len()
                        ),
                    ));
                }
                for hostname in certificates_changed {
                    events.push((
                        "certificate-rotated".into(),
                        env.to_owned(),
                        format!(
                            "{hostname}: the brought certificate changed in Git; published again at generation {} on every node that serves it, no replica restarted",
                            s.generation
                        ),
                    ));
                }
            }
        }
        self.events().events_in(tx, now_ms, &events).await
    }
}
