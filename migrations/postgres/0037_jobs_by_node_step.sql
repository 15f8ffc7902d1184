-- SQLite's 0037 indexes a node's jobs of one rollout (`jobs_by_node_step`) for the release of
-- held replicas. Not here: on PostgreSQL every lease and completion changes `state`, which a
-- partial index's predicate reads, so no such update is HOT and each inserts an entry into
-- every index of `jobs`; with this one the fleet bench's agent loop ran at 0.83 and its
-- release at 1.2 of before (docs/benchmarks.md, forty-fourth session). The release keeps
-- `jobs_by_step` here. The number is kept so both ledgers count the same migrations.
SELECT 1;
