-- Node enrolment. A node is declared in Git (a NodePool's `nodes`); these tables hold what the
-- control plane knows of it beyond that: its age recipient, its certificates, and the one-time
-- tokens that let it enrol. Tokens are stored as SHA-256 hashes only.
CREATE TABLE nodes (
    name          TEXT    PRIMARY KEY,
    age_recipient TEXT    NOT NULL,
    enrolled_at   BIGINT NOT NULL,
    last_seen     BIGINT,
    agent_version TEXT
);

CREATE TABLE enrolment_tokens (
    token_hash TEXT    PRIMARY KEY,
    node       TEXT    NOT NULL,
    created_by TEXT    NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at    BIGINT
);

-- Every certificate ever issued to a node; `revoked_at` set when it may no longer be used.
CREATE TABLE node_certificates (
    fingerprint TEXT    PRIMARY KEY,  -- SHA-256 of the DER, hex
    node        TEXT    NOT NULL,
    issued_at   BIGINT NOT NULL,
    not_after   BIGINT NOT NULL,
    revoked_at  BIGINT,
    replaces    TEXT  -- the certificate this one renewed: revoked when this one is first used
);
CREATE INDEX node_certificates_by_node ON node_certificates (node);
