//! Placement against the live fleet: the ledger's side of `state_schema::placement`. With the
//! fleet a placement run sees (`store::placement`: what Git declares, what heartbeats said,
//! what running deployments reserve), it re-places running deployments when the fleet changes (a node lost,
//! draining or retired; room appearing for a waiting replica), announces waiting replicas once,
//! and hands each environment a subnet per node.
//!
//! Level-triggered like the rest of the reconciler: `replace` compares what placement says now
//! with what the ledger holds and writes only the difference, through the same planner that
//! applies commits (`plan_branch`), so a move is a new generation with the usual order (the new
//! replica healthy before the old one stops) and a newly placed waiting replica is a scale.

use crate::reconcile::deploy::Applied;
use crate::store::{Ledger, LedgerError};
use state_schema::desired::Desired;
use state_schema::model::NodePool;
use state_schema::placement::{Liveness, Waiting};
use state_schema::replacement;
use state_schema::values::Name;
use std::collections::BTreeMap;

use state_schema::placement::subnets::{self, Want};

type Tx = crate::store::WriteTx;

impl Ledger {
    /// The node pools `branch`'s accepted state declares, decoded from the ledger's documents
    /// (`state_schema::declared::node_pools`).
    pub(crate) async fn applied_pools(&self, branch: &str) -> Result<Vec<(Name, NodePool)>, LedgerError> {
        Ok(crate::hub::node_pools(&self.nodes().pool_documents(branch).await?))
    }

    /// A cheap summary of what placement depends on: each node's liveness class and
    /// capabilities, the applied branch's pools, each running deployment's spec hash (what it
    /// reserves where), and which finished ones have replicas waiting. A step advancing
    /// changes none of it. Equal signatures: re-placing would change nothing, so it is skipped.
    pub async fn fleet_signature(
        &self,
        applied_branch: &str,
        now_ms: i64,
        lost_after: i64,
    ) -> Result<String, LedgerError> {
        let seen = self.nodes().seen_nodes().await?;
        let nodes: Vec<(String, Liveness, Vec<String>)> = seen
            .into_iter()
            .map(|(n, s)| {
                (
                    n,
                    Liveness::of(s.live_from(), now_ms, lost_after),
                    s.capabilities.into_iter().collect(),
                )
            })
            .collect();
        let pools = self.nodes().pool_hashes(applied_branch).await?;
        let deployments = self.nodes().placement_marks().await?;
        // A restore moves a volume to its next generation: its role is placed again on it.
        let restores = self.volumes().volume_generation_mark().await?;
        Ok(state_schema::canonical::hash(&(nodes, pools, deployments, restores)))
    }

    /// Re-places every running deployment against the fleet as it is now, and writes what
    /// changed: a replica that must leave its node (lost, draining, retired, out of the pool)
    /// moves at a new generation; a waiting replica that now fits is added at the current
    /// generation once its rollout is done. Pools come from the accepted state of
    /// `applied_branch`. Returns what was started.
    pub async fn replace(&self, applied_branch: &str, now_ms: i64, lost_after_ms: i64) -> Result<Applied, LedgerError> {
        let pools = self.applied_pools(applied_branch).await?;
        let snapshot = self.nodes().fleet_snapshot(now_ms, lost_after_ms).await?;
        // A drain never moves a volume's role: each such volume is reported once (and the
        // drain waits until it is moved). The decision is placement's own.
        let mut fleet = replacement::live_fleet(&pools, &snapshot.nodes, &[], now_ms, snapshot.lost_after_ms);
        fleet.pin(snapshot.pins.iter().cloned());
        let blocked = fleet.pinned_to_draining();
        self.volumes().mark_drain_blocked(&blocked, now_ms).await?;
        // The decision is `replacement::replace_snapshot`'s, the one `pl plan --fleet` shows.
        let mut by_branch: BTreeMap<String, Vec<Desired>> = BTreeMap::new();
        for r in replacement::replace_snapshot(snapshot, &pools) {
            by_branch.entry(r.branch).or_default().push(r.desired);
        }
        let mut applied = Applied::default();
        for (branch, wanted) in by_branch {
            let Some(revision) = self.deployments().last_accepted_id(&self.pool, &branch).await? else {
                continue;
            };
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
        let stored = self.nodes().waiting_stored(tx).await?;
        for (env, waiting) in wanted {
            let env = env.as_str();
            let now = serde_json::to_string(waiting)?;
            let before = stored.get(env).map_or("[]", String::as_str);
            if now == before {
                continue;
            }
            self.nodes().set_waiting(tx, env, &now).await?;
            let was: Vec<Waiting> = serde_json::from_str(before).unwrap_or_default();
            for w in waiting.iter().filter(|w| !was.contains(w)) {
                let detail = format!("{}/{}: {}", w.role, w.index, w.reason);
                self.events()
                    .event(tx, now_ms, "placement-waiting", env, &detail)
                    .await?;
            }
        }
        Ok(())
    }

    /// Gives each (environment, node) pair of `wants` a subnet of its own on that node, if it
    /// has none: the choice is `state_schema::placement::subnets::give`'s (unique on the node's
    /// machine and among environments whose pools overlap, so the mesh routes one /24 to one
    /// place), over the pools `branch` declares. Kept until the environment is torn down. A
    /// pair none is left for is said once as a `subnet-pool-exhausted` event.
    pub(crate) async fn ensure_subnets(
        &self,
        tx: &mut Tx,
        branch: &str,
        wants: &[Want],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        if wants.is_empty() {
            return Ok(());
        }
        // Read in `tx`: the pools of the commit being applied, not the one before.
        let pools = crate::hub::node_pools(&self.nodes().pool_documents_in(tx, branch).await?);
        let rows = self.nodes().subnet_fleet(tx).await?;
        let index = |i: i64| usize::try_from(i).ok();
        let fleet = subnets::Fleet {
            held: rows
                .held
                .into_iter()
                .filter_map(|(n, e, i)| Some((n, e, index(i)?)))
                .collect(),
            host: rows.host.into_iter().collect(),
            taken: rows
                .taken
                .into_iter()
                .map(|(n, list)| (n, list.into_iter().filter_map(index).collect()))
                .collect(),
            pools: pools
                .iter()
                .map(|(name, pool)| {
                    (
                        name.to_string(),
                        pool.nodes.iter().map(|n| n.name.to_string()).collect(),
                    )
                })
                .collect(),
        };
        let given = subnets::give(&fleet, wants);
        for (env, node) in &given.exhausted {
            let detail = format!(
                "no /24 left in 10.208.0.0/12 for {env} on this node: its machine and the nodes of overlapping pools hold them all"
            );
            self.events()
                .event(tx, now_ms, "subnet-pool-exhausted", node, &detail)
                .await?;
        }
        let new: Vec<(String, String, i64)> = given
            .new
            .into_iter()
            .filter_map(|(n, e, i)| Some((n, e, i64::try_from(i).ok()?)))
            .collect();
        self.nodes().add_subnets(tx, &new).await
    }

    /// The pairs `spec` runs on, wanting subnets.
    pub(crate) fn subnet_wants(spec: &state_schema::deployment::DeploymentSpec) -> Vec<Want> {
        spec.nodes
            .iter()
            .map(|n| Want {
                environment: spec.environment.to_string(),
                node: n.to_string(),
                pool: spec.pool.as_ref().map(ToString::to_string),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Ledger;
    use crate::store::rows::{subnet, subnet_index};
    use sqlx::Row;
    use state_schema::placement::subnets::Want;

    #[tokio::test]
    async fn every_node_gets_subnets_no_other_node_holds_and_its_machine_does_not_use() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ledger, _) = Ledger::sqlite_in(dir.path()).await;
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
        // No pools declared: every pair avoids what the whole fleet holds.
        let wants: Vec<Want> = [("e", "a1"), ("e", "a2"), ("e", "b"), ("e", "c"), ("f", "a2")]
            .iter()
            .map(|(e, n)| Want {
                environment: (*e).to_owned(),
                node: (*n).to_owned(),
                pool: Some("p".to_owned()),
            })
            .collect();
        for _ in 0..2 {
            // Twice: what has a subnet keeps it.
            let mut tx = ledger.write_tx().await.expect("tx");
            ledger
                .ensure_subnets(&mut tx, "main", &wants, 0)
                .await
                .expect("subnets");
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
        // One /24, one place in the fleet (the mesh routes them between nodes); b's machine's
        // taken ones are never given.
        assert_eq!(got, ["e@a1=0", "e@a2=1", "e@b=2", "e@c=3", "f@a2=4"]);
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
        let (ledger, url) = Ledger::sqlite_in(dir.path()).await;
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
