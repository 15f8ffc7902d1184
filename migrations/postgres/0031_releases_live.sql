-- Each release's commit-to-live: when the pass that judged its commit made the generation
-- (`made_at`), and when every replica ran it with its routes published (`live_at`, the time of
-- its `deployment-rollout-done`). Written in the transaction that records the release done;
-- a rollback's own generation is no release and has no row. The web view's fleet-wide picture
-- over days reads it by `live_at` (events have no index by kind, and a day's events of a big
-- fleet are millions); append-only like the generations it pairs.
CREATE TABLE releases_live (
    environment TEXT   NOT NULL,
    generation  BIGINT NOT NULL,
    made_at     BIGINT NOT NULL,
    live_at     BIGINT NOT NULL,
    PRIMARY KEY (environment, generation)
);
CREATE INDEX releases_live_by_time ON releases_live (live_at);
CREATE TRIGGER releases_live_append_only BEFORE UPDATE OR DELETE ON releases_live FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- The releases already live, from their events.
INSERT INTO releases_live (environment, generation, made_at, live_at)
SELECT g.environment, g.generation, g.created_at, MIN(e.at)
FROM events e
JOIN deployment_generations g
  ON g.environment = e.subject
 AND g.generation = CAST(substring(e.detail FROM '^generation ([0-9]+)') AS BIGINT)
WHERE e.kind = 'deployment-rollout-done'
  AND e.detail NOT LIKE '%, a rollback%'
GROUP BY g.environment, g.generation, g.created_at;
