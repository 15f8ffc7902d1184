-- Mesh health (`reconcile/mesh_health.rs`): when the node's agent last said it applied a newer
-- generation (Unix ms; a peer that has never handshaken is "connecting" for a while after
-- it, then down), and the peers whose links were judged down last (JSON list of node names),
-- so a change of health is an event once.
ALTER TABLE node_meshes ADD COLUMN applied_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE node_meshes ADD COLUMN down TEXT NOT NULL DEFAULT '[]';
