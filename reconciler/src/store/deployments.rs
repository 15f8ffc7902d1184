//! The deployment tables: each environment's current generation (`deployments`), its history
//! (`deployment_generations`) and the accepted state's canonical documents (`desired_objects`).
//! SQL only: what is written is decided in `reconcile::deploy` by `state_schema::generations`.
//! Rows map through `sqlx::FromRow`; actions and statuses leave here as enums, and a row that
//! holds neither is `LedgerError::Corrupt`.

use super::rows::{g, gen_u64};
use super::{LedgerError, WriteTx};
use sqlx::FromRow;
use state_schema::deployment::DeploymentSpec;
use state_schema::generations::{Action, Current, Status};
use std::collections::BTreeMap;

pub(super) fn action(s: &str) -> Result<Action, LedgerError> {
    Action::parse(s).ok_or_else(|| LedgerError::Corrupt(format!("a deployment row's action is {s:?}")))
}

fn status(s: &str) -> Result<Status, LedgerError> {
    Status::parse(s).ok_or_else(|| LedgerError::Corrupt(format!("a deployment row's status is {s:?}")))
}

#[derive(FromRow)]
struct CurrentRow {
    environment: String,
    generation: i64,
    action: String,
    status: String,
    spec_hash: String,
}

#[derive(FromRow)]
struct SpecsRow {
    environment: String,
    spec: String,
    retired: String,
}

#[derive(FromRow)]
struct ObjectRow {
    kind: String,
    name: String,
    hash: String,
}

/// A new generation's row: the deployment as it starts, and its history line.
pub(crate) struct GenerationRow<'a> {
    pub environment: &'a str,
    pub generation: u64,
    pub action: Action,
    pub status: Status,
    pub step: i64,
    pub spec_hash: &'a str,
    pub spec: &'a DeploymentSpec,
    pub retired: &'a [DeploymentSpec],
    /// Whether it runs another release than the row it replaces (what `previous` follows).
    pub new_release: bool,
}

/// An object document to write: kind, name, hash, canonical YAML.
pub(crate) type ObjectDoc = (String, String, String, String);

impl crate::store::Deployments<'_> {
    /// The id of `sha`'s accepted revision on `branch`, if it was accepted.
    pub(crate) async fn accepted_revision(
        &self,
        tx: &mut WriteTx,
        branch: &str,
        sha: &str,
    ) -> Result<Option<i64>, LedgerError> {
        Ok(sqlx::query_scalar(
            self.sql("SELECT id FROM revisions WHERE branch = ? AND sha = ? AND verdict = 'accepted'"),
        )
        .bind(branch)
        .bind(sha)
        .fetch_optional(&mut **tx)
        .await?)
    }

    /// The id of `branch`'s last accepted revision.
    pub(crate) async fn last_accepted_id<'e, E>(&self, on: E, branch: &str) -> Result<Option<i64>, LedgerError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Any>,
    {
        Ok(sqlx::query_scalar(
            self.sql("SELECT id FROM revisions WHERE branch = ? AND verdict = 'accepted' ORDER BY id DESC LIMIT 1"),
        )
        .bind(branch)
        .fetch_optional(on)
        .await?)
    }

    /// Every live deployment of `branch` expires at `at` (a preview's lifetime).
    pub(crate) async fn set_expiry(&self, tx: &mut WriteTx, branch: &str, at: i64) -> Result<(), LedgerError> {
        sqlx::query(self.sql("UPDATE deployments SET expires_at = ? WHERE branch = ? AND action = 'rollout'"))
            .bind(at)
            .bind(branch)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Branches with a live deployment whose lifetime ran out by `now_ms`.
    pub(crate) async fn expired_branches(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        Ok(sqlx::query_scalar(self.sql(
            "SELECT DISTINCT branch FROM deployments WHERE action = 'rollout' AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY branch",
        ))
        .bind(now_ms)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The hash of each of `branch`'s stored object documents, by kind and name.
    pub(crate) async fn object_hashes_of(
        &self,
        tx: &mut WriteTx,
        branch: &str,
    ) -> Result<BTreeMap<(String, String), String>, LedgerError> {
        let rows: Vec<ObjectRow> =
            sqlx::query_as(self.sql("SELECT kind, name, hash FROM desired_objects WHERE branch = ?"))
                .bind(branch)
                .fetch_all(&mut **tx)
                .await?;
        Ok(rows.into_iter().map(|r| ((r.kind, r.name), r.hash)).collect())
    }

    /// Writes `docs` (drained) as `branch`'s documents of `revision`, replacing older ones.
    pub(crate) async fn upsert_objects(
        &self,
        tx: &mut WriteTx,
        branch: &str,
        revision: i64,
        docs: &mut Vec<ObjectDoc>,
    ) -> Result<(), LedgerError> {
        if docs.is_empty() {
            return Ok(());
        }
        let marks = vec!["(?, ?, ?, ?, ?, ?)"; docs.len()].join(", ");
        let q = format!(
            "INSERT INTO desired_objects (branch, kind, name, hash, document, revision_id) VALUES {marks} \
             ON CONFLICT (branch, kind, name) DO UPDATE SET hash = excluded.hash, document = excluded.document, revision_id = excluded.revision_id"
        );
        let mut query = sqlx::query(self.sql(&q));
        for (kind, name, hash, doc) in docs.drain(..) {
            query = query
                .bind(branch.to_owned())
                .bind(kind)
                .bind(name)
                .bind(hash)
                .bind(doc)
                .bind(revision);
        }
        query.execute(&mut **tx).await?;
        Ok(())
    }

    /// Deletes `branch`'s documents of `gone` (kind, name).
    pub(crate) async fn delete_objects(
        &self,
        tx: &mut WriteTx,
        branch: &str,
        gone: &[(String, String)],
    ) -> Result<(), LedgerError> {
        for chunk in gone.chunks(200) {
            let marks = vec!["(kind = ? AND name = ?)"; chunk.len()].join(" OR ");
            let q = format!("DELETE FROM desired_objects WHERE branch = ? AND ({marks})");
            let mut query = sqlx::query(self.sql(&q)).bind(branch.to_owned());
            for (kind, name) in chunk {
                query = query.bind(kind.clone()).bind(name.clone());
            }
            query.execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// What the ledger holds of each of `branch`'s deployments.
    pub(crate) async fn current_of(
        &self,
        tx: &mut WriteTx,
        branch: &str,
    ) -> Result<BTreeMap<String, Current>, LedgerError> {
        let rows: Vec<CurrentRow> = sqlx::query_as(
            self.sql("SELECT environment, generation, action, status, spec_hash FROM deployments WHERE branch = ?"),
        )
        .bind(branch)
        .fetch_all(&mut **tx)
        .await?;
        let mut out = BTreeMap::new();
        for r in rows {
            let current = Current {
                generation: gen_u64(r.generation),
                action: action(&r.action)?,
                status: status(&r.status)?,
                spec_hash: r.spec_hash,
            };
            out.insert(r.environment, current);
        }
        Ok(out)
    }

    /// The stored spec and retired specs of some deployments.
    pub(crate) async fn specs_of(
        &self,
        tx: &mut WriteTx,
        envs: &[&str],
    ) -> Result<BTreeMap<String, (DeploymentSpec, Vec<DeploymentSpec>)>, LedgerError> {
        let mut out = BTreeMap::new();
        for chunk in envs.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q = format!("SELECT environment, spec, retired FROM deployments WHERE environment IN ({marks})");
            let mut query = sqlx::query_as::<_, SpecsRow>(self.sql(&q));
            for env in chunk {
                query = query.bind(env.to_string());
            }
            for r in query.fetch_all(&mut **tx).await? {
                out.insert(
                    r.environment,
                    (serde_json::from_str(&r.spec)?, serde_json::from_str(&r.retired)?),
                );
            }
        }
        Ok(out)
    }

    /// Which of `envs` another branch than `branch` deploys already, and that branch.
    pub(crate) async fn owners_of(
        &self,
        tx: &mut WriteTx,
        branch: &str,
        envs: &[&str],
    ) -> Result<BTreeMap<String, String>, LedgerError> {
        let mut out = BTreeMap::new();
        for chunk in envs.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q =
                format!("SELECT environment, branch FROM deployments WHERE branch <> ? AND environment IN ({marks})");
            let mut query = sqlx::query_as::<_, (String, String)>(self.sql(&q)).bind(branch.to_owned());
            for env in chunk {
                query = query.bind(env.to_string());
            }
            out.extend(query.fetch_all(&mut **tx).await?);
        }
        Ok(out)
    }

    /// A deployment scaled at its generation: its stored spec becomes `spec`.
    /// With `removes` (the scale removes replicas), the spec it replaces joins the retired
    /// ones until the scale's jobs are done ([`Ledger::settle_scale_in`]): the nodes it leaves
    /// stay in the environment's mesh while their replicas serve, and a teardown or a new
    /// generation that comes first cleans them up with the rest.
    pub(crate) async fn rescale(
        &self,
        tx: &mut WriteTx,
        spec: &DeploymentSpec,
        spec_hash: &str,
        revision: i64,
        removes: bool,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let env = spec.environment.as_str();
        let retired = match removes {
            false => None,
            true => {
                let row: Option<(String, String)> =
                    sqlx::query_as(self.sql("SELECT spec, retired FROM deployments WHERE environment = ?"))
                        .bind(env)
                        .fetch_optional(&mut **tx)
                        .await?;
                match row {
                    Some((old, retired)) => {
                        let old: DeploymentSpec = serde_json::from_str(&old)?;
                        let mut retired: Vec<DeploymentSpec> = serde_json::from_str(&retired)?;
                        if !retired.contains(&old) {
                            retired.push(old);
                        }
                        Some(serde_json::to_string(&retired)?)
                    }
                    None => None,
                }
            }
        };
        sqlx::query(self.sql(
            "UPDATE deployments SET spec = ?, spec_hash = ?, revision_id = ?, updated_at = ?, retired = COALESCE(?, retired) WHERE environment = ?",
        ))
        .bind(serde_json::to_string(spec)?)
        .bind(spec_hash.to_owned())
        .bind(revision)
        .bind(now_ms)
        .bind(retired)
        .bind(env)
        .execute(&mut **tx)
        .await?;
        self.write_uses(tx, &[(env, spec)]).await
    }

    /// What each written spec uses (`deployment_uses`), beside the deployment's row: written
    /// with the spec, never by a step's update.
    async fn write_uses(&self, tx: &mut WriteTx, specs: &[(&str, &DeploymentSpec)]) -> Result<(), LedgerError> {
        if specs.is_empty() {
            return Ok(());
        }
        let marks = vec!["(?, ?, ?, ?)"; specs.len()].join(", ");
        let q = format!(
            "INSERT INTO deployment_uses (environment, backups, cron, domains) VALUES {marks} \
             ON CONFLICT (environment) DO UPDATE SET backups = excluded.backups, cron = excluded.cron, \
             domains = excluded.domains"
        );
        let mut query = sqlx::query(self.sql(&q));
        for (env, spec) in specs {
            let u = spec.uses();
            query = query
                .bind((*env).to_owned())
                .bind(i64::from(u.backups))
                .bind(i64::from(u.cron))
                .bind(i64::from(u.domains));
        }
        query.execute(&mut **tx).await?;
        Ok(())
    }

    /// A scale of `env` at `generation` had a job end: once none of its scales' jobs is queued,
    /// held or leased, the specs they replaced are retired for good (the rollout is done, so
    /// nothing else holds them).
    pub(crate) async fn settle_scale_in(
        &self,
        tx: &mut WriteTx,
        env: &str,
        generation: i64,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql(
            "UPDATE deployments SET retired = '[]', updated_at = ? \
             WHERE environment = ? AND generation = ? AND status = 'done' AND retired <> '[]' \
             AND NOT EXISTS (SELECT 1 FROM jobs WHERE environment = ? AND generation = ? AND key LIKE '%#r%' \
                             AND state IN ('queued', 'leased'))",
        ))
        .bind(now_ms)
        .bind(env)
        .bind(generation)
        .bind(env)
        .bind(generation)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Cancels what generations older than each `(environment, generation)` still have queued
    /// or leased; how many jobs of each environment.
    pub(crate) async fn cancel_older(
        &self,
        tx: &mut WriteTx,
        newer: &[(&str, u64)],
        now_ms: i64,
    ) -> Result<BTreeMap<String, usize>, LedgerError> {
        let mut cancelled: BTreeMap<String, usize> = BTreeMap::new();
        if newer.is_empty() {
            return Ok(cancelled);
        }
        let marks = vec!["(environment = ? AND generation < ?)"; newer.len()].join(" OR ");
        // A volume move's jobs are the move's, not a generation's (`store::moves`): cancelled,
        // the move would never end.
        let moves = state_schema::task::MOVE_KEYS.map(|_| "key NOT LIKE ?").join(" AND ");
        let q = format!(
            "UPDATE jobs SET state = 'cancelled', lease_token = NULL, lease_expires_at = NULL, updated_at = ? \
             WHERE state IN ('queued', 'leased') AND ({marks}) AND {moves} RETURNING environment"
        );
        let mut query = sqlx::query_scalar::<_, String>(self.sql(&q)).bind(now_ms);
        for (env, generation) in newer {
            query = query.bind((*env).to_owned()).bind(g(*generation));
        }
        for pattern in state_schema::task::MOVE_KEYS {
            query = query.bind(pattern);
        }
        for env in query.fetch_all(&mut **tx).await? {
            *cancelled.entry(env).or_default() += 1;
        }
        Ok(cancelled)
    }

    /// Writes new generations of `branch`'s deployments (attributed to `revision`) and their
    /// history lines.
    pub(crate) async fn write_generations(
        &self,
        tx: &mut WriteTx,
        branch: &str,
        revision: i64,
        rows: &[GenerationRow<'_>],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        if rows.is_empty() {
            return Ok(());
        }
        let marks = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; rows.len()].join(", ");
        // The generation a new one with another release replaces becomes the previous one if
        // it finished its rollout (it served); otherwise the one before it stays previous (a
        // re-placement's move keeps it too). A hold is kept unless the row sets one
        // (`KEEP_HOLD` stands for "keep" in the statement).
        let shifted: Vec<&str> = rows.iter().filter(|r| r.new_release).map(|r| r.environment).collect();
        for chunk in shifted.chunks(100) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q = format!(
                "UPDATE deployments SET previous_generation = generation, previous_hash = spec_hash, previous_spec = spec \
                 WHERE status = 'done' AND action = 'rollout' AND environment IN ({marks})"
            );
            let mut query = sqlx::query(self.sql(&q));
            for env in chunk {
                query = query.bind((*env).to_owned());
            }
            query.execute(&mut **tx).await?;
        }
        let q = format!(
            "INSERT INTO deployments (environment, branch, generation, action, status, step, spec_hash, spec, retired, revision_id, updated_at) \
             VALUES {marks} \
             ON CONFLICT (environment) DO UPDATE SET generation = excluded.generation, action = excluded.action, status = excluded.status, \
             step = excluded.step, spec_hash = excluded.spec_hash, spec = excluded.spec, retired = excluded.retired, \
             revision_id = excluded.revision_id, updated_at = excluded.updated_at, \
             watch_from = 0, watch_until = 0, watch_failure = '', watch = '', \
             step_state = 'running', step_due = 0, share = 0"
        );
        let mut query = sqlx::query(self.sql(&q));
        for r in rows {
            query = query
                .bind(r.environment.to_owned())
                .bind(branch.to_owned())
                .bind(g(r.generation))
                .bind(r.action.as_str())
                .bind(r.status.as_str())
                .bind(r.step)
                .bind(r.spec_hash.to_owned())
                .bind(serde_json::to_string(r.spec)?)
                .bind(serde_json::to_string(r.retired)?)
                .bind(revision)
                .bind(now_ms);
        }
        query.execute(&mut **tx).await?;
        let specs: Vec<(&str, &DeploymentSpec)> = rows.iter().map(|r| (r.environment, r.spec)).collect();
        self.write_uses(tx, &specs).await?;
        let marks = vec!["(?, ?, ?, ?, ?, ?, ?)"; rows.len()].join(", ");
        let q = format!(
            "INSERT INTO deployment_generations (environment, generation, branch, action, spec_hash, revision_id, created_at) VALUES {marks}"
        );
        let mut query = sqlx::query(self.sql(&q));
        for r in rows {
            query = query
                .bind(r.environment.to_owned())
                .bind(g(r.generation))
                .bind(branch.to_owned())
                .bind(r.action.as_str())
                .bind(r.spec_hash.to_owned())
                .bind(revision)
                .bind(now_ms);
        }
        query.execute(&mut **tx).await?;
        Ok(())
    }

    /// `env`'s subnets are free again (its networks are gone from every node).
    pub(crate) async fn free_subnets(&self, tx: &mut WriteTx, env: &str) -> Result<(), LedgerError> {
        sqlx::query(self.sql("DELETE FROM subnets WHERE environment = ?"))
            .bind(env)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}
