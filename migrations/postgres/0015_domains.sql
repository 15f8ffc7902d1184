-- Custom domains (Domain documents of current rollouts) and what their last DNS check proved.
-- state: pending (never proven: not routed, no certificate), verified, failing (proven once,
-- not at the last check: still served, no new certificate). `seen` is what the resolver
-- answered, cut short; `reason` what is missing; `verified_at` when it was first proven.
CREATE TABLE domains (
    hostname      TEXT    PRIMARY KEY,
    environment   TEXT    NOT NULL,
    method        TEXT    NOT NULL,
    state         TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'verified', 'failing')),
    ever_verified BIGINT NOT NULL DEFAULT 0,
    seen          TEXT,
    reason        TEXT,
    checked_at    BIGINT NOT NULL DEFAULT 0,
    next_check_at BIGINT NOT NULL DEFAULT 0,
    verified_at   BIGINT NOT NULL DEFAULT 0,
    updated_at    BIGINT NOT NULL
);

-- When each certificate was last issued (a publish made after it carries it).
ALTER TABLE certificates ADD COLUMN issued_at BIGINT NOT NULL DEFAULT 0;
