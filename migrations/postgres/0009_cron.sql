-- Cron roles: the newest scheduled time of each environment's cron role that was queued or
-- skipped. Times missed while the control plane was down collapse to one run past it.
CREATE TABLE cron_schedules (
    environment    TEXT    NOT NULL,
    role           TEXT    NOT NULL,
    last_scheduled BIGINT  NOT NULL,  -- Unix seconds, a whole minute
    PRIMARY KEY (environment, role)
);
