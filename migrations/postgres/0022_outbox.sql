-- Outgoing notifications (`store/outbox.rs`, `notify.rs`): commit statuses for the forge and
-- webhooks for events, written from the events table (whose id is the cursor kept here) and
-- delivered in order per target with retries. A row that exhausted its attempts, or that a full
-- queue could not take, is `dead`: the dead-letter record, with its last error. Payloads hold
-- no token or secret (those are read from files when a call is made).
CREATE TABLE outbox (
    id          BIGSERIAL PRIMARY KEY,
    target      TEXT    NOT NULL,  -- 'forge' or 'hook:<n>'
    event_id    BIGINT  NOT NULL,
    kind        TEXT    NOT NULL,  -- the event's kind
    payload     TEXT    NOT NULL,  -- JSON: a commit status, or the event as posted
    state       TEXT    NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts    BIGINT  NOT NULL DEFAULT 0,
    next_at     BIGINT  NOT NULL,
    last_error  TEXT    NOT NULL DEFAULT '',
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL
);
CREATE INDEX outbox_pending ON outbox (target, id) WHERE state = 'pending';
CREATE INDEX outbox_by_state ON outbox (state, id);
CREATE TABLE outbox_cursor (
    name     TEXT    PRIMARY KEY,
    event_id BIGINT  NOT NULL
);
