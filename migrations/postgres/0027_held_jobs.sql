-- A scale's job that waits for the rest of its scale (the removals of a move) is held: a
-- typed column, instead of a `not_before` of i64::MAX that no clock reaches. A held job is
-- queued (pending for its step and its rollout) but never leased; the scale's last success
-- releases it (`held = 0`, due at once). Rows held before carry over.
ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET held = 1, not_before = updated_at WHERE state = 'queued' AND not_before = 9223372036854775807;
-- Leases look only at queued jobs that are not held: the partial index says both, so a lease
-- still reads the index alone.
DROP INDEX jobs_queued;
CREATE INDEX jobs_queued ON jobs (target_node, id, not_before) WHERE state = 'queued' AND held = 0;
