//! Completions: outcomes recorded against a live lease (its lease and fencing tokens), set-based
//! (a batch costs a few statements), each refused alone when stale or another node's, with
//! retries backed off and a repaired replica kept for the pass to publish its routes again.

use super::jobs::{Completion, Outcome, Refused, backoff_ms};
use super::rows::JobState;
use super::{Backend, LedgerError, WriteTx, rows};
use sqlx::FromRow;
use std::collections::{BTreeSet, HashMap};

/// A leased job as `complete` finds it, locked for the rest of the transaction.
#[derive(FromRow)]
struct LiveLease {
    id: i64,
    target_node: String,
    /// 1 when the lease is live (leased, not expired), else 0.
    live: i64,
    attempts: i64,
    max_attempts: i64,
    key: String,
    lease_token: Option<String>,
    fencing_token: Option<i64>,
    environment: Option<String>,
    generation: Option<i64>,
    /// The rollout step it belongs to (none for a scale's or a repair's job).
    step: Option<i64>,
    created_at: i64,
}

/// What a group of completions moved on besides the jobs themselves, for the caller to tell.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ends {
    /// Drift repairs that succeeded (their routes wait for the pass).
    pub repaired: usize,
    /// Jobs a set-up's success made due (`release_set_up_in`): their nodes' waiting leases
    /// may be woken at once.
    pub released: u64,
}

/// What one batch of completions writes.
#[derive(Default)]
struct Recorded<'c> {
    /// Job ids by their new state (all but retries, which each get their own `not_before`).
    by_state: std::collections::BTreeMap<JobState, Vec<i64>>,
    retries: Vec<(i64, i64)>,
    /// (job, fencing token, outcome, detail)
    results: Vec<(i64, i64, &'c str, String)>,
    /// (kind, subject, detail)
    events: Vec<(String, String, String)>,
    /// Repairs that succeeded (their job keys).
    repaired: Vec<String>,
    /// Backups that ended for good: (key, node, what it saved, reason).
    backups: Vec<(String, String, Option<&'c super::backups::Saved>, String)>,
    /// Restores that ended for good: (key, node, succeeded, reason).
    restores: Vec<(String, String, bool, String)>,
    /// Canary measures that succeeded: (job, what was measured).
    measures: Vec<(i64, super::jobs::Measure)>,
    /// Replicas that became healthy: (environment, role, node), for volume moves.
    up: Vec<(String, String, String)>,
    /// Set-ups that succeeded: (environment, generation, node, step), whose node's held
    /// replicas may now be due (`release_set_up_in`).
    set_up: BTreeSet<(String, i64, String, i64)>,
    /// Scales with a job that succeeded: (environment, generation, revision).
    scaled: BTreeSet<(String, i64, i64)>,
    /// Scales with a job that ended, succeeded or not: (environment, generation).
    scales_ended: BTreeSet<(String, i64)>,
    /// What the batch adds to the metrics' counters: (family, labels) → how many.
    tallies: std::collections::BTreeMap<(&'static str, String), i64>,
}

impl crate::store::Jobs<'_> {
    /// Records outcomes. A stale token is refused and records nothing: no result, no event,
    /// no state change. Set-based: a batch costs a few statements, not a few per job.
    pub async fn complete(
        &self,
        completions: &[Completion],
        now_ms: i64,
    ) -> Result<Vec<Result<(), Refused>>, LedgerError> {
        self.complete_as(completions, &[], now_ms).await
    }

    /// [`Ledger::complete`], each completion made by the node in `callers` at its index (none
    /// given: no check): a job targeted at another node is refused with `NotYourJob`, in the
    /// same transaction that records the others, and records nothing.
    pub async fn complete_as(
        &self,
        completions: &[Completion],
        callers: &[String],
        now_ms: i64,
    ) -> Result<Vec<Result<(), Refused>>, LedgerError> {
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.write_tx().await?;
        let out = self
            .complete_as_in(&mut tx, completions, callers, now_ms, &mut Ends::default())
            .await?;
        tx.commit().await?;
        Ok(out)
    }

    /// [`Ledger::complete_as`] in the caller's transaction: per chunk of 500, the live leases
    /// read and locked, each completion checked against them, then what they end written.
    /// Adds to `ends` what the completions moved on (repairs, jobs released).
    pub(crate) async fn complete_as_in(
        &self,
        tx: &mut WriteTx,
        completions: &[Completion],
        callers: &[String],
        now_ms: i64,
        ends: &mut Ends,
    ) -> Result<Vec<Result<(), Refused>>, LedgerError> {
        let mut out = vec![Err(Refused::StaleFencingToken); completions.len()];
        for chunk_start in (0..completions.len()).step_by(500) {
            let chunk = &completions[chunk_start..(chunk_start + 500).min(completions.len())];
            let (live, owners) = self.live_leases(tx, chunk, now_ms).await?;
            let callers = callers.get(chunk_start..).unwrap_or_default();
            let rec = recorded(chunk, callers, live, &owners, &mut out[chunk_start..], now_ms);
            ends.repaired += rec.repaired.len();
            ends.released += self.write_recorded(tx, rec, now_ms).await?;
        }
        Ok(out)
    }

    /// The leases of `chunk`'s jobs, locked until commit: the live ones by job, and every
    /// job's node.
    async fn live_leases(
        &self,
        tx: &mut WriteTx,
        chunk: &[Completion],
        now_ms: i64,
    ) -> Result<(HashMap<i64, LiveLease>, HashMap<i64, String>), LedgerError> {
        // The live leases among the batch, locked until commit.
        let ids = self.id_set(chunk.iter().map(|c| c.token.job_id));
        let q = format!(
            "SELECT id, attempts, max_attempts, key, lease_token, fencing_token, target_node, environment, generation, step, created_at, \
             CASE WHEN state = 'leased' AND lease_expires_at >= ? THEN 1 ELSE 0 END AS live FROM jobs WHERE {}{}",
            ids.condition("id"),
            if self.backend == Backend::Postgres {
                " FOR UPDATE"
            } else {
                ""
            },
        );
        let query = ids.bind(sqlx::query_as::<_, LiveLease>(self.sql(&q)).bind(now_ms));
        let mut live: std::collections::HashMap<i64, LiveLease> = std::collections::HashMap::new();
        let mut owners: std::collections::HashMap<i64, String> = std::collections::HashMap::new();
        for mut r in query.fetch_all(&mut **tx).await? {
            owners.insert(r.id, std::mem::take(&mut r.target_node));
            if r.live == 1 {
                live.insert(r.id, r);
            }
        }
        Ok((live, owners))
    }

    /// What one chunk's judged completions end, written. Returns how many held jobs were made
    /// due.
    async fn write_recorded(&self, tx: &mut WriteTx, rec: Recorded<'_>, now_ms: i64) -> Result<u64, LedgerError> {
        for (state, ids) in &rec.by_state {
            let ids = self.id_set(ids.iter().copied());
            let q = format!(
                "UPDATE jobs SET state = ?, lease_token = NULL, lease_expires_at = NULL, updated_at = ? WHERE {}",
                ids.condition("id")
            );
            ids.bind(sqlx::query(self.sql(&q)).bind(state.as_str()).bind(now_ms))
                .execute(&mut **tx)
                .await?;
        }
        // Their routes are published again by the pass (`reconcile::drift`).
        self.mark_repaired_in(tx, &rec.repaired, now_ms).await?;
        let set_up: Vec<(&str, i64, &str, i64)> = rec
            .set_up
            .iter()
            .map(|(env, generation, node, step)| (env.as_str(), *generation, node.as_str(), *step))
            .collect();
        let released = self.release_set_up_in(tx, &set_up, now_ms).await?;
        for (env, generation, revision) in &rec.scaled {
            self.release_scale_in(tx, env, *generation, *revision, now_ms).await?;
        }
        for (env, generation) in &rec.scales_ended {
            self.deployments().settle_scale_in(tx, env, *generation, now_ms).await?;
        }
        for (key, node, saved, reason) in &rec.backups {
            let ended = super::backups::Ended {
                key,
                node,
                saved: *saved,
                reason: if saved.is_some() { "" } else { reason },
            };
            self.backups().record_backup_in(tx, &ended, now_ms).await?;
        }
        for (key, node, succeeded, reason) in &rec.restores {
            self.backups()
                .record_restore_in(tx, key, node, *succeeded, reason, now_ms)
                .await?;
        }
        if !rec.up.is_empty() {
            self.volumes().record_moves_up_in(tx, &rec.up, now_ms).await?;
        }
        for (id, m) in &rec.measures {
            // A job completes once (its lease token is spent), so one row per job.
            sqlx::query(self.sql(
                "INSERT INTO step_measures (job_id, requests, errors, p95_micros, logged) VALUES (?, ?, ?, ?, ?)",
            ))
            .bind(*id)
            .bind(m.requests)
            .bind(m.errors)
            .bind(m.p95_micros)
            .bind(i64::from(m.logged))
            .execute(&mut **tx)
            .await?;
        }
        for (id, not_before) in &rec.retries {
            sqlx::query(self.sql("UPDATE jobs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL, not_before = ?, updated_at = ? WHERE id = ?"))
                .bind(*not_before)
                .bind(now_ms)
                .bind(*id)
                .execute(&mut **tx)
                .await?;
        }
        if !rec.results.is_empty() {
            if self.backend == Backend::Postgres {
                // One statement text for any number of results (see `IdSet`).
                let rows: Vec<(i64, i64, &str, &str)> = rec
                    .results
                    .iter()
                    .map(|(id, fencing, outcome, detail)| (*id, *fencing, *outcome, detail.as_str()))
                    .collect();
                sqlx::query(self.sql(
                    "INSERT INTO job_results (job_id, fencing_token, outcome, detail, at) \
                     SELECT (r->>0)::int8, (r->>1)::int8, r->>2, r->>3, ? FROM json_array_elements(?::json) AS r",
                ))
                .bind(now_ms)
                .bind(serde_json::to_string(&rows)?)
                .execute(&mut **tx)
                .await?;
            } else {
                let rows = vec!["(?, ?, ?, ?, ?)"; rec.results.len()].join(", ");
                let mut query = sqlx::query(self.sql(&format!(
                    "INSERT INTO job_results (job_id, fencing_token, outcome, detail, at) VALUES {rows}"
                )));
                for (id, fencing, outcome, detail) in &rec.results {
                    query = query
                        .bind(*id)
                        .bind(*fencing)
                        .bind(*outcome)
                        .bind(detail.clone())
                        .bind(now_ms);
                }
                query.execute(&mut **tx).await?;
            }
            self.events().events_in(tx, now_ms, &rec.events).await?;
        }
        let tallies = rec.tallies.iter().map(|((f, l), n)| ((*f, l.as_str()), *n)).collect();
        tx.tally(now_ms, &tallies);
        Ok(released)
    }
}

/// A job's end in the metrics' counters (`store::tallies`): by task kind, outcome and
/// failure code; a route published also by how long it took from its job's queueing.
fn count(rec: &mut Recorded<'_>, key: &str, state: JobState, detail: &str, took_ms: i64) {
    use super::tallies as tally;
    let outcome = match state {
        JobState::Queued => "retried",
        s => s.as_str(),
    };
    let failed = state != JobState::Succeeded;
    let code = failed.then(|| agent_proto::codes::failure_code(detail)).flatten();
    *rec.tallies
        .entry((tally::JOBS, tally::job_labels(key, outcome, code, failed)))
        .or_default() += 1;
    if state == JobState::Succeeded && tally::publishes_routes(key) {
        let ms = took_ms.max(0);
        let le = tally::bucket(ms, tally::ROUTE_PUBLICATION_BOUNDS);
        *rec.tallies.entry((tally::ROUTE_PUBLICATION, le)).or_default() += 1;
        *rec.tallies
            .entry((tally::ROUTE_PUBLICATION, tally::SUM_MS.to_owned()))
            .or_default() += ms;
    }
}

/// What a job that succeeded on `node` moves on: a replica up (a volume's move waits for it),
/// an environment set up (the replicas held with it on that node).
fn succeeded(
    rec: &mut Recorded<'_>,
    key: &str,
    node: &str,
    (env, generation, step): (Option<&str>, Option<i64>, Option<i64>),
) {
    if let Some((env, role)) = rows::ensured_role(key) {
        rec.up.push((env.to_owned(), role.to_owned(), node.to_owned()));
    }
    if rows::sets_up(key)
        && let (Some(env), Some(generation), Some(step)) = (env, generation, step)
    {
        rec.set_up.insert((env.to_owned(), generation, node.to_owned(), step));
    }
}

/// Each completion of `chunk` (made by the node at its index in `callers`, if given) checked
/// against the live leases: a stale or foreign one keeps its refusal in `out`; the others'
/// new states, retries, results, events and what their ends touch (backups, restores,
/// measures, moves, scales, repairs) are gathered for one write.
fn recorded<'c>(
    chunk: &'c [Completion],
    callers: &[String],
    mut live: HashMap<i64, LiveLease>,
    owners: &HashMap<i64, String>,
    out: &mut [Result<(), Refused>],
    now_ms: i64,
) -> Recorded<'c> {
    let mut rec = Recorded::default();
    for (i, c) in chunk.iter().enumerate() {
        let t = &c.token;
        if let (Some(caller), Some(owner)) = (callers.get(i), owners.get(&t.job_id))
            && caller != owner
        {
            out[i] = Err(Refused::NotYourJob);
            continue;
        }
        let Some(LiveLease {
            attempts,
            max_attempts,
            key,
            lease_token: token,
            fencing_token: fencing,
            environment,
            generation,
            step,
            created_at,
            ..
        }) = live.remove(&t.job_id)
        else {
            continue;
        };
        if token.as_deref() != Some(t.lease_token.as_str()) || fencing != Some(t.fencing_token) {
            continue;
        }
        let (state, outcome, detail) = match &c.outcome {
            Outcome::Succeeded | Outcome::Saved(_) | Outcome::Measured(_) => {
                (JobState::Succeeded, "succeeded", String::new())
            }
            Outcome::Retryable(d) if attempts >= max_attempts => (JobState::Dead, "retryable", d.clone()),
            Outcome::Retryable(d) => {
                rec.retries.push((t.job_id, now_ms + backoff_ms(t.job_id, attempts)));
                (JobState::Queued, "retryable", d.clone())
            }
            Outcome::Permanent(d) => (JobState::Failed, "permanent", d.clone()),
        };
        if let Outcome::Measured(m) = &c.outcome {
            rec.measures.push((t.job_id, *m));
        }
        count(&mut rec, &key, state, &detail, now_ms - created_at);
        if state == JobState::Succeeded {
            let node = owners.get(&t.job_id).map_or("", String::as_str);
            succeeded(&mut rec, &key, node, (environment.as_deref(), generation, step));
        }
        if state != JobState::Queued
            && let (Some(revision), Some(env), Some(generation)) =
                (rows::scaled_revision(&key), environment, generation)
        {
            rec.scales_ended.insert((env.clone(), generation));
            if state == JobState::Succeeded {
                rec.scaled.insert((env, generation, revision));
            }
        }
        if state != JobState::Queued {
            rec.by_state.entry(state).or_default().push(t.job_id);
            if state_schema::task::restore_of_key(&key).is_some() {
                let node = owners.get(&t.job_id).cloned().unwrap_or_default();
                rec.restores
                    .push((key.clone(), node, state == JobState::Succeeded, detail.clone()));
            }
            if state_schema::task::backup_of_key(&key).is_some() || state_schema::task::drill_of_key(&key).is_some() {
                let saved = match &c.outcome {
                    Outcome::Saved(s) => Some(s),
                    _ => None,
                };
                let node = owners.get(&t.job_id).cloned().unwrap_or_default();
                rec.backups.push((key.clone(), node, saved, detail.clone()));
            }
        }
        rec.results.push((t.job_id, t.fencing_token, outcome, detail.clone()));
        if state == JobState::Succeeded && rows::is_repair(&key) {
            // `app:<env>/…@<node>`: the environment's event, as the agent's repairs are.
            let env = key
                .trim_start_matches("app:")
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            let node = key.rsplit('@').next().unwrap_or_default();
            let what = format!("{node}: replica {key} was gone from its node: made again");
            rec.events.push(("drift-repaired".to_owned(), env, what));
            rec.repaired.push(key.clone());
        }
        rec.events.push((format!("job-{}", state.as_str()), key, detail));
        out[i] = Ok(());
    }
    rec
}
