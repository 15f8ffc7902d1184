-- The job ledger (SQLite). Times are milliseconds since the epoch, UTC.

-- One counter per name; `fencing` only ever grows and stamps every lease.
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO counters (name, value) VALUES ('fencing', 0);

-- Current state of each job lives here; its history lives in job_results and events.
CREATE TABLE jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    key              TEXT    NOT NULL UNIQUE,   -- idempotency key: what the job is, not when
    task             TEXT    NOT NULL,          -- the typed task, as JSON
    target_node      TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('queued', 'leased', 'succeeded', 'failed', 'dead', 'cancelled')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL CHECK (max_attempts > 0),
    not_before       INTEGER NOT NULL,
    lease_token      TEXT,
    fencing_token    INTEGER,
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX jobs_leasable ON jobs (target_node, state, not_before, id);
CREATE INDEX jobs_expiring ON jobs (state, lease_expires_at);

-- Append-only: what each attempt reported.
CREATE TABLE job_results (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id        INTEGER NOT NULL REFERENCES jobs (id),
    fencing_token INTEGER NOT NULL,
    outcome       TEXT    NOT NULL CHECK (outcome IN ('succeeded', 'retryable', 'permanent')),
    detail        TEXT    NOT NULL,
    at            INTEGER NOT NULL
);

-- Append-only: the event stream; `id` is the cursor.
CREATE TABLE events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    kind    TEXT    NOT NULL,
    subject TEXT    NOT NULL,
    detail  TEXT    NOT NULL
);

CREATE TRIGGER job_results_no_update BEFORE UPDATE ON job_results BEGIN SELECT RAISE(ABORT, 'job_results is append-only'); END;
CREATE TRIGGER job_results_no_delete BEFORE DELETE ON job_results BEGIN SELECT RAISE(ABORT, 'job_results is append-only'); END;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT RAISE(ABORT, 'events is append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN SELECT RAISE(ABORT, 'events is append-only'); END;
