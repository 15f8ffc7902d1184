-- A rewrite is a head that does not descend from the commit in force *at that time*: the same
-- head refused again after another commit (say `pl down`'s teardown revision) is a new rewrite
-- that needs a new approval, so rows are unique by (branch, sha, accepted_sha). An approved
-- head that was judged before (a return to an earlier accepted commit) is applied again, and
-- `applied_at` records when: from then on it is the commit in force.
ALTER TABLE history_rewrites DROP CONSTRAINT history_rewrites_branch_sha_key;
ALTER TABLE history_rewrites ADD CONSTRAINT history_rewrites_branch_sha_base_key UNIQUE (branch, sha, accepted_sha);
ALTER TABLE history_rewrites ADD COLUMN applied_at BIGINT;
