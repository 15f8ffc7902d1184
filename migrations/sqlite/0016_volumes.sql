-- Volumes: an environment's data, on the node where its role was first placed (its pin).
-- `generation` grows with each restore (a restore makes a new volume, the old one is kept);
-- `released_at` is set when the environment is torn down, and the row (with the volume on
-- its node) goes `retain_days` later or by `pl volume rm`. `bytes` and `measured_at` are
-- what the node's agent last reported (NULL: never measured). `drain_blocked_at`: since when a
-- drain of its node waits for it to be moved (NULL: none).
CREATE TABLE volumes (
    environment TEXT    NOT NULL,
    volume      TEXT    NOT NULL,
    role        TEXT    NOT NULL,
    node        TEXT    NOT NULL,
    generation  INTEGER NOT NULL DEFAULT 1,
    size_bytes  INTEGER,
    retain_days INTEGER NOT NULL DEFAULT 7,
    created_at  INTEGER NOT NULL,
    released_at INTEGER,
    bytes       INTEGER,
    measured_at INTEGER NOT NULL DEFAULT 0,
    drain_blocked_at INTEGER,
    PRIMARY KEY (environment, volume)
);
