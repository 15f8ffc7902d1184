-- Backups: each backup of a volume that ended, as the node's agent reported it (`succeeded`
-- with restic's snapshot id and sizes, or `failed` with its reason). The newest
-- 200 per volume are kept. When a volume's next scheduled backup is due lives in
-- `cron_schedules`, under the role `volume:<name>` (a role's name has no `:`).
CREATE TABLE backups (
    id          BIGSERIAL PRIMARY KEY,
    environment TEXT    NOT NULL,
    volume      TEXT    NOT NULL,
    generation  BIGINT  NOT NULL,
    node        TEXT    NOT NULL,
    job_key     TEXT    NOT NULL UNIQUE,
    finished_at BIGINT  NOT NULL,
    status      TEXT    NOT NULL,
    snapshot    TEXT,
    bytes       BIGINT,
    data_added  BIGINT,
    reason      TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX backups_by_volume ON backups (environment, volume, id);
