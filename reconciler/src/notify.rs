//! Feedback where people look: each accepted commit's deployments as commit statuses on the
//! forge (`[forge]`: `pending` while an environment's rollout runs, `success` when it is live,
//! `failure` with the reason when it failed or was rolled back), and events as signed webhooks
//! (`[[hooks]]`). Events are the source: the leader turns those past its cursor into outbox rows
//! (`store::outbox`, one transaction with the cursor), and delivers each target's rows oldest
//! first through the `forge` crate, retrying with backoff until [`MAX_ATTEMPTS`]; the rest is
//! the dead-letter record. Tokens and secrets are read from their files at each call and never
//! reach a row, a log or an error.

use crate::config::{Config, ForgeConfig, HookConfig};
use crate::hub::Hub;
use crate::store::Event;
use crate::store::outbox::{MAX_ATTEMPTS, NewRow, OutboxRow};
use crate::store::{Ledger, LedgerError, now_ms};
use forge::status::{CommitStatus, Forge, Kind, State};
use forge::{Outcome, Secret};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Events read per round.
const BATCH: u32 = 500;
/// The longest wait between two attempts of one row.
const MAX_BACKOFF_MS: i64 = 300_000;

/// Where notifications go, from the configuration.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    pub forge: Option<ForgeConfig>,
    pub hooks: Vec<HookConfig>,
}

impl Targets {
    pub fn of(config: &Config) -> Targets {
        Targets {
            forge: config.forge.clone(),
            hooks: config.hooks.clone(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.forge.is_none() && self.hooks.is_empty()
    }
}

/// What an event means for its commit's status: environment, generation, state, description.
/// `None` for events that say nothing of a commit's deployment, and for a rollback's own
/// generation (its commit is the one rolled back). The details parsed are the reconciler's own
/// (`docs/reconciler.md`, "Events").
pub fn status_of(kind: &str, subject: &str, detail: &str) -> Option<(String, i64, State, String)> {
    if detail.contains(", a rollback") {
        return None;
    }
    let generation = crate::store::events::generation_in;
    let env = subject.to_owned();
    match kind {
        "deployment-rollout" => {
            let g = generation(detail)?;
            Some((env, g, State::Pending, format!("rolling out generation {g}")))
        }
        "deployment-rollout-done" => {
            let g = generation(detail)?;
            Some((env, g, State::Success, format!("live: generation {g} on every replica")))
        }
        "deployment-failed" => {
            let g = generation(detail)?;
            let step = detail.split(", step ").nth(1).unwrap_or("?");
            Some((env, g, State::Failure, format!("generation {g} failed at step {step}")))
        }
        "rollback-automatic" => {
            let g = generation(detail)?;
            let why = detail.split_once("failed its watch: ").map_or(detail, |(_, w)| w);
            let why = why.split("; back to ").next().unwrap_or(why);
            Some((env, g, State::Failure, format!("rolled back: {why}")))
        }
        "deployment-rollback" => {
            // `generation G: generation P's release again, rolled back from C by NAME`; an
            // automatic one said so already (`rollback-automatic`).
            let (_, from) = detail.split_once("rolled back from ")?;
            let (c, by) = from.split_once(" by ")?;
            if by == crate::store::rollbacks::WATCH {
                return None;
            }
            let c: i64 = c.parse().ok()?;
            Some((env, c, State::Failure, format!("rolled back by {by}")))
        }
        _ => None,
    }
}

/// The outbox rows event `e` makes for `targets`; `sha` finds a generation's commit.
async fn rows_of(ledger: &Ledger, targets: &Targets, e: &Event) -> Result<Vec<NewRow>, LedgerError> {
    let mut rows = Vec::new();
    if let Some(f) = &targets.forge
        && let Some((env, generation, state, description)) = status_of(&e.kind, &e.subject, &e.detail)
        && let Some(sha) = ledger.events().generation_sha(&env, generation).await?
    {
        let status = CommitStatus {
            sha,
            context: format!("{}/{env}", f.context),
            state,
            description,
            target_url: f.target_url.clone(),
        };
        rows.push(NewRow {
            target: "forge".into(),
            event_id: e.id,
            kind: e.kind.clone(),
            payload: serde_json::to_string(&status)?,
        });
    }
    for (i, h) in targets.hooks.iter().enumerate() {
        if h.events.contains(&e.kind) {
            let body = serde_json::json!({
                "id": e.id,
                "event": e.kind,
                "subject": e.subject,
                "detail": e.detail,
                "atMs": e.at_ms,
            });
            rows.push(NewRow {
                target: format!("hook:{i}"),
                event_id: e.id,
                kind: e.kind.clone(),
                payload: body.to_string(),
            });
        }
    }
    Ok(rows)
}

/// Turns the events past the cursor into outbox rows (at most [`BATCH`] events a call). A
/// ledger seen for the first time starts at its newest event: history is not replayed to a
/// forge. Returns how many rows were written.
pub async fn collect(ledger: &Ledger, targets: &Targets) -> Result<usize, LedgerError> {
    let now = now_ms();
    let cursor = match ledger.events().outbox_cursor().await? {
        Some(c) => c,
        None => {
            let newest = ledger.views().last_event_id().await?;
            ledger.events().outbox_write(&[], newest, now).await?;
            return Ok(0);
        }
    };
    let events = ledger.events().events_after(cursor, BATCH).await?;
    let Some(last) = events.last().map(|e| e.id) else {
        return Ok(0);
    };
    let mut rows = Vec::new();
    for e in &events {
        rows.extend(rows_of(ledger, targets, e).await?);
    }
    ledger.events().outbox_write(&rows, last, now).await?;
    Ok(rows.len())
}

fn read_secret(path: &Path) -> Result<Secret, String> {
    pushleft_secrets::check_private_file(path).map_err(|m| format!("{}: {m}", path.display()))?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Secret::new(text.trim().to_owned()))
}

/// Sends one row (blocking: run it off the runtime).
fn send(targets: &Targets, row: &OutboxRow) -> Outcome {
    if row.target == "forge" {
        let Some(f) = &targets.forge else {
            return Outcome::Refused("the forge is no longer configured".into());
        };
        let token = match read_secret(&f.token_file) {
            Ok(t) => t,
            Err(e) => return Outcome::Retry(format!("the forge token: {e}")),
        };
        let kind = Kind::parse(&f.kind).unwrap_or(Kind::GitHub);
        let forge = match Forge::new(kind, &f.api, &f.repository, token) {
            Ok(f) => f,
            Err(e) => return Outcome::Refused(e.to_string()),
        };
        let status: CommitStatus = match serde_json::from_str(&row.payload) {
            Ok(s) => s,
            Err(e) => return Outcome::Refused(format!("a stored status: {e}")),
        };
        return match forge.request(&status) {
            Ok(request) => forge::send(&request, |code, body| forge.judge(code, body)),
            Err(e) => Outcome::Refused(e.to_string()),
        };
    }
    let hook = row
        .target
        .strip_prefix("hook:")
        .and_then(|i| i.parse::<usize>().ok())
        .and_then(|i| targets.hooks.get(i));
    let Some(h) = hook else {
        return Outcome::Refused(format!("{} is no longer configured", row.target));
    };
    let secret = match read_secret(&h.secret_file) {
        Ok(s) => s,
        Err(e) => return Outcome::Retry(format!("the hook's secret: {e}")),
    };
    let Some(hook) = forge::hook::Hook::new(&h.url, secret) else {
        return Outcome::Refused("the hook's URL is not one Pushleft calls".into());
    };
    let request = hook.request(row.id, &row.kind, row.payload.as_bytes());
    forge::send(&request, forge::judge_status)
}

/// When a row that failed `attempts` times is tried again: 1 s, 2 s, 4 s… at most 5 min.
pub fn backoff_ms(attempts: i64) -> i64 {
    (1000i64 << attempts.clamp(0, 20)).min(MAX_BACKOFF_MS)
}

/// Delivers each target's due head row (targets at once, each in order); returns how many
/// were delivered.
pub async fn deliver(ledger: &Ledger, targets: &Arc<Targets>) -> Result<usize, LedgerError> {
    let heads = ledger.events().outbox_heads(now_ms()).await?;
    let mut calls = tokio::task::JoinSet::new();
    for row in heads {
        let targets = Arc::clone(targets);
        calls.spawn_blocking(move || {
            let outcome = send(&targets, &row);
            (row, outcome)
        });
    }
    let mut delivered = 0;
    while let Some(done) = calls.join_next().await {
        let Ok((row, outcome)) = done else { continue };
        let now = now_ms();
        match outcome {
            Outcome::Delivered => {
                ledger.events().outbox_delivered(row.id, now).await?;
                delivered += 1;
            }
            Outcome::Retry(why) if row.attempts + 1 < MAX_ATTEMPTS => {
                tracing::warn!(target = %row.target, id = row.id, attempts = row.attempts + 1, reason = %why, "notification not delivered; retrying");
                ledger
                    .events()
                    .outbox_failed(row.id, &why, Some(now + backoff_ms(row.attempts)), now)
                    .await?;
            }
            Outcome::Retry(why) | Outcome::Refused(why) => {
                tracing::warn!(target = %row.target, id = row.id, reason = %why, "notification dead: kept in the outbox's dead letters");
                ledger.events().outbox_failed(row.id, &why, None, now).await?;
            }
        }
    }
    Ok(delivered)
}

/// The leader's notifier: collects and delivers every second, or sooner after this daemon
/// wrote events, until `stopped`.
pub async fn run(
    ledger: Arc<Ledger>,
    hub: Arc<Hub>,
    targets: Targets,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    if targets.is_empty() {
        return;
    }
    let targets = Arc::new(targets);
    loop {
        if hub.leader.load(Ordering::Relaxed) {
            let round = async {
                collect(&ledger, &targets).await?;
                // Rows of targets whose head was delivered go on at once.
                while deliver(&ledger, &targets).await? > 0 {}
                Ok::<_, LedgerError>(())
            };
            if let Err(e) = round.await {
                tracing::warn!(error = %e, "notifications: the next round retries");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = hub.wrote.notified() => {}
            _ = stopped.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_map_to_their_commits_statuses() {
        let s = |k: &str, d: &str| status_of(k, "web-production", d);
        assert_eq!(
            s("deployment-rollout", "generation 4"),
            Some((
                "web-production".into(),
                4,
                State::Pending,
                "rolling out generation 4".into()
            ))
        );
        assert_eq!(
            s("deployment-rollout-done", "generation 4, watched for 30 s").map(|x| (x.1, x.2)),
            Some((4, State::Success))
        );
        assert_eq!(
            s("deployment-failed", "generation 5, step 2").map(|x| x.3),
            Some("generation 5 failed at step 2".into())
        );
        assert_eq!(
            s(
                "rollback-automatic",
                "generation 6 failed its watch: web/0 on n1: not healthy at generation 6; back to generation 4's release as generation 7"
            )
            .map(|x| (x.1, x.3)),
            Some((6, "rolled back: web/0 on n1: not healthy at generation 6".into()))
        );
        assert_eq!(
            s(
                "deployment-rollback",
                "generation 7: generation 4's release again, rolled back from 6 by ops"
            )
            .map(|x| (x.1, x.2, x.3)),
            Some((6, State::Failure, "rolled back by ops".into()))
        );
        assert_eq!(
            s(
                "deployment-rollback",
                "generation 7: generation 4's release again, rolled back from 6 by watch"
            ),
            None
        );
        assert_eq!(
            s("deployment-rollout", "generation 7, a rollback"),
            None,
            "a rollback's own generation"
        );
        assert_eq!(s("deployment-rollout-done", "generation 7, a rollback"), None);
        assert_eq!(
            s("deployment-scaled", "generation 4: 1 replicas added, 0 removed"),
            None
        );
    }

    #[test]
    fn retries_back_off_to_five_minutes() {
        assert_eq!((backoff_ms(0), backoff_ms(1), backoff_ms(3)), (1000, 2000, 8000));
        assert_eq!(backoff_ms(11), MAX_BACKOFF_MS);
        assert_eq!(backoff_ms(100), MAX_BACKOFF_MS);
    }
}
