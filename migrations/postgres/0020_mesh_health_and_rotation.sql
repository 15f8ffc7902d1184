-- Mesh health (`reconcile/mesh_health.rs`): when the node's agent last said it applied a newer
-- generation (Unix ms; a peer that has never handshaken is "connecting" for a while after
-- it, then down), and the peers whose links were judged down last (JSON list of node names),
-- so a change of health is an event once.
ALTER TABLE node_meshes ADD COLUMN applied_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE node_meshes ADD COLUMN down TEXT NOT NULL DEFAULT '[]';
-- Key rotation: raised by `pl nodes rotate-mesh-key`; a node whose mesh carries a higher
-- epoch than it used last makes a new key pair before applying it (the private key never
-- leaves the node; only the new public key comes back, with the next heartbeat).
ALTER TABLE nodes ADD COLUMN mesh_key_epoch BIGINT NOT NULL DEFAULT 0;
