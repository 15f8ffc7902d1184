//! What placement reads: the nodes as heartbeats left them, the applied branch's node pool
//! documents,
//! and the specs of the deployments that run (what holds room on nodes); and what it writes:
//! which replicas wait, and each environment's subnet per node. SQL and the mapping of rows to
//! the `state_schema::placement` values; the decisions are `state_schema::replacement`'s and
//! `reconcile::placing`'s.

use super::{LedgerError, WriteTx};
use sqlx::FromRow;
use state_schema::deployment::DeploymentSpec;
use state_schema::generations::Status;
use state_schema::replacement::{FleetRows, Running, SeenNode, Snapshot};
use std::collections::{BTreeMap, BTreeSet};

/// What placement reads of what heartbeats said.
fn seen_nodes(seen: &BTreeMap<String, Seen>) -> BTreeMap<String, SeenNode> {
    seen.iter()
        .map(|(n, s)| {
            let node = SeenNode {
                last_seen_ms: s.live_from(),
                capabilities: s.capabilities.clone(),
            };
            (n.clone(), node)
        })
        .collect()
}

#[derive(FromRow)]
struct SeenRow {
    name: String,
    last_seen: Option<i64>,
    beat_grace_ms: i64,
    agent_version: Option<String>,
    agent_protocol: i64,
    capabilities: String,
}

#[derive(FromRow)]
struct RunningRow {
    branch: String,
    status: String,
    spec: String,
}

#[derive(FromRow)]
struct SubnetRow {
    node: String,
    environment: String,
    idx: i64,
}

/// Rows choosing subnets reads: held (node, environment, index), hosts (node, host), and
/// taken indices by node.
pub(crate) struct SubnetFleet {
    pub held: Vec<(String, String, i64)>,
    pub host: Vec<(String, String)>,
    pub taken: Vec<(String, Vec<i64>)>,
}

/// What heartbeats said of a node.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub last_seen: Option<i64>,
    /// The extra silence its last heartbeat was given (a longer interval than the
    /// thresholds': `state_schema::placement::heartbeats`).
    pub grace_ms: i64,
    pub agent_version: Option<String>,
    /// The agent protocol its last heartbeat spoke (`0`: from before agents said it).
    pub agent_protocol: u32,
    pub capabilities: BTreeSet<String>,
}

impl Seen {
    /// What liveness measures silence from: the last heartbeat, with its grace.
    pub fn live_from(&self) -> Option<i64> {
        self.last_seen.map(|t| t.saturating_add(self.grace_ms))
    }
}

impl crate::store::Nodes<'_> {
    /// Every enrolled node, with what its heartbeats said.
    pub async fn seen_nodes(&self) -> Result<BTreeMap<String, Seen>, LedgerError> {
        let mut out = BTreeMap::new();
        let rows: Vec<SeenRow> = sqlx::query_as(
            self.sql("SELECT name, last_seen, beat_grace_ms, agent_version, agent_protocol, capabilities FROM nodes"),
        )
        .fetch_all(&self.pool)
        .await?;
        for r in rows {
            out.insert(
                r.name,
                Seen {
                    last_seen: r.last_seen,
                    grace_ms: r.beat_grace_ms,
                    agent_version: r.agent_version,
                    agent_protocol: u32::try_from(r.agent_protocol).unwrap_or(0),
                    capabilities: r
                        .capabilities
                        .split(',')
                        .filter(|c| !c.is_empty())
                        .map(str::to_owned)
                        .collect(),
                },
            );
        }
        Ok(out)
    }

    /// The canonical NodePool documents of `branch`'s accepted state (decoded by the caller:
    /// `state_schema::declared::node_pools`).
    pub async fn pool_documents(&self, branch: &str) -> Result<Vec<String>, LedgerError> {
        Ok(
            sqlx::query_scalar(self.sql("SELECT document FROM desired_objects WHERE branch = ? AND kind = 'NodePool'"))
                .bind(branch)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// [`Self::pool_documents`] inside `tx`: what a commit being applied in it just wrote.
    pub(crate) async fn pool_documents_in(&self, tx: &mut WriteTx, branch: &str) -> Result<Vec<String>, LedgerError> {
        Ok(
            sqlx::query_scalar(self.sql("SELECT document FROM desired_objects WHERE branch = ? AND kind = 'NodePool'"))
                .bind(branch)
                .fetch_all(&mut **tx)
                .await?,
        )
    }

    /// The nodes whose agents' last heartbeat said a task set older than `protocol` (or none
    /// yet): what their environments' set-ups are queued as (`rollout::for_agents`). Read in
    /// `tx`, as the jobs it shapes are written there.
    pub(crate) async fn older_agents_in(
        &self,
        tx: &mut WriteTx,
        protocol: u32,
    ) -> Result<BTreeSet<String>, LedgerError> {
        let names: Vec<String> = sqlx::query_scalar(self.sql("SELECT name FROM nodes WHERE agent_protocol < ?"))
            .bind(i64::from(protocol))
            .fetch_all(&mut **tx)
            .await?;
        Ok(names.into_iter().collect())
    }

    /// The specs of every running (rolled-out, not torn-down) deployment, of every branch:
    /// what holds reservations on nodes.
    pub async fn running_specs(&self) -> Result<Vec<DeploymentSpec>, LedgerError> {
        let mut out = Vec::new();
        let specs: Vec<String> =
            sqlx::query_scalar(self.sql("SELECT spec FROM deployments WHERE action = 'rollout' ORDER BY environment"))
                .fetch_all(&self.pool)
                .await?;
        for spec in specs {
            out.push(serde_json::from_str(&spec)?);
        }
        Ok(out)
    }

    /// What a placement run reads of the fleet now: what heartbeats said of every enrolled
    /// node, every running deployment's spec, the volumes' pins, and when a silent node is
    /// lost (`state_schema::replacement::fleet_of` makes the fleet of them).
    pub async fn fleet_rows(&self, lost_after_ms: i64) -> Result<FleetRows, LedgerError> {
        self.fleet_rows_seen(&self.seen_nodes().await?, lost_after_ms).await
    }

    /// [`Self::fleet_rows`] with what heartbeats said read already (`seen_nodes`): a caller
    /// that needs both reads every node's row once (a page of `GET /v1/nodes` read it twice).
    pub async fn fleet_rows_seen(
        &self,
        seen: &BTreeMap<String, Seen>,
        lost_after_ms: i64,
    ) -> Result<FleetRows, LedgerError> {
        Ok(FleetRows {
            seen: seen_nodes(seen),
            running: self.running_specs().await?,
            pins: self.volumes().volume_pins().await?,
            lost_after_ms,
        })
    }

    /// The live fleet as placement sees it now: every enrolled node and every running
    /// deployment, for re-placement and for `GET /v1/fleet`.
    pub async fn fleet_snapshot(&self, now_ms: i64, lost_after_ms: i64) -> Result<Snapshot, LedgerError> {
        Ok(Snapshot {
            at_ms: now_ms,
            lost_after_ms,
            nodes: seen_nodes(&self.seen_nodes().await?),
            running: self.running().await?,
            pins: self.volumes().volume_pins().await?,
            held: self.held_environments().await?,
        })
    }

    /// Environments a rollback holds, for the snapshot.
    async fn held_environments(&self) -> Result<Vec<state_schema::replacement::Held>, LedgerError> {
        let rows: Vec<(String, String)> =
            sqlx::query_as(self.sql("SELECT environment, hold FROM deployments WHERE hold <> '' ORDER BY environment"))
                .fetch_all(&self.pool)
                .await?;
        let mut out = Vec::new();
        for (environment, hold) in rows {
            if let Some(h) = super::rollbacks::Hold::parse(&hold)?.filter(|h| !h.released) {
                out.push(state_schema::replacement::Held {
                    environment,
                    generation: h.generation,
                    to: h.to,
                    by: h.by,
                });
            }
        }
        Ok(out)
    }

    /// The hashes of the applied branch's node pool documents, by name.
    pub(crate) async fn pool_hashes(&self, branch: &str) -> Result<Vec<String>, LedgerError> {
        Ok(sqlx::query_scalar(
            self.sql("SELECT hash FROM desired_objects WHERE branch = ? AND kind = 'NodePool' ORDER BY name"),
        )
        .bind(branch)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Each running deployment's spec hash, and whether a finished one has replicas waiting.
    pub(crate) async fn placement_marks(&self) -> Result<Vec<(String, String, bool)>, LedgerError> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(self.sql(
            "SELECT environment, spec_hash, CASE WHEN status <> 'in-progress' AND waiting <> '[]' THEN 'waits' ELSE '' END \
             FROM deployments WHERE action = 'rollout' ORDER BY environment",
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(e, h, w)| (e, h, w == "waits")).collect())
    }

    /// Every running (rolled-out, not torn-down) deployment, with its branch and whether its
    /// rollout is unfinished, in environment order.
    pub(crate) async fn running(&self) -> Result<Vec<Running>, LedgerError> {
        let rows: Vec<RunningRow> = sqlx::query_as(
            self.sql("SELECT branch, status, spec FROM deployments WHERE action = 'rollout' ORDER BY environment"),
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let status = Status::parse(&r.status)
                .ok_or_else(|| LedgerError::Corrupt(format!("a deployment row's status is {:?}", r.status)))?;
            out.push(Running {
                branch: r.branch,
                in_progress: status == Status::InProgress,
                spec: serde_json::from_str(&r.spec)?,
            });
        }
        Ok(out)
    }

    /// What waits, as stored, of every deployment with waiting replicas.
    pub(crate) async fn waiting_stored(&self, tx: &mut WriteTx) -> Result<BTreeMap<String, String>, LedgerError> {
        let rows: Vec<(String, String)> =
            sqlx::query_as(self.sql("SELECT environment, waiting FROM deployments WHERE waiting <> '[]'"))
                .fetch_all(&mut **tx)
                .await?;
        Ok(rows.into_iter().collect())
    }

    /// `env`'s waiting replicas are now `waiting` (JSON).
    pub(crate) async fn set_waiting(&self, tx: &mut WriteTx, env: &str, waiting: &str) -> Result<(), LedgerError> {
        sqlx::query(self.sql("UPDATE deployments SET waiting = ? WHERE environment = ?"))
            .bind(waiting)
            .bind(env)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// What choosing subnets reads (`state_schema::placement::subnets`): every subnet held,
    /// each node's host where its agent said one, and the indices others' networks use on
    /// each node's machine. Pools are the caller's (they come from Git).
    pub(crate) async fn subnet_fleet(&self, tx: &mut WriteTx) -> Result<SubnetFleet, LedgerError> {
        let held: Vec<SubnetRow> = sqlx::query_as(self.sql("SELECT node, environment, idx FROM subnets"))
            .fetch_all(&mut **tx)
            .await?;
        let host: Vec<(String, String)> =
            sqlx::query_as(self.sql("SELECT name, host FROM nodes WHERE host IS NOT NULL"))
                .fetch_all(&mut **tx)
                .await?;
        let taken: Vec<(String, String)> =
            sqlx::query_as(self.sql("SELECT name, taken_subnets FROM nodes WHERE taken_subnets <> ''"))
                .fetch_all(&mut **tx)
                .await?;
        Ok(SubnetFleet {
            held: held.into_iter().map(|r| (r.node, r.environment, r.idx)).collect(),
            host,
            taken: taken
                .into_iter()
                .map(|(node, list)| (node, list.split(',').filter_map(|i| i.parse::<i64>().ok()).collect()))
                .collect(),
        })
    }

    /// Records new subnets: (node, environment, pool index).
    pub(crate) async fn add_subnets(&self, tx: &mut WriteTx, new: &[(String, String, i64)]) -> Result<(), LedgerError> {
        for chunk in new.chunks(200) {
            let marks = vec!["(?, ?, ?)"; chunk.len()].join(", ");
            let q = format!("INSERT INTO subnets (node, environment, idx) VALUES {marks}");
            let mut query = sqlx::query(self.sql(&q));
            for (node, env, idx) in chunk {
                query = query.bind(node.clone()).bind(env.clone()).bind(*idx);
            }
            query.execute(&mut **tx).await?;
        }
        Ok(())
    }
}

impl crate::store::Nodes<'_> {
    /// Keeps the subnets `node` reports its environments' networks have, as (environment, pool
    /// index), where the ledger holds none for that pair and no other of the node's has that
    /// index: a rebuilt ledger takes the subnets the hosts have rather than choosing others.
    pub async fn adopt_subnets(&self, node: &str, networks: &[(String, i64)]) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        for chunk in networks.chunks(200) {
            let marks = vec!["(?, ?, ?)"; chunk.len()].join(", ");
            let q = format!("INSERT INTO subnets (node, environment, idx) VALUES {marks} ON CONFLICT DO NOTHING");
            let mut query = sqlx::query(self.sql(&q));
            for (env, idx) in chunk {
                query = query.bind(node).bind(env.clone()).bind(*idx);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Announces nodes that fell silent past the lost threshold (`node-lost`, once each) and
    /// those heard from again since (`node-back`). Returns both lists. Called when the fleet's
    /// signature changed (a node's liveness class is part of it), so a quiet fleet reads
    /// nothing.
    pub async fn announce_lost(&self, now_ms: i64, lost_after: i64) -> Result<(Vec<String>, Vec<String>), LedgerError> {
        let mut tx = self.write_tx().await?;
        let lost: Vec<(String, i64)> = sqlx::query_as(self.sql(
            "UPDATE nodes SET lost_at = ? WHERE lost_at = 0 AND last_seen IS NOT NULL AND last_seen + beat_grace_ms < ? \
             RETURNING name, last_seen",
        ))
        .bind(now_ms)
        .bind(now_ms - lost_after)
        .fetch_all(&mut *tx)
        .await?;
        let back: Vec<(String, i64)> =
            sqlx::query_as(self.sql(
                "UPDATE nodes SET lost_at = 0 WHERE lost_at > 0 AND last_seen > lost_at RETURNING name, last_seen",
            ))
            .fetch_all(&mut *tx)
            .await?;
        let mut events = Vec::with_capacity(lost.len() + back.len());
        for (node, last) in &lost {
            let detail = format!(
                "not heard from for {} s (lost after {} s): what it ran is placed elsewhere",
                (now_ms - last) / 1000,
                lost_after / 1000
            );
            events.push(("node-lost".to_owned(), node.clone(), detail));
        }
        for (node, _) in &back {
            events.push(("node-back".to_owned(), node.clone(), "heard from again".to_owned()));
        }
        self.events().events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok((
            lost.into_iter().map(|(n, _)| n).collect(),
            back.into_iter().map(|(n, _)| n).collect(),
        ))
    }
}
