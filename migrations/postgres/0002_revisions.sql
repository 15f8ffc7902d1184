-- Every commit of a tracked branch the reconciler has judged, accepted or not. One row per
-- (sha, branch): reprocessing a commit writes nothing.
CREATE TABLE revisions (
    id          BIGSERIAL PRIMARY KEY,
    sha         TEXT   NOT NULL,
    branch      TEXT   NOT NULL,
    verdict     TEXT   NOT NULL CHECK (verdict IN ('accepted', 'rejected')),
    principals  TEXT,            -- the signer's principals, comma-separated
    fingerprint TEXT,            -- the signer's key, SHA256:…
    reasons     TEXT   NOT NULL, -- JSON list of {code, message} for a rejection; [] otherwise
    seen_at     BIGINT NOT NULL,
    UNIQUE (sha, branch)
);
CREATE INDEX revisions_by_branch ON revisions (branch, verdict, id);
CREATE TRIGGER revisions_append_only BEFORE UPDATE OR DELETE ON revisions FOR EACH ROW EXECUTE FUNCTION refuse_change();
