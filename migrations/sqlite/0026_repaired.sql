-- A drift repair that succeeded (`…:ensure#r<n>`), waiting for the pass to publish its
-- environment's routes again (`reconcile::drift`): written in the completion's transaction,
-- taken (and the publish jobs queued) in one of the pass's. The decision of what to publish
-- is the pure core's, so it is not made in the completion's transaction.
CREATE TABLE repaired (
    job_key TEXT PRIMARY KEY,
    at INTEGER NOT NULL
);
