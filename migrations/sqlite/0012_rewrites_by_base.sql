-- A rewrite is a head that does not descend from the commit in force *at that time*: the same
-- head refused again after another commit (say `pl down`'s teardown revision) is a new rewrite
-- that needs a new approval, so rows are unique by (branch, sha, accepted_sha). An approved
-- head that was judged before (a return to an earlier accepted commit) is applied again, and
-- `applied_at` records when: from then on it is the commit in force. SQLite cannot drop a
-- constraint, so the table is made again with its rows.
CREATE TABLE history_rewrites_new (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    branch       TEXT    NOT NULL,
    sha          TEXT    NOT NULL,
    accepted_sha TEXT    NOT NULL,
    seen_at      INTEGER NOT NULL,
    approved_by  TEXT,
    approved_at  INTEGER,
    applied_at   INTEGER,
    UNIQUE (branch, sha, accepted_sha)
);
INSERT INTO history_rewrites_new (id, branch, sha, accepted_sha, seen_at, approved_by, approved_at)
    SELECT id, branch, sha, accepted_sha, seen_at, approved_by, approved_at FROM history_rewrites;
DROP TABLE history_rewrites;
ALTER TABLE history_rewrites_new RENAME TO history_rewrites;
CREATE TRIGGER history_rewrites_no_delete BEFORE DELETE ON history_rewrites BEGIN SELECT RAISE(ABORT, 'history_rewrites keeps its history'); END;
