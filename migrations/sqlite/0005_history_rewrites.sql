-- Heads of the applied branch that do not descend from its last accepted commit (a force-push):
-- refused with `history-rewritten` until an admin approves that one head. Kept apart from
-- `revisions`, which holds one verdict per (sha, branch): an approved rewrite is judged then,
-- and recorded there like any other commit.
CREATE TABLE history_rewrites (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    branch       TEXT    NOT NULL,
    sha          TEXT    NOT NULL,
    accepted_sha TEXT    NOT NULL, -- the last accepted commit, which the head does not descend from
    seen_at      INTEGER NOT NULL,
    approved_by  TEXT,             -- the name of the admin token that approved it
    approved_at  INTEGER,
    UNIQUE (branch, sha)
);
CREATE TRIGGER history_rewrites_no_delete BEFORE DELETE ON history_rewrites BEGIN SELECT RAISE(ABORT, 'history_rewrites keeps its history'); END;
