-- What a deployment uses that passes look for among the live ones
-- (`state_schema::deployment::Uses`), written with its spec: no query searches the spec's
-- text any more. A table of its own, not columns of `deployments`: a step's update rewrites
-- the deployment's row many times per rollout, this one only when the spec changes.
-- Filled once here from the stored specs (the patterns the queries used).
CREATE TABLE deployment_uses (
    environment TEXT    PRIMARY KEY,
    backups     INTEGER NOT NULL,
    cron        INTEGER NOT NULL,
    domains     INTEGER NOT NULL,
    canary      INTEGER NOT NULL
);
INSERT INTO deployment_uses (environment, backups, cron, domains, canary)
SELECT environment,
  CASE WHEN spec LIKE '%"backup":{%' AND spec LIKE '%"backups":{%' THEN 1 ELSE 0 END,
  CASE WHEN spec LIKE '%"cron":[[%' THEN 1 ELSE 0 END,
  CASE WHEN spec LIKE '%"domains":[%' THEN 1 ELSE 0 END,
  CASE WHEN spec LIKE '%"canary":%' THEN 1 ELSE 0 END
FROM deployments;
