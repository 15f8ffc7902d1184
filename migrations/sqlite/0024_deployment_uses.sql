-- What a deployment uses that the reconciler looks for among the live ones
-- (`state_schema::deployment::Uses`), written with its spec: no query searches the spec's
-- text any more. Filled once here from the stored specs (the patterns the queries used).
ALTER TABLE deployments ADD COLUMN uses_backups INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN uses_cron INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN uses_domains INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN uses_canary INTEGER NOT NULL DEFAULT 0;
UPDATE deployments SET
  uses_backups = CASE WHEN spec LIKE '%"backup":{%' AND spec LIKE '%"backups":{%' THEN 1 ELSE 0 END,
  uses_cron = CASE WHEN spec LIKE '%"cron":[[%' THEN 1 ELSE 0 END,
  uses_domains = CASE WHEN spec LIKE '%"domains":[%' THEN 1 ELSE 0 END,
  uses_canary = CASE WHEN spec LIKE '%"canary":%' THEN 1 ELSE 0 END;
