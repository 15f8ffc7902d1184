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
    generation  BIGINT NOT NULL DEFAULT 1,
    size_bytes  BIGINT,
    retain_days BIGINT NOT NULL DEFAULT 7,
    created_at  BIGINT NOT NULL,
    released_at BIGINT,
    bytes       BIGINT,
    measured_at BIGINT NOT NULL DEFAULT 0,
    drain_blocked_at BIGINT,
    PRIMARY KEY (environment, volume)
);
