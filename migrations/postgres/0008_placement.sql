-- Placement and delivery. Heartbeats say what a node can run and what it runs; a deployment
-- remembers the replicas that wait for room (so a wait is announced once); each environment
-- gets one subnet per node it runs on, chosen here and unique on that node; secrets reach a
-- node sealed to its own age key, and those sealed copies are kept (never plaintext).
ALTER TABLE nodes ADD COLUMN capabilities TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN observed TEXT;
ALTER TABLE deployments ADD COLUMN waiting TEXT NOT NULL DEFAULT '[]';
-- The CA that signed each certificate (SHA-256 of its DER, hex): during a CA rotation,
-- `pl nodes` shows which nodes still hold a certificate from the old one.
ALTER TABLE node_certificates ADD COLUMN ca TEXT;

CREATE TABLE subnets (
    node        TEXT    NOT NULL,
    environment TEXT    NOT NULL,
    idx         BIGINT NOT NULL,  -- the n-th /24 of the subnet pool
    PRIMARY KEY (node, environment),
    UNIQUE (node, idx)
);

CREATE TABLE sealed_secrets (
    node        TEXT    NOT NULL,
    ciphertext  TEXT    NOT NULL,  -- SHA-256 of the Git ciphertext, hex
    sealed      TEXT    NOT NULL,  -- the value, age-encrypted to the node's recipient alone
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (node, ciphertext)
);
