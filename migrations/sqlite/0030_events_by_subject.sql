-- The web view reads one environment's events newest first, and each release's
-- `deployment-rollout-done`: without an index, a quiet environment's 30 newest events were
-- found by reading every event (277 ms for an environment page at 10,000 environments). The
-- index leaves out the events of single jobs and leases (`job-*`, `jobs-leased`,
-- `lease-expired`), most of the events and none of an environment's: indexing them too cost
-- the fleet bench 5% of its lease+complete throughput on SQLite.
CREATE INDEX events_by_subject ON events (subject, id)
    WHERE kind NOT LIKE 'job-%' AND kind <> 'jobs-leased' AND kind <> 'lease-expired';
