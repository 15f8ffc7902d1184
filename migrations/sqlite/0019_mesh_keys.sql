-- The mesh between nodes: each node's WireGuard public key, the UDP port it listens on and
-- the address it says it is reached at, as its agent last said in a heartbeat (the private
-- key never leaves the node), and what its service names answer with its own replicas (JSON:
-- environment, role, addresses), which other nodes' names add. A node without a key is not in
-- the mesh.
ALTER TABLE nodes ADD COLUMN mesh_key TEXT;
ALTER TABLE nodes ADD COLUMN mesh_port INTEGER;
ALTER TABLE nodes ADD COLUMN mesh_address TEXT;
ALTER TABLE nodes ADD COLUMN mesh_names TEXT;
-- Each keyed node's mesh as the control plane decided it (`reconcile/mesh.rs`): its spec
-- (JSON of the wire's MeshSpec without the generation), a hash of it, and a generation that
-- rises whenever the spec changes; `applied` is the generation the node's agent last said it
-- applied, `links` its peers' last handshakes as it said (JSON), for `pl nodes`.
CREATE TABLE node_meshes (
    node       TEXT    PRIMARY KEY,
    generation INTEGER NOT NULL,
    hash       TEXT    NOT NULL,
    spec       TEXT    NOT NULL,
    applied    INTEGER NOT NULL DEFAULT 0,
    links      TEXT    NOT NULL DEFAULT '[]'
);
