-- Rollbacks (`reconcile/rollback.rs`): the generation that served before the current one
-- (kept when a new generation starts over a finished rollout), so `pl rollback` can bring its
-- release back; and the hold a rollback puts on the environment (JSON: who, when, from which
-- generation to which, and the hash Git wanted then; '' for none), which ends when an accepted
-- commit changes the environment or an operator releases it.
ALTER TABLE deployments ADD COLUMN previous_generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN previous_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE deployments ADD COLUMN previous_spec TEXT NOT NULL DEFAULT '';
ALTER TABLE deployments ADD COLUMN hold TEXT NOT NULL DEFAULT '';
