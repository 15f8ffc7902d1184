-- Deployments: what each accepted revision asks the fleet to run, by generation, and the jobs
-- that roll each generation out in ordered steps.

ALTER TABLE jobs ADD COLUMN environment TEXT;
ALTER TABLE jobs ADD COLUMN generation  BIGINT;
ALTER TABLE jobs ADD COLUMN step        BIGINT;
CREATE INDEX jobs_by_step ON jobs (environment, generation, step, state);

-- The desired objects of each tracked branch as its newest accepted revision declares them
-- (canonical documents; secrets as ciphertext only). Their history is the revisions table.
CREATE TABLE desired_objects (
    branch      TEXT   NOT NULL,
    kind        TEXT   NOT NULL,
    name        TEXT   NOT NULL,
    hash        TEXT   NOT NULL,
    document    TEXT   NOT NULL,
    revision_id BIGINT NOT NULL REFERENCES revisions (id),
    PRIMARY KEY (branch, kind, name)
);

-- One row per environment: its current generation and where its rollout or teardown stands.
CREATE TABLE deployments (
    environment TEXT   PRIMARY KEY,
    branch      TEXT   NOT NULL,
    generation  BIGINT NOT NULL CHECK (generation > 0),
    action      TEXT   NOT NULL CHECK (action IN ('rollout', 'teardown')),
    status      TEXT   NOT NULL CHECK (status IN ('in-progress', 'done', 'failed')),
    step        BIGINT NOT NULL,
    spec_hash   TEXT   NOT NULL,  -- of the desired spec; '' for a teardown
    spec        TEXT   NOT NULL,  -- JSON: the generation's spec (the last one rolled out, for a teardown)
    retired     TEXT   NOT NULL,  -- JSON: specs of older generations that may still run
    revision_id BIGINT NOT NULL REFERENCES revisions (id),
    updated_at  BIGINT NOT NULL
);
CREATE INDEX deployments_by_status ON deployments (status);
CREATE INDEX deployments_by_branch ON deployments (branch);

-- Append-only: every generation ever made, and the revision that made it.
CREATE TABLE deployment_generations (
    environment TEXT   NOT NULL,
    generation  BIGINT NOT NULL,
    branch      TEXT   NOT NULL,
    action      TEXT   NOT NULL CHECK (action IN ('rollout', 'teardown')),
    spec_hash   TEXT   NOT NULL,
    revision_id BIGINT NOT NULL REFERENCES revisions (id),
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (environment, generation)
);
CREATE TRIGGER deployment_generations_append_only BEFORE UPDATE OR DELETE ON deployment_generations FOR EACH ROW EXECUTE FUNCTION refuse_change();
