-- Each release's commit-to-live: when the pass that judged its commit made the generation
-- (`made_at`), and when every replica ran it with its routes published (`live_at`, the time of
-- its `deployment-rollout-done`). Written in the transaction that records the release done;
-- a rollback's own generation is no release and has no row. The web view's fleet-wide picture
-- over days reads it by `live_at` (events have no index by kind, and a day's events of a big
-- fleet are millions); append-only like the generations it pairs.
CREATE TABLE releases_live (
    environment TEXT    NOT NULL,
    generation  INTEGER NOT NULL,
    made_at     INTEGER NOT NULL,
    live_at     INTEGER NOT NULL,
    PRIMARY KEY (environment, generation)
);
CREATE INDEX releases_live_by_time ON releases_live (live_at);
CREATE TRIGGER releases_live_no_update BEFORE UPDATE ON releases_live BEGIN SELECT RAISE(ABORT, 'releases_live is append-only'); END;
CREATE TRIGGER releases_live_no_delete BEFORE DELETE ON releases_live BEGIN SELECT RAISE(ABORT, 'releases_live is append-only'); END;

-- The releases already live, from their events (SQLite's CAST reads the leading integer of
-- "generation 4, watched for 30 s").
INSERT INTO releases_live (environment, generation, made_at, live_at)
SELECT g.environment, g.generation, g.created_at, MIN(e.at)
FROM events e
JOIN deployment_generations g
  ON g.environment = e.subject AND g.generation = CAST(substr(e.detail, 12) AS INTEGER)
WHERE e.kind = 'deployment-rollout-done'
  AND e.detail LIKE 'generation %'
  AND e.detail NOT LIKE '%, a rollback%'
GROUP BY g.environment, g.generation, g.created_at;
