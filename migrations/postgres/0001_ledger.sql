-- The job ledger (PostgreSQL). Times are milliseconds since the epoch, UTC.

-- One counter per name; `fencing` only ever grows and stamps every lease.
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO counters (name, value) VALUES ('fencing', 0);

-- Current state of each job lives here; its history lives in job_results and events.
CREATE TABLE jobs (
    id               BIGSERIAL PRIMARY KEY,
    key              TEXT    NOT NULL UNIQUE,   -- idempotency key: what the job is, not when
    task             TEXT    NOT NULL,          -- the typed task, as JSON
    target_node      TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('queued', 'leased', 'succeeded', 'failed', 'dead', 'cancelled')),
    attempts         BIGINT  NOT NULL DEFAULT 0,
    max_attempts     BIGINT  NOT NULL CHECK (max_attempts > 0),
    not_before       BIGINT  NOT NULL,
    lease_token      TEXT,
    fencing_token    BIGINT,
    lease_expires_at BIGINT,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL
);
CREATE INDEX jobs_leasable ON jobs (target_node, state, not_before, id);
CREATE INDEX jobs_expiring ON jobs (state, lease_expires_at);

-- Append-only: what each attempt reported.
CREATE TABLE job_results (
    id            BIGSERIAL PRIMARY KEY,
    job_id        BIGINT NOT NULL REFERENCES jobs (id),
    fencing_token BIGINT NOT NULL,
    outcome       TEXT   NOT NULL CHECK (outcome IN ('succeeded', 'retryable', 'permanent')),
    detail        TEXT   NOT NULL,
    at            BIGINT NOT NULL
);

-- Append-only: the event stream; `id` is the cursor.
CREATE TABLE events (
    id      BIGSERIAL PRIMARY KEY,
    at      BIGINT NOT NULL,
    kind    TEXT   NOT NULL,
    subject TEXT   NOT NULL,
    detail  TEXT   NOT NULL
);

CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END;
$$;
CREATE TRIGGER job_results_append_only BEFORE UPDATE OR DELETE ON job_results FOR EACH ROW EXECUTE FUNCTION refuse_change();
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events FOR EACH ROW EXECUTE FUNCTION refuse_change();
CREATE TRIGGER job_results_no_truncate BEFORE TRUNCATE ON job_results FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();
