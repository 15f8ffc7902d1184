//! Nodes: every declared node with what its agent last said (and its mesh); a one-time
//! enrolment token for a declared node (shown once; the ledger keeps its hash); a new mesh key
//! pair for a node (the control plane raises the key epoch; the node makes the pair itself
//! when its next mesh carries it, and its private key never leaves it).

use super::{Answer, Kind, OpError, Ops, wire};
use crate::store::fleet::NodeRow;
use crate::store::{Ledger, LedgerError, now_ms};
use operator_proto::nodes::{MeshKeyAsked, NodeToken, Nodes};
use state_schema::declared::{self, Declared};
use std::collections::BTreeMap;

/// The node pools `branch`'s accepted state declares, decoded from the ledger's documents.
pub async fn applied_pools(
    ledger: &Ledger,
    branch: &str,
) -> Result<Vec<(state_schema::values::Name, state_schema::model::NodePool)>, LedgerError> {
    Ok(crate::hub::node_pools(&ledger.nodes().pool_documents(branch).await?))
}

/// The hashes of `branch`'s applied pools: equal hashes, the same pools.
pub async fn pools_signature(ledger: &Ledger, branch: &str) -> Result<Vec<String>, LedgerError> {
    ledger.nodes().pool_hashes(branch).await
}

/// Every node `branch`'s accepted state declares, by name, with what the control plane saw
/// of it (its lifecycle state: `declared::lifecycle`, after `lost_after_ms` of silence lost)
/// and what its replicas reserve in the fleet placement sees now
/// (`state_schema::replacement::fleet_of`).
pub async fn node_rows(
    ledger: &Ledger,
    branch: &str,
    now_ms: i64,
    lost_after_ms: i64,
) -> Result<Vec<NodeRow>, LedgerError> {
    rows_of(ledger, branch, (now_ms, lost_after_ms), None).await
}

/// A page of [`node_rows`]: at most `limit` nodes after `after`, by name. What a node's
/// reservations need is still read for the fleet (every node's row and running spec: any
/// deployment may hold room on a page's node); each node's report and certificates only for
/// the page's nodes.
pub async fn node_rows_page(
    ledger: &Ledger,
    branch: &str,
    (now_ms, lost_after_ms): (i64, i64),
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<NodeRow>, LedgerError> {
    rows_of(ledger, branch, (now_ms, lost_after_ms), Some((after, limit))).await
}

async fn rows_of(
    ledger: &Ledger,
    branch: &str,
    (now_ms, lost_after_ms): (i64, i64),
    page: Option<(Option<&str>, usize)>,
) -> Result<Vec<NodeRow>, LedgerError> {
    let seen = ledger.nodes().seen_nodes().await?;
    let pools = applied_pools(ledger, branch).await?;
    let rows = ledger.nodes().fleet_rows_seen(&seen, lost_after_ms).await?;
    let fleet = state_schema::replacement::fleet_of(&pools, &rows, now_ms);
    let mut placed: BTreeMap<String, usize> = BTreeMap::new();
    for i in rows.running.iter().flat_map(|s| &s.instances) {
        *placed.entry(i.node.to_string()).or_default() += 1;
    }
    // The declared nodes by name, cut to the page asked for before anything is read per node.
    let mut listed: Vec<_> = pools
        .iter()
        .flat_map(|(pool, p)| p.nodes.iter().map(move |n| (pool, n)))
        .collect();
    listed.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    if let Some((after, limit)) = page {
        listed.retain(|(_, n)| after.is_none_or(|a| n.name.as_str() > a));
        listed.truncate(limit);
    }
    let since = now_ms - state_schema::placement::UNHEALTHY_AFTER_MS;
    let (observed, cas) = match page {
        None => (
            ledger.nodes().observed_replicas(since).await?,
            ledger.nodes().node_cas().await?,
        ),
        Some(_) => {
            let names: Vec<&str> = listed.iter().map(|(_, n)| n.name.as_str()).collect();
            (
                ledger.nodes().observed_replicas_of(&names, since).await?,
                ledger.nodes().node_cas_of(&names).await?,
            )
        }
    };
    let mut out = Vec::with_capacity(listed.len());
    for (pool, n) in listed {
        let name = n.name.to_string();
        let s = seen.get(&name);
        let last_seen = s.and_then(|s| s.last_seen);
        let (cpu, mem) = fleet.reserved(&n.name);
        let protocol = s.filter(|s| s.last_seen.is_some()).map(|s| s.agent_protocol);
        out.push(NodeRow {
            state: declared::lifecycle(
                n.state,
                s.is_some(),
                s.and_then(|s| s.live_from()),
                now_ms,
                lost_after_ms,
            )
            .to_owned(),
            pool: pool.to_string(),
            cpu_millis: n.capacity.cpu.millis(),
            memory_bytes: n.capacity.memory.bytes(),
            last_seen_ms: last_seen,
            agent_version: s.and_then(|s| s.agent_version.clone()),
            agent_protocol: protocol,
            older_agent: protocol.is_some_and(|p| p < agent_proto::PROTOCOL),
            instances: placed.get(&name).copied().unwrap_or(0),
            running: observed
                .get(&name)
                .map_or(0, |list| list.iter().filter(|i| i.healthy).count()),
            reserved_cpu_millis: cpu,
            reserved_memory_bytes: mem,
            capabilities: s.map(|s| s.capabilities.iter().cloned().collect()).unwrap_or_default(),
            certificate_ca: cas.get(&name).cloned(),
            name,
        });
    }
    Ok(out)
}

/// What `branch`'s accepted state declares of `node`.
pub async fn declared_node(ledger: &Ledger, branch: &str, node: &str) -> Result<Declared, LedgerError> {
    let pools = applied_pools(ledger, branch).await?;
    Ok(declared::declared_nodes(&pools).remove(node).unwrap_or(Declared::No))
}

impl Ops {
    /// Lease freshness's population, read now and cheaply (two statements, no replicas): every
    /// node Git declares and does not retire that has enrolled and been heard from, with when
    /// it last leased or beat.
    pub async fn heard_from(&self) -> Answer<Vec<(String, i64)>> {
        let seen = self.ledger.nodes().seen_nodes().await?;
        let pools = applied_pools(&self.ledger, &self.branch).await?;
        Ok(pools
            .iter()
            .flat_map(|(_, p)| &p.nodes)
            .filter(|n| n.state != state_schema::model::NodeState::Retired)
            .filter_map(|n| {
                let name = n.name.to_string();
                let at = seen.get(&name)?.last_seen?;
                Some((name, at))
            })
            .collect())
    }

    /// `GET /v1/nodes`: what Git declares and what each node's agent said, with its mesh, by
    /// name: at most `limit` nodes after `after`, and the next page's cursor when there may be
    /// more (a fleet of 10,000 is not one answer). Only the page's rows are turned into answers.
    pub async fn nodes(&self, after: Option<&str>, limit: u32) -> Answer<Nodes> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let times = (now_ms(), self.lost_after_ms);
        let rows = node_rows_page(&self.ledger, &self.branch, times, after, limit).await?;
        let nodes = self.answered(rows).await?;
        Ok(Nodes {
            next: (nodes.len() == limit)
                .then(|| nodes.last().map(|n| n.name.clone()))
                .flatten(),
            nodes,
        })
    }

    /// Every declared node, by name (the indicators read every node's mesh links).
    pub async fn all_nodes(&self) -> Answer<Vec<operator_proto::nodes::Node>> {
        let rows = self.rows_by_name().await?;
        self.answered(rows).await
    }

    async fn rows_by_name(&self) -> Result<Vec<NodeRow>, LedgerError> {
        let mut rows = node_rows(&self.ledger, &self.branch, now_ms(), self.lost_after_ms).await?;
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(rows)
    }

    /// `rows` as the operator's wire has them, each with its mesh.
    async fn answered(&self, rows: Vec<NodeRow>) -> Answer<Vec<operator_proto::nodes::Node>> {
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        let meshes = self.ledger.nodes().mesh_states_of(&names).await?;
        Ok(wire::all(rows, |r| {
            let mesh = meshes.get(&r.name);
            wire::node(r, mesh)
        })?)
    }

    /// `POST /v1/nodes/{node}/token`: a one-time token, valid 15 minutes, for a node Git
    /// declares (and has not retired).
    pub async fn node_token(&self, who: &str, node: &str) -> Answer<NodeToken> {
        match declared_node(&self.ledger, &self.branch, node).await? {
            Declared::Yes { .. } | Declared::Draining { .. } => {}
            Declared::Retired => {
                return Err(OpError::new(
                    Kind::Forbidden,
                    "node-retired",
                    "the node is retired in Git",
                ));
            }
            Declared::No => {
                return Err(OpError::not_found(
                    "node-not-declared",
                    "no node of that name is declared in the accepted state",
                ));
            }
        }
        let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
        getrandom::fill(&mut *bytes)
            .map_err(|_| OpError::unavailable("the operating system's random source failed"))?;
        let token = zeroize::Zeroizing::new(format!("ple_{}", hex::encode(&bytes[..])));
        let expires_at_ms = self
            .ledger
            .nodes()
            .add_enrolment_token(node, &token, who, now_ms())
            .await?;
        tracing::info!(node = %node, by = %who, "enrolment token made");
        Ok(NodeToken {
            node: node.to_owned(),
            token: token.to_string(),
            expires_at_ms,
        })
    }

    /// `POST /v1/nodes/{node}/mesh-key`: the node's key epoch raised; decided now, so the
    /// node's next mesh carries it.
    pub async fn rotate_mesh_key(&self, who: &str, node: &str) -> Answer<MeshKeyAsked> {
        if node.is_empty() || node.len() > 63 || !node.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(OpError::malformed("a node name is letters, digits and dashes"));
        }
        let epoch = self
            .ledger
            .nodes()
            .rotate_mesh_key(node, who, now_ms())
            .await?
            .ok_or_else(|| {
                OpError::not_found(
                    "mesh-not-joined",
                    format!("{node} has no mesh key: it is not a node, or its agent has not joined the mesh"),
                )
            })?;
        tracing::info!(node = %node, by = %who, epoch, "mesh key rotation asked");
        self.hub.hint.notify_one();
        Ok(MeshKeyAsked {
            node: node.to_owned(),
            key_epoch: epoch,
        })
    }
}
