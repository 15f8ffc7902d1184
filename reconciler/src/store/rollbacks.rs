//! Rollbacks in the ledger: an ask (an operator's `pl rollback ENV`, an abort, or the pass's
//! after a failed watch) judged against the deployment's row by the caller's decision
//! (`state_schema::generations::rollback`, handed in: the store reads and writes, the caller
//! decides) and recorded as the environment's hold in the same transaction, and its release
//! (`pl rollback --release ENV`). SQL only: the rollback's generation is started by the
//! reconcile pass (`reconcile/rollback.rs`).

use super::LedgerError;
use super::rows::gen_u64;
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use state_schema::deployment::DeploymentSpec;
use state_schema::generations::{Action, Current, RollbackAsk, RollbackRefusal, Status};

/// How a rollback is judged on a deployment's row (`state_schema::generations::rollback`): its
/// current generation, its release, the previous generation with its release, and whether a
/// hold is on it. The caller's, handed to [`Ledger::ask_rollback`].
pub type RollbackDecision = fn(&Current, &str, Option<(u64, &str)>, bool) -> Result<RollbackAsk, RollbackRefusal>;

/// Who an automatic rollback's hold names (a release that failed its watch).
pub const WATCH: &str = "watch";
/// Who holds an environment whose canary failed (its watch during the canary, or a step).
pub const CANARY: &str = "canary";
/// Who holds an environment whose rolling rollout failed between its batches.
pub const ROLLING: &str = "rolling";

/// A rollback's hold on an environment, as the `deployments.hold` column keeps it (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hold {
    /// The operator token's name that asked.
    pub by: String,
    pub at_ms: i64,
    /// The generation rolled back.
    pub from: u64,
    /// The generation whose release runs again.
    pub to: u64,
    /// The rollback's own generation.
    pub generation: u64,
    /// The spec hash the environment's deployment had (what Git wanted) when the hold began:
    /// a commit that wants something else ends the hold.
    pub git_hash: String,
    /// Released by an operator: the next pass plans the environment from Git again.
    #[serde(default)]
    pub released: bool,
}

impl Hold {
    /// The column's value back; `None` for no hold.
    pub fn parse(s: &str) -> Result<Option<Hold>, LedgerError> {
        if s.is_empty() {
            return Ok(None);
        }
        serde_json::from_str(s)
            .map(Some)
            .map_err(|e| LedgerError::Corrupt(format!("a deployment's hold: {e}")))
    }
}

/// Why an ask or a release is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    Rollback(RollbackRefusal),
    UnknownEnvironment,
    NotHeld,
    /// The generation asked for is no longer the current one.
    MovedOn,
    /// An abort of a rollout that is not in progress.
    NotInProgress,
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Rollback(r) => r.code(),
            Refusal::UnknownEnvironment => "unknown-environment",
            Refusal::NotHeld => "not-held",
            Refusal::MovedOn => "generation-moved-on",
            Refusal::NotInProgress => "not-in-progress",
        }
    }
}

#[derive(FromRow)]
struct RollbackRow {
    branch: String,
    generation: i64,
    action: String,
    status: String,
    spec_hash: String,
    spec: String,
    retired: String,
    previous_generation: i64,
    previous_hash: String,
    previous_spec: String,
    hold: String,
    revision_id: i64,
}

/// A deployment whose hold asks for work from the pass: a rollback not started yet, or a
/// release.
pub struct Held {
    pub environment: String,
    pub branch: String,
    pub hold: Hold,
    /// The deployment's generation now.
    pub generation: u64,
    pub spec: DeploymentSpec,
    pub retired: Vec<DeploymentSpec>,
    /// The previous generation, its spec and spec hash (what the rollback runs).
    pub previous: Option<(u64, DeploymentSpec, String)>,
    /// The revision the deployment's row is attributed to.
    pub revision: i64,
}

fn release_of(spec: &str) -> Option<String> {
    serde_json::from_str::<DeploymentSpec>(spec)
        .ok()
        .map(|s| s.release_hash)
}

impl crate::store::Deployments<'_> {
    /// Asks for `environment`'s rollback to its previous release, by `by`, of generation `of`
    /// only when given (an abort, or an automatic rollback of the generation whose watch
    /// failed: a newer one may have started since): judged by `decide` on the deployment's row
    /// and recorded as the hold in one transaction, with a `rollback-asked` event. Nothing runs
    /// until the pass starts the generation.
    pub async fn ask_rollback(
        &self,
        environment: &str,
        of: Option<u64>,
        by: &str,
        now_ms: i64,
        decide: RollbackDecision,
    ) -> Result<Result<RollbackAsk, Refusal>, LedgerError> {
        let mut tx = self.write_tx().await?;
        let Some(r) = self.rollback_row(&mut tx, environment).await? else {
            return Ok(Err(Refusal::UnknownEnvironment));
        };
        if of.is_some_and(|g| g != gen_u64(r.generation)) {
            return Ok(Err(Refusal::MovedOn));
        }
        let current = Current {
            generation: gen_u64(r.generation),
            action: Action::parse(&r.action).ok_or_else(|| LedgerError::Corrupt(format!("action {:?}", r.action)))?,
            status: Status::parse(&r.status).ok_or_else(|| LedgerError::Corrupt(format!("status {:?}", r.status)))?,
            spec_hash: r.spec_hash.clone(),
        };
        let release = release_of(&r.spec).unwrap_or_default();
        let previous = release_of(&r.previous_spec).map(|h| (gen_u64(r.previous_generation), h));
        let held = !r.hold.is_empty();
        let ask = match decide(
            &current,
            &release,
            previous.as_ref().map(|(g, h)| (*g, h.as_str())),
            held,
        ) {
            Ok(a) => a,
            Err(e) => return Ok(Err(Refusal::Rollback(e))),
        };
        let hold = Hold {
            by: by.to_owned(),
            at_ms: now_ms,
            from: ask.from,
            to: ask.to,
            generation: ask.generation,
            git_hash: r.spec_hash,
            released: false,
        };
        self.set_hold(&mut tx, environment, &serde_json::to_string(&hold)?)
            .await?;
        let detail = format!(
            "generation {} back to generation {}'s release as generation {}, by {by}",
            ask.from, ask.to, ask.generation
        );
        self.events()
            .event(&mut tx, now_ms, "rollback-asked", environment, &detail)
            .await?;
        tx.commit().await?;
        Ok(Ok(ask))
    }

    /// Releases `environment`'s hold, by `by`: the next pass plans it from Git's accepted state
    /// again. Refused when nothing holds it.
    pub async fn release_rollback(
        &self,
        environment: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<Result<Hold, Refusal>, LedgerError> {
        let mut tx = self.write_tx().await?;
        let Some(r) = self.rollback_row(&mut tx, environment).await? else {
            return Ok(Err(Refusal::UnknownEnvironment));
        };
        let Some(mut hold) = Hold::parse(&r.hold)?.filter(|h| !h.released) else {
            return Ok(Err(Refusal::NotHeld));
        };
        hold.released = true;
        self.set_hold(&mut tx, environment, &serde_json::to_string(&hold)?)
            .await?;
        let detail = format!("by {by}: planned from Git again");
        self.events()
            .event(&mut tx, now_ms, "rollback-released", environment, &detail)
            .await?;
        tx.commit().await?;
        Ok(Ok(hold))
    }

    /// Ends `branch`'s released holds whose commit in force is no longer accepted when judged
    /// again (a key window closed, say): nothing is planned, and the pass stops trying until a
    /// new accepted commit decides the environments.
    pub async fn end_released(&self, branch: &str, why: &str, now_ms: i64) -> Result<usize, LedgerError> {
        let mut tx = self.write_tx().await?;
        let held = self.holds_of(&mut tx, branch).await?;
        let released: Vec<&String> = held.iter().filter(|(_, h)| h.released).map(|(e, _)| e).collect();
        for env in &released {
            self.set_hold(&mut tx, env, "").await?;
            let detail = format!("released; the commit in force is not accepted when judged again: {why}");
            self.events()
                .event(&mut tx, now_ms, "rollback-hold-ended", env, &detail)
                .await?;
        }
        tx.commit().await?;
        Ok(released.len())
    }

    async fn rollback_row(
        &self,
        tx: &mut super::WriteTx,
        environment: &str,
    ) -> Result<Option<RollbackRow>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT branch, generation, action, status, spec_hash, spec, retired, previous_generation, previous_hash, \
             previous_spec, hold, revision_id FROM deployments WHERE environment = ?",
        ))
        .bind(environment)
        .fetch_optional(&mut **tx)
        .await?)
    }

    pub(crate) async fn set_hold(
        &self,
        tx: &mut super::WriteTx,
        environment: &str,
        hold: &str,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql("UPDATE deployments SET hold = ? WHERE environment = ?"))
            .bind(hold)
            .bind(environment)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Every held deployment (few: one per rollback an operator asked for).
    pub(crate) async fn held(&self, tx: &mut super::WriteTx) -> Result<Vec<Held>, LedgerError> {
        let rows: Vec<(String, RollbackRow)> = sqlx::query_as::<_, RollbackRowWithEnv>(self.sql(
            "SELECT environment, branch, generation, action, status, spec_hash, spec, retired, previous_generation, \
             previous_hash, previous_spec, hold, revision_id FROM deployments WHERE hold <> ''",
        ))
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|r| (r.environment, r.row))
        .collect();
        let mut out = Vec::with_capacity(rows.len());
        for (environment, r) in rows {
            let Some(hold) = Hold::parse(&r.hold)? else { continue };
            let previous = if r.previous_spec.is_empty() {
                None
            } else {
                Some((
                    gen_u64(r.previous_generation),
                    serde_json::from_str(&r.previous_spec)?,
                    r.previous_hash,
                ))
            };
            out.push(Held {
                environment,
                branch: r.branch,
                hold,
                generation: gen_u64(r.generation),
                spec: serde_json::from_str(&r.spec)?,
                retired: serde_json::from_str(&r.retired)?,
                previous,
                revision: r.revision_id,
            });
        }
        Ok(out)
    }

    /// The environments of `branch` a rollback holds (the image watcher leaves them alone).
    pub async fn held_environments(&self, branch: &str) -> Result<std::collections::BTreeSet<String>, LedgerError> {
        let rows: Vec<(String,)> =
            sqlx::query_as(self.sql("SELECT environment FROM deployments WHERE branch = ? AND hold <> ''"))
                .bind(branch)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|(e,)| e).collect())
    }

    /// The holds of `branch`'s deployments: environment → the hold.
    pub(crate) async fn holds_of(
        &self,
        tx: &mut super::WriteTx,
        branch: &str,
    ) -> Result<std::collections::BTreeMap<String, Hold>, LedgerError> {
        let rows: Vec<(String, String)> =
            sqlx::query_as(self.sql("SELECT environment, hold FROM deployments WHERE branch = ? AND hold <> ''"))
                .bind(branch)
                .fetch_all(&mut **tx)
                .await?;
        let mut out = std::collections::BTreeMap::new();
        for (env, hold) in rows {
            if let Some(h) = Hold::parse(&hold)? {
                out.insert(env, h);
            }
        }
        Ok(out)
    }
}

#[derive(FromRow)]
struct RollbackRowWithEnv {
    environment: String,
    #[sqlx(flatten)]
    row: RollbackRow,
}
