-- Each scheduled snapshot the leader took (`[snapshots]`): when, where, how large, or why it
-- failed. `/metrics` serves the newest success's age (an alert fires past 26 hours); the
-- archive itself lives in `snapshots.dir`, not here. Append-only.
CREATE TABLE snapshots (
    id         BIGSERIAL PRIMARY KEY,
    taken_at   BIGINT NOT NULL,
    path       TEXT   NOT NULL,
    bytes      BIGINT NOT NULL,
    error      TEXT   NOT NULL DEFAULT ''
);
