-- Heads of the applied branch that do not descend from its last accepted commit (a force-push):
-- refused with `history-rewritten` until an admin approves that one head. Kept apart from
-- `revisions`, which holds one verdict per (sha, branch): an approved rewrite is judged then,
-- and recorded there like any other commit.
CREATE TABLE history_rewrites (
    id           BIGSERIAL PRIMARY KEY,
    branch       TEXT   NOT NULL,
    sha          TEXT   NOT NULL,
    accepted_sha TEXT   NOT NULL, -- the last accepted commit, which the head does not descend from
    seen_at      BIGINT NOT NULL,
    approved_by  TEXT,            -- the name of the admin token that approved it
    approved_at  BIGINT,
    UNIQUE (branch, sha)
);
CREATE TRIGGER history_rewrites_no_delete BEFORE DELETE ON history_rewrites FOR EACH ROW EXECUTE FUNCTION refuse_change();
