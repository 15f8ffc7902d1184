-- How a rollout's current step stands, typed (`state_schema::rollout::advance::StepState`):
-- a step that waits out a canary's pause or a promote has no jobs queued until it runs, so no
-- job carries a never-due `not_before` any more, and a canary's watch to its switch is a kind
-- of watch, not a far-future `watch_until`.
--   step_state: 'running' | 'paused' (until step_due, ms) | 'awaits-promote'
--   share:      the percent of requests the new release has from its last canary step done
--   watch:      '' (none) | 'window' (until watch_until) | 'to-switch' (a canary's, ended by
--               its switch or its rollback)
ALTER TABLE deployments ADD COLUMN step_state TEXT NOT NULL DEFAULT 'running';
ALTER TABLE deployments ADD COLUMN step_due BIGINT NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN share INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN watch TEXT NOT NULL DEFAULT '';
-- What the sentinels said, carried over: watch_until = i64::MAX / 2 was a canary's watch to
-- its switch; jobs queued with not_before = i64::MAX / 4 waited for a promote (they go: the
-- promote queues its step afresh). A timed pause in flight keeps its jobs, due at their time.
UPDATE deployments SET watch = CASE
    WHEN watch_until = 4611686018427387903 THEN 'to-switch'
    WHEN watch_until > 0 THEN 'window'
    ELSE '' END;
UPDATE deployments SET watch_until = 0 WHERE watch = 'to-switch';
UPDATE deployments SET step_state = 'awaits-promote'
WHERE status = 'in-progress' AND EXISTS (
    SELECT 1 FROM jobs j WHERE j.environment = deployments.environment AND j.generation = deployments.generation
    AND j.step = deployments.step AND j.state = 'queued' AND j.not_before = 2305843009213693951);
DELETE FROM jobs WHERE state = 'queued' AND not_before = 2305843009213693951;
DROP INDEX deployments_watched;
CREATE INDEX deployments_watched ON deployments (watch) WHERE watch <> '';
-- When the next pause ends, asked after every settle: the paused steps only (few).
CREATE INDEX deployments_paused ON deployments (step_due) WHERE step_state = 'paused';
-- A canary's gates are judged by the control plane on what every ingress measured of a share
-- (a step of `measure-canary` jobs; `state_schema::rollout::advance::verdict`), no longer by
-- each agent inside its next publish: each measure as its job reported it (the job's row
-- says which environment, generation and step).
CREATE TABLE step_measures (
    job_id      BIGINT PRIMARY KEY REFERENCES jobs (id),
    requests    BIGINT NOT NULL,
    errors      BIGINT NOT NULL,
    p95_micros  BIGINT,
    logged      INTEGER NOT NULL
);
-- A publish queued before carries the gate it was to judge; the agent no longer takes one.
-- (A canary upgraded mid-rollout takes that one share without its gates.)
UPDATE jobs SET task = (task::jsonb - 'gate')::text WHERE task LIKE '%"gate":{%' AND task LIKE '{"task":"publish-ingress"%';
