-- Rollbacks (`reconcile/rollback.rs`): the generation that served before the current one
-- (kept when a new generation starts over a finished rollout), so `pl rollback` can bring its
-- release back; and the hold a rollback puts on the environment (JSON: who, when, from which
-- generation to which, and the hash Git wanted then; '' for none), which ends when an accepted
-- commit changes the environment or an operator releases it.
ALTER TABLE deployments ADD COLUMN previous_generation BIGINT NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN previous_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE deployments ADD COLUMN previous_spec TEXT NOT NULL DEFAULT '';
ALTER TABLE deployments ADD COLUMN hold TEXT NOT NULL DEFAULT '';
-- A release's watch (`rollout.watchSeconds`, `store/watch.rs`): when the generation's rollout
-- finished (its switch) and until when its replicas are watched (0: not watched), and the first
-- failure a heartbeat showed ('' for none), which the pass turns into an automatic rollback.
ALTER TABLE deployments ADD COLUMN watch_from BIGINT NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN watch_until BIGINT NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN watch_failure TEXT NOT NULL DEFAULT '';
-- Heartbeats look only at deployments under watch: few at any time.
CREATE INDEX deployments_watched ON deployments (watch_until) WHERE watch_until > 0;
