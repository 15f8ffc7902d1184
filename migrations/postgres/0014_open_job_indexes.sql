-- The lease and expiry indexes hold open jobs only. A job is open for a moment and finished
-- for ever, so whole-table indexes grew with history while every lease and completion paid to
-- move each job's entry in them (on PostgreSQL, a state change writes an entry in every index;
-- a partial index is skipped when the new row is outside it). Within a node, queued jobs are
-- in id order, so "its oldest due jobs, up to N" reads N entries instead of sorting them all.
-- A step's jobs are found without their state in the key: a step has a few jobs, and an index
-- keyed by state moves an entry at every lease and every completion.
DROP INDEX jobs_leasable;
DROP INDEX jobs_expiring;
DROP INDEX jobs_by_step;
CREATE INDEX jobs_by_step ON jobs (environment, generation, step);
CREATE INDEX jobs_queued ON jobs (target_node, id, not_before) WHERE state = 'queued';
CREATE INDEX jobs_leased ON jobs (lease_expires_at) WHERE state = 'leased';
