//! What the mesh between nodes reads and writes: each node's key and where it listens (from
//! heartbeats), which environment runs on which node with which subnet, and each keyed node's
//! decided mesh with its generation and what its agent last applied. SQL only; the decision
//! is `reconcile::mesh`'s.

use super::LedgerError;
use crate::store::rows::Placed;
use sqlx::FromRow;
use std::collections::{BTreeMap, BTreeSet};

/// A node's mesh as its heartbeats left it.
#[derive(Clone, Debug, FromRow)]
pub struct KeyRow {
    pub name: String,
    pub mesh_key: Option<String>,
    pub mesh_port: Option<i64>,
    pub mesh_address: Option<String>,
    /// Its own names as its heartbeat said them (JSON).
    pub mesh_names: Option<String>,
    /// Raised to have the node make a new key pair (`pl nodes rotate-mesh-key`).
    pub mesh_key_epoch: i64,
}

/// A node's decided mesh.
#[derive(Clone, Debug, FromRow)]
pub struct MeshRow {
    pub node: String,
    pub generation: i64,
    pub hash: String,
    pub spec: String,
    pub applied: i64,
    pub links: String,
    /// When the agent last said it applied a newer generation (Unix ms).
    pub applied_at: i64,
    /// The peers whose links were judged down last (JSON list).
    pub down: String,
}

#[derive(FromRow)]
struct DeploymentRow {
    environment: String,
    spec: String,
    retired: String,
}

impl crate::store::Nodes<'_> {
    /// Every enrolled node's mesh key, port and address.
    pub async fn mesh_keys(&self) -> Result<Vec<KeyRow>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT name, mesh_key, mesh_port, mesh_address, mesh_names, mesh_key_epoch FROM nodes ORDER BY name",
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    /// (node, environment, pool index) for every environment with a replica placed on a node,
    /// by its running generation or one still being cleaned up, and a subnet there.
    pub async fn mesh_placed(&self) -> Result<Vec<(String, String, i64)>, LedgerError> {
        let rows: Vec<DeploymentRow> =
            sqlx::query_as(self.sql("SELECT environment, spec, retired FROM deployments WHERE action = 'rollout'"))
                .fetch_all(&self.pool)
                .await?;
        let mut on: BTreeSet<(String, String)> = BTreeSet::new();
        for r in rows {
            let now = serde_json::from_str::<Placed>(&r.spec)
                .map(|p| vec![p])
                .unwrap_or_default();
            let old = serde_json::from_str::<Vec<Placed>>(&r.retired).unwrap_or_default();
            for i in now.iter().chain(old.iter()).flat_map(|p| &p.instances) {
                on.insert((i.node.to_string(), r.environment.clone()));
            }
        }
        let subnets: Vec<(String, String, i64)> =
            sqlx::query_as(self.sql("SELECT node, environment, idx FROM subnets ORDER BY node, environment"))
                .fetch_all(&self.pool)
                .await?;
        Ok(subnets
            .into_iter()
            .filter(|(n, e, _)| on.contains(&(n.clone(), e.clone())))
            .collect())
    }

    /// A short account of everything the mesh is decided from (the deployments' rows, the
    /// subnets, the nodes' keys, addresses and names): when it is unchanged, so is every mesh.
    /// `None` when no node has a key (no mesh to decide: one small read of `nodes`).
    pub async fn mesh_signature(&self) -> Result<Option<String>, LedgerError> {
        let any: Option<i64> = sqlx::query_scalar(self.sql("SELECT 1 FROM nodes WHERE mesh_key IS NOT NULL LIMIT 1"))
            .fetch_optional(&self.pool)
            .await?;
        if any.is_none() {
            return Ok(None);
        }
        let (d, dmax): (i64, Option<i64>) =
            sqlx::query_as(self.sql("SELECT COUNT(*), MAX(updated_at) FROM deployments"))
                .fetch_one(&self.pool)
                .await?;
        // (PostgreSQL sums BIGINTs as NUMERIC: cast back.)
        let (s, ssum): (i64, Option<i64>) =
            sqlx::query_as(self.sql("SELECT COUNT(*), CAST(SUM(idx) AS BIGINT) FROM subnets"))
                .fetch_one(&self.pool)
                .await?;
        let keys: Vec<KeyRow> =
            sqlx::query_as(self.sql(
                "SELECT name, mesh_key, mesh_port, mesh_address, mesh_names, mesh_key_epoch FROM nodes WHERE mesh_key IS NOT NULL ORDER BY name",
            ))
            .fetch_all(&self.pool)
            .await?;
        let keys = {
            use sha2::Digest;
            let mut h = sha2::Sha256::new();
            for k in &keys {
                h.update(
                    format!(
                        "{}/{:?}/{:?}/{:?}/{:?}/{};",
                        k.name, k.mesh_key, k.mesh_port, k.mesh_address, k.mesh_names, k.mesh_key_epoch
                    )
                    .as_bytes(),
                );
            }
            hex::encode(h.finalize())
        };
        Ok(Some(format!(
            "{d}/{}/{s}/{}/{keys}",
            dmax.unwrap_or(0),
            ssum.unwrap_or(0)
        )))
    }

    /// Up to `limit` nodes' decided meshes after `after` (by node name), with their specs or
    /// without (`spec` empty): what the links' judgment and `/v1/status` read a page at a
    /// time (every node's spec and links at once were hundreds of MB at 10,000 nodes).
    pub async fn meshes_page(&self, after: Option<&str>, limit: i64, specs: bool) -> Result<Vec<MeshRow>, LedgerError> {
        let spec = if specs { "spec" } else { "'' AS spec" };
        let q = format!(
            "SELECT node, generation, hash, {spec}, applied, links, applied_at, down FROM node_meshes \
             WHERE node > ? ORDER BY node LIMIT ?"
        );
        Ok(sqlx::query_as(self.sql(&q))
            .bind(after.unwrap_or(""))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Each node's decided mesh's hash: what the mesh plan compares its new specs with (the
    /// specs themselves, about 10 KB a node at 10,000 nodes, are not read for that).
    pub async fn mesh_hashes(&self) -> Result<BTreeMap<String, String>, LedgerError> {
        let rows: Vec<(String, String)> = sqlx::query_as(self.sql("SELECT node, hash FROM node_meshes"))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// The mesh rows of `nodes` as the operator's answers show them: without their specs
    /// (`spec` is empty), which are most of a row (about 10 KB at 10,000 nodes) and which no
    /// answer shows. A page of `GET /v1/nodes` read every node's whole row before.
    pub async fn mesh_states_of(&self, nodes: &[&str]) -> Result<BTreeMap<String, MeshRow>, LedgerError> {
        if nodes.is_empty() {
            return Ok(BTreeMap::new());
        }
        let q = format!(
            "SELECT node, generation, hash, '' AS spec, applied, links, applied_at, down FROM node_meshes WHERE {}",
            self.text_in("node")
        );
        let rows: Vec<MeshRow> = sqlx::query_as(self.sql(&q))
            .bind(serde_json::to_string(nodes)?)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(|r| (r.node.clone(), r)).collect())
    }

    /// Numbers `node`'s meshes from `applied` on when the ledger has none of it: a row with
    /// no spec (never served) at that generation, which the next mesh written for the node
    /// follows.
    pub async fn mesh_floor(&self, node: &str, applied: u64) -> Result<(), LedgerError> {
        sqlx::query(self.sql(
            "INSERT INTO node_meshes (node, generation, hash, spec) VALUES (?, ?, '', '') ON CONFLICT (node) DO NOTHING",
        ))
        .bind(node)
        .bind(i64::try_from(applied).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records the meshes that changed, (node, hash, spec), each at its next generation, with
    /// `events` (kind, subject, detail).
    pub async fn write_meshes(
        &self,
        changed: &[(String, String, String)],
        events: &[(String, String, String)],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        if changed.is_empty() && events.is_empty() {
            return Ok(());
        }
        let mut tx = self.write_tx().await?;
        self.events().events_in(&mut tx, now_ms, events).await?;
        for (node, hash, spec) in changed {
            sqlx::query(self.sql(
                "INSERT INTO node_meshes (node, generation, hash, spec) VALUES (?, 1, ?, ?) \
                 ON CONFLICT (node) DO UPDATE SET generation = node_meshes.generation + 1, \
                 hash = excluded.hash, spec = excluded.spec",
            ))
            .bind(node)
            .bind(hash)
            .bind(spec)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Asks `node` for a new mesh key pair: raises its key epoch, with an event naming who
    /// asked. `None` when the node has no mesh key (it is not in the mesh).
    pub async fn rotate_mesh_key(&self, node: &str, by: &str, now_ms: i64) -> Result<Option<i64>, LedgerError> {
        let mut tx = self.write_tx().await?;
        let epoch: Option<i64> = sqlx::query_scalar(self.sql(
            "UPDATE nodes SET mesh_key_epoch = mesh_key_epoch + 1 WHERE name = ? AND mesh_key IS NOT NULL \
             RETURNING mesh_key_epoch",
        ))
        .bind(node)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(e) = epoch {
            let detail = format!("{by} asked {node} for a new mesh key pair (epoch {e})");
            self.events()
                .events_in(
                    &mut tx,
                    now_ms,
                    &[("mesh-key-rotation".to_owned(), node.to_owned(), detail)],
                )
                .await?;
        }
        tx.commit().await?;
        Ok(epoch)
    }

    /// Records each node's links judged down now, (node, JSON list of peers), with `events`
    /// (kind, subject, detail) saying what changed.
    pub async fn write_mesh_health(
        &self,
        changed: &[(String, String)],
        events: &[(String, String, String)],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        if changed.is_empty() {
            return Ok(());
        }
        let mut tx = self.write_tx().await?;
        self.events().events_in(&mut tx, now_ms, events).await?;
        for (node, down) in changed {
            sqlx::query(self.sql("UPDATE node_meshes SET down = ? WHERE node = ?"))
                .bind(down)
                .bind(node)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// What a node's heartbeat said of its mesh: the generation it applied and its links
    /// (JSON, bounded by the API). Returns its mesh when the node has not applied it yet:
    /// (generation, spec).
    pub async fn mesh_beat(
        &self,
        node: &str,
        applied: u64,
        links: &str,
        now_ms: i64,
    ) -> Result<Option<(i64, String)>, LedgerError> {
        let applied = i64::try_from(applied).unwrap_or(i64::MAX);
        // One read; a write only when the node says something new (most beats say the same).
        let row: Option<(i64, Option<String>, i64, Option<String>)> = sqlx::query_as(self.sql(
            "SELECT applied, links, generation, CASE WHEN generation > ? THEN spec END FROM node_meshes WHERE node = ?",
        ))
        .bind(applied)
        .bind(node)
        .fetch_optional(&self.pool)
        .await?;
        let Some((was_applied, was_links, generation, newer)) = row else {
            return Ok(None);
        };
        if was_applied != applied || was_links.as_deref() != Some(links) {
            sqlx::query(self.sql(
                "UPDATE node_meshes SET applied_at = CASE WHEN applied = ? THEN applied_at ELSE ? END, \
                 applied = ?, links = ? WHERE node = ?",
            ))
            .bind(applied)
            .bind(now_ms)
            .bind(applied)
            .bind(links)
            .bind(node)
            .execute(&self.pool)
            .await?;
        }
        Ok(newer.map(|spec| (generation, spec)))
    }

    /// A node's mesh when its generation is above `held`: (generation, spec).
    pub async fn mesh_newer(&self, node: &str, held: i64) -> Result<Option<(i64, String)>, LedgerError> {
        let row: Option<(i64, String)> =
            sqlx::query_as(self.sql("SELECT generation, spec FROM node_meshes WHERE node = ? AND generation > ?"))
                .bind(node)
                .bind(held)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row)
    }
}
