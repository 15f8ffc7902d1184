//! The rows a lease's execution specs are built from (`crate::delivery`): each leased
//! environment's current generation and spec, the older generations a rolling rollout
//! replaces, a rollback's resumed generation, the environment's subnet on the node, the
//! node's age recipient, and the secrets already sealed to it (by node and ciphertext hash).

use super::LedgerError;
use super::rows::subnet;
use state_schema::deployment::DeploymentSpec;
use std::collections::{BTreeMap, BTreeSet};

/// Each environment's current generation and its spec. Jobs of older generations that would
/// run something are cancelled when a newer one starts, so a lease only ever needs these.
pub(crate) type Specs = BTreeMap<String, (u64, DeploymentSpec)>;
/// Environments whose current generation is a rollback's: (that generation, the generation
/// whose containers its replicas resume).
pub(crate) type Resumes = BTreeMap<String, (u64, u64)>;

impl crate::store::Jobs<'_> {
    /// Each of `envs`' current generation and spec, and the rollbacks among them: (that
    /// generation, the generation whose containers its replicas resume). One statement for the
    /// lease's environments (a lease of five environments' jobs was five round trips, at every
    /// lease of a release, and the rollback holds a second statement).
    pub(crate) async fn specs_for(&self, envs: &BTreeSet<String>) -> Result<(Specs, Resumes), LedgerError> {
        let (mut specs, mut resumes) = (Specs::new(), Resumes::new());
        if envs.is_empty() {
            return Ok((specs, resumes));
        }
        let q = format!(
            "SELECT environment, generation, spec, hold FROM deployments WHERE {}",
            self.text_in("environment")
        );
        let rows: Vec<(String, i64, String, String)> = sqlx::query_as(self.sql(&q))
            .bind(serde_json::to_string(envs)?)
            .fetch_all(&self.pool)
            .await?;
        for (env, generation, spec, hold) in rows {
            if let Some(h) = super::rollbacks::Hold::parse(&hold)? {
                resumes.insert(env.clone(), (h.generation, h.to));
            }
            let spec: DeploymentSpec = serde_json::from_str(&spec)?;
            specs.insert(env, (u64::try_from(generation).unwrap_or(0), spec));
        }
        Ok((specs, resumes))
    }

    /// The specs of the older generations an environment's rollout replaces (a rolling
    /// publish routes to their replicas not replaced yet).
    pub(crate) async fn retired_of(&self, env: &str) -> Result<Vec<DeploymentSpec>, LedgerError> {
        let retired: Option<String> =
            sqlx::query_scalar(self.sql("SELECT retired FROM deployments WHERE environment = ?"))
                .bind(env)
                .fetch_optional(&self.pool)
                .await?;
        Ok(match retired {
            Some(r) => serde_json::from_str(&r)?,
            None => Vec::new(),
        })
    }

    pub(crate) async fn subnets_of(
        &self,
        node: &str,
        envs: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, String>, LedgerError> {
        let mut out = BTreeMap::new();
        if envs.is_empty() {
            return Ok(out);
        }
        let q = format!(
            "SELECT environment, idx FROM subnets WHERE node = ? AND {}",
            self.text_in("environment")
        );
        let rows: Vec<(String, i64)> = sqlx::query_as(self.sql(&q))
            .bind(node)
            .bind(serde_json::to_string(envs)?)
            .fetch_all(&self.pool)
            .await?;
        for (env, idx) in rows {
            out.insert(env, subnet(idx));
        }
        Ok(out)
    }

    /// The node's sealed copy of the secret whose ciphertext hashes to `hash`, if kept.
    pub(crate) async fn sealed_copy(&self, node: &str, hash: &str) -> Result<Option<String>, LedgerError> {
        Ok(
            sqlx::query_scalar(self.sql("SELECT sealed FROM sealed_secrets WHERE node = ? AND ciphertext = ?"))
                .bind(node)
                .bind(hash)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Keeps the node's sealed copy (the first one kept stays).
    pub(crate) async fn keep_sealed(
        &self,
        node: &str,
        hash: &str,
        sealed: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql(
            "INSERT INTO sealed_secrets (node, ciphertext, sealed, created_at) VALUES (?, ?, ?, ?) ON CONFLICT (node, ciphertext) DO NOTHING",
        ))
        .bind(node)
        .bind(hash)
        .bind(sealed)
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The node's age recipient, once enrolled (a re-admitted node's once its first
    /// heartbeat gave it).
    pub(crate) async fn age_recipient(&self, node: &str) -> Result<Option<String>, LedgerError> {
        Ok(
            sqlx::query_scalar::<_, Option<String>>(self.sql("SELECT age_recipient FROM nodes WHERE name = ?"))
                .bind(node)
                .fetch_optional(&self.pool)
                .await?
                .flatten()
                .filter(|r| !r.is_empty()),
        )
    }
}
