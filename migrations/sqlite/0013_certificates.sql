-- Certificates the control plane issues for the hostnames it serves (an issuer configured in
-- [certificates]; a certificate the user brings in Git is not here). The chain is public; the
-- key is age-encrypted to the control host's own recipient, so no row holds it in the clear.
-- A hostname that failed has a row without a chain: its failures, when to try again, and why.
-- `issued` counts issuances: each one's re-publish jobs are keyed by it.
CREATE TABLE certificates (
    hostname    TEXT    PRIMARY KEY,
    issuer      TEXT    NOT NULL,
    chain       TEXT,
    key_sealed  TEXT,
    not_before  INTEGER NOT NULL DEFAULT 0,
    not_after   INTEGER NOT NULL DEFAULT 0,
    renew_after INTEGER NOT NULL DEFAULT 0,
    issued      INTEGER NOT NULL DEFAULT 0,
    failures    INTEGER NOT NULL DEFAULT 0,
    retry_at    INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT,
    updated_at  INTEGER NOT NULL
);
