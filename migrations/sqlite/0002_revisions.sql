-- Every commit of a tracked branch the reconciler has judged, accepted or not. One row per
-- (sha, branch): reprocessing a commit writes nothing.
CREATE TABLE revisions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    sha         TEXT    NOT NULL,
    branch      TEXT    NOT NULL,
    verdict     TEXT    NOT NULL CHECK (verdict IN ('accepted', 'rejected')),
    principals  TEXT,            -- the signer's principals, comma-separated
    fingerprint TEXT,            -- the signer's key, SHA256:…
    reasons     TEXT    NOT NULL, -- JSON list of {code, message} for a rejection; [] otherwise
    seen_at     INTEGER NOT NULL,
    UNIQUE (sha, branch)
);
CREATE INDEX revisions_by_branch ON revisions (branch, verdict, id);
CREATE TRIGGER revisions_no_update BEFORE UPDATE ON revisions BEGIN SELECT RAISE(ABORT, 'revisions is append-only'); END;
CREATE TRIGGER revisions_no_delete BEFORE DELETE ON revisions BEGIN SELECT RAISE(ABORT, 'revisions is append-only'); END;
