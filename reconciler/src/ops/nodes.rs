//! Nodes: every declared node with what its agent last said (and its mesh); a one-time
//! enrolment token for a declared node (shown once; the ledger keeps its hash); a new mesh key
//! pair for a node (the control plane raises the key epoch; the node makes the pair itself
//! when its next mesh carries it, and its private key never leaves it).

use super::{Answer, Kind, OpError, Ops, wire};
use crate::store::fleet::Declared;
use crate::store::now_ms;
use operator_proto::nodes::{MeshKeyAsked, NodeToken, Nodes};

impl Ops {
    /// `GET /v1/nodes`: what Git declares and what each node's agent said, with its mesh.
    pub async fn nodes(&self) -> Answer<Nodes> {
        let rows = self
            .ledger
            .nodes(
                &self.branch,
                now_ms(),
                self.lost_after_ms,
                state_schema::replacement::fleet_of,
            )
            .await?;
        let meshes = self.ledger.meshes().await?;
        Ok(Nodes {
            nodes: wire::all(rows, |r| {
                let mesh = meshes.get(&r.name);
                wire::node(r, mesh)
            })?,
        })
    }

    /// `POST /v1/nodes/{node}/token`: a one-time token, valid 15 minutes, for a node Git
    /// declares (and has not retired).
    pub async fn node_token(&self, who: &str, node: &str) -> Answer<NodeToken> {
        match self.ledger.declared_node(&self.branch, node).await? {
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
        let expires_at_ms = self.ledger.add_enrolment_token(node, &token, who, now_ms()).await?;
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
        let epoch = self.ledger.rotate_mesh_key(node, who, now_ms()).await?.ok_or_else(|| {
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
