//! Placement against the live fleet: the ledger's side of `state_schema::placement`. It builds
//! the fleet a placement run sees (what Git declares, what heartbeats said, what running
//! deployments reserve), re-places running deployments when the fleet changes (a node lost,
//! draining or retired; room appearing for a waiting replica), announces waiting replicas once,
//! and hands each environment a subnet per node.
//!
//! Level-triggered like the rest of the reconciler: `replace` compares what placement says now
//! with what the ledger holds and writes only the difference, through the same planner that
//! applies commits (`plan_branch`), so a move is a new generation with the usual order (the new
//! replica healthy before the old one stops) and a newly placed waiting replica is a scale.

use crate::reconcile::deploy::Applied;
use crate::store::{Ledger, LedgerError};
use sqlx::Row;
use state_schema::deployment::DeploymentSpec;
use state_schema::desired::Desired;
use state_schema::model::{NodePool, Spec};
use state_schema::placement::{Fleet, FleetNode, Liveness, Waiting};
use state_schema::release::{self, Change};
use state_schema::values::Name;
use std::collections::{BTreeMap, BTreeSet};

use crate::store::rows::SUBNET_POOL_SIZE;

type Tx = crate::store::WriteTx;

/// What heartbeats said of a node.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub last_seen: Option<i64>,
    pub agent_version: Option<String>,
    pub capabilities: BTreeSet<String>,
}

impl Ledger {
    /// Every enrolled node, with what its heartbeats said.
    pub async fn seen_nodes(&self) -> Result<BTreeMap<String, Seen>, LedgerError> {
        let mut out = BTreeMap::new();
        for r in sqlx::query(self.sql("SELECT name, last_seen, agent_version, capabilities FROM nodes"))
            .fetch_all(&self.pool)
            .await?
        {
            let caps: String = r.try_get(3)?;
            out.insert(
                r.try_get(0)?,
                Seen {
                    last_seen: r.try_get(1)?,
                    agent_version: r.try_get(2)?,
                    capabilities: caps.split(',').filter(|c| !c.is_empty()).map(str::to_owned).collect(),
                },
            );
        }
        Ok(out)
    }

    /// The node pools the accepted state of `branch` declares, from the ledger's canonical
    /// documents.
    pub async fn applied_pools(&self, branch: &str) -> Result<Vec<(Name, NodePool)>, LedgerError> {
        let mut out = Vec::new();
        for r in sqlx::query(self.sql("SELECT document FROM desired_objects WHERE branch = ? AND kind = 'NodePool'"))
            .bind(branch)
            .fetch_all(&self.pool)
            .await?
        {
            let doc: String = r.try_get(0)?;
            for l in state_schema::parse::parse_file("pool.yaml", doc.as_bytes()).objects {
                if let Spec::NodePool(pool) = l.object.spec {
                    out.push((l.object.metadata.name, pool));
                }
            }
        }
        Ok(out)
    }

    /// The specs of every running (rolled-out, not torn-down) deployment, of every branch:
    /// what holds reservations on nodes.
    pub async fn running_specs(&self) -> Result<Vec<DeploymentSpec>, LedgerError> {
        let mut out = Vec::new();
        for r in sqlx::query(self.sql("SELECT spec FROM deployments WHERE action = 'rollout' ORDER BY environment"))
            .fetch_all(&self.pool)
            .await?
        {
            out.push(serde_json::from_str(&r.try_get::<String, _>(0)?)?);
        }
        Ok(out)
    }

    /// The fleet a placement run sees now: `pools`' nodes with their liveness and
    /// capabilities, and every running deployment's reservations.
    pub async fn fleet_view(&self, pools: &[(Name, NodePool)], now_ms: i64) -> Result<Fleet, LedgerError> {
        let seen = self.seen_nodes().await?;
        Ok(self.fleet_of(pools, &seen, &self.running_specs().await?, now_ms))
    }

    /// The fleet from what was read already: `pools`' nodes with what heartbeats said of
    /// them, holding what `running` deployments reserve.
    pub fn fleet_of(
        &self,
        pools: &[(Name, NodePool)],
        seen: &BTreeMap<String, Seen>,
        running: &[DeploymentSpec],
        now_ms: i64,
    ) -> Fleet {
        let lost_after = self.lost_after_ms();
        let mut nodes = BTreeMap::new();
        for (pool, p) in pools {
            for n in &p.nodes {
                let s = seen.get(n.name.as_str());
                nodes.insert(
                    n.name.clone(),
                    FleetNode {
                        pool: pool.clone(),
                        cpu_millis: n.capacity.cpu.millis(),
                        memory_bytes: n.capacity.memory.bytes(),
                        git: n.state,
                        liveness: s.map_or(Liveness::Unseen, |s| Liveness::of(s.last_seen, now_ms, lost_after)),
                        capabilities: Some(s.map(|s| s.capabilities.clone()).unwrap_or_default()),
                    },
                );
            }
        }
        Fleet::new(nodes, running)
    }

    /// A cheap summary of what placement depends on: each node's liveness class and
    /// capabilities, the applied branch's pools, each running deployment's spec hash (what it
    /// reserves where), and which finished ones have replicas waiting. A step advancing
    /// changes none of it. Equal signatures: re-placing would change nothing, so it is skipped.
    pub async fn fleet_signature(&self, applied_branch: &str, now_ms: i64) -> Result<String, LedgerError> {
        let seen = self.seen_nodes().await?;
        let lost_after = self.lost_after_ms();
        let nodes: Vec<(String, Liveness, Vec<String>)> = seen
            .into_iter()
            .map(|(n, s)| {
                (
                    n,
                    Liveness::of(s.last_seen, now_ms, lost_after),
                    s.capabilities.into_iter().collect(),
                )
            })
            .collect();
        let pools: Vec<String> = sqlx::query(
            self.sql("SELECT hash FROM desired_objects WHERE branch = ? AND kind = 'NodePool' ORDER BY name"),
        )
        .bind(applied_branch)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
        let mut deployments: Vec<(String, String, String)> = Vec::new();
        for r in sqlx::query(self.sql(
            "SELECT environment, spec_hash, CASE WHEN status <> 'in-progress' AND waiting <> '[]' THEN 'waits' ELSE '' END \
             FROM deployments WHERE action = 'rollout' ORDER BY environment",
        ))
        .fetch_all(&self.pool)
        .await?
        {
            deployments.push((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?));
        }
        Ok(state_schema::canonical::hash(&(nodes, pools, deployments)))
    }

    /// Re-places every running deployment against the fleet as it is now, and writes what
    /// changed: a replica that must leave its node (lost, draining, retired, out of the pool)
    /// moves at a new generation; a waiting replica that now fits is added at the current
    /// generation once its rollout is done. Pools come from the accepted state of
    /// `applied_branch`. Returns what was started.
    pub async fn replace(&self, applied_branch: &str, now_ms: i64) -> Result<Applied, LedgerError> {
        let pools = self.applied_pools(applied_branch).await?;
        let mut rows: Vec<(String, String, String, DeploymentSpec)> = Vec::new();
        for r in sqlx::query(self.sql(
            "SELECT environment, branch, status, spec FROM deployments WHERE action = 'rollout' ORDER BY environment",
        ))
        .fetch_all(&self.pool)
        .await?
        {
            let spec: String = r.try_get(3)?;
            rows.push((
                r.try_get(0)?,
                r.try_get(1)?,
                r.try_get(2)?,
                serde_json::from_str(&spec)?,
            ));
        }
        // The running specs are read once: they are both what reserves room and what is placed.
        let running: Vec<DeploymentSpec> = rows.iter().map(|r| r.3.clone()).collect();
        let mut fleet = self.fleet_of(&pools, &self.seen_nodes().await?, &running, now_ms);
        drop(running);
        let mut by_branch: BTreeMap<String, Vec<Desired>> = BTreeMap::new();
        for (_, branch, status, stored) in rows {
            let usable = stored.pool.as_ref().is_some_and(|p| fleet.has_usable(p));
            if !usable {
                // From before placement knew pools, or nothing usable to move to: it keeps
                // what it runs.
                fleet.hold(&stored);
                continue;
            }
            let mut spec = stored.clone();
            let waiting = fleet.place(&mut spec);
            if spec == stored {
                continue;
            }
            let change = release::change(&stored, &spec);
            let moved = change == Change::Generation;
            // An unfinished rollout is re-placed only to leave a node it cannot stay on; new
            // room for a waiting replica is taken once it is done (a scale, not a release).
            if status == "in-progress" && !moved {
                fleet.hold(&stored);
                continue;
            }
            let spec_hash = state_schema::canonical::hash(&spec);
            by_branch.entry(branch).or_default().push(Desired {
                spec,
                spec_hash,
                waiting,
            });
        }
        let mut applied = Applied::default();
        for (branch, wanted) in by_branch {
            let revision: Option<i64> = sqlx::query(
                self.sql("SELECT id FROM revisions WHERE branch = ? AND verdict = 'accepted' ORDER BY id DESC LIMIT 1"),
            )
            .bind(&branch)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
            let Some(revision) = revision else { continue };
            let mut tx = self.write_tx().await?;
            self.plan_some(&mut tx, &branch, wanted, revision, now_ms, &mut applied)
                .await?;
            tx.commit().await?;
        }
        Ok(applied)
    }

    /// Announces replicas that wait for a node, once per change of what waits: a
    /// `placement-waiting` event per replica with its reason, and the deployment remembers.
    pub(crate) async fn record_waiting(
        &self,
        tx: &mut Tx,
        wanted: &[(String, Vec<Waiting>)],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let mut stored: BTreeMap<String, String> = BTreeMap::new();
        for r in sqlx::query(self.sql("SELECT environment, waiting FROM deployments WHERE waiting <> '[]'"))
            .fetch_all(&mut **tx)
            .await?
        {
            stored.insert(r.try_get(0)?, r.try_get(1)?);
        }
        for (env, waiting) in wanted {
            let env = env.as_str();
            let now = serde_json::to_string(waiting)?;
            let before = stored.get(env).map_or("[]", String::as_str);
            if now == before {
                continue;
            }
            sqlx::query(self.sql("UPDATE deployments SET waiting = ? WHERE environment = ?"))
                .bind(&now)
                .bind(env)
                .execute(&mut **tx)
                .await?;
            let was: Vec<Waiting> = serde_json::from_str(before).unwrap_or_default();
            for w in waiting.iter().filter(|w| !was.contains(w)) {
                let detail = format!("{}/{}: {}", w.role, w.index, w.reason);
                self.event(tx, now_ms, "placement-waiting", env, &detail).await?;
            }
        }
        Ok(())
    }

    /// Gives each (environment, node) pair a subnet of its own on that node, if it has none:
    /// the lowest /24 of the pool free on that node's machine (nodes whose agents report the
    /// same host share one Docker engine and kernel, where subnets must not overlap). Kept
    /// until the environment is torn down.
    pub(crate) async fn ensure_subnets(
        &self,
        tx: &mut Tx,
        pairs: &[(String, String)],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let nodes: BTreeSet<&str> = pairs.iter().map(|(_, n)| n.as_str()).collect();
        let nodes: Vec<&str> = nodes.into_iter().collect();
        // The machine of each node (itself when its agent never said), and every node on
        // those machines.
        let mut machine: BTreeMap<String, String> =
            nodes.iter().map(|n| (n.to_string(), format!("node:{n}"))).collect();
        for chunk in nodes.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q = format!(
                "SELECT name, host FROM nodes WHERE host IN \
                 (SELECT host FROM nodes WHERE host IS NOT NULL AND name IN ({marks}))"
            );
            let mut query = sqlx::query(self.sql(&q));
            for n in chunk {
                query = query.bind(n.to_string());
            }
            for r in query.fetch_all(&mut **tx).await? {
                let host: String = r.try_get(1)?;
                machine.insert(r.try_get(0)?, format!("host:{host}"));
            }
        }
        let every: Vec<&String> = machine.keys().collect();
        let mut taken: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
        // What others' networks use on each machine, as its agents last said: never chosen.
        for chunk in every.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q = format!("SELECT name, taken_subnets FROM nodes WHERE name IN ({marks}) AND taken_subnets <> ''");
            let mut query = sqlx::query(self.sql(&q));
            for n in chunk {
                query = query.bind((*n).clone());
            }
            for r in query.fetch_all(&mut **tx).await? {
                let (node, list): (String, String) = (r.try_get(0)?, r.try_get(1)?);
                let key = machine.get(&node).cloned().unwrap_or_else(|| format!("node:{node}"));
                taken
                    .entry(key)
                    .or_default()
                    .extend(list.split(',').filter_map(|i| i.parse::<i64>().ok()));
            }
        }
        let mut have: BTreeSet<(String, String)> = BTreeSet::new();
        for chunk in every.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q = format!("SELECT node, environment, idx FROM subnets WHERE node IN ({marks})");
            let mut query = sqlx::query(self.sql(&q));
            for n in chunk {
                query = query.bind((*n).clone());
            }
            for r in query.fetch_all(&mut **tx).await? {
                let (node, env): (String, String) = (r.try_get(0)?, r.try_get(1)?);
                let key = machine.get(&node).cloned().unwrap_or_else(|| format!("node:{node}"));
                taken.entry(key).or_default().insert(r.try_get(2)?);
                have.insert((env, node));
            }
        }
        let mut new: Vec<(String, String, i64)> = Vec::new();
        for (env, node) in pairs {
            if !have.insert((env.clone(), node.clone())) {
                continue;
            }
            let key = machine.get(node).cloned().unwrap_or_else(|| format!("node:{node}"));
            let used = taken.entry(key).or_default();
            let Some(idx) = (0..SUBNET_POOL_SIZE).find(|i| !used.contains(i)) else {
                self.event(
                    tx,
                    now_ms,
                    "subnet-pool-exhausted",
                    node,
                    "no /24 left in 10.208.0.0/12 on this node's machine",
                )
                .await?;
                continue;
            };
            used.insert(idx);
            new.push((node.clone(), env.clone(), idx));
        }
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

#[cfg(test)]
mod tests {
    use crate::store::Ledger;
    use crate::store::rows::{subnet, subnet_index};
    use sqlx::Row;

    #[tokio::test]
    async fn nodes_on_one_machine_get_subnets_that_do_not_overlap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let ledger = Ledger::connect(&url, 2).await.expect("ledger");
        ledger.migrate().await.expect("migrate");
        // a1 and a2 share machine m1; b is alone on m2, where another control plane's networks
        // use the pool's first two /24s (b's agent said so); c never said.
        for (name, host, taken) in [
            ("a1", Some("m1"), ""),
            ("a2", Some("m1"), ""),
            ("b", Some("m2"), "0,1"),
            ("c", None, ""),
        ] {
            sqlx::query(
                "INSERT INTO nodes (name, age_recipient, enrolled_at, host, taken_subnets) VALUES (?, 'age1x', 0, ?, ?)",
            )
            .bind(name)
            .bind(host)
            .bind(taken)
            .execute(&ledger.pool)
            .await
            .expect("node");
        }
        let pairs: Vec<(String, String)> = [("e", "a1"), ("e", "a2"), ("e", "b"), ("e", "c"), ("f", "a2")]
            .iter()
            .map(|(e, n)| ((*e).to_owned(), (*n).to_owned()))
            .collect();
        for _ in 0..2 {
            // Twice: what has a subnet keeps it.
            let mut tx = ledger.write_tx().await.expect("tx");
            ledger.ensure_subnets(&mut tx, &pairs, 0).await.expect("subnets");
            tx.commit().await.expect("commit");
        }
        let got: Vec<String> = sqlx::query("SELECT environment, node, idx FROM subnets ORDER BY environment, node")
            .fetch_all(&ledger.pool)
            .await
            .expect("subnets")
            .iter()
            .map(|r| {
                let (e, n, i): (String, String, i64) = (
                    r.try_get(0).expect("e"),
                    r.try_get(1).expect("n"),
                    r.try_get(2).expect("i"),
                );
                format!("{e}@{n}={i}")
            })
            .collect();
        assert_eq!(got, ["e@a1=0", "e@a2=1", "e@b=2", "e@c=0", "f@a2=2"]);
    }

    #[test]
    fn subnet_indices_read_back_only_from_the_pool() {
        for i in [0, 1, 255, 256, 4095] {
            assert_eq!(subnet_index(&subnet(i)), Some(i));
        }
        for bad in ["10.224.0.0/24", "10.208.0.0/16", "10.208.0.1/24", "192.168.0.0/24", "x"] {
            assert_eq!(subnet_index(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn the_control_plane_id_is_made_once_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let ledger = Ledger::connect(&url, 2).await.expect("ledger");
        ledger.migrate().await.expect("migrate");
        let id = ledger.control_plane().await.expect("id");
        assert!(agent_proto::valid_control_plane(&id), "{id}");
        // Another daemon of the same ledger reads the same id.
        let again = Ledger::connect(&url, 2).await.expect("ledger");
        assert_eq!(again.control_plane().await.expect("id"), id);
        let other = tempfile::tempdir().expect("tempdir");
        let other = Ledger::connect(&format!("sqlite://{}", other.path().join("l.db").display()), 2)
            .await
            .expect("ledger");
        other.migrate().await.expect("migrate");
        assert_ne!(
            other.control_plane().await.expect("id"),
            id,
            "another ledger, another id"
        );
    }
}
